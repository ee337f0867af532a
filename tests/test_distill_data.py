"""Distillation data for the SmolLM2 draft (refimpl.train.distill_data) and the draft trainer's batches.

Run on ``tiny`` (no chat template: prompts are encoded as plain text), so they are fast.
"""
import torch

from refimpl import prompts
from refimpl.models.smollm2 import dequantize_int8, quantize_int8
from refimpl.train import distill_data, distill_prompts
from refimpl.train.smol_draft import draft_batch

TEXTS = ["And God said", "In the beginning God created", "Jesus wept.", "The LORD is my shepherd; I shall",
         "And it came to pass"]


def test_pools_exclude_the_benchmark_prompts_and_cover_its_categories(monkeypatch):
    bench = {t for texts in prompts.PROMPTS.values() for t in texts}
    stage1 = distill_prompts.prompt_pool()
    passages = ["The mill by the river was built long ago and grinds flour for visitors on Saturdays."] * 3
    stage2 = distill_prompts.stage2_prompts(passages, ["def f(x):\n    return x + 1\n"], seed=1, n_math=50, n_kjv=20)
    assert not (set(stage1) | set(stage2)) & bench
    assert len(stage2) > 1500 and len(set(stage2)) > 0.9 * len(stage2)
    for needle in ("Summarize", "Repeat the following text", "Question:", "def f(x)", "Solve for x", "Python"):
        assert any(needle in t for t in stage2), needle
    # a benchmark prompt slipped into a word list is filtered out of stage 2
    sneaky = prompts.PROMPTS["chat"][0]
    monkeypatch.setattr(distill_prompts, "ADVICE", distill_prompts.ADVICE + [sneaky, "A new question?"])
    leaked = distill_prompts.stage2_prompts([], [], n_math=0, n_kjv=0)
    assert "A new question?" in leaked and sneaky not in leaked


def test_generated_rows_hold_the_targets_greedy_answers_and_hidden_states(tiny):
    rows = distill_data.generate_answers(tiny, TEXTS, max_new_tokens=12, batch=2, progress=False, min_answer=1)
    assert sorted(r[3] for r in rows) == sorted(TEXTS)
    head = tiny.model.lm_head.weight.float()  # (V, H)
    for ids, n, hidden, text in rows:
        assert ids[:n] == tiny.encode(text)
        answer = ids[n:]
        assert 1 <= len(answer) <= 12 and hidden.shape == (len(answer), head.shape[1])
        assert tiny.eos_token_id not in answer[:-1]
        # hidden[i] @ head.T is the target's logits for answer token i, whose argmax it is (greedy)
        assert (hidden.float() @ head.T).argmax(-1).tolist() == answer
        # and the answer equals plain AR greedy decoding of the same prompt
        from refimpl import autoregressive

        ref = autoregressive.generate(tiny, [ids[:n]], max_new_tokens=len(answer)).tokens[0]
        assert ref == answer


def test_draft_batch_marks_exactly_the_answer_positions(tiny):
    rows = distill_data.generate_answers(tiny, TEXTS[:3], max_new_tokens=6, batch=3, progress=False, min_answer=1)
    kept = torch.arange(50)
    head = tiny.model.lm_head.weight.float()[kept]
    x, m, t_logits = draft_batch(rows, [0, 1, 2], tiny.pad_token_id, head)
    assert x.shape[0] == 3 and m.shape == x.shape
    assert int(m.sum()) == sum(len(r[0]) - r[1] for r in rows) == t_logits.shape[0]
    for b, (ids, n, _, _) in enumerate(rows):
        pos = m[b].nonzero().flatten().tolist()
        assert pos == list(range(n - 1, len(ids) - 1))  # position t predicts ids[t + 1]
        assert x[b, : len(ids) - 1].tolist() == ids[:-1]


def test_extract_code():
    fenced = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert distill_data.extract_code(fenced) == "def add(a, b):\n    return a + b\n"
    assert distill_data.extract_code("def f():\n    pass") == "def f():\n    pass\n"
    assert distill_data.extract_code("No code here.") is None


def test_int8_draft_storage_round_trips():
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(7, 33, generator=g) * torch.rand(7, 1, generator=g), "norm": torch.rand(33, generator=g)}
    q = quantize_int8(state)
    assert q["w"].dtype == torch.int8 and q["w.scale"].shape == (7, 1) and q["norm"].dtype == torch.float16
    back = dequantize_int8(q)
    assert set(back) == {"w", "norm"}
    err = (back["w"] - state["w"]).abs().amax(1) / state["w"].abs().amax(1)  # per row, relative to its max
    assert float(err.max()) < 0.6 / 127 + 1e-3
    assert torch.allclose(back["norm"].float(), state["norm"], atol=1e-3)
    # a float16 checkpoint passes through unchanged
    assert dequantize_int8({"w": state["w"].half()})["w"].dtype == torch.float16


def test_self_instruct_keeps_clean_distinct_questions_and_never_a_benchmark_prompt(tiny, monkeypatch):
    clean = distill_prompts.clean_question
    assert clean('2. "How do volcanoes form?"') == "How do volcanoes form?"
    assert clean("Question: Why is the sky blue?") == "Why is the sky blue?"
    assert clean("Write a short poem about the sea.") == "Write a short poem about the sea."
    assert clean("why") is None and clean("no capital letter here?") is None
    assert clean("I'm afraid of you, I am a cat.") is None  # neither a question nor a request
    # a fake sampler whose "lists" hold a duplicate, a benchmark prompt and an unfinished last line
    bench_q = prompts.PROMPTS["chat"][0]
    lists = iter([f" How do bees make honey?\n2. {bench_q}\n3. Why do cats purr?\n4. What is a bl",
                  " How do bees make honey?\n2. bad\n3. Give me a fact about owls.\n4. Why"] * 10)

    class FakeGen:
        def __init__(self, n):
            self.tokens = [tiny.tokenizer(next(lists), add_special_tokens=False)["input_ids"] for _ in range(n)]

    monkeypatch.setattr("refimpl.autoregressive.generate", lambda lm, ps, **kw: FakeGen(len(ps)))
    qs = distill_data.self_instruct_questions(tiny, n=3, batch=2, progress=False)
    assert qs == ["How do bees make honey?", "Why do cats purr?", "Give me a fact about owls."]


def test_a_limit_stops_after_the_batch_that_reaches_it(tiny):
    def run(limit):
        return distill_data.generate_answers(tiny, TEXTS, max_new_tokens=4, batch=2, progress=False, min_answer=1,
                                             limit=limit)
    assert len(run(None)) == 5 and len(run(2)) == 2 and len(run(3)) == 4 and len(run(10)) == 5
    assert {r[3] for r in run(3)} < set(TEXTS)


def test_all_stages_answers_each_stage_and_labels_its_rows(tiny, monkeypatch):
    # small stand-ins for the four pools; stage 2 is built from stage 1's answers, and cut by its limit
    seen = {}

    def sources(lm, rows):
        seen["s1"] = [r[3] for r in rows]
        return ["a passage"], ["def f(): pass"]
    monkeypatch.setattr(distill_data, "prompt_pool", lambda seed: TEXTS[:2])
    monkeypatch.setattr(distill_data, "stage1_sources", sources)
    monkeypatch.setattr(distill_data, "stage2_prompts", lambda src, fns, seed: [t + " again" for t in TEXTS])
    monkeypatch.setattr(distill_data, "human_copy_prompts", lambda seed: TEXTS[2:3])
    monkeypatch.setattr(distill_data, "self_instruct_questions", lambda lm, n, seed, batch, progress: TEXTS[3:3 + n])
    rows, stage = distill_data.all_stages(tiny, n_questions=2, stage2_limit=3, max_new_tokens=8, batch=2,
                                          progress=False)
    assert sorted(seen["s1"]) == sorted(TEXTS[:2])
    assert stage == [1] * 2 + [2] * 4 + [3] + [4] * 2 and len(rows) == len(stage)
    assert all(r[3].endswith(" again") for r, s in zip(rows, stage) if s == 2)
    assert sorted(r[3] for r, s in zip(rows, stage) if s == 4) == sorted(TEXTS[3:5])


def test_a_row_that_wrote_eos_leaves_the_batch(tiny, monkeypatch):
    """The batch shrinks as rows finish (their slots would decode for nothing), and every row is still the
    target's greedy answer (the test above): rows of one batch end at different steps here."""
    from refimpl.lm import decoder_of

    inner, sizes = decoder_of(tiny.model), []
    forward = inner.forward

    def counted(*a, **kw):
        sizes.append(kw["input_ids"].shape[0])
        return forward(*a, **kw)
    monkeypatch.setattr(inner, "forward", counted)
    eos = tiny.encode(",")[-1]  # (tiny's text rarely ends within 40 tokens; a comma does, at different steps)
    monkeypatch.setattr(tiny, "eos_token_id", eos)
    rows = distill_data.generate_answers(tiny, TEXTS, max_new_tokens=40, batch=5, progress=False, min_answer=1)
    lengths = sorted(len(r[0]) - r[1] for r in rows)
    ended = [r for r in rows if r[0][-1] == eos]
    assert ended and len(set(lengths)) > 1, lengths  # (the case this test is about)
    assert sizes[0] == 5 and sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]
    assert sum(sizes[1:]) == sum(lengths) - len(rows)  # after the prompt: one slot per answer token, none past EOS
    from refimpl import autoregressive

    for ids, n, _, _ in rows:
        want = autoregressive.generate(tiny, [ids[:n]], max_new_tokens=40, eos_token_id=eos).tokens[0]
        assert want == ids[n:]


def test_the_general_pool_holds_every_model_free_prompt_once_and_no_benchmark_prompt():
    """The pool a drafter for any model answers (and SmolLM2's drafters' held-out set, the benchmark's prompts,
    stays out of it: refimpl.train.smollm2_data.smollm2_heldout_rows checks the same)."""
    pool = distill_prompts.general_pool(0)
    assert len(pool) == len(set(pool)) >= 10_000
    assert set(distill_prompts.prompt_pool(0)) <= set(pool) and set(distill_prompts.human_copy_prompts(0)) <= set(pool)
    assert not set(pool) & {t for _, t in prompts.prompt_set()}
    # the second part comes after the first, whose order does not depend on it (cached answers stay valid)
    first = set(distill_prompts.prompt_pool(0) + distill_prompts.stage2_prompts([], [], 0)
                + distill_prompts.human_copy_prompts(0))
    n = len(first)
    assert set(pool[:n]) == first and not set(pool[n:]) & first
    assert set(pool[n:]) == set(distill_prompts.more_prompts(0)) - first - distill_prompts.bench_texts()

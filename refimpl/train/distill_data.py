"""Distillation data for ``smollm2-135m-draft``: a large prompt pool and the target's own answers.

A draft is scored on how often it predicts the target's next token (greedy speculative decoding
accepts exactly those), so it is trained on the *target's* answers, not on human text: the
classic recipe of DistillSpec (Zhou et al., "DistillSpec: Improving Speculative Decoding via
Knowledge Distillation", arXiv 2310.08461, section 4: on-policy data from the model being served).

Nothing is downloaded: every prompt is built here from word lists, random arithmetic, King James
Bible passages (``refimpl.data``) and passages/functions that the target itself writes in a first
stage. The benchmark's prompts (``refimpl.prompts``) are excluded, and :func:`prompt_pool` checks it.

Stage 1 asks the target for short paragraphs and Python functions about many topics; stage 2 reuses
those answers as source texts for summary / copy / edit / question-answer / code-edit tasks (the
categories of the benchmark), together with chat questions, random word problems and KJV passages.
Stage 3 adds copy / edit tasks on *human* text (standard-library docstrings, KJV): the target's
own paragraphs are easy to predict without looking back, so they never teach a draft to copy.
Stage 4 is self-instruct (Wang et al., "Self-Instruct", arXiv 2212.10560): the target *samples*
lists of user questions of several kinds about the topics, then answers them greedily. Templated prompts
alone left a gap (held-out agreement 0.72, benchmark chat prompts 0.32): the questions a person
asks are more varied than any template list.

``generate_answers`` runs the target batched in bfloat16 (about 2x the tokens/s of float32 on a
CPU with bf16 matrix units) and keeps, for every answer position, the target's final hidden state
``h`` (float16): the target's logits on any token subset are then one matmul, ``h @ E[kept].T``.
"""
from __future__ import annotations

import json
import os
import random
import time

import torch

from .. import autoregressive
from ..lm import decoder_of
from ..primitives import left_pad, positions_from_mask
from ..models import load
from ..prompts import encode_prompt
from .distill_prompts import (ASK_KINDS, ASK_PROMPT, TOPICS, bench_texts, clean_question, human_copy_prompts,
                              prompt_pool, stage2_prompts)


@torch.inference_mode()
def generate_answers(lm, texts: list[str], max_new_tokens: int = 96, batch: int = 96, seconds: float = 1e9,
                     path: str | None = None, progress: bool = True, start: list | None = None,
                     min_answer: int = 4, limit: int | None = None):
    """Greedy answers of ``lm`` to ``texts`` as chat turns, batched by prompt length.

    Returns rows ``(ids, n_prompt, hidden, text)``: ``ids`` = prompt + answer (up to and including
    the first EOS), ``hidden`` (n_answer, H) float16 = the target's final hidden states at positions
    ``n_prompt - 1 .. len(ids) - 2`` (``hidden[i]`` predicts answer token ``i``). Prompts are
    shuffled, then sorted by length within windows of 8 batches (little padding, no length bias
    when ``seconds`` cuts the run short); ``path`` saves after every batch (a cut-off run keeps its
    rows); ``start`` continues an earlier list (its texts are skipped); ``limit``: stop after the
    batch that reaches ``limit`` prompts (a count, where ``seconds`` depends on the machine).
    """
    from tqdm.auto import tqdm


    rows = list(start or [])
    done_texts = {r[3] for r in rows} if rows and len(rows[0]) > 3 else set()
    todo = [t for t in texts if t not in done_texts]
    random.Random(len(rows)).shuffle(todo)
    enc = [(encode_prompt(lm, t), t) for t in todo]
    win = 8 * batch
    enc = [x for i in range(0, len(enc), win) for x in sorted(enc[i : i + win], key=lambda x: len(x[0]))]
    inner, head = decoder_of(lm.model), lm.model.lm_head
    t0 = time.time()
    bar = tqdm(range(0, len(enc), batch), desc="target answers", disable=not progress)
    for j in bar:
        chunk = enc[j : j + batch]
        prompts = [p for p, _ in chunk]
        ids, mask = left_pad(prompts, lm.pad_token_id, lm.device)  # (B, L)
        pos = positions_from_mask(mask)
        B = ids.shape[0]
        cache = lm.new_cache()
        feed, feed_pos = ids, pos
        live = list(range(B))  # the rows still decoding: a row that wrote EOS leaves the batch
        hs, toks = [[] for _ in range(B)], [[] for _ in range(B)]  # per row: (H,) hidden, token
        for _ in range(max_new_tokens):
            h = inner(input_ids=feed, past_key_values=cache, position_ids=feed_pos, attention_mask=mask,
                      use_cache=True).last_hidden_state[:, -1]  # (b, H) over the live rows
            nxt = head(h).float().argmax(-1)  # (b,)
            half, words = h.half(), nxt.tolist()
            for i, b in enumerate(live):
                hs[b].append(half[i])
                toks[b].append(words[i])
            going = (nxt != lm.eos_token_id).nonzero().flatten()  # (b',) indices into the live rows
            if going.numel() == 0:
                break
            if going.numel() < len(live):  # drop the finished rows: their slots would decode for nothing
                cache.batch_select_indices(going)
                nxt, pos, mask = nxt[going], pos[going], mask[going]
                live = [live[i] for i in going.tolist()]
            feed, feed_pos = nxt[:, None], pos[:, -1:] + 1
            pos = torch.cat([pos, feed_pos], 1)
            mask = torch.cat([mask, torch.ones_like(feed)], 1)
        for b, (p, text) in enumerate(chunk):
            if len(toks[b]) >= min_answer:
                rows.append((p + toks[b], len(p), torch.stack(hs[b]), text))
        bar.set_postfix(rows=len(rows), tokens=sum(len(r[0]) - r[1] for r in rows))
        if path:
            torch.save(rows, path)
        if time.time() - t0 > seconds or (limit is not None and j + batch >= limit):
            break
    return rows


def answer_text(lm, row) -> str:
    """The decoded answer of a row from :func:`generate_answers` (EOS dropped)."""
    ids, n, _, _ = row
    return lm.tokenizer.decode([t for t in ids[n:] if t != lm.eos_token_id], skip_special_tokens=True).strip()


def extract_code(text: str) -> str | None:
    """The first Python function in an answer (fenced or not), or None."""
    if "```" in text:
        parts = text.split("```")
        if len(parts) >= 3:
            body = parts[1]
            body = body[body.index("\n") + 1:] if "\n" in body else body
            return body.strip("\n") + "\n" if "def " in body else None
    i = text.find("def ")
    return text[i:].strip("\n") + "\n" if i >= 0 else None


def build(folder: str, seconds: float = 1800.0, max_new_tokens: int = 96, batch: int = 96, seed: int = 0,
          progress: bool = True, stages=(1, 2, 3)):
    """The target's (SmolLM2-135M, bfloat16) answers for every stage; returns all rows.

    Stage 1: :func:`prompt_pool`; stage 2: :func:`stage2_prompts` on stage 1's paragraphs and
    functions; stage 3: :func:`human_copy_prompts` (copy / edit tasks on human-written text);
    stage 4: :func:`self_instruct_questions` (questions sampled from the target; the list is cached
    in ``smollm2-distill-s4-questions.json``). Rows are cached in
    ``folder/smollm2-distill-s{1,2,3,4}.pt``; a rerun continues where a stage stopped, for at most
    ``seconds`` in all.
    """

    lm = load("smollm2-135m", device="cpu", dtype=torch.bfloat16)
    t0 = time.time()
    out = []
    for stage in (1, 2, 3, 4):
        if stage not in stages and not (stage == 1 and 2 in stages):
            continue  # (stage 2 is built from stage 1's answers)
        path = os.path.join(folder, f"smollm2-distill-s{stage}.pt")
        rows = torch.load(path) if os.path.exists(path) else []
        if stage == 1:
            texts = prompt_pool(seed)
        elif stage == 2:
            passages, functions = stage1_sources(lm, s1)
            texts = stage2_prompts(passages, functions, seed)
            random.Random(seed).shuffle(texts)
        elif stage == 3:
            texts = human_copy_prompts(seed)
        else:
            qpath = os.path.join(folder, "smollm2-distill-s4-questions.json")
            if not os.path.exists(qpath):
                if seconds - (time.time() - t0) <= 0:
                    continue
                questions = self_instruct_questions(lm, seed=seed, progress=progress)
                with open(qpath, "w") as f:  # written only once complete
                    json.dump(questions, f, indent=0)
            with open(qpath) as f:
                texts = json.load(f)
        left = seconds - (time.time() - t0)
        if left > 0:
            rows = generate_answers(lm, texts, max_new_tokens, batch, seconds=left, path=path, progress=progress,
                                    start=rows)
        if stage == 1:
            s1 = rows
        if stage in stages:
            out += rows
    return out


def all_stages(lm, n_questions: int = 4000, stage2_limit: int | None = 4608, max_new_tokens: int = 96,
               batch: int = 256, seed: int = 0, progress: bool = True) -> tuple[list, list[int]]:
    """``lm``'s greedy answers to all four stages of :func:`build`, on whatever device ``lm`` is (an
    H200 answers the ~10,000 prompts in 2.4 minutes), nothing cached: stage 1's pool, stage 2 on its
    answers (the first ``stage2_limit`` of its ~7,000 prompts), stage 3's copy / edit tasks on human
    text, stage 4's ``n_questions`` self-instruct questions. -> ``(rows, stage of each row)`` (rows
    as :func:`generate_answers` returns them)."""
    s1 = generate_answers(lm, prompt_pool(seed), max_new_tokens, batch, progress=progress)
    passages, functions = stage1_sources(lm, s1)
    s2 = generate_answers(lm, stage2_prompts(passages, functions, seed), max_new_tokens, batch, progress=progress,
                          limit=stage2_limit)
    s3 = generate_answers(lm, human_copy_prompts(seed), max_new_tokens, batch, progress=progress)
    questions = self_instruct_questions(lm, n=n_questions, seed=seed, batch=batch, progress=progress)
    s4 = generate_answers(lm, questions, max_new_tokens, batch, progress=progress)
    rows = s1 + s2 + s3 + s4
    return rows, [1] * len(s1) + [2] * len(s2) + [3] * len(s3) + [4] * len(s4)


#: Stage-4 question lists: the target continues "1." with user questions / requests on a topic.

@torch.inference_mode()
def self_instruct_questions(lm, n: int = 2000, seed: int = 0, batch: int = 96, temperature: float = 0.8,
                            top_p: float = 0.95, max_new_tokens: int = 48, progress: bool = True) -> list[str]:
    """About ``n`` distinct user questions sampled from ``lm``: it continues numbered lists
    (:data:`ASK_PROMPT` x :data:`ASK_KINDS` x :data:`TOPICS`, plain text, no chat template) and
    every complete list item that looks like a question or a request is kept (:func:`clean_question`)."""
    from tqdm.auto import tqdm


    rng = random.Random(seed)
    gen = torch.Generator(device=lm.device).manual_seed(seed)  # (sampling draws on the model's device)
    bench, seen, out = bench_texts(), set(), []
    bar = tqdm(total=n, desc="self-instruct questions", disable=not progress)
    for _ in range(2 * n // batch + 1):
        asks = [ASK_PROMPT.format(rng.choice(ASK_KINDS), rng.choice(TOPICS)) for _ in range(batch)]
        ids = [lm.tokenizer(a, add_special_tokens=False)["input_ids"] for a in asks]
        g = autoregressive.generate(lm, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, generator=gen)
        for toks in g.tokens:
            lines = ("1." + lm.tokenizer.decode(toks, skip_special_tokens=True)).split("\n")[:-1]  # complete lines
            for line in lines:
                q = clean_question(line)
                if q and q not in seen and q not in bench:
                    seen.add(q)
                    out.append(q)
                    bar.update(1)
        if len(out) >= n:
            break
    bar.close()
    return out[:n]


def stage1_sources(lm, rows):
    """Stage 1's paragraphs (cut at their last full stop) and Python functions."""
    passages, functions = [], []
    for row in rows:
        text = answer_text(lm, row)
        if row[3].startswith("Write a Python function"):
            code = extract_code(text)
            if code and len(code) < 700:
                functions.append(code)
        elif "```" not in text and "." in text:
            text = text[: text.rindex(".") + 1]  # answers cut at max_new_tokens end mid-sentence
            if 150 < len(text) < 900:
                passages.append(text)
    return passages, functions


#: Standard-library modules whose docstrings give human-written modern English passages.

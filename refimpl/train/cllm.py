"""Chapter 15's trained-to-decode-in-parallel models, fine-tuned from the zoo on this CPU.

- ``tiny-cllm``: ``tiny`` fine-tuned on its own greedy Jacobi trajectories with the consistency
  + AR loss (:mod:`refimpl.cllm`, CLLMs arXiv 2403.00835 §3);
- ``tiny-bdlm-dparallel``: ``tiny-bdlm`` distilled on its own one-token-per-step trajectories with
  certainty forcing (:mod:`refimpl.dparallel`, dParallel arXiv 2509.26488 §3), on our states (prefixes
  of the teacher's commit order; the release's random masks are ``states="upstream"``);
- ``learn2pd-tiny-bdlm-dparallel``, ``learn2pd-tiny-bdlm``: Learn2PD's filter (:mod:`refimpl.learn2pd`,
  arXiv 2509.25188) for each dLLM, which stays frozen.

Both report what the chapter measures: the speed term (Jacobi tokens per call; threshold-decoding
calls) before and after, and how far the text moved (agreement with the original's greedy text).
"""
from __future__ import annotations

import copy
import os
import time

import torch

from .. import block_diffusion, data, jacobi
from ..cllm import agreement, cllm_loss, collect
from ..dparallel import certainty_forcing_loss, complementary_loss, record
from ..generation import check_positive_int
from ..learn2pd import Filter, FilterData, FilterRule, collect as collect_filter_data, filter_loss
from ..models import drafters
from ..models import load_folder, zoo_folder
from .common import causal_lm_perplexity, context_batches, encode_docs, save_half, train_loop, write_report


def load_base(name: str):
    return load_folder(zoo_folder(name, f"train it first: python -m refimpl.train {name}"), device="cpu")


def jacobi_tau(lm, prompts, window: int, new: int = 64):
    g = jacobi.generate(lm, prompts, max_new_tokens=new, window=window, eos_token_id=[])
    return g.stats.tau, g.tokens


def train_tiny_cllm(out_dir: str, steps: int = 800, n: int = 16, contexts: int = 1024, context_length: int = 48,
                    blocks: int = 4, batch: int = 16, lr: float = 3e-4, ar_weight: float | None = None,
                    frozen_teacher: bool | None = None, horizon: int | None = None, seed: int = 0, base: str = "tiny",
                    init: str | None = None, on_policy: bool = False, recipe: str = "ours"):
    """CLLM fine-tune of ``tiny``: collect ``contexts`` greedy Jacobi trajectories (``blocks``
    consecutive ``n``-token blocks after ``context_length`` King James tokens, guesses drawn from the
    context), then ``steps`` steps of global consistency + ``ar_weight`` * AR loss. The teacher of the
    consistency loss is the frozen original (``frozen_teacher``) or the model itself, stop-grad (the
    paper's theta^-); ``horizon`` limits the consistency loss to the frontier (:func:`refimpl.cllm.frontier_mask`).
    ``init``: the zoo model the fine-tune starts from (default ``base``); ``on_policy``: the later blocks'
    contexts are the starting model's own greedy text, the trajectories and targets stay ``base``'s
    (:func:`refimpl.cllm.collect`'s ``student``). ``recipe``: :func:`refimpl.cllm.cllm_loss`'s; ``"ours"``
    defaults to ``ar_weight`` 8 and the frozen teacher, ``"upstream"`` to Consistency_LLM's 10 and the
    model itself, stop-grad.

    The defaults put the trajectories where the benchmark decodes: 48-token prompts, then 4 blocks of
    16 = the 64 new tokens, so the model trains on contexts that hold up to 48 tokens of its own greedy
    text (with 2 blocks after 64 tokens, the zoo's earlier recipe, its text moved 4x further)."""
    if recipe not in ("ours", "upstream"):
        raise ValueError(f"recipe must be 'ours' or 'upstream', got {recipe!r}")
    ar_weight = (8.0 if recipe == "ours" else 10.0) if ar_weight is None else ar_weight
    frozen_teacher = (recipe == "ours") if frozen_teacher is None else frozen_teacher
    torch.manual_seed(seed)
    orig = load_base(base)
    start = orig if init is None else load_base(init)
    tok = orig.tokenizer
    train_docs, valid_docs = data.kjv_split()
    stream = encode_docs(tok, train_docs, tok.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, tok.eos_token_id)
    prompts = data.kjv_prompts(tok, 8)
    tau_before, text_before = jacobi_tau(start, prompts, n)
    text_base = text_before if init is None else jacobi_tau(orig, prompts, n)[1]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()
    student = start.model if on_policy and start is not orig else None  # the original's own text: plain collect
    trajs = [collect(orig.model, ctx, n, blocks, gen, student)
             for ctx in context_batches(stream, contexts, context_length, gen)]
    collect_s = time.time() - t0
    model = copy.deepcopy(start.model)
    teacher = orig.model if frozen_teacher else None

    def step_loss(s):
        t = trajs[int(torch.randint(0, len(trajs), (1,), generator=gen, device="cpu"))]
        ctx, state, target, fixed = t.sample(gen)
        idx = torch.randperm(ctx.shape[0], generator=gen, device="cpu")[:batch].to(ctx.device)
        return cllm_loss(model, (ctx[idx], state[idx], target[idx], fixed[idx]), ar_weight, teacher, horizon, recipe)[0]

    train_loop(model, step_loss, steps, lr, f"fine-tune {init or base} -> {os.path.basename(out_dir)}", warmup=20)
    minutes = (time.time() - t0) / 60
    os.makedirs(out_dir, exist_ok=True)
    save_half(model, out_dir)
    tok.save_pretrained(out_dir)
    lm = load_folder(out_dir, device="cpu")  # report on the fp16 round trip
    tau_after, text_after = jacobi_tau(lm, prompts, n)
    report = {"base": base, "init": init or base, "on_policy": on_policy, "recipe": recipe, "steps": steps, "block": n,
              "trajectories": len(trajs) * 64 * blocks,
              "context_length": context_length, "batch": batch, "lr": lr, "ar_weight": ar_weight,
              "teacher": "frozen original" if frozen_teacher else "self, stop-grad", "horizon": horizon, "blocks": blocks,
              "jacobi_tokens_per_call_before": round(tau_before, 2), "jacobi_tokens_per_call_after": round(tau_after, 2),
              "greedy_agreement_with_base": round(agreement(text_after, text_base), 3),
              "valid_perplexity_before": round(causal_lm_perplexity(orig.logits, valid_stream), 2),
              "valid_perplexity_after": round(causal_lm_perplexity(lm.logits, valid_stream), 2),
              "collect_seconds": round(collect_s), "minutes": round(minutes, 1), "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def train_tiny_cllm_onpolicy(out_dir: str, steps: int = 800, lr: float = 3e-4, **options):
    """``tiny-cllm-onpolicy``: the zoo's ``tiny-cllm`` fine-tuned once more on on-policy contexts:
    each context continues with ``tiny-cllm``'s own greedy text, while the Jacobi trajectories, the
    fixed points and the consistency loss's teacher stay the frozen ``tiny`` (DAgger's idea,
    :func:`refimpl.cllm.collect`'s ``student``). Chapter 15 and docs/learned-parallel.md measure what it buys."""
    return train_tiny_cllm(out_dir, steps=steps, lr=lr, init="tiny-cllm", on_policy=True, **options)


def threshold_calls(lm, prompts, threshold: float | None, gen_length: int = 32, block_length: int = 8, rule=None):
    calls, outs = 0, []
    for p in prompts:
        g = block_diffusion.generate(lm, [p], gen_length=gen_length, block_length=block_length, threshold=threshold,
                                     eos_token_id=[], rule=rule)
        calls += g.stats.nfe
        outs.append(g.tokens[0])
    return calls / len(prompts), outs


def train_tiny_bdlm_dparallel(out_dir: str, steps: int = 600, contexts: int = 1024, context_length: int = 48,
                              block_length: int = 8, blocks: int = 8, batch: int = 32, lr: float = 2e-4,
                              beta: float = 1.0, rounds: int = 3, seed: int = 0, base: str = "tiny-bdlm",
                              states: str = "ours"):
    """dParallel distillation of ``tiny-bdlm``: record ``contexts`` one-token-per-step trajectories
    (``blocks`` blocks of ``block_length`` after ``context_length`` King James tokens), then ``steps``
    steps of certainty forcing (cross-entropy to the trajectory's tokens on every masked position +
    ``beta`` * entropy where already right).

    The defaults put the trajectories where the benchmark decodes: 48-token prompts, then 8 blocks of 8
    = 64 new tokens (``blocks=2, context_length=32, contexts=2048`` met the goals at 32 new tokens and
    missed the quality goal at 64: the student had never trained past position 48; docs/learned-parallel.md).

    ``rounds`` > 1 (ours, measured in docs/learned-parallel.md): each further round records the same
    contexts again, decoded one token per step by the previous round's student (its fp16 weights, as
    the zoo stores them), and distils on those, so the student learns to be sure of *its own* final
    text, which is what its parallel decoding is judged against (the oracle's "final").

    ``states``: ``"ours"``, prefixes of the teacher's commit order (:meth:`refimpl.dparallel.Trajectories.sample`);
    ``"upstream"``, the release's random p = 0.5 masks of a block plus the complementary mask
    (:meth:`refimpl.dparallel.Trajectories.sample_random`, :func:`refimpl.dparallel.complementary_loss`)."""
    check_positive_int("rounds", rounds)
    if states not in ("ours", "upstream"):
        raise ValueError(f"states must be 'ours' or 'upstream', got {states!r}")
    torch.manual_seed(seed)
    orig = load_base(base)
    tok, mask_id = orig.tokenizer, orig.mask_token_id
    train_docs, _ = data.kjv_split()
    stream = encode_docs(tok, train_docs, tok.eos_token_id)
    prompts = data.kjv_prompts(tok, 8)
    calls_before, text_before = threshold_calls(orig, prompts, 0.9)
    t0, collect_s = time.time(), 0.0
    model, teacher = copy.deepcopy(orig.model), orig.model
    for r in range(rounds):
        gen = torch.Generator(device="cpu").manual_seed(seed)  # every round: the same contexts
        t_rec = time.time()
        trajs = [record(teacher, ctx, mask_id, block_length, blocks)
                 for ctx in context_batches(stream, contexts, context_length, gen)]
        collect_s += time.time() - t_rec

        def step_loss(s):
            t = trajs[int(torch.randint(0, len(trajs), (1,), generator=gen, device="cpu"))]
            if states == "upstream":
                ctx, state, comp, final = t.sample_random(gen, mask_id)
                idx = torch.randperm(ctx.shape[0], generator=gen, device="cpu")[:batch].to(ctx.device)
                return complementary_loss(model, ctx[idx], state[idx], comp[idx], final[idx], mask_id, beta=beta)[0]
            ctx, state, final = t.sample(gen, mask_id)
            idx = torch.randperm(ctx.shape[0], generator=gen, device="cpu")[:batch].to(ctx.device)
            return certainty_forcing_loss(model, ctx[idx], state[idx], final[idx], mask_id, beta=beta)[0]

        train_loop(model, step_loss, steps, lr, f"distil {base} -> tiny-bdlm-dparallel, round {r + 1}/{rounds}",
                   warmup=20)
        if r + 1 < rounds:
            with torch.no_grad():  # the next round starts from, and records with, the weights the zoo would store
                for p in model.parameters():
                    p.copy_(p.half().float())
            teacher = model
    minutes = (time.time() - t0) / 60
    os.makedirs(out_dir, exist_ok=True)
    save_half(model, out_dir)
    tok.save_pretrained(out_dir)
    lm = load_folder(out_dir, device="cpu")
    calls_after, text_after = threshold_calls(lm, prompts, 0.9)
    one = [block_diffusion.generate(orig, [p], gen_length=32, block_length=8, eos_token_id=[]).tokens[0]
           for p in prompts]
    report = {"base": base, "states": states, "steps": steps, "rounds": rounds, "trajectories": len(trajs) * 64 * blocks,
              "block_length": block_length, "context_length": context_length, "batch": batch, "lr": lr, "beta": beta,
              "threshold_0.9_calls_per_32_tokens_before": round(calls_before, 2),
              "threshold_0.9_calls_per_32_tokens_after": round(calls_after, 2),
              "agreement_with_base_one_token_per_step": round(agreement(text_after, one), 3),
              "collect_seconds": round(collect_s), "minutes": round(minutes, 1), "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def train_learn2pd(out_dir: str, base: str = "tiny-bdlm-dparallel", steps: int = 2000, contexts: int = 512,
                   context_length: int = 48, block_length: int = 8, blocks: int = 4, batch: int = 256,
                   lr: float = 1e-2, hidden: int = 32, cutoff: float = 0.5, seed: int = 0):
    """Learn2PD's filter for the frozen dLLM ``base``: replay ``contexts`` one-token-per-step trajectories
    (``blocks`` blocks of ``block_length`` after ``context_length`` King James tokens, where the benchmark
    decodes) state by state, then ``steps`` steps of binary cross-entropy on "argmax == final"."""
    torch.manual_seed(seed)
    lm = load_base(base)
    tok, mask_id = lm.tokenizer, lm.mask_token_id
    stream = encode_docs(tok, data.kjv_split()[0], tok.eos_token_id)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()
    parts = [collect_filter_data(lm.model, record(lm.model, ctx, mask_id, block_length, blocks), mask_id)
             for ctx in context_batches(stream, contexts, context_length, gen)]
    collect_s = time.time() - t0
    held = parts.pop() if len(parts) > 1 else parts[0]  # the last batch of contexts: held out for the report
    train = FilterData(*(torch.cat([getattr(p, f) for p in parts]) for f in ("feats", "labels", "masked")))
    filt = Filter(block_length, hidden)
    train_loop(filt, lambda s: filter_loss(filt, *train.batch(batch, gen)), steps, lr, f"train learn2pd-{base}",
               warmup=50)
    with torch.no_grad():
        prob = torch.sigmoid(filt(held.feats))[held.masked]
    right, conf = held.labels[held.masked].bool(), held.feats[:, :block_length][held.masked]
    minutes = (time.time() - t0) / 60
    prompts = data.kjv_prompts(tok, 8)
    one = [block_diffusion.generate(lm, [p], gen_length=32, block_length=block_length, eos_token_id=[]).tokens[0]
           for p in prompts]
    calls_thr, text_thr = threshold_calls(lm, prompts, cutoff)
    calls_filter, text_filter = threshold_calls(lm, prompts, None, rule=FilterRule(filt, cutoff))
    report = {"base": base, "steps": steps, "rows": int(train.feats.shape[0]), "block_length": block_length,
              "context_length": context_length, "hidden": hidden, "params": sum(p.numel() for p in filt.parameters()),
              "held_out_label_rate": round(float(right.float().mean()), 3),
              f"held_out_filter_above_{cutoff}": {"fraction": round(float((prob > cutoff).float().mean()), 3),
                                               "precision": round(float(right[prob > cutoff].float().mean()), 3)},
              f"held_out_confidence_above_{cutoff}": {"fraction": round(float((conf > cutoff).float().mean()), 3),
                                                   "precision": round(float(right[conf > cutoff].float().mean()), 3)},
              f"calls_per_32_tokens_threshold_{cutoff}": round(calls_thr, 2),
              f"calls_per_32_tokens_filter_{cutoff}": round(calls_filter, 2),
              "agreement_with_one_token_per_step": {"threshold": round(agreement(text_thr, one), 3),
                                                    "filter": round(agreement(text_filter, one), 3)},
              "collect_seconds": round(collect_s), "minutes": round(minutes, 1), "threads": torch.get_num_threads()}
    drafters.save(filt, out_dir, lm, report)
    return write_report(out_dir, report)


def train_learn2pd_bdlm(out_dir: str, **options):
    """Learn2PD's filter for ``tiny-bdlm`` itself (no distillation): :func:`train_learn2pd`."""
    return train_learn2pd(out_dir, base="tiny-bdlm", **options)

"""Adapt a chain draft model for parallel drafting (PARD): ``python -m refimpl.train tiny-pard``.

Paper: An et al., "PARD", arXiv 2504.18583, §3.2; the layout (``k`` copies of each sequence, the masks'
attention, conditional drop-token sampling) is :func:`refimpl.pard.training_layout`.

Ours: the draft starts from the zoo's chain draft for the target (``tiny-draft``), and each kept item is
distilled towards the target's distribution at the position it predicts (KL at temperature 2 plus 0.1 x
the cross-entropy of the text, :func:`refimpl.drafts.distill_loss`, the chain draft's own recipe) on King
James windows: the teacher is what verification checks. Upstream trains on chat data with the text's
cross-entropy. The mask token is the tokenizer's MASK (``tiny``'s id 2, reserved and never trained);
the draft's config records it as ``pard_token`` (vLLM reads that name).

SmolLM2 (``python -m refimpl.train smollm2-135m-pard``): the zoo's ``smollm2-135m-draft`` (3 layers, the
target's frozen embedding, a head over 8,192 kept tokens) adapted on SmolLM2's own greedy answers to the course's
prompt pool (:func:`refimpl.train.smollm2_data.smollm2_corpus`, with the target's final hidden state at every
answer token): the teacher's logits on the kept tokens are those states times the kept embedding rows
(a tied head), so no target forward runs while training. The mask token is ``<gh_stars>``, a special
token a chat never produces; its embedding row (the target's, frozen) fills the slots.

Report: held-out acceptance per depth of the one-call chain (P(the first d drafts all equal the
target's greedy tokens), from random positions of held-out windows or answers) and the chain tau it implies.
"""
from __future__ import annotations

import os
import random
import time

import torch

from .. import data
from ..drafts import distill_loss
from ..models import drafters, load
from ..models.hf import load_folder
from ..pard import training_layout
from ..primitives import additive
from .common import answer_anchors, budget_step, cosine_lr, encode_docs, random_windows, save_half, train_loop, write_report


def pard_loss(student, teacher, x: torch.Tensor, mask_id: int, k: int, keep: float, min_keep: float, gen,
              temperature: float = 2.0, ce_weight: float = 0.1) -> torch.Tensor:
    """One batch ``x`` (B, T) of PARD training: the ``k``-copy layout with conditional drop-token sampling
    through ``student`` (a Hugging Face causal LM) in one forward; each kept item distilled towards
    ``teacher``'s distribution at the token it predicts (:func:`refimpl.drafts.distill_loss`)."""
    slot, pos, allow = training_layout(x, k, keep, min_keep, gen)
    B, T = x.shape
    dev = x.device
    inp = torch.where(slot.to(dev)[None] == 0, x[:, pos.to(dev)], torch.full_like(x[:, pos.to(dev)], mask_id))
    logits = student(input_ids=inp, position_ids=pos.to(dev)[None].expand(B, -1),
                     attention_mask=additive(allow.to(dev)[None].expand(B, -1, -1))).logits  # (B, N, V)
    with torch.no_grad():
        t_logits = teacher(input_ids=x).logits  # (B, T, V): position t predicts token t + 1
    has = (pos + 1 < T).to(dev)  # items whose target token exists
    at = pos.to(dev)[has]
    V = logits.shape[-1]
    return distill_loss(logits[:, has].reshape(-1, V), t_logits[:, at].reshape(-1, V),
                        x[:, at + 1].reshape(-1), temperature, ce_weight)


@torch.no_grad()
def accept_rates(draft, target, windows: torch.Tensor, k: int, mask_id: int, starts: int = 8, seed: int = 0) -> list:
    """P(the one-call chain's first d drafts all equal the target's greedy tokens), d = 1 .. k."""
    rng, hits, count = random.Random(seed), [0] * k, 0
    for w in windows:
        for a in sorted(rng.sample(range(8, w.shape[0] - k - 1), starts)):
            ctx = w[:a + 1].tolist()
            inp = torch.tensor([ctx + [mask_id] * (k - 1)], device=draft.device)
            guess = draft.logits(inp)[0, -k:].argmax(-1).tolist()
            truth = target.logits(torch.tensor([ctx + guess], device=target.device))[0, a:a + k].argmax(-1).tolist()
            count += 1
            for d in range(k):
                if guess[d] != truth[d]:
                    break
                hits[d] += 1
    return [round(h / max(count, 1), 4) for h in hits]


def train_tiny_pard(out_dir: str, steps: int = 500, batch: int = 4, length: int = 128, k: int = 8, keep: float = 0.7,
                    min_keep: float = 0.2, lr: float = 1e-3, seed: int = 0, progress: bool = True) -> dict:
    """``tiny-draft`` adapted into ``tiny-pard`` on King James windows (see the module doc)."""
    torch.manual_seed(seed)
    teacher, start = load("tiny", device="cpu"), load("tiny-draft", device="cpu")
    student, tok, mask_id = start.model, start.tokenizer, start.tokenizer.mask_token_id
    train_docs, valid_docs = data.kjv_split()
    stream = encode_docs(tok, train_docs, tok.eos_token_id)
    valid = encode_docs(tok, valid_docs, tok.eos_token_id)
    gen, wgen = torch.Generator(device="cpu").manual_seed(seed), torch.Generator(device="cpu").manual_seed(seed + 1)
    held = random_windows(valid, 24, length, torch.Generator(device="cpu").manual_seed(seed + 2))
    before = accept_rates(start, teacher, held, k, mask_id)
    t0 = time.time()
    student.train()
    train_loop(student, lambda s: pard_loss(student, teacher.model, random_windows(stream, batch, length, wgen), mask_id,
                                            k, keep, min_keep, gen), steps, lr, "adapt tiny-draft -> tiny-pard",
               warmup=20, progress=progress)
    student.eval()
    student.config.pard_token = mask_id
    os.makedirs(out_dir, exist_ok=True)
    save_half(student, out_dir)
    tok.save_pretrained(out_dir)
    drafters.record_target(out_dir, teacher, "tiny")
    draft = load_folder(out_dir, device="cpu")
    rates = accept_rates(draft, teacher, held, k, mask_id)
    student.config.heldout_accept = rates  # what refimpl.pard.cpu_slots sizes the decoding chain by
    student.config.save_pretrained(out_dir)
    report = {"start": "tiny-draft", "k": k, "cod_keep": keep, "cod_min_keep": min_keep, "steps": steps,
              "batch": batch, "length": length, "lr": lr, "pard_token": mask_id,
              "accept_rate_per_depth": rates, "heldout_chain_tau": round(1 + sum(rates), 3),
              "accept_rate_per_depth_before": before, "minutes": round((time.time() - t0) / 60, 1),
              "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def row_batch(rows, pick, head: torch.Tensor, col: torch.Tensor, pad_id: int):
    """Right-padded rows ``(ids, n_prompt, hidden, ...)`` -> tokens (B, T), the teacher's logits on the
    kept tokens at every answer-predicting position (B, T, K) (``hidden @ head.T``), which positions carry
    a loss (B, T) and their labels as kept indices (B, T) (-100: no loss or outside the kept vocabulary)."""
    T = max(len(rows[i][0]) for i in pick)
    B, K = len(pick), head.shape[0]
    x = torch.full((B, T), pad_id, dtype=torch.long, device="cpu")
    teacher = torch.zeros((B, T, K), device="cpu")
    has = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    labels = torch.full((B, T), -100, dtype=torch.long, device="cpu")
    for b, i in enumerate(pick):
        ids, n, h = rows[i][:3]
        x[b, :len(ids)] = torch.as_tensor(ids, device="cpu")
        teacher[b, n - 1:len(ids) - 1] = h.float() @ head.T  # position t predicts ids[t + 1]
        has[b, n - 1:len(ids) - 1] = True
        lab = col[torch.as_tensor(ids[n:], device="cpu")]
        labels[b, n - 1:len(ids) - 1] = torch.where(lab >= 0, lab, torch.full_like(lab, -100))
    return x, teacher, has, labels


def pard_rows_loss(model, x, teacher, has, labels, mask_id: int, k: int, keep: float, min_keep: float, gen,
                   temperature: float = 2.0, ce_weight: float = 0.1) -> torch.Tensor:
    """PARD's loss on a :func:`row_batch`: every kept item of the ``k``-copy layout through ``model`` (a
    trimmed causal LM whose logits are over the kept tokens) in one forward, distilled towards the
    teacher's logits at the position it predicts, plus ``ce_weight`` x the cross-entropy of its label. Masks
    start at the batch's first answer-predicting position (``first_anchor``): a mask on a prompt position
    would carry no loss."""
    first = int(has.int().argmax(-1).min())  # the earliest position whose next token is an answer token
    slot, pos, allow = training_layout(x, k, keep, min_keep, gen, first_anchor=first)
    B = x.shape[0]
    inp = torch.where(slot[None] == 0, x[:, pos], torch.full_like(x[:, pos], mask_id))  # (B, N)
    logits = model(input_ids=inp, position_ids=pos[None].expand(B, -1),
                   attention_mask=additive(allow[None].expand(B, -1, -1))).logits  # (B, N, K)
    sel = has[:, pos]  # (B, N) items whose predicted token is an answer token
    s, t = logits[sel], teacher[:, pos][sel]  # (M, K)
    kl = distill_loss(s, t, None, temperature, 0.0)
    lab = labels[:, pos][sel]
    ce = torch.nn.functional.cross_entropy(s.float(), lab, ignore_index=-100) if bool((lab >= 0).any()) else 0.0
    return kl + ce_weight * ce


@torch.no_grad()
def row_accept_rates(model, rows, kept: torch.Tensor, mask_id: int, k: int, starts: int = 6, seed: int = 0) -> list:
    """P(the one-call chain's first d drafts all equal the target's greedy answer tokens), d = 1 .. k, from
    ``starts`` random answer anchors per row (the rows are the target's own greedy answers)."""
    hits, count = [0] * k, 0
    for ids, a in answer_anchors(rows, k, starts, seed):
        inp = torch.tensor([list(ids[:a + 1]) + [mask_id] * (k - 1)], device=model.device)
        guess = kept[model(input_ids=inp).logits[0, -k:].argmax(-1)].tolist()
        count += 1
        for d in range(k):
            if guess[d] != int(ids[a + 1 + d]):
                break
            hits[d] += 1
    return [round(h / max(count, 1), 4) for h in hits]


def train_smollm2_pard(out_dir: str, steps: int = 1200, batch: int = 8, k: int = 8, keep: float = 0.7,
                       min_keep: float = 0.2, lr: float = 3e-4, seconds: float = 2400.0, gen_seconds: float = 1500.0,
                       mask_token: str = "<gh_stars>", seed: int = 0, data: str = "corpus",
                       progress: bool = True) -> dict:
    """``smollm2-135m-draft`` adapted into ``smollm2-135m-pard`` (see the module doc); ``steps`` steps or
    ``seconds`` (the cosine sized to whichever ends first); the report's held-out rows are SmolLM2's answers to
    the benchmark's prompts, which no training pool holds, the base draft's included
    (:func:`refimpl.train.smollm2_data.smollm2_heldout_rows`). ``data``: ``"corpus"`` (the zoo's draft),
    SmolLM2's bf16 answers to the whole pool (:func:`refimpl.train.smollm2_data.smollm2_corpus`), or
    ``"fp32"``, its fp32 answers to the model-free distillation prompts
    (:func:`refimpl.train.smollm2_data.smollm2_rows`); either generated for at most ``gen_seconds`` more (the
    zoo's draft: 40 minutes of steps on 2 threads, the DFlash drafter's budget)."""
    import json

    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from ..models.smollm2 import load_draft, quantize_int8
    from .smollm2_data import smollm2_corpus, smollm2_heldout_rows, smollm2_rows

    if data not in ("corpus", "fp32"):
        raise ValueError(f"data must be 'corpus' or 'fp32', got {data!r}")
    torch.manual_seed(seed)
    if data == "corpus":
        rows, target = smollm2_corpus(gen_seconds, progress=progress), load("smollm2-135m", device="cpu", fast=False)
        if not rows:
            raise FileNotFoundError("no SmolLM2 corpus cached: run with gen_seconds > 0")
    else:
        rows, target, _ = smollm2_rows(8192, gen_seconds, progress)
    start = load_draft(device="cpu", copy_prior=False)
    model, kept = start.model, start.kept_ids.cpu()
    mask_id = target.tokenizer.convert_tokens_to_ids(mask_token)
    head = model.lm_head.weight.detach().float()  # (K, H) the target's embedding rows of the kept tokens
    col = torch.full((target.vocab_size,), -1, dtype=torch.long, device="cpu").index_copy_(0, kept, torch.arange(len(kept), device="cpu"))
    held, train = smollm2_heldout_rows(progress=progress), rows
    before = row_accept_rates(model, held, kept, mask_id, k)
    gen, pick_rng, t0 = torch.Generator("cpu").manual_seed(seed), random.Random(seed), time.time()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    bar = tqdm(range(steps), desc="adapt smollm2-135m-draft -> smollm2-135m-pard", disable=not progress)
    done = 0
    for step in bar:
        for grp in opt.param_groups:
            grp["lr"] = cosine_lr(budget_step(step, steps, time.time() - t0, seconds), steps, lr, warmup=30)
        x, teacher, has, labels = row_batch(train, pick_rng.sample(range(len(train)), batch), head, col,
                                            target.pad_token_id)
        loss = pard_rows_loss(model, x, teacher, has, labels, mask_id, k, keep, min_keep, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if time.time() - t0 > seconds:
            break
    model.eval()
    rates = row_accept_rates(model, held, kept, mask_id, k)
    os.makedirs(out_dir, exist_ok=True)
    state = quantize_int8({n: v.detach() for n, v in model.state_dict().items()
                           if not n.startswith(("model.embed_tokens", "lm_head"))})
    state["kept_ids"] = kept.to(torch.int32)
    save_file(state, os.path.join(out_dir, "draft.safetensors"), metadata={"format": "pt"})
    model.config.pard_token, model.config.heldout_accept = mask_id, rates  # heldout_accept: refimpl.pard.cpu_slots
    model.config.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "draft.json"), "w") as f:
        json.dump({"target": "smollm2-135m", "vocab_keep": int(kept.numel()), "init": "smollm2-135m-draft",
                   "head": "target embedding rows of kept_ids", "tie": "embed_tokens from the target",
                   "pard_token": mask_id, "mask_token": mask_token,
                   "storage": "matrices int8 with one float16 scale per row (name + '.scale'); vectors float16"},
                  f, indent=2)
    drafters.record_target(out_dir, target, "smollm2-135m")
    report = {"start": "smollm2-135m-draft", "k": k, "cod_keep": keep, "cod_min_keep": min_keep,
              "steps": done, "batch": batch, "lr": lr, "pard_token": mask_id, "mask_token": mask_token,
              "data": data, "train_rows": len(train), "heldout_rows": len(held),
              "accept_rate_per_depth": rates, "heldout_chain_tau": round(1 + sum(rates), 3),
              "accept_rate_per_depth_before": before, "minutes": round((time.time() - t0) / 60, 1),
              "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def heldout_report(progress: bool = True) -> dict:
    """Measure a saved SmolLM2 PARD draft on the shared held-out rows (before: the chain draft it started from)
    into its ``train_report.json`` (``shared_heldout``): ``python -c "from refimpl.train.pard import heldout_report; heldout_report()"``."""
    import json

    from ..models import MODELS_DIR
    from ..models.smollm2 import load_draft, load_pard
    from .smollm2_data import record_shared_heldout, smollm2_heldout_rows

    held = smollm2_heldout_rows(progress=progress)
    lm = load_pard(device="cpu")
    with open(os.path.join(MODELS_DIR, lm.name, "train_report.json")) as f:
        k = json.load(f)["k"]
    mask_id, kept = lm.model.config.pard_token, lm.kept_ids.cpu()
    rates = row_accept_rates(lm.model, held, kept, mask_id, k)
    start = load_draft(device="cpu", copy_prior=False)
    before = row_accept_rates(start.model, held, start.kept_ids.cpu(), mask_id, k)
    return record_shared_heldout(lm.name, held, rates, "6 random answer positions a row",
                                 accept_rate_per_depth_before=before)

"""Training the zoo's ``smollm2-135m-draft``: distillation on SmolLM2's own answers plus an
induction drill (``python -m refimpl.train smollm2-135m-draft``).

The draft is a :class:`refimpl.drafts.TrimmedLM` (VocabTrim, arXiv 2506.22694) of 3 layers sharing
SmolLM2's embedding; the data is :mod:`refimpl.train.distill_data`; the committed weights are
stored int8 (:func:`refimpl.models.smollm2.quantize_int8`).
"""
from __future__ import annotations

import copy
import json
import os
import random
import time
import zlib

import torch

from .. import data
from ..lm import decoder_of
from ..drafts import distill_loss, student_config, top_tokens
from ..models import drafters, load
from ..models.hf import cache_dir
from ..models.smollm2 import load_draft, quantize_int8, trimmed_model
from ..speculative import expected_tau
from . import distill_data, distill_prompts
from .common import answer_anchors, cosine_lr, write_report


def smol_draft_config(target_config, num_layers: int = 2, intermediate_size: int = 1536):
    cfg = student_config(target_config, num_layers)
    cfg.intermediate_size = intermediate_size
    cfg.tie_word_embeddings = False
    return cfg


def prune_mlp(dst_layer, src_layer, keep: int) -> None:
    """Copy a layer, keeping the ``keep`` MLP neurons with the largest weight norms (all: a plain copy)."""
    sd = src_layer.state_dict()
    mlp = src_layer.mlp
    score = mlp.down_proj.weight.norm(dim=0) * (mlp.gate_proj.weight.norm(dim=1) + mlp.up_proj.weight.norm(dim=1))
    idx = score.topk(keep).indices.sort().values
    sd["mlp.gate_proj.weight"] = mlp.gate_proj.weight[idx]
    sd["mlp.up_proj.weight"] = mlp.up_proj.weight[idx]
    sd["mlp.down_proj.weight"] = mlp.down_proj.weight[:, idx]
    dst_layer.load_state_dict(sd)


def grow_layer(model, source_layer, at: int):
    """``model`` (a trimmed Llama draft) with one more decoder layer at index ``at``: a copy of
    ``source_layer`` whose attention output and MLP down projections are zero, so the residual
    stream -- and every prediction -- is unchanged until training moves them ("zero-init residual
    branch", as in Goyal et al., arXiv 1706.02677, section 5.1, for batch-norm gammas)."""
    L = model.config.num_hidden_layers
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= L:
        raise ValueError(f"at must be a layer index in [0, {L}], got {at!r}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = L + 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[0]] * (L + 1)
    inner = decoder_of(model)
    with torch.device(model.lm_head.weight.device):
        big = type(model)(cfg)  # fresh layers; the embedding and the head are shared below
    big.model.embed_tokens, big.lm_head = inner.embed_tokens, model.lm_head
    old = list(inner.layers)
    for i, layer in enumerate(big.model.layers):
        if i == at:
            prune_mlp(layer, source_layer, cfg.intermediate_size)
            with torch.no_grad():
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        else:
            layer.load_state_dict(old[i if i < at else i - 1].state_dict())
    big.model.norm.load_state_dict(inner.norm.state_dict())
    return big


def draft_batch(rows, pick, pad_id: int, head: torch.Tensor | None = None):
    """Right-padded inputs (B, T), the loss positions (B, T) bool and the teacher's logits (N, K)
    on the kept tokens (``head`` = their embedding rows (K, H); None: no logits)."""
    T = max(len(rows[i][0]) for i in pick) - 1
    dev = "cpu" if head is None else head.device  # the teacher's logits are computed where its head lives
    x = torch.full((len(pick), T), pad_id, dtype=torch.long, device=dev)
    m = torch.zeros(len(pick), T, dtype=torch.bool, device=dev)
    hs = []
    for b, i in enumerate(pick):
        ids, n, h = rows[i][:3]
        x[b, : len(ids) - 1] = torch.tensor(ids[:-1], device=dev)
        m[b, n - 1 : len(ids) - 1] = True  # position t predicts ids[t + 1]: the answer tokens
        hs.append(h)
    if head is None:
        return x, m, None
    with torch.no_grad():
        t_logits = torch.cat(hs).float() @ head.T  # (N, K): the target's logits on the kept tokens
    return x, m, t_logits


def copy_drill(kept: torch.Tensor, text_ids: torch.Tensor | None, batch: int, span: int, gen: torch.Generator):
    """An induction drill: spans of ``span`` tokens, each shown twice -> (x (B, 3*span), labels).

    Half the spans are random kept tokens, half are windows of human text ``text_ids`` (1-D; None:
    all spans random). Each
    row is ``noise(span - g) + span + noise(g) + span`` with its own gap ``g`` in [0, span] (noise:
    random kept tokens), so the distance between the two showings differs from row to row: a
    fixed-offset attention pattern cannot solve the drill, only copying by content can (with one
    fixed distance a draft learned "look back 47 tokens" and still copied nothing at 40). The
    labels (B, 3*span) are the *kept-vocabulary indices* of the next token inside the second
    showing (from its second token on, where copying determines the answer) and -100 elsewhere. A
    draft that cannot copy scores ~0; the target, scored on the same kept tokens, ~82% (its induction heads
    sit in layers 17-18).
    """
    K, dev, gdev = kept.numel(), kept.device, gen.device  # rows live with ``kept``; draws where ``gen`` lives
    index = torch.full((int(kept.max()) + 1,), -100, dtype=torch.long, device=dev)
    index[kept] = torch.arange(K, device=dev)
    n_rand = batch if text_ids is None else batch // 2
    first = kept[torch.randint(0, K, (n_rand, span), generator=gen, device=gdev).to(dev)]  # (b, span)
    if n_rand < batch:
        starts = torch.randint(0, max(len(text_ids) - span, 1), (batch - n_rand,), generator=gen, device=gdev)
        first = torch.cat([first, torch.stack([text_ids[s: s + span] for s in starts.tolist()]).to(dev)])  # (B, span)
    x = kept[torch.randint(0, K, (batch, 3 * span), generator=gen, device=gdev).to(dev)]  # (B, 3*span) noise
    gaps = torch.randint(0, span + 1, (batch,), generator=gen, device=gdev)
    for b, g in enumerate(gaps.tolist()):
        x[b, span - g: 2 * span - g] = first[b]
    x[:, 2 * span:] = first
    nxt = x[:, 1:].clamp(max=len(index) - 1)
    lab = torch.where(x[:, 1:] < len(index), index[nxt], torch.full_like(nxt, -100))  # (B, 3*span-1)
    lab[:, : 2 * span] = -100  # position t predicts x[t+1]: score only inside the second showing
    labels = torch.cat([lab, torch.full((batch, 1), -100, dtype=torch.long, device=dev)], dim=1)
    return x, labels


def drill_text_ids(tokenizer, chapters: int = 400) -> torch.Tensor:
    """Human text for :func:`copy_drill`: KJV chapters and standard-library docstrings, tokenized (1-D)."""
    texts = data.kjv_chapters()[:chapters] + distill_prompts.human_passages()
    return torch.tensor([t for s in texts for t in tokenizer(s + "\n", add_special_tokens=False)["input_ids"]], device="cpu")


@torch.no_grad()
def copy_accuracy(model, kept: torch.Tensor, span: int = 40, batch: int = 8, seed: int = 1) -> float:
    """Top-1 accuracy on the second showing of random spans (:func:`copy_drill` without text)."""
    params = getattr(model, "parameters", None)  # any callable model; the drill goes where its weights are
    dev = next(params(), kept).device if params is not None else kept.device
    x, labels = copy_drill(kept.to(dev), None, batch, span, torch.Generator(device="cpu").manual_seed(seed))  # on dev
    pred = model(input_ids=x).logits.argmax(-1)  # (B, T) kept indices
    m = labels >= 0
    return float((pred[m] == labels[m]).float().mean())


@torch.no_grad()
def heldout_agreement(model, rows, head_ids: torch.Tensor, pad_id: int, batch: int = 16) -> float:
    """Teacher-forced top-1 agreement on answer tokens: how often the draft's argmax is the target's."""
    hit = n = 0
    for j in range(0, len(rows), batch):
        pick = list(range(j, min(j + batch, len(rows))))
        x, m, _ = draft_batch(rows, pick, pad_id)
        dev = model.lm_head.weight.device
        x, m = x.to(dev), m.to(dev)
        h = model.model(input_ids=x).last_hidden_state[m]  # (N, H)
        pred = head_ids.to(dev)[model.lm_head(h).argmax(-1)]  # (N,) token ids
        nxt = torch.cat([torch.tensor(rows[i][0][rows[i][1]:], device=pred.device) for i in pick])  # (N,) greedy = target argmax
        hit += int((pred == nxt).sum())
        n += nxt.numel()
    return hit / max(n, 1)


@torch.no_grad()
def chain_accept_rates(model, rows, kept: torch.Tensor, depth: int = 8, starts: int = 6, seed: int = 0) -> list:
    """P(the draft's first d greedy tokens, drafted one by one after the target's answer prefix, all equal the
    target's greedy answer tokens), d = 1 .. ``depth``, from ``starts`` random answer anchors per row
    (:func:`refimpl.train.common.answer_anchors`, as :func:`refimpl.train.pard.row_accept_rates` draws them, so the
    chain and the one-call chain compare)."""
    hits, count = [0] * depth, 0
    dev = model.lm_head.weight.device
    for ids, a in answer_anchors(rows, depth, starts, seed):
        x, count = list(ids[:a + 1]), count + 1
        for d in range(depth):
            guess = int(kept[model(input_ids=torch.tensor([x], device=dev)).logits[0, -1].argmax()])
            if guess != int(ids[a + 1 + d]):
                break
            hits[d] += 1
            x.append(guess)
    return [round(h / max(count, 1), 4) for h in hits]


def train_smollm2_draft(out_dir: str, gen_seconds: float = 1900.0, steps: int = 1800, train_seconds: float = 2400.0,
                        vocab_keep: int = 8192, num_layers: int = 3, intermediate_size: int = 1536,
                        init_layers=(0, 1, -1), batch: int = 32, lr: float = 5e-4, holdout: int = 50, seed: int = 0,
                        bf16: bool = True, stages=(1, 2, 3), init_from: str | None = None,
                        drill_batch: int = 0, drill_span: int = 48, drill_weight: float = 0.5,
                        grow: tuple[int, int] | None = None, progress: bool = True) -> dict:
    """Distil SmolLM2-135M-Instruct into a small trimmed-vocabulary draft on its own greedy answers.

    1. data (:mod:`refimpl.distill_data`): the target (bf16, batched) answers ~10,800 generated
       prompts greedily, keeping its final hidden state at every answer position; cached in
       ``~/.cache/refimpl/smollm2-distill-s{1,2,3,4}.pt`` (a rerun continues for ``gen_seconds``);
       ``stages`` picks which stages train;
    2. the kept vocabulary = the ``vocab_keep`` most frequent answer tokens (+ specials);
    3. the draft = target embeddings (frozen) -> ``num_layers`` layers initialised from the
       target's ``init_layers`` (MLP pruned to ``intermediate_size`` if smaller) -> norm -> the kept
       rows of the embedding as head (frozen); the layers and the norm train on
       ``KL(p_kept || q)`` over answer positions, ``p_kept`` = the target's distribution
       renormalised on the kept set (DistillSpec's forward KL on on-policy data), in bf16 autocast;
    4. one prompt in ``holdout`` (by a hash of its text) is kept out and scored by teacher-forced
       top-1 agreement (~ alpha); ``init_from`` continues a saved draft (its vocabulary and layers);
    5. ``drill_batch > 0`` adds the induction drill (:func:`copy_drill`, spans of up to
       ``drill_span`` tokens shown twice, cross-entropy weighted ``drill_weight``): distillation
       alone never taught the draft to copy from its context (:func:`copy_accuracy` stayed 0.0),
       which summary / copy / question-answer prompts need;
    6. ``grow=(at, j)`` (with ``init_from``) inserts one more layer at index ``at``, copied from
       the target's layer ``j`` with its two output projections zeroed (:func:`grow_layer`), so
       training starts from exactly the smaller draft's predictions.

    Runs for ``steps`` steps or ``train_seconds``, whichever comes first (cosine learning rate over
    the budget that runs out first).
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    rows = distill_data.build(cache_dir(), seconds=gen_seconds, seed=seed, progress=progress, stages=stages)
    target = load("smollm2-135m", device="cpu", prepack=False)
    random.Random(seed).shuffle(rows)
    # held out by a hash of the prompt: the same rows whichever stages are included
    out_ = [zlib.crc32(r[3].encode()) % holdout == 0 for r in rows]
    valid = [r for r, o in zip(rows, out_) if o]
    rows = [r for r, o in zip(rows, out_) if not o]
    specials = sorted({target.eos_token_id, target.pad_token_id, *target.tokenizer.all_special_ids})
    if init_from:  # continue training a saved draft (its kept vocabulary and layers)
        start = load_draft(device="cpu", path=init_from, copy_prior=False)
        kept = start.kept_ids.cpu()
    else:
        kept = top_tokens([(r[0][r[1]:],) for r in rows], vocab_keep, always=specials)  # (K,)
    kept_set = set(kept.tolist())
    answers = [t for r in valid for t in r[0][r[1]:]]
    coverage = sum(t in kept_set for t in answers) / max(len(answers), 1)

    E = decoder_of(target.model).embed_tokens.weight.detach()  # (V, H)
    if init_from:
        model, cfg = start.model, start.model.config
        if grow is not None:
            model = grow_layer(model, decoder_of(target.model).layers[grow[1]], grow[0])
            cfg = model.config
        num_layers, intermediate_size = cfg.num_hidden_layers, cfg.intermediate_size
        for n, p in model.named_parameters():  # the shared embedding and the head stay frozen
            p.requires_grad_(not n.startswith(("model.embed_tokens", "lm_head")))
    else:
        if grow is not None:
            raise ValueError("grow inserts a layer into a saved draft: pass init_from too")
        cfg = smol_draft_config(target.config, num_layers, intermediate_size)
        model = trimmed_model(cfg, E, kept)
        L = target.num_layers
        for i, j in enumerate(init_layers[:num_layers]):
            prune_mlp(model.model.layers[i], decoder_of(target.model).layers[j % L], intermediate_size)
        model.model.norm.load_state_dict(decoder_of(target.model).norm.state_dict())
    tokenizer = target.tokenizer
    del target
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    head = E[kept].float()  # (K, H)
    pad = int(cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id)
    alpha0 = heldout_agreement(model, valid, kept, pad)
    copy0 = copy_accuracy(model, kept)
    drill_ids = drill_text_ids(tokenizer) if drill_batch else None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()
    bar = tqdm(range(steps), desc="distil smollm2-135m-draft", disable=not progress)
    model.train()
    for step in bar:
        frac = max(step / steps, (time.time() - t0) / train_seconds)  # the budget used so far
        for g in opt.param_groups:
            g["lr"] = cosine_lr(int(frac * steps), steps, lr, warmup=20)
        pick = torch.randint(0, len(rows), (batch,), generator=gen, device="cpu").tolist()
        x, m, t_logits = draft_batch(rows, pick, pad, head)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = model.model(input_ids=x).last_hidden_state[m]  # (N, H): answer positions only
            s_logits = model.lm_head(h)  # (N, K)
        loss = distill_loss(s_logits, t_logits, temperature=1.0, ce_weight=0.0)
        if drill_batch:  # the induction drill: copy a span seen earlier in the sequence
            dx, dl = copy_drill(kept, drill_ids, drill_batch, drill_span, gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                d_logits = model(input_ids=dx).logits  # (b, 3*span, K)
            drill = torch.nn.functional.cross_entropy(d_logits.float().flatten(0, 1), dl.flatten(), ignore_index=-100)
            loss = loss + drill_weight * drill
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}", **({"drill": f"{drill.item():.2f}"} if drill_batch else {}))
        if time.time() - t0 > train_seconds:
            break
    model.eval()
    alpha = heldout_agreement(model, valid, kept, pad)
    copy1 = copy_accuracy(model, kept)
    os.makedirs(out_dir, exist_ok=True)
    state = quantize_int8({k: v.detach() for k, v in model.state_dict().items()
                           if not k.startswith(("model.embed_tokens", "lm_head"))})
    state["kept_ids"] = kept.to(torch.int32)
    save_file(state, os.path.join(out_dir, "draft.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out_dir)
    meta = {"target": "smollm2-135m", "vocab_keep": int(kept.numel()),
            "init": (f"continued from {init_from}" + (f", layer inserted at {grow[0]} from target layer {grow[1]}"
                                                      if grow else "")) if init_from
            else f"target layers {list(init_layers)}",
            "head": "target embedding rows of kept_ids", "tie": "embed_tokens from the target",
            "storage": "matrices int8 with one float16 scale per row (name + '.scale'); vectors float16"}
    with open(os.path.join(out_dir, "draft.json"), "w") as f:
        json.dump(meta, f, indent=2)
    drafters.record_target(out_dir, load("smollm2-135m", device="cpu"), "smollm2-135m")
    report = {
        "target": "smollm2-135m",
        "train_rows": len(rows),
        "answer_tokens": sum(len(r[0]) - r[1] for r in rows),
        "heldout_rows": len(valid),
        "vocab_keep": int(kept.numel()),
        "heldout_kept_coverage": round(coverage, 4),
        "layers": num_layers,
        "intermediate_size": intermediate_size,
        "trained_params": sum(p.numel() for p in params),
        "steps": step + 1,
        "batch": batch,
        "train_minutes": round((time.time() - t0) / 60, 1),
        "final_loss": round(loss.item(), 4),
        "data_stages": list(stages),
        "init_from": init_from,
        "lr": lr,
        "heldout_agreement_at_init": round(alpha0, 4),
        "heldout_agreement": round(alpha, 4),
        "expected_tau_gamma4": round(expected_tau(alpha, 4), 3),
        "drill_batch": drill_batch,
        "copy_accuracy_at_init": round(copy0, 3),
        "copy_accuracy": round(copy1, 3),
    }
    return write_report(out_dir, report)


def train_smollm2_draft_recipe(out_dir: str, progress: bool = True) -> dict:
    """The committed ``smollm2-135m-draft``: ``python -m refimpl.train smollm2-135m-draft``.

    Phase 1 (40 min): a 3-layer draft from the target's layers 0, 1 and 29 on stages 1-2 (the
    target's answers to chat / code / math / passage prompts); phase 2 (16 min): continued on
    stages 1-3 (adds copy / edit tasks on human text), lr 2e-4; phase 3 (25 min): the induction
    drill (:func:`copy_drill`) next to distillation, lr 1e-3, which takes copying from 0.0 to 0.90;
    phase 4 (25 min): stages 1-4 (adds self-instruct questions) with the drill, lr 3e-4. Data
    generation first: ~35 min for stages 1-3, ~12 min for stage 4.
    """
    phases = [out_dir.rstrip("/") + f"-phase{i}" for i in (1, 2, 3)]
    train_smollm2_draft(phases[0], stages=(1, 2), progress=progress)
    train_smollm2_draft(phases[1], gen_seconds=0, init_from=phases[0], lr=2e-4, steps=600, train_seconds=960,
                        progress=progress)
    train_smollm2_draft(phases[2], gen_seconds=0, init_from=phases[1], lr=1e-3, steps=1000, train_seconds=1500,
                        batch=16, drill_batch=32, drill_span=24, drill_weight=1.0, progress=progress)
    return train_smollm2_draft(out_dir, gen_seconds=900, stages=(1, 2, 3, 4), init_from=phases[2], lr=3e-4,
                               steps=1000, train_seconds=1500, batch=16, drill_batch=16, drill_span=24,
                               drill_weight=1.0, progress=progress)


def heldout_report(progress: bool = True) -> dict:
    """Measure the zoo's ``smollm2-135m-draft`` on the shared held-out rows
    (:func:`refimpl.train.smollm2_data.smollm2_heldout_rows`) as a chain draft (:func:`chain_accept_rates`,
    the draft alone: no copy prior) into its ``train_report.json`` (``shared_heldout``): ``python -c "from
    refimpl.train.smol_draft import heldout_report; heldout_report()"``."""
    from .smollm2_data import record_shared_heldout, smollm2_heldout_rows

    held = smollm2_heldout_rows(progress)
    start = load_draft(device="cpu", copy_prior=False)
    return record_shared_heldout("smollm2-135m-draft", held,
                                 chain_accept_rates(start.model, held, start.kept_ids.cpu()),
                                 "6 random answer positions a row")

"""A drafter for your own model: ``python -m refimpl.train {eagle3,dflash,pard} --target PATH [--out DIR]``.

Any causal LM that :func:`refimpl.models.load` accepts (a Hugging Face folder, a cached id, a zoo name).
The drafter learns what verification checks: the *target's own* greedy answers (DistillSpec, Zhou et al.,
arXiv 2310.08461, §4), so no dataset is needed, only prompts:

1. **Prompts**: ``--prompts FILE`` (one per line; a ``.jsonl`` file with a ``"prompt"`` field per line), or
   the course's pool, built with no model (:func:`refimpl.train.distill_prompts.general_pool`: 10,813
   paragraph and code requests, chat and advice questions, arithmetic, summary / copy / edit / question
   tasks on human text: King James passages, standard-library docstrings, Python's language reference).
2. **Answers**: the target's greedy answers, batched (:func:`refimpl.train.distill_data.generate_answers`),
   cached per target weights and length in the cache folder and resumed by the next run.
3. **Held-out**: every :data:`HOLDOUT`-th prompt by a hash of its text (:func:`split`): disjoint from the
   training rows at the prompt level, and the same prompts for every kind, so the kinds' taus compare.
4. **Training** (one :data:`RECIPES` entry per device kind; the flags override it):

   - ``eagle3``: EAGLE-3 (Li et al., arXiv 2503.01840, §3): :func:`refimpl.train.eagle3.train_draft`
     (training-time test) on the target's tapped features;
   - ``dflash``: DFlash (Chen et al., arXiv 2602.06036, §4.2): :func:`refimpl.train.dflash.train_draft`;
   - ``pard``: PARD (An et al., arXiv 2504.18583, §3.2): a draft made of the target's first layers
     (:func:`pard_student`), adapted with the ``k``-copy layout (:func:`refimpl.train.pard.pard_rows_loss`).

   EAGLE-3 and DFlash are shaped after a Llama-style config (``intermediate_size``, ``rms_norm_eps``: Llama,
   Qwen, Mistral, Gemma); PARD takes any architecture.
5. **The folder**: the drafter, ``train_report.json`` (only what this run measured) and ``target.json``,
   which records the target's weights (:func:`refimpl.models.drafters.fingerprint`) and folder. The front
   door attaches it by those weights: ``refimpl.generate(target, prompts, method=KIND, draft=DIR)``, or with
   no ``draft=`` when the folder is the default ``models/<kind>-<target name>``; ``python -m refimpl.export
   DIR --to SERVED`` writes the layout vLLM loads.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import zlib

import torch

from ..models import drafters, load
from ..models.hf import MODELS_DIR, cache_dir
from .common import answer_vocabulary, write_report

#: the kinds of drafter this trainer makes for any target
OWN_KINDS = ("eagle3", "dflash", "pard")
#: every HOLDOUT-th prompt (by a hash of its text) is held out
HOLDOUT = 20
#: per device kind: the prompts to answer (None: every prompt), the answers' length, the training budget
#: and each kind's shape and optimiser (the CPU recipe fits about an hour on 2 cores; the GPU one takes
#: the papers' shapes: EAGLE-3's 7 unrolled steps and trained head, DFlash's 16-token blocks). Learning
#: rates: SpecForge's DFlash 6e-4 on either device (it beat 2e-3 for SmolLM2's drafter on held-out text:
#: ``bench_results/experiments/2026-12-07_dflash_lr``); EAGLE-3 as the zoo's GPU draft was trained (1e-3),
#: the CPU recipe at the zoo's CPU trainer's rate (a short budget). PARD's upstream (AMD-AGI/PARD) adapts a
#: pretrained small model at 1e-5; ours starts from the target's first layers, which must move further,
#: at the zoo's SmolLM2 rate (3e-4); EAGLE-3's and PARD's rates are not settled by an A/B on held-out
#: prompts yet.
RECIPES = {
    "cpu": {"answers": 2000, "max_new_tokens": 96, "answer_batch": 32, "steps": 4000, "seconds": 1800.0,
            "vocab_keep": 8192,
            "eagle3": {"batch": 4, "lr": 2e-3, "ttt": 3, "train_head": False},
            "dflash": {"batch": 8, "lr": 6e-4, "layers": 2, "block": 8},
            "pard": {"batch": 4, "lr": 3e-4, "k": 8, "keep": 0.7, "min_keep": 0.2}},
    "gpu": {"answers": None, "max_new_tokens": 128, "answer_batch": 128, "steps": 20000, "seconds": 1e9,
            "vocab_keep": 32000,
            "eagle3": {"batch": 64, "lr": 1e-3, "ttt": 7, "train_head": True},
            "dflash": {"batch": 32, "lr": 6e-4, "layers": 5, "block": 16},
            "pard": {"batch": 16, "lr": 3e-4, "k": 8, "keep": 0.7, "min_keep": 0.2}},
}


def read_prompts(path: str) -> list[str]:
    """Prompts from ``path``: one per line, or a ``.jsonl`` file of objects with a ``"prompt"`` field."""
    with open(path) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if path.endswith(".jsonl"):
        try:
            lines = [json.loads(line)["prompt"] for line in lines]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"prompts: every line of {path} must be a JSON object with a 'prompt' field ({e})") from e
    if not lines:
        raise ValueError(f"prompts: {path} holds no prompt")
    return list(dict.fromkeys(lines))


def held_out(text: str) -> bool:
    """Is the prompt ``text`` held out (:data:`HOLDOUT`)? The rule every kind shares."""
    return zlib.crc32(text.encode()) % HOLDOUT == 0


def split(rows) -> tuple[list, list]:
    """Answer rows ``(ids, n_prompt, hidden, text)`` -> (training rows, held-out rows), by prompt."""
    return [r for r in rows if not held_out(r[3])], [r for r in rows if held_out(r[3])]


def weights_key(target) -> str:
    """A short name for ``target``'s weights (its fingerprint): answers are cached per target."""
    return hashlib.sha256(json.dumps(drafters.fingerprint(target)).encode()).hexdigest()[:12]


def answers(target, prompts: list[str], n: int | None, max_new_tokens: int, batch: int,
            progress: bool = True) -> tuple[list, int]:
    """The target's greedy answers to the first ``n`` of ``prompts`` (None: all), cached per target weights and length
    (``answers-<weights>-<max_new_tokens>.pt``): a later run reuses them and answers only the prompts still missing.
    -> (rows, how many of them this call generated)."""
    from .distill_data import generate_answers

    path = os.path.join(cache_dir(), f"answers-{weights_key(target)}-{max_new_tokens}.pt")
    done = torch.load(path) if os.path.exists(path) else []
    cached, want = len(done), prompts[:n]
    have = {r[3] for r in done}
    if any(t not in have for t in want):
        done = generate_answers(target, want, max_new_tokens, batch, path=path, progress=progress, start=done)
    keep = set(want)
    return [(ids, n_prompt, h.cpu(), text) for ids, n_prompt, h, text in done if text in keep], len(done) - cached


def mask_token(target, rows) -> int:
    """The token a drafter's empty slots carry: the tokenizer's mask token, else a special token no row
    uses, else the highest id no row uses (its embedding is only ever read as "a slot to fill")."""
    tok = target.tokenizer
    if getattr(tok, "mask_token_id", None) is not None:
        return int(tok.mask_token_id)
    used = {t for r in rows for t in r[0]}
    special = [i for i in getattr(tok, "all_special_ids", []) if i not in used and i < target.vocab_size]
    if special:
        return int(special[-1])
    return next(i for i in range(target.vocab_size - 1, -1, -1) if i not in used)


def check_llama_style(target, kind: str) -> None:
    c = target.config
    missing = [f for f in ("intermediate_size", "rms_norm_eps") if getattr(c, f, None) is None]
    if missing:
        raise ValueError(f"target: a {kind} drafter is shaped after a Llama-style config; this "
                         f"{getattr(c, 'model_type', '?')} config has no {missing} (pard takes any architecture)")


def pard_student(target, layers: int):
    """PARD's draft for a target with no small sibling: a copy of the target's config with ``layers``
    decoder layers, starting from the target's first ``layers`` layers, its embedding and head (the
    layer-skip view of the target: it already predicts the target's tokens better than a random draft)."""
    import copy

    from transformers import AutoModelForCausalLM

    L = target.num_layers
    if not (isinstance(layers, int) and 1 <= layers < L):
        raise ValueError(f"layers must be in [1, {L - 1}] (the target has {L}), got {layers!r}")
    cfg = copy.deepcopy(target.model.config)
    cfg.num_hidden_layers = layers
    for field in ("layer_types",):  # per-layer lists follow the layer count
        if isinstance(getattr(cfg, field, None), list):
            setattr(cfg, field, getattr(cfg, field)[:layers])
    student = AutoModelForCausalLM.from_config(cfg).to(dtype=torch.float32)
    missing, _ = student.load_state_dict({k: v.float() for k, v in target.model.state_dict().items()}, strict=False)
    if [m for m in missing if not m.endswith("lm_head.weight")]:
        raise ValueError(f"target: its first {layers} layers do not map onto a {layers}-layer copy (missing {missing})")
    return student


def train_pard(target, train, held, out: str, steps: int, seconds: float, batch: int, lr: float, k: int, keep: float,
               min_keep: float, layers: int, mask_id: int, progress: bool = True, init: str | None = None) -> dict:
    """PARD on the target's answer rows (see the module doc) -> the report; the draft is written to ``out``
    as a Hugging Face folder with ``pard_token``. ``init``: a PARD folder to go on training (its layers and
    ``pard_token``), else :func:`pard_student`."""
    import random

    from tqdm.auto import tqdm

    from .common import budget_step, cosine_lr, save_half
    from .pard import pard_rows_loss, row_accept_rates, row_batch

    dev = target.device
    if init is None:
        model = pard_student(target, layers).to(dev)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32).to(dev)
        layers, mask_id = model.config.num_hidden_layers, int(model.config.pard_token)
    head = target.model.get_output_embeddings().weight.detach().float().cpu()  # (V, H): teacher = h @ head.T
    V = head.shape[0]
    every = torch.arange(V, device="cpu")  # the student scores every token: kept index = token id
    before = row_accept_rates(model, held, every.to(dev), mask_id, k)
    gen, pick, t0, losses = torch.Generator("cpu").manual_seed(0), random.Random(0), time.time(), []
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    for step in tqdm(range(steps), desc="pard", disable=not progress):
        for grp in opt.param_groups:
            grp["lr"] = cosine_lr(budget_step(step, steps, time.time() - t0, seconds), steps, lr, warmup=min(30, steps // 10))
        b = row_batch(train, pick.sample(range(len(train)), min(batch, len(train))), head, every, target.pad_token_id)
        loss = pard_rows_loss(model, *(t.to(dev) for t in b), mask_id, k, keep, min_keep, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if time.time() - t0 > seconds:
            break
    model.eval()
    rates = row_accept_rates(model, held, every.to(dev), mask_id, k)
    model.config.pard_token, model.config.heldout_accept = mask_id, rates  # heldout_accept: refimpl.pard.cpu_slots
    os.makedirs(out, exist_ok=True)
    save_half(model, out)
    target.tokenizer.save_pretrained(out)
    return {"layers": layers, "k": k, "cod_keep": keep, "cod_min_keep": min_keep, "lr": lr, "batch": batch,
            "pard_token": mask_id, "steps": len(losses), "first_loss": round(losses[0], 4),
            "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4), "train_seconds": round(time.time() - t0, 1),
            "accept_rate_per_depth_before": before, "accept_rate_per_depth": rates,
            "heldout_chain_tau": round(1 + sum(rates), 3)}


def train(kind: str, target_path: str, out: str | None = None, prompts: str | None = None, device=None,
          recipe: str | None = None, init: str | None = None, progress: bool = True, **overrides) -> dict:
    """Train a ``kind`` drafter (:data:`OWN_KINDS`) for the model at ``target_path`` into ``out`` (None:
    ``models/<kind>-<target name>``, where the front door finds it by itself). ``recipe``: a key of
    :data:`RECIPES` (None: ``"gpu"`` on a CUDA device, else ``"cpu"``); ``overrides``: any of its fields
    (``answers``, ``max_new_tokens``, ``steps``, ``seconds``, ``vocab_keep``, the kind's ``batch``, ``lr``,
    ...), and ``layers`` (a DFlash or PARD draft's depth) or ``taps`` (the target streams an EAGLE-3 or DFlash
    drafter reads, :meth:`refimpl.lm.LM.forward`'s layer ids, each once; default: upstream's spread, within what vLLM
    serves, :func:`servable`). ``init``: a folder holding a ``kind`` drafter trained for this target (an earlier
    run's ``out``) to go on training: its weights and shapes (``layers``, ``taps``, ``vocab_keep`` are then its
    own), a fresh warmup and cosine over this run's budget (a warm restart: Loshchilov & Hutter, "SGDR", arXiv
    1608.03983); the answers are cached, so a second run spends its budget on steps. -> the report, also in
    ``out/train_report.json``."""
    from ..lm import default_device

    if kind not in OWN_KINDS:
        raise ValueError(f"kind must be one of {list(OWN_KINDS)}, got {kind!r}")
    device = torch.device(device) if device is not None else default_device()
    recipe = recipe or ("gpu" if device.type == "cuda" else "cpu")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")
    o = {**RECIPES[recipe], **RECIPES[recipe][kind]}
    unknown = sorted(set(overrides) - set(o) - {"layers", "taps"})
    if unknown:
        raise ValueError(f"options {unknown} do not exist; the {kind} recipe takes {sorted(k for k in o if k not in OWN_KINDS)}")
    o.update(overrides)
    if o.get("taps") is not None and len(set(o["taps"])) != len(o["taps"]):
        raise ValueError(f"taps: each target layer once (a serving engine reads each stream once), got {tuple(o['taps'])}")
    target = load(target_path, device=device, prepack=False, fast=False)
    if init is not None:
        drafters.check_folder(target, kind, init, "init")
    if kind != "pard":
        check_llama_style(target, kind)
    name = target.name
    out = out or os.path.join(MODELS_DIR, f"{kind}-{name}")
    pool = read_prompts(prompts) if prompts else None
    if pool is None:
        from .distill_prompts import general_pool
        pool = general_pool(0)
    t0 = time.time()
    rows, fresh = answers(target, pool, o["answers"], o["max_new_tokens"], o["answer_batch"], progress)
    answer_s = time.time() - t0
    train_rows, held = split(rows)
    if not train_rows or not held:
        raise ValueError(f"answers: {len(rows)} answered prompts leave {len(train_rows)} to train on and {len(held)} "
                         f"held out; give more prompts (every {HOLDOUT}th is held out)")
    tokens = sum(len(r[0]) - r[1] for r in rows)
    common = {"kind": kind, "target": name, "recipe": recipe, "device": str(device), "threads": torch.get_num_threads(),
              "answers": len(rows), "answer_tokens": tokens, "answers_generated": fresh,
              "answer_seconds": round(answer_s, 1),  # (answers from the cache take no time: see answers_generated)
              "answer_tokens_per_minute": round(60 * tokens / answer_s) if fresh == len(rows) and answer_s > 0 else None,
              "train_rows": len(train_rows), "heldout_rows": len(held), "max_new_tokens": o["max_new_tokens"]}
    kept = (None if init is not None or target.vocab_size <= o["vocab_keep"]  # (a drafter from ``init`` keeps its own)
            else answer_vocabulary(target.tokenizer, train_rows, o["vocab_keep"]))
    if kind == "pard":
        layers = o.get("layers") or max(1, target.num_layers // 8)
        report = train_pard(target, train_rows, held, out, o["steps"], o["seconds"], o["batch"], o["lr"], o["k"], o["keep"],
                            o["min_keep"], layers, mask_token(target, rows), progress, init)
    else:
        report = train_feature_drafter(kind, target, train_rows, held, kept, o, mask_token(target, rows), progress, init)
        drafters.save(report.pop("draft").to("cpu"), out, target)
    drafters.record_target(out, target, name, path=target_path)
    if init is not None:
        common["init"] = os.path.abspath(init)
    return write_report(out, {**common, **report})


def servable(taps, num_layers: int) -> tuple[int, ...]:
    """``taps`` as vLLM serves them: its tap ``L`` is the residual stream *before* the final norm, ours the final
    normed state (another tensor), so a drafter meant for export reads streams ``1 .. L - 1`` only (a small
    target's default reaches ``L``); and vLLM keeps the tapped layers as a set, read in increasing order, so each
    stream once, in that order (a small target's defaults repeat a layer)."""
    return tuple(sorted({max(1, min(t, num_layers - 1)) for t in taps}))


def train_feature_drafter(kind: str, target, train_rows, held, kept, o: dict, mask_id: int, progress: bool,
                          init: str | None = None) -> dict:
    """EAGLE-3 or DFlash on the target's tapped features of every row -> the report, with ``"draft"``; ``init``:
    the folder of the drafter to start from (else a new one)."""
    from .. import dflash, eagle3
    from . import dflash as train_dflash, eagle3 as train_eagle3

    t0 = time.time()
    L, layers = target.num_layers, o.get("layers") or 2
    if init is not None:
        d = drafters.load(target, kind, init)
        kept = d.kept
    elif kind == "eagle3":
        taps = o.get("taps") or servable(eagle3.default_taps(L), L)
        d = eagle3.new_draft(target, taps=taps, kept=kept)
    else:
        taps = o.get("taps") or servable(dflash.default_taps(L, layers), L)
        d = dflash.new_draft(target, num_layers=layers, block=o["block"], mask_id=mask_id, kept=kept, taps=taps)
    rows = train_rows + held
    seqs = train_eagle3.target_features(target, rows, d.taps, progress=progress, device=target.device)
    feature_s = time.time() - t0
    if kind == "eagle3":
        W = target.model.get_output_embeddings().weight.detach()
        W = W if kept is None else W[kept.to(W.device)]
        d, report = train_eagle3.train_draft(d, seqs, W, steps=o["steps"], seconds=o["seconds"], batch=o["batch"],
                                             lr=o["lr"], ttt=o["ttt"], train_head=o["train_head"], prompt_loss=True,
                                             texts=[r[3] for r in rows], holdout=HOLDOUT, progress=progress,
                                             device=target.device)
    else:
        d, report = train_dflash.train_draft(d, seqs, steps=o["steps"], seconds=o["seconds"], batch=o["batch"],
                                             lr=o["lr"], progress=progress, held=seqs[len(train_rows):])
    return {**report, "feature_seconds": round(feature_s, 1),
            "feature_tokens_per_minute": round(60 * sum(len(r[0]) for r in rows) / max(feature_s, 1e-9)),
            "vocab_keep": None if kept is None else int(kept.numel()), "draft": d}

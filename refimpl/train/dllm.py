"""Trainers of the masked diffusion LMs (:mod:`refimpl.diffusion_lm`): ``tiny-dllm`` on King James
text and ``tiny-dllm-rev`` on digit reversal (:mod:`refimpl.digit_reversal`)."""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict

import torch
from transformers import AutoTokenizer

from .. import data
from ..diffusion_lm import CharTokenizer, DiffusionLM, DLMConfig, load_dir, masked_diffusion_loss, masked_token_eval
from ..digit_reversal import synthetic_accuracy, synthetic_batch, synthetic_split
from ..models import drafters
from ..models.hf import load_folder, zoo_folder
from .common import (causal_lm_perplexity, encode_docs, random_windows, save_fp16, save_half, train_loop,
                     write_report)


def save_dllm(model: DiffusionLM, out_dir: str) -> None:
    """fp16 safetensors + config.json (+ tokenizer files) in ``out_dir``: what
    :func:`refimpl.diffusion_lm.load_dir` reads."""
    os.makedirs(out_dir, exist_ok=True)
    save_fp16(model.state_dict(), os.path.join(out_dir, "model.safetensors"))
    # (no "model_type" key: transformers' AutoTokenizer would read it and warn)
    cfg = {"refimpl_model": "diffusion-lm", **asdict(model.cfg)}
    cfg["tokenizer"] = "char" if isinstance(model.tokenizer, CharTokenizer) else "hf"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(out_dir)


def train_tiny_dllm(out_dir: str, steps: int = 1000, batch: int = 16, length: int = 128, lr: float = 3e-3,
                    seed: int = 0):
    """Masked-diffusion pretraining on King James text (LLaDA Eq. 3).

    1,000 steps of 16 x 128 tokens: ~10 minutes on 2 idle CPU cores (26 on our shared machine).
    """
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(zoo_folder("tiny", "train it first: python -m refimpl.train tiny"))
    train_docs, valid_docs = data.kjv_split()
    train_stream = encode_docs(tok, train_docs, tok.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, tok.eos_token_id)
    cfg = DLMConfig(vocab_size=len(tok), hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384,
                    max_length=256, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id)
    model = DiffusionLM(cfg, tok, name="tiny-dllm")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()
    train_loop(model, lambda s: masked_diffusion_loss(model, random_windows(train_stream, batch, length, gen),
                                                       generator=gen), steps, lr, "train tiny-dllm")
    save_dllm(model, out_dir)
    lm = load_dir(out_dir, device="cpu")  # report on the fp16 round trip
    n = min(64, valid_stream.numel() // length)
    metrics = masked_token_eval(lm, valid_stream[: n * length].view(n, length))
    report = {"params": sum(p.numel() for p in model.parameters()), "steps": steps,
              "tokens_seen": steps * batch * length, "valid": metrics,
              "minutes": round((time.time() - t0) / 60, 1), "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def train_tiny_dllm_rev(out_dir: str, steps: int = 400, batch: int = 128, lr: float = 2e-3, seed: int = 0):
    """SFT-style masked diffusion on digit reversal (LLaDA Eq. 5: only the answer is masked).

    Learned absolute positions (the task is a fixed position mapping) and the mean masked CE.
    """
    torch.manual_seed(seed)
    tok = CharTokenizer("0123456789=")
    cfg = DLMConfig(vocab_size=len(tok), hidden_size=96, num_layers=3, num_heads=4, intermediate_size=256,
                    max_length=32, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, abs_pos=True)
    model = DiffusionLM(cfg, tok, name="tiny-dllm-rev")
    rng = random.Random(seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    valid = synthetic_split()
    exclude = frozenset(valid)
    t0 = time.time()

    def step_loss(s):
        x0, maskable = synthetic_batch(tok, batch, rng, exclude)
        return masked_diffusion_loss(model, x0, maskable, generator=gen, weighting="mean")

    train_loop(model, step_loss, steps, lr, "train tiny-dllm-rev", warmup=30)
    save_dllm(model, out_dir)
    lm = load_dir(out_dir, device="cpu")
    acc = synthetic_accuracy(lm, valid)
    acc_par = synthetic_accuracy(lm, valid, threshold=0.9)
    report = {"params": sum(p.numel() for p in model.parameters()), "steps": steps, "batch": batch,
              "valid_problems": len(valid), "valid_exact_match_default_sampler": acc,
              "valid_exact_match_threshold_0.9": acc_par,
              "minutes": round((time.time() - t0) / 60, 1), "threads": torch.get_num_threads()}
    return write_report(out_dir, report)


def train_tiny_bdlm(out_dir: str, steps: int = 700, batch: int = 16, length: int = 128, lr: float = 1e-3,
                    seed: int = 0, teacher: str = "tiny"):
    """Adapt the AR ``tiny`` into the block-diffusion ``tiny-bdlm`` (Fast-dLLM v2 recipe,
    :func:`refimpl.block_diffusion.block_diffusion_loss`): same weights to start, same tokenizer
    (its MASK id 2 was reserved from the start), King James windows, block sizes 2..16."""
    from ..block_diffusion import block_diffusion_loss

    torch.manual_seed(seed)
    base = load_folder(zoo_folder(teacher, f"train it first: python -m refimpl.train {teacher}"), device="cpu")
    model, tok = base.model, base.tokenizer
    train_docs, valid_docs = data.kjv_split()
    train_stream = encode_docs(tok, train_docs, tok.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, tok.eos_token_id)
    ppl_before = causal_lm_perplexity(base.logits, valid_stream)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()

    def step_loss(s):
        loss, _ = block_diffusion_loss(model, random_windows(train_stream, batch, length, gen), tok.mask_token_id,
                                       generator=gen)
        return loss

    train_loop(model, step_loss, steps, lr, "adapt tiny -> tiny-bdlm", warmup=30)
    os.makedirs(out_dir, exist_ok=True)
    save_half(model, out_dir)
    tok.save_pretrained(out_dir)
    drafters.record_target(out_dir, load_folder(zoo_folder(teacher, ""), device="cpu"), teacher)  # the drafter's target
    lm = load_folder(out_dir, device="cpu")  # report on the fp16 round trip
    vgen = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        parts = [block_diffusion_loss(lm.model, random_windows(valid_stream, batch, length, vgen), tok.mask_token_id,
                                      generator=vgen)[1] for _ in range(8)]
    report = {"base": teacher, "params": sum(p.numel() for p in model.parameters()), "steps": steps,
              "tokens_seen": steps * batch * length, "block_sizes": [2, 16],
              "valid_masked_ce": round(sum(p["masked_ce"] for p in parts) / len(parts), 4),
              "valid_ar_ce": round(sum(p["ar_ce"] for p in parts) / len(parts), 4),
              "valid_ar_perplexity": round(causal_lm_perplexity(lm.logits, valid_stream), 2),
              "valid_ar_perplexity_before": round(ppl_before, 2),
              "minutes": round((time.time() - t0) / 60, 1), "threads": torch.get_num_threads()}
    return write_report(out_dir, report)

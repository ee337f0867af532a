"""Trainers of the autoregressive models: ``tiny`` (tokenizer + 4-layer Llama on the King James
Bible) and ``tiny-draft`` (a 1-layer student distilled from it, :func:`refimpl.drafts.distill_loss`)."""
from __future__ import annotations

import os
import time

import torch

from .. import data
from ..autoregressive import generate as ar_generate
from ..drafts import distill_loss, greedy_agreement, init_from_target
from ..models import drafters, load
from ..models.hf import load_folder
from .common import (causal_lm_perplexity, encode_docs, random_windows, save_half, tiny_config, train_loop,
                     train_tokenizer, wrap_tokenizer, write_report)


def train_tiny(out_dir: str, steps: int = 800, batch: int = 16, length: int = 128, lr: float = 2e-3, seed: int = 0):
    """Tokenizer + 4-layer Llama on the King James Bible. About 7 minutes on 2 CPU cores."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    os.makedirs(out_dir, exist_ok=True)
    train_docs, valid_docs = data.kjv_split()
    tok = wrap_tokenizer(train_tokenizer(train_docs))
    tok.save_pretrained(out_dir)
    eos = tok.eos_token_id
    train_stream = encode_docs(tok, train_docs, eos)
    valid_stream = encode_docs(tok, valid_docs, eos)
    print(f"tokens: train {train_stream.numel():,}, valid {valid_stream.numel():,}")

    model = LlamaForCausalLM(tiny_config(len(tok)))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()

    def next_token_loss(step):
        x = random_windows(train_stream, batch, length, gen)  # (batch, length)
        return model(input_ids=x, labels=x).loss

    train_loop(model, next_token_loss, steps, lr, "train tiny")
    save_half(model, out_dir)
    lm = load_folder(out_dir, device="cpu")  # report on the weights as stored (float16 round trip)
    ppl = causal_lm_perplexity(lm.logits, valid_stream)
    sample = lm.decode(ar_generate(lm, lm.encode("And God said"), max_new_tokens=40).tokens[0])
    report = {
        "params": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "tokens_seen": steps * batch * length,
        "train_tokens": train_stream.numel(),
        "valid_perplexity": round(ppl, 2),
        "minutes": round((time.time() - t0) / 60, 1),
        "threads": torch.get_num_threads(),
        "greedy_sample": "And God said" + sample,
    }
    return write_report(out_dir, report)


def train_tiny_draft(out_dir: str, steps: int = 180, batch: int = 16, length: int = 128, lr: float = 1e-3,
                     temperature: float = 2.0, ce_weight: float = 0.1, seed: int = 0, teacher: str = "tiny",
                     progress: bool = True) -> dict:
    """Distil ``tiny`` into a 1-layer draft (same tokenizer, same width). About 4 minutes on 2 busy cores.

    The student starts from the teacher's embeddings, layer 0 and final norm (an early exit at
    ``k = 1``) and learns to match the teacher's softened distribution on random KJV windows.
    """
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    teacher_lm = load(teacher, device="cpu", prepack=False) if isinstance(teacher, str) else teacher
    tok = teacher_lm.tokenizer
    train_docs, valid_docs = data.kjv_split()
    train_stream = encode_docs(tok, train_docs, teacher_lm.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, teacher_lm.eos_token_id)
    student = LlamaForCausalLM(tiny_config(teacher_lm.vocab_size, num_hidden_layers=1))
    init_from_target(student, teacher_lm.model, layers=(0,))
    opt = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0 = time.time()

    def distil_step(step):
        x = random_windows(train_stream, batch, length, gen)  # (B, T)
        with torch.no_grad():
            t_logits = teacher_lm.model(input_ids=x).logits  # (B, T, V)
        s_logits = student(input_ids=x).logits  # (B, T, V)
        V = s_logits.size(-1)
        return distill_loss(s_logits[:, :-1].reshape(-1, V), t_logits[:, :-1].reshape(-1, V),
                            x[:, 1:].reshape(-1), temperature, ce_weight)

    train_loop(student, distil_step, steps, lr, "distil tiny-draft", warmup=20, opt=opt, progress=progress)
    os.makedirs(out_dir, exist_ok=True)
    save_half(student, out_dir)
    tok.save_pretrained(out_dir)
    drafters.record_target(out_dir, teacher_lm, teacher if isinstance(teacher, str) else None)
    draft = load_folder(out_dir, device="cpu")
    probe = [teacher_lm.encode(t) for t in ("And God said", "In the beginning", "Jesus answered and said")]
    report = {
        "teacher": teacher if isinstance(teacher, str) else teacher_lm.name,
        "params": sum(p.numel() for p in student.parameters()),
        "steps": steps,
        "minutes": round((time.time() - t0) / 60, 1),
        "valid_perplexity": round(causal_lm_perplexity(draft.logits, valid_stream), 2),
        "teacher_valid_perplexity": round(causal_lm_perplexity(teacher_lm.logits, valid_stream), 2),
        "greedy_agreement": round(greedy_agreement(teacher_lm, draft, probe), 3),
    }
    return write_report(out_dir, report)

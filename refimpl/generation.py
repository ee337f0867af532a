"""What every decoder returns: :class:`Generation` (tokens + :class:`Stats`), and input checks.

All decoders in :mod:`refimpl` share these, so notebooks and the benchmark read the same
counters. Notation: ``tau`` = tokens emitted per target forward pass,
``alpha`` = per-draft-token acceptance rate, ``NFE`` = model forward evaluations.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch


@dataclass
class Stats:
    """Counters of one ``generate`` call (for the whole batch).

    - ``target_calls``: forward passes of the target model (prefill included).
    - ``draft_calls``: forward passes of the draft model (0 for methods without a draft).
    - ``accepted``: per verification step, per row, the number of *draft* tokens accepted.
    - ``nfe``: all model forward evaluations (target + draft, or denoiser calls for a dLLM).
    - ``seconds``: wall time of the call.
    - ``new_tokens``: tokens emitted, summed over rows; ``rows``: the batch size.
    - ``drafted``: draft tokens proposed, summed over rows (for ``alpha``).
    - ``row_steps``: target passes counted per row still decoding (0: the decoder does not
      count them, and ``tau`` assumes every row took part in every pass).
    - ``extra``: method-specific numbers (iterations, proposals, ...).
    """

    target_calls: int = 0
    draft_calls: int = 0
    accepted: list = field(default_factory=list)
    nfe: int = 0
    seconds: float = 0.0
    new_tokens: int = 0
    drafted: int = 0
    rows: int = 1
    row_steps: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def alpha(self) -> float:
        """Fraction of drafted tokens that were accepted (nan when nothing was drafted)."""
        acc = sum(sum(a) if isinstance(a, (list, tuple)) else a for a in self.accepted)
        return acc / self.drafted if self.drafted else float("nan")

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward pass, per row (prefill included): 1.0 for AR.

        Rows that finished early do not count in later passes when the decoder records ``row_steps``.
        """
        if self.row_steps:
            return self.new_tokens / self.row_steps
        if self.target_calls == 0 or self.rows == 0:
            return float("nan")
        return self.new_tokens / (self.rows * self.target_calls)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        return {
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "nfe": self.nfe,
            "seconds": self.seconds,
            "new_tokens": self.new_tokens,
            "drafted": self.drafted,
            "rows": self.rows,
            "alpha": self.alpha,
            "tau": self.tau,
            "tokens_per_second": self.tokens_per_second,
            **self.extra,
        }


@dataclass
class Generation:
    """``tokens[b]``: the new tokens of row ``b`` (stopped at EOS inclusive or at max_new_tokens)."""

    tokens: list
    stats: Stats = field(default_factory=Stats)

    def text(self, tokenizer) -> list[str]:
        return [tokenizer.decode(t) for t in self.tokens]


class Outputs:
    """The outputs and counters of one draft-and-verify call (:func:`refimpl.speculative.decode`): each row's
    tokens, which rows still decode (``rows``: current batch index -> original row), the :class:`Stats`."""

    def __init__(self, prompts, max_new_tokens: int, eos: frozenset):
        self.out: list[list[int]] = [[] for _ in prompts]
        self.rows, self.max_new, self.eos = list(range(len(prompts))), max_new_tokens, eos
        self.stats, self.gammas, self.lengths = Stats(rows=len(prompts)), [], []

    def caps(self) -> list[int]:
        """The most drafts each row may take: what it still needs, less the target's own token."""
        return [self.max_new - len(self.out[r]) - 1 for r in self.rows]

    def emit(self, target, prop, n, nxt, valid, accepted):
        """After one verification: ``n`` (b,) drafts accepted of ``prop`` (a Proposal), the target's ``nxt``
        (b,), the candidates per row ``valid`` (b,) and the ``accepted`` tokens (b, max n). Appends each row's
        accepted drafts and the target's token, stopping at EOS / max_new_tokens (one host copy, through
        ``target.host``) -> ``(n_list, committed, finished batch indices, mean tokens emitted per row)``,
        ``committed[i]`` row i's accepted drafts then the target's token (before any EOS cut)."""
        s = self.stats
        s.target_calls, s.draft_calls, s.row_steps = s.target_calls + 1, s.draft_calls + prop.calls, s.row_steps + len(self.rows)
        self.gammas.append(prop.tokens.shape[1])
        n_list, nxt, valid, accepted = target.host(n[:, None], nxt[:, None], valid[:, None], accepted)
        step, finished, emitted, committed = [0] * len(self.out), [], [], []
        for i, r in enumerate(self.rows):
            k, left = n_list[i][0], self.max_new - len(self.out[r])
            step[r], s.drafted = k, s.drafted + valid[i][0]
            self.lengths.append(valid[i][0])
            committed.append(accepted[i][:k] + nxt[i])
            new, done = truncate_at_eos(committed[-1], self.eos, left)
            self.out[r].extend(new)
            emitted.append(len(new))
            if done or len(self.out[r]) >= self.max_new:
                finished.append(i)
        s.accepted.append(step)
        return [k[0] for k in n_list], committed, finished, sum(emitted) / len(emitted)

    def drop(self, finished: list[int]) -> list[int]:
        """Take the ``finished`` batch indices out of the batch -> the batch indices that go on."""
        keep = [i for i in range(len(self.rows)) if i not in finished]
        self.rows = [self.rows[i] for i in keep]
        return keep

    def result(self) -> Generation:
        s = self.stats
        s.nfe, s.new_tokens = s.target_calls + s.draft_calls, sum(len(o) for o in self.out)
        s.extra["gammas"] = self.gammas
        s.extra["mean_gamma"] = sum(self.lengths) / len(self.lengths) if self.lengths else 0.0
        return Generation(self.out, s)


class Timer:
    """``with Timer(stats): ...`` records wall time into ``stats.seconds``."""

    def __init__(self, stats: Stats):
        self.stats = stats

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.stats.seconds = time.perf_counter() - self.t0


def normalize_prompts(prompts: Any, max_length: int | None = None, max_new_tokens: int | None = None,
                      vocab_size: int | None = None) -> list[list[int]]:
    """A ragged batch as a list of lists of ints; a single list of ints is a batch of one.

    Raises ``ValueError`` naming ``prompts`` for an empty batch, an empty prompt, non-integer
    tokens, ids outside ``[0, vocab_size)``, or a prompt that (with ``max_new_tokens``) does not
    fit the model's context.
    """
    import torch

    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token ids or a list of such lists")
    if all(isinstance(t, int) for t in prompts):
        prompts = [list(prompts)]
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            p = p.tolist()
        if not isinstance(p, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise ValueError(f"prompts[{i}] must be a list of int token ids")
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        if vocab_size is not None and (min(p) < 0 or max(p) >= vocab_size):
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab_size}): wrong tokenizer?")
        out.append(list(p))
    check_fits(out, max_length, max_new_tokens)
    return out


def check_fits(prompts: list[list[int]], max_length: int | None, max_new_tokens: int | None = None) -> None:
    """``ValueError`` naming the prompt that (with ``max_new_tokens``) does not fit a ``max_length`` context
    (None: no limit)."""
    if max_length is None:
        return
    for i, p in enumerate(prompts):
        if len(p) > max_length:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens, longer than the model's context ({max_length})")
        if max_new_tokens is not None and len(p) + max_new_tokens > max_length:
            raise ValueError(f"prompts[{i}] ({len(p)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"the model's context ({max_length})")


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_generate_args(max_new_tokens, temperature, top_k=None, top_p=None) -> None:
    """The checks every ``generate`` shares: ``max_new_tokens >= 1`` and the sampling settings."""
    from .sampling import check_sampling_args

    check_positive_int("max_new_tokens", max_new_tokens)
    check_sampling_args(temperature, top_k, top_p)


def eos_set(eos_token_id, default) -> frozenset:
    """Normalise ``eos_token_id``: None -> the model's default; an int or a list of ints; () disables."""
    if eos_token_id is None:
        eos_token_id = default
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    if isinstance(eos_token_id, Sequence) or isinstance(eos_token_id, (set, frozenset)):
        ids = list(eos_token_id)
        if not all(isinstance(t, int) for t in ids):
            raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
        return frozenset(ids)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")


def truncate_at_eos(tokens: Sequence[int], eos: frozenset, max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut ``tokens`` after the first EOS (inclusive) and at ``max_new_tokens``; return (tokens, done)."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos:
            return out, True
        if len(out) >= max_new_tokens:
            return out, True
    return out, len(out) >= max_new_tokens


def int_tensor(values, device) -> torch.Tensor:
    """A rectangular (nested) list of ints as an int64 tensor on ``device``, e.g. a proposer's draft
    rows (b, g), already padded. Built from a NumPy array, several times cheaper on a CPU than
    ``torch.tensor`` of a list, which a small model's decode step notices."""
    out = torch.from_numpy(np.array(values, dtype=np.int64))
    return out if torch.device(device).type == "cpu" else out.to(device)


# -- presets: each method's named configurations ------------------------------------------------
#: what one more drafted position adds to a step's cost on a CPU, in AR steps: verifying a DFlash block of 8
#: positions instead of 3 costs 0.29 AR steps more on 2 cores with SmolLM2 (1.70 against 1.41,
#: ``bench_results/experiments/2026-12-07_dflash_block_cpu``), about 0.06 a position
SLOT_COST = 0.06


def paying_slots(accept, most: int, cost: float = SLOT_COST) -> int:
    """How many drafts a one-call drafter (PARD, DFlash) proposes a step on a CPU: the leading slots whose
    held-out chain acceptance ``accept[d]`` (the probability that drafts 1 to d + 1 are all accepted, as the
    drafter's trainer measured it) is at least ``cost``, since a slot adds that acceptance to tau and about
    ``cost`` AR steps to the step; at least 1, at most ``most``; ``most`` when nothing was measured (None)."""
    if not accept:
        return most
    n = 0
    while n < min(len(accept), most) and accept[n] >= cost:
        n += 1
    return max(1, n)


def default_preset(target, presets: dict) -> str:
    """The preset ``generate`` uses when none is named: ``"cpu"`` (the configuration measured
    fastest on a CPU target: ``bench_results/capstone/``) for a target on the CPU; on any other
    device ``"paper"`` where the method has one (the paper's reference settings, tuned by its
    authors on GPUs, where scoring many tree nodes costs about as much as one), else ``"cpu"``."""
    device = getattr(target, "device", None)
    on_cpu = device is None or torch.device(device).type == "cpu"
    return "paper" if not on_cpu and "paper" in presets else "cpu"


def preset_options(presets: dict, preset: str | None, target, **given) -> dict:
    """The options ``generate`` runs with: those of ``presets[preset]`` (None: :func:`default_preset`)
    with every option the caller gave (not None) on top. A method's ``generate`` declares its
    tunable options with default None and resolves them here, so one table per module
    (``PRESETS``) is the only place a default lives, and the benchmark reads the same table."""
    name = default_preset(target, presets) if preset is None else preset
    if name not in presets:
        raise ValueError(f"preset must be one of {sorted(presets)}, got {preset!r}")
    out = dict(presets[name])
    unknown = sorted(set(given) - set(out))
    if unknown:  # a preset names every option its method tunes
        raise ValueError(f"preset {name!r} does not set {unknown}")
    out.update({k: v for k, v in given.items() if v is not None})
    return out


def required(model, role: str, method: str):
    """``model`` itself, or a ``ValueError`` saying how to get one (``refimpl.generate`` loads the zoo's)."""
    if model is None:
        raise ValueError(f"{role} is required: pass {role}=... (refimpl.generate(target, prompts, "
                         f"method={method!r}) loads the zoo's {role} for the target)")
    return model

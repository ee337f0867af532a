"""The decode step against the memory roofline (chapters 00 and 04c, ``--suite latency``).

A one-token decode step must read every weight once, so on a machine that reads ``bandwidth``
bytes per second it cannot take less than ``weight bytes / bandwidth`` (the *floor*; Williams,
Waterman & Patterson, "Roofline: An Insightful Visual Performance Model", CACM 2009, applied to
batch-1 decoding as in Leviathan et al., arXiv 2211.17192, section 3.3). This module measures
the three numbers that test it on the machine at hand:

- :func:`read_bandwidth`: how fast this machine streams memory (a ``torch`` sum over a buffer as
  large as the model's weights, so it cannot sit in a cache);
- :func:`weight_bytes`: what a step reads (the decoder layers, the final norm, the LM head);
- :func:`interleaved`: the bandwidth and latency(k) of one or more forwards in one interleaved loop;
- :func:`breakdown`: where one cached step of k tokens spends its time, per stage of
  :func:`refimpl.models.lean_llama.forward` (each matrix product, norms, rotary, attention, the
  cache, and the Python between them), with each matrix's effective read rate.

:func:`run` is ``python -m refimpl.bench --suite latency``: latency(k) next to the floor.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch

from ..lm import LM
from ..models import lean_llama
from .decode import markdown_table, timer

#: the stages of :func:`refimpl.models.lean_llama.forward` that are matrix products
MATRIX_STAGES = ("qkv", "o_proj", "gate_up", "down", "lm_head")
#: the order stages are reported in (``python`` = the rest of the wall time)
STAGES = MATRIX_STAGES + ("attention", "cache", "norm", "rope", "swiglu", "embed", "python")


def read_bandwidth(nbytes: int, repeats: int = 7, device="cpu") -> float:
    """Bytes per second to read ``nbytes`` of float32 once (median of ``repeats`` sums)."""
    if nbytes < 4 or repeats < 1:
        raise ValueError(f"nbytes must be >= 4 and repeats >= 1, got {nbytes}, {repeats}")
    buf, timed = torch.ones(nbytes // 4, device=device), timer(device)
    buf.sum()
    return buf.numel() * 4 / statistics.median(timed(buf.sum) for _ in range(repeats))


def matrix_bytes(model) -> dict[str, int]:
    """Bytes of weights each matrix stage reads in one step, summed over the layers."""
    out = dict.fromkeys(MATRIX_STAGES, 0)
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        for stage, mods in (("qkv", (att.q_proj, att.k_proj, att.v_proj)), ("o_proj", (att.o_proj,)),
                            ("gate_up", (mlp.gate_proj, mlp.up_proj)), ("down", (mlp.down_proj,))):
            out[stage] += sum(m.weight.numel() * m.weight.element_size() for m in mods)
    w = model.lm_head.weight
    out["lm_head"] = w.numel() * w.element_size()
    return out


def weight_bytes(model) -> int:
    """Bytes one decode step must read: every matrix, plus the norms (the embedding lookup reads one row)."""
    norms = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "norm" in n)
    return sum(matrix_bytes(model).values()) + norms


class Stopwatch:
    """A ``probe`` for :func:`refimpl.models.lean_llama.forward`: milliseconds per stage."""

    def __init__(self):
        self.ms: dict[str, float] = defaultdict(float)
        self.name, self.t0 = "", 0.0

    def __call__(self, name: str) -> "Stopwatch":
        self.name = name
        return self

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.ms[self.name] += 1e3 * (time.perf_counter() - self.t0)


@torch.no_grad()
def breakdown(lm: LM, k: int = 1, context: int = 128, repeats: int = 15) -> dict:
    """Where one cached step of ``k`` tokens after ``context`` cached ones spends its time.

    Returns ``{"k", "wall_ms", "stages": {stage: ms}, "read_gbs": {matrix stage: GB/s}}``, medians
    over ``repeats``; ``python`` is the wall time no stage accounts for. ``lm`` must be a plain
    Llama-recipe model (:func:`refimpl.models.lean_llama.supports`); its weights are read as it
    holds them (fused and prepacked when its linears are prepacked). The timer needs stage
    boundaries, so the step runs stage by stage even where the lean forward's default is the
    whole-layer kernel (:func:`refimpl.models.lean_llama.whole_layers`): its ``wall_ms`` is that
    path's, and the latency rows give the default's.
    """
    if not lean_llama.supports(lm.model):
        raise ValueError("lm must wrap a plain Llama-recipe model (lean_llama.supports(lm.model))")
    if k < 1 or context < 1 or repeats < 1:
        raise ValueError(f"k, context and repeats must be >= 1, got {k}, {context}, {repeats}")
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, lm.vocab_size, (1, context + k), generator=g, device="cpu").to(lm.device)
    cache = lean_llama.KVCache(lm.num_layers)
    lean_llama.forward(lm.model, ids[:, :context], cache, logits_to_keep=1)
    walls, runs = [], []
    for i in range(repeats + 1):
        watch = Stopwatch()
        t0 = time.perf_counter()
        lean_llama.forward(lm.model, ids[:, context:], cache, probe=watch)
        wall = 1e3 * (time.perf_counter() - t0)
        cache.crop(-k)
        if i:  # the first run warms up
            watch.ms["python"] = wall - sum(watch.ms.values())
            walls.append(wall)
            runs.append(watch.ms)
    stages = {s: statistics.median(r.get(s, 0.0) for r in runs) for s in STAGES}
    nbytes = matrix_bytes(lm.model)
    return {"k": k, "wall_ms": statistics.median(walls), "stages": stages,
            "read_gbs": {s: nbytes[s] / (stages[s] * 1e6) if stages[s] else None for s in MATRIX_STAGES}}


@torch.no_grad()
def interleaved(lms: dict, nbytes: int, ks, context: int = 128, repeats: int = 7) -> dict:
    """Bandwidth and latency(k) of every LM in ``lms`` ({name: lm}, sharing a device), measured in
    one interleaved loop: each repeat reads the ``nbytes`` buffer once, then runs every (k, lm)
    step once, so drift on a shared machine hits all of them alike. Returns medians:
    ``{"bandwidth": bytes/s, name: {k: ms}}``."""
    if nbytes < 4 or repeats < 1 or not lms or not ks:
        raise ValueError(f"nbytes >= 4, repeats >= 1 and some lms and ks needed, got {nbytes}, {repeats}")
    first = next(iter(lms.values()))
    dev = first.device
    timed = timer(dev)
    buf = torch.ones(nbytes // 4, device=dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, first.vocab_size, (1, context + max(ks)), generator=g, device="cpu").to(dev)
    caches = {name: lm.forward(ids[:, :context], logits_to_keep=1)[1] for name, lm in lms.items()}
    reads, ms = [], {name: {k: [] for k in ks} for name in lms}
    for _ in range(repeats + 1):
        reads.append(timed(buf.sum))
        for k in ks:
            for name, lm in lms.items():
                ms[name][k].append(1e3 * timed(lambda: lm.forward(ids[:, context: context + k], caches[name])))
                lm.crop(caches[name], context)
    out = {"bandwidth": buf.numel() * 4 / statistics.median(reads[1:])}
    for name in lms:
        out[name] = {k: statistics.median(v[1:]) for k, v in ms[name].items()}  # the first run warms up
    return out


def run(lm: LM, fast: bool = False) -> dict:
    """The latency suite: bandwidth, floor, latency(k) against it, the breakdown at k = 1 and 5,
    and (for a :class:`refimpl.models.lean_llama.LeanLM`) the same weights' steps through the plain
    Hugging Face forward, all interleaved in one loop."""
    nbytes = weight_bytes(lm.model)
    ks = [1, 2, 3, 5, 8, 16] if fast else [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]
    lms = {"this": lm}
    if isinstance(lm, lean_llama.LeanLM):
        lms["hf"] = LM(lm.model, lm.tokenizer, name=lm.name)  # the same weights, Hugging Face's forward
    t = interleaved(lms, nbytes, ks, repeats=2 if fast else 7)
    floor_ms = 1e3 * nbytes / t["bandwidth"]
    rows = [{"k": k, "ms": t["this"][k], "seconds": t["this"][k] / 1e3, "relative_to_k1": t["this"][k] / t["this"][1],
             "floor_ms": floor_ms, "x_floor": t["this"][k] / floor_ms} for k in ks]
    out = {"bandwidth_gbs": t["bandwidth"] / 1e9, "weight_mb": nbytes / 1e6, "floor_ms": floor_ms,
           "rows": rows, "breakdown": [], "hf_step_ms": t.get("hf", {})}
    if lean_llama.supports(lm.model):
        out["breakdown"] = [breakdown(lm, k, repeats=3 if fast else 15) for k in (1, 5)]
    return out


def markdown(result: dict, rows: list[dict]) -> str:
    """The latency suite's report: the floor, latency(k) against it, the breakdown table."""
    by_k = {r["k"]: r for r in rows}
    lines = [f"Read bandwidth {result['bandwidth_gbs']:.1f} GB/s (a torch sum over {result['weight_mb']:.0f} MB); "
             f"weights read per step {result['weight_mb']:.0f} MB; floor = bytes / bandwidth = "
             f"{result['floor_ms']:.1f} ms.", ""]
    if 1 in by_k and 5 in by_k:
        lines += [f"One-token step {by_k[1]['ms']:.1f} ms = {by_k[1]['x_floor']:.2f}x the floor "
                  f"({1 / by_k[1]['x_floor']:.0%} of the roofline); a 5-token verification = "
                  f"{by_k[5]['relative_to_k1']:.2f}x a one-token step.", ""]
    hf = {int(k): v for k, v in (result.get("hf_step_ms") or {}).items()}  # (JSON keys are strings)
    if hf and 1 in by_k and 5 in by_k:
        lines += [f"The same weights through Hugging Face's forward, interleaved: {hf[1]:.1f} ms (k=1), "
                  f"{hf[5]:.1f} ms (k=5); the lean forward is {hf[1] / by_k[1]['ms']:.2f}x as fast at k=1, "
                  f"{hf[5] / by_k[5]['ms']:.2f}x at k=5.", ""]
    cols = [("k", "k new tokens", ""), ("ms", "ms", ".1f"), ("floor_ms", "floor ms", ".1f"),
            ("x_floor", "x floor", ".2f"), ("relative_to_k1", "cost vs k=1", ".2f")]
    lines.append(markdown_table(rows, cols))
    if result.get("breakdown"):
        b1, b5 = result["breakdown"]
        table = [{"stage": s, "k1": b1["stages"][s], "k5": b5["stages"][s], "gbs": b1["read_gbs"].get(s)} for s in STAGES]
        table.append({"stage": "total", "k1": b1["wall_ms"], "k5": b5["wall_ms"]})
        lines += ["", "Where a step goes, run stage by stage so a timer sees each stage (ms, medians; GB/s = "
                  "the matrix's bytes / its time). Where the whole-layer kernel runs (cpu_gemv), the default "
                  "step is the k=1 / k=5 rows above; this total is the same math with a call per stage:", "",
                  markdown_table(table, [("stage", "stage", ""), ("k1", "k=1 ms", ".2f"), ("k5", "k=5 ms", ".2f"),
                                         ("gbs", "k=1 GB/s", ".1f")])]
    return "\n".join(lines)


def stages_bar(ax, breakdowns: list[dict], floor_ms: float | None = None, steps_ms: list | None = None) -> None:
    """One stacked bar per :func:`breakdown` (its stages in :data:`STAGES` order) on ``ax``, with
    the floor as a red line when given, and ``steps_ms`` (one per bar: the default forward's step,
    e.g. the whole-layer kernel's, which the stage timer cannot split) as black ticks."""
    import matplotlib.pyplot as plt

    for y, br in enumerate(breakdowns):
        left = 0.0
        for i, s in enumerate(STAGES):
            ax.barh(y, br["stages"][s], left=left, color=plt.cm.tab20.colors[i % 20], label=s if y == 0 else None)
            left += br["stages"][s]
    if floor_ms is not None:
        ax.axvline(floor_ms, color="tab:red", ls="--")
    for y, ms in enumerate(steps_ms or []):
        ax.plot([ms, ms], [y - 0.45, y + 0.45], color="black", lw=2.5, label="default step" if y == 0 else None)
    ax.set_yticks(range(len(breakdowns)), [f"k={br['k']}" for br in breakdowns])
    ax.set_xlabel("ms" + ("" if floor_ms is None else " (red: the floor)"))
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # beside the bars, clear of the axis label


def figure(result: dict, rows: list[dict], path: str | None = None):
    """latency(k) against the floor (left) and where a step goes (right): saved as a PNG at
    ``path`` (returned), or returned as a matplotlib figure when ``path`` is None (a notebook)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    ks = [r["k"] for r in rows]
    a.plot(ks, [r["ms"] for r in rows], "o-", label="measured step")
    a.axhline(result["floor_ms"], color="tab:red", ls="--", label=f"floor: {result['weight_mb']:.0f} MB / "
              f"{result['bandwidth_gbs']:.1f} GB/s")
    hf = {int(k): v for k, v in (result.get("hf_step_ms") or {}).items()}
    if hf:
        a.plot(list(hf), list(hf.values()), "s--", color="0.5", lw=0.8, label="Hugging Face forward")
    a.set_xscale("log", base=2)
    a.set_xticks(ks, [str(k) for k in ks])
    a.set_xlabel("k tokens scored in one step")
    a.set_ylabel("ms")
    a.set_ylim(0, None)
    a.set_title("latency(k) against the memory floor")
    a.legend(fontsize=7)
    if result.get("breakdown"):
        by_k = {r["k"]: r["ms"] for r in rows}
        steps = [by_k.get(br["k"]) for br in result["breakdown"]]
        stages_bar(b, result["breakdown"], result["floor_ms"], steps if None not in steps else None)
        b.set_title("where one step goes, stage by stage (black: the default step)")
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path

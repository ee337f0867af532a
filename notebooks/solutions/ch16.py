"""Reference answers for chapter 16 (the capstone)."""


def predict_speedup(tau, step_cost):
    """Speed-up over AR = tokens per step / (cost of a step in AR steps)."""
    return tau / step_cost


def pick_method(rows, category):
    """The fastest lossless greedy method in ``category``: speed-up over the AR of the run that timed it."""
    from refimpl.bench.decode import category_speedups

    ar = next(r for r in rows if r["method"] == "ar (cache)")
    ok = [r for r in rows if r["exact"] == 1.0 and "T=0.7" not in r["method"]]
    return max(ok, key=lambda r: category_speedups(r, ar).get(category, 0.0))["method"]


def gpu_step_cost(draft_calls_per_step, c_draft):
    """A GPU-like step: the target call costs one AR step whatever it scores, plus the draft calls."""
    return 1.0 + draft_calls_per_step * c_draft

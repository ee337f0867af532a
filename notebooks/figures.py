"""Drawing helpers the notebooks share (pictures only: nothing here is part of an algorithm)."""
from __future__ import annotations

ROOT = -1  # as refimpl.tree.ROOT: the parent of the root's children


def tree_xy(parents: list[int]) -> dict[int, tuple[float, float]]:
    """Layout of a tree given parents-first ``parents``: x = depth, leaves stacked top to bottom, a
    parent at the mean height of its children. Node ``ROOT`` (-1) is the root."""
    kids, xy, leaves = {}, {}, [0]
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)

    def place(i, d):
        ys = [place(c, d + 1) for c in kids.get(i, [])]
        y = sum(ys) / len(ys) if ys else leaves[0]
        leaves[0] += 0 if ys else 1
        xy[i] = (d, -y)
        return y
    place(ROOT, 0)
    return xy


def draw_tree(labels, parents, ax, root="root", green=(), fontsize: int = 9) -> None:
    """Edges, then one labelled box per node (``labels[i]`` for node i); nodes in ``green`` (the
    accepted path, say; ``ROOT`` included to colour the root) are highlighted."""
    xy = tree_xy(parents)
    for i, p in enumerate(parents):
        ax.plot(*zip(xy[p], xy[i]), color="green" if i in green else "0.6", lw=2.5 if i in green else 1, zorder=1)
    for i, lab in [(ROOT, root)] + list(enumerate(labels)):
        fc = "#b7e4c7" if i in green else ("#ffe8a3" if i == ROOT else "white")
        ax.text(*xy[i], lab, ha="center", va="center", fontsize=fontsize, zorder=2,
                bbox=dict(boxstyle="round,pad=0.25", fc=fc, ec="0.4"))
    ax.set_xlim(-0.5, max(x for x, _ in xy.values()) + 0.5)
    ax.axis("off")


def draw_rounds(ax, steps, title: str = "", ymax: int | None = None) -> None:
    """One bar per target call of a speculative run (``steps`` = [(accepted n, drafted g)]): the
    accepted drafts (green), the rejected drafts (red: draft work thrown away) and the target's own
    token on top (blue: a bonus after a full accept, orange: the correction after a rejection)."""
    for i, (n, g) in enumerate(steps):
        ax.bar(i, n, color="#52b788", width=0.8)
        ax.bar(i, g - n, bottom=n, color="#e76f51", width=0.8, alpha=0.55)
        ax.bar(i, 1, bottom=g, color="#4895ef" if n == g else "#f4a261", width=0.8)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("target call (verification step)")
    ax.set_ylabel("tokens")
    ax.set_ylim(0, (ymax if ymax is not None else max(g for _, g in steps) + 1) + 0.5)
    ax.set_title(f"{title}  ({len(steps)} target calls)" if title else f"{len(steps)} target calls", fontsize=9)


def rounds_legend(ax) -> None:
    """The legend of :func:`draw_rounds`, to the right of ``ax``."""
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#52b788", label="accepted draft"),
                       Patch(color="#e76f51", alpha=0.55, label="rejected draft"),
                       Patch(color="#f4a261", label="target's correction"),
                       Patch(color="#4895ef", label="target's bonus token")], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))


def draw_scored_tree(labels, parents, conf, ax, root="root", green=(), fontsize: int = 8, cmap: str = "viridis",
                     floor: float = 1e-3):
    """The tree of :func:`draw_tree` drawn as discs whose area and colour grow with ``conf[i]`` in
    (0, 1] (a cumulative confidence, say) on a log scale from ``floor`` to 1, each labelled on its
    right; ``green`` nodes (``ROOT`` included) and the edges into them are highlighted.
    -> the scatter, for a colour bar."""
    import math

    from matplotlib.colors import LogNorm

    xy = tree_xy(parents)
    for i, p in enumerate(parents):
        ax.plot(*zip(xy[p], xy[i]), color="green" if i in green else "0.7", lw=3 if i in green else 1, zorder=1)
    xs, ys = zip(*(xy[i] for i in range(len(parents))))
    c = [min(max(x, floor), 1.0) for x in conf]
    sc = ax.scatter(xs, ys, s=[40 + 500 * (1 - math.log(x) / math.log(floor)) for x in c], c=c, cmap=cmap,
                    norm=LogNorm(floor, 1.0), zorder=2, edgecolors=["green" if i in green else "0.3" for i in range(len(c))],
                    linewidths=[2.5 if i in green else 0.5 for i in range(len(c))])
    for i, lab in enumerate(labels):
        ax.text(xy[i][0] + 0.12, xy[i][1] + 0.12, lab, va="bottom", fontsize=fontsize, zorder=3,
                bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.75))
    ax.text(*xy[ROOT], root, ha="center", va="center", fontsize=fontsize, zorder=3,
            bbox=dict(boxstyle="round,pad=0.25", fc="#b7e4c7" if ROOT in green else "#ffe8a3", ec="0.4"))
    ax.set_xlim(-0.5, max(x for x, _ in xy.values()) + 0.9)
    ax.axis("off")
    return sc


def call_colour(call: int) -> str:
    """A light background colour of its own for denoiser call ``call``: hues a golden-ratio turn
    apart never repeat, and two successive calls sit far apart on the colour wheel."""
    from colorsys import hls_to_rgb

    return "#%02x%02x%02x" % tuple(int(255 * v) for v in hls_to_rgb((call * 0.6180339887) % 1.0, 0.8, 0.75))


def tokens_by_call(pieces: list[str], call_of: list[int]) -> str:
    """HTML: each decoded piece on its call's colour (:func:`call_colour`), with the call's number."""
    from html import escape

    return "".join(f'<span style="background:{call_colour(c)}" title="call {c}">{escape(p)}'
                   f'<sub style="font-size:60%">{c}</sub></span>' for p, c in zip(pieces, call_of))

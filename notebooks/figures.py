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


def place_labels(ax, xy, labels, fontsize: int = 7, marker_pt: float = 3.0, rings: int = 10, colors=None) -> list:
    """Label point ``xy[i]`` (data coordinates) with ``labels[i]``, inside the axes, where the label
    overlaps no other label, text or point of ``ax`` (with a gap of 2.5 points), crosses no leader
    line and, without a leader, lies nearer its own point than any other: the first free place among eight directions around the point, ring after ring farther
    out (9 points apart); beyond the first ring a grey leader line, itself crossing no label, joins
    label and point, crossing no other leader. The most crowded points are labelled first; a label
    with no free place takes the place that overlaps least. ``colors[i]``: label i's colour (its
    point's, say). Call it last: the axes' limits and the figure's layout fix where the points
    are. -> the labels."""
    import math

    from matplotlib.text import Text
    from matplotlib.transforms import Bbox, ScaledTranslation

    xy, labels = list(xy), list(labels)
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    at = [tuple(p) for p in ax.transData.transform(xy)] if xy else []
    r, gap = marker_pt * fig.dpi / 72, 2.5 * fig.dpi / 72
    dots = [Bbox.from_extents(x - r, y - r, x + r, y + r) for x, y in at]       # the points themselves
    boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]  # texts, then labels placed
    leaders = []                                                               # (start, end) in pixels
    directions = [(1, 0.35), (1, 1), (0, 1), (-1, 1), (-1, 0.35), (-1, -1), (0, -1), (1, -1)]

    def area(a, b):
        return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))

    def reach(bb, p):                                                          # distance box -> point
        return math.hypot(max(bb.x0 - p[0], 0.0, p[0] - bb.x1), max(bb.y0 - p[1], 0.0, p[1] - bb.y1))

    def crossings(seg, bb, n=24):
        (x0, y0), (x1, y1) = seg
        return sum(bb.contains(x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n) for k in range(1, n))

    def cross(s1, s2):                                                         # do two segments cross?
        (a, b), (c, d) = s1, s2

        def side(p, q, r):
            return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
        return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0

    def cost(bb, seg, i):
        c = sum(area(bb, o) for o in boxes) + sum(area(bb, d) for j, d in enumerate(dots) if j != i)
        c += 10 * (bb.width * bb.height - area(bb, inside))                    # outside the axes
        if seg is None:                                                        # no leader: no other point nearer
            near = min(range(len(at)), key=lambda j: (reach(bb, at[j]), j != i))
            c += 0 if near == i else 500
        c += 50 * sum(crossings(s_, bb) for s_ in leaders)                     # over a leader line
        if seg is not None:                                                    # its own line over a label
            c += 50 * sum(crossings(seg, o) for o in boxes)
            c += 50 * sum(crossings(seg, d) for j, d in enumerate(dots) if j != i)
            c += 500 * sum(cross(seg, s_) for s_ in leaders)
        return c

    near = 40 * fig.dpi / 72                                                   # "crowded": points within 40 pt
    crowd = [sum(math.dist(p, q) < near for q in at) for p in at]
    out = [None] * len(at)
    for i in sorted(range(len(at)), key=lambda k: -crowd[k]):
        (x, y), (px, py), label = xy[i], at[i], labels[i]
        best = None
        for ring in range(rings):
            dist = 4 + 9 * ring
            for dx, dy in directions:
                n = math.hypot(dx, dy)
                ox, oy = dist * dx / n, dist * dy / n
                ha = "left" if dx > 0 else "right" if dx < 0 else "center"
                va = "bottom" if dy > 0.5 else "top" if dy < -0.5 else "center"
                probe = Text(x, y, label, fontsize=fontsize, ha=ha, va=va, figure=fig,
                             transform=ax.transData + ScaledTranslation(ox / 72, oy / 72, fig.dpi_scale_trans))
                bb = probe.get_window_extent(renderer).padded(gap)
                px1, py1 = px + ox * fig.dpi / 72, py + oy * fig.dpi / 72           # the leader's end
                seg = ((px, py), (px1, py1)) if ring else None
                c = cost(bb, seg, i)
                if best is None or c < best[0]:
                    best = (c, ox, oy, ha, va, seg, bb)
                if c == 0:
                    break
            if best[0] == 0:
                break
        _, ox, oy, ha, va, seg, bb = best
        arrow = {"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 0, "shrinkB": 2} if seg else None
        out[i] = ax.annotate(label, (x, y), xytext=(ox, oy), textcoords="offset points", fontsize=fontsize,
                             ha=ha, va=va, arrowprops=arrow, color=colors[i] if colors is not None else None)
        boxes.append(bb)
        if seg:
            leaders.append(seg)
    return out


def stacked(xy, width: float, min_points: int = 4) -> list[int]:
    """The indices of the largest group of points whose x values lie within ``width`` of each other (a
    vertical stack, as when a model gives many methods the same cost), or [] when that group has fewer
    than ``min_points``."""
    order = sorted(range(len(xy)), key=lambda i: xy[i][0])
    best: list[int] = []
    for a in range(len(order)):
        group = [i for i in order[a:] if xy[i][0] - xy[order[a]][0] <= width]
        best = group if len(group) > len(best) else best
    return best if len(best) >= min_points else []


def column_labels(ax, xy, labels, x_text: float, fontsize: int = 7, colors=None) -> list:
    """Label points that stand on (nearly) one vertical line in a column at ``x_text`` (data coordinates;
    left of the points the labels end there, right of them they start there), top to bottom in the order
    of the points' heights, evenly spaced over the axes' height, each joined to its point by a grey
    leader. Matching the two orders keeps any two leaders from crossing, however close the points are.
    -> the labels."""
    xy, labels = list(xy), list(labels)
    order = sorted(range(len(xy)), key=lambda i: -xy[i][1])
    lo, hi = ax.get_ylim()
    step = (hi - lo) / (len(order) + 1)
    out = [None] * len(xy)
    for rank, i in enumerate(order):
        y_text = hi - step * (rank + 1)
        out[i] = ax.annotate(labels[i], xy[i], xytext=(x_text, y_text), textcoords="data", fontsize=fontsize,
                             ha="right" if x_text < xy[i][0] else "left", va="center",
                             color=colors[i] if colors is not None else None,
                             arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 0, "shrinkB": 2})
    return out


def interact_figure(draw, **controls):
    """A picture with controls, redrawn when one moves: ``controls`` (keyword -> ipywidgets control)
    above an ``ipywidgets.Image`` of the matplotlib figure ``draw(**values)`` leaves current (it
    draws with pyplot and does not call ``plt.show()``). The picture travels as the Image widget's
    value, not as captured cell output, so it is whole after Run All, after a second Run All and
    after every move. Displays the widget and returns it: ``children`` are the controls in the
    order given, then the image (as ``interact(...).widget``'s, whose last child is its output)."""
    import io

    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    image = widgets.Image(format="png")

    def redraw(_=None):
        plt.close("all")                     # nothing left for the inline backend to show twice
        draw(**{name: c.value for name, c in controls.items()})
        fig = plt.gcf()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
        plt.close(fig)
        png = buf.getvalue()
        image.width = str(int.from_bytes(png[16:20], "big"))   # the PNG's own width: shown at 1:1
        image.value = png

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([*controls.values(), image])
    display(box)
    return box

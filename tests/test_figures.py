"""The notebooks' shared drawing helpers (notebooks/figures.py) say what their pictures claim."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "notebooks"))
import figures  # noqa: E402
import figure_check  # noqa: E402


def test_every_call_of_a_decode_has_its_own_colour_and_neighbours_contrast():
    """'Same colour = same call' holds for every decode the chapters draw (at most one call per token,
    64 tokens; here twice that); a cyclic palette such as tab20 repeats from call 20 on."""
    colours = [figures.call_colour(r) for r in range(128)]
    assert len(set(colours)) == len(colours)
    rgb = [tuple(int(c[i: i + 2], 16) for i in (1, 3, 5)) for c in colours]
    assert all(sum(abs(a - b) for a, b in zip(rgb[r], rgb[r + 1])) > 60 for r in range(len(rgb) - 1))


def test_tokens_by_call_escapes_text_and_labels_each_token_with_its_call():
    html = figures.tokens_by_call(["<b>", " and"], [0, 3])
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert html.count("<sub") == 2 and ">3</sub>" in html and figures.call_colour(3) in html


#: (step cost, pooled tau, label) of the committed SmolLM2 capstone rows: a crowded corner near (1.6, 1.6)
CLUSTER = [(2.216, 2.335, "chain draft"), (2.822, 1.946, "chain draft T=0.7"), (5.228, 1.044, "self-spec (early exit)"),
           (2.178, 2.129, "chain draft, no copy prior"), (2.617, 2.576, "adaptive gamma"), (7.69, 2.172, "static tree"),
           (2.863, 2.981, "dynamic tree"), (1.812, 1.543, "Medusa"), (1.923, 1.671, "Medusa typical (LOSSY)"),
           (1.768, 2.23, "EAGLE"), (1.842, 2.58, "EAGLE-3 + copy prior"), (1.514, 1.056, "Jacobi"),
           (1.561, 1.581, "lookahead"), (1.531, 1.633, "prompt lookup"), (1.883, 1.367, "prompt lookup T=0.7"),
           (1.68, 1.634, "SAM"), (4.347, 2.04, "token recycling"), (3.926, 2.198, "SAM + recycling")]


def cluster_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([c for c, _, _ in CLUSTER], [t for _, t, _ in CLUSTER], s=18)
    ax.set_xlim(0, 8.5)
    ax.set_ylim(0, 3.5)
    return fig, ax


def test_placed_labels_never_overlap_on_the_capstone_cluster():
    import matplotlib.pyplot as plt

    fig, ax = cluster_axes()
    figures.place_labels(ax, [(c, t) for c, t, _ in CLUSTER], [lab for _, _, lab in CLUSTER])
    fig.canvas.draw()
    assert len(ax.texts) == len(CLUSTER)
    assert figure_check.overlaps(fig) == []
    inside = ax.get_window_extent()
    assert all(inside.contains(*t.get_window_extent().min) and inside.contains(*t.get_window_extent().max)
               for t in ax.texts), "every label stays inside the axes"
    plt.close(fig)


def test_the_overlap_check_flags_labels_at_a_fixed_offset():
    """Negative control: each label 3 points right of its point, as the capstone figure had them."""
    import matplotlib.pyplot as plt

    fig, ax = cluster_axes()
    for c, t, lab in CLUSTER:
        ax.annotate(lab, (c, t), fontsize=7, xytext=(3, 2), textcoords="offset points")
    fig.canvas.draw()
    assert ("EAGLE-3 + copy prior", "adaptive gamma") in figure_check.overlaps(fig) or \
           ("adaptive gamma", "EAGLE-3 + copy prior") in figure_check.overlaps(fig)
    plt.close(fig)


def test_the_figure_check_counts_only_text_that_is_drawn():
    """Axis labels over a legend, a title over a title are flagged; an annotation's arrow, a tick label
    outside the view and a hidden text are not: only the text a reader sees counts."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_xticks([0, 0.5, 1, 5])                                   # 5 lies outside the view: not drawn
    ax.set_xlim(0, 1)
    ax.annotate("far", (0.1, 0.9), xytext=(80, -60), textcoords="offset points", arrowprops={"arrowstyle": "-"})
    ax.text(0.45, 0.45, "hidden", visible=False)
    ax.text(0.5, 0.5, "")                                          # empty: nothing to read
    ax.text(0.5, 0.45, "seen")
    fig.tight_layout()
    assert figure_check.overlaps(fig) == []
    ax.text(0.51, 0.45, "over it")                                # negative control
    assert figure_check.overlaps(fig) == [("seen", "over it")]
    plt.close(fig)


def test_a_figure_with_overlapping_text_cannot_become_a_picture():
    """What the kernels of a test run do (figure_check.install): savefig, and the inline backend's PNG,
    raise OverlappingText naming the texts and the figure's title; a clean figure saves."""
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pytest
    from matplotlib.backend_bases import FigureCanvasBase

    before = FigureCanvasBase.print_figure
    figure_check.install()
    try:
        fig, ax = plt.subplots()
        ax.set_title("a crowded picture")
        ax.text(0.5, 0.5, "first label")
        fig.savefig(io.BytesIO(), format="png")
        ax.text(0.52, 0.5, "second label")
        with pytest.raises(figure_check.OverlappingText, match=r"'a crowded picture'.*'first label' over 'second label'"):
            fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
    finally:
        FigureCanvasBase.print_figure = before


# ---------------------------------------------------------------------------------------
# every float a widget's title, label or heading prints is formatted: a slider's value arrives as
# min + k * step in binary floating point (0.7999999999999999, not 0.8)
# ---------------------------------------------------------------------------------------
import ast  # noqa: E402
import glob  # noqa: E402

NOTEBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks")


def float_names(fn, slider_fed) -> set:
    """The names in ``fn`` that hold a computed float: parameters with a float default (a widget's
    callback gets the slider's value there) and parameters an ``interact`` call feeds a FloatSlider."""
    a = fn.args
    pos = a.posonlyargs + a.args
    pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
    own = {arg.arg for arg, d in pairs if isinstance(d, ast.Constant) and isinstance(d.value, float)}
    return own | slider_fed.get(fn.name, set())


def unformatted_floats(src: str, name: str = "<src>") -> list:
    """One line per f-string interpolation of a float-like value (a name of :func:`float_names`, or a
    true division) with no format spec and no ``!r`` / ``!s``: what a title, label or heading built
    from it would print as 0.7999999999999999."""
    tree = ast.parse(src)
    fed = {}
    for n in ast.walk(tree):
        func = getattr(n, "func", None)
        if isinstance(n, ast.Call) and getattr(func, "attr", getattr(func, "id", "")) in ("interact", "interactive") \
                and n.args and isinstance(n.args[0], ast.Name):
            fed.setdefault(n.args[0].id, set()).update(
                kw.arg for kw in n.keywords if isinstance(kw.value, ast.Call) and "FloatSlider" in ast.unparse(kw.value.func))
    out = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        names = float_names(fn, fed)
        for js in (n for n in ast.walk(fn) if isinstance(n, ast.JoinedStr)):
            for v in js.values:
                if not isinstance(v, ast.FormattedValue) or v.format_spec is not None or v.conversion != -1:
                    continue
                e = v.value
                if (isinstance(e, ast.Name) and e.id in names) or (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div)):
                    out.append(f"{name}:{js.lineno}: {{{ast.unparse(e)}}} in {ast.unparse(js)[:90]}")
    return out


def test_titles_labels_and_headings_format_every_float():
    paths = sorted(glob.glob(os.path.join(NOTEBOOKS, "[0-9]*.py"))) + [os.path.join(NOTEBOOKS, "figures.py")]
    problems = [p for path in paths for p in unformatted_floats(open(path).read(), os.path.basename(path))]
    assert problems == [], "format these floats (e.g. {x:.2f}):\n" + "\n".join(problems)


def test_the_float_format_check_flags_a_bad_title():
    """Negative control: chapter 00's widget title as it printed alpha=0.7999999999999999, a heading
    of a FloatSlider-fed parameter, and a division; their formatted forms pass."""
    bad = ('def plot(alpha=0.8, c=0.05):\n    plt.title(f"alpha={alpha}, c={c}: gamma={g}")\n'
           'def render(t, k=3):\n    return f"(threshold {t}), {k} calls, rate {n / m}"\n'
           'ui = widgets.interact(render, t=widgets.FloatSlider(value=0.9), k=widgets.IntSlider(value=3))\n')
    found = unformatted_floats(bad)
    assert [f.split(": ", 1)[1] for f in found] == ["{alpha} in f'alpha={alpha}, c={c}: gamma={g}'",
                                                 "{c} in f'alpha={alpha}, c={c}: gamma={g}'",
                                                 "{t} in f'(threshold {t}), {k} calls, rate {n / m}'",
                                                 "{n / m} in f'(threshold {t}), {k} calls, rate {n / m}'"], found
    good = bad.replace("{alpha}", "{alpha:.2f}").replace("{c}", "{c:.2f}").replace("{t}", "{t:.2f}").replace(
        "{n / m}", "{n / m:.1%}")
    assert unformatted_floats(good) == []


def test_every_kernel_of_a_test_run_checks_its_figures():
    """A kernel this pytest run starts (as nbval starts one per chapter) has the check installed
    (conftest.py's IPython profile), and a figure whose texts overlap fails its cell there."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.text(0.5, 0.5, 'one label')\n"
                "ax.text(0.5, 0.5, 'two label')\nfig.savefig('/dev/null', format='png')")
        errors = []
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: errors.append(m["content"])
                                       if m["msg_type"] == "error" else None)
        assert reply["content"]["status"] == "error" and errors[0]["ename"] == "OverlappingText", errors
        assert "'one label' over 'two label'" in errors[0]["evalue"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_stack_of_points_gets_a_column_of_labels_in_their_order():
    """Twenty points on one vertical line (the GPU model at c_draft = 0): ``stacked`` finds them, and
    ``column_labels`` lists them top to bottom in the points' order (so no two leaders cross) with no
    text over another; a scattered set is no stack (negative control)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = [1.0 + 0.07 * ((7 * k) % 20) for k in range(20)]     # close together, in no particular order
    xy = [(1.0, y) for y in ys] + [(2.5, 1.0)]
    assert sorted(figures.stacked(xy, width=0.01)) == list(range(20))
    assert figures.stacked([(float(k), 1.0) for k in range(6)], width=0.01) == []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(*zip(*xy))
    ax.set_xlim(0, 3)
    ax.set_ylim(0, 3)
    labels = figures.column_labels(ax, xy[:20], [f"method {k}" for k in range(20)], x_text=1.3)
    assert figure_check.overlaps(fig) == []
    heights = [labels[i].xyann[1] for i in sorted(range(20), key=lambda i: -ys[i])]
    assert heights == sorted(heights, reverse=True), "the labels keep the points' top-to-bottom order"
    plt.close(fig)

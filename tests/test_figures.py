"""The notebooks' shared drawing helpers (notebooks/figures.py) say what their pictures claim."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "notebooks"))
import figures  # noqa: E402


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

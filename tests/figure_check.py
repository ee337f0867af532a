"""Every figure a chapter shows has readable text: no two pieces of text print over each other.

Hooks the repository's conftest.py gives every pytest run, so that every run of the chapters
under nbval checks every figure they draw, whoever starts it (``make test``, ``make test-learner``):

- :func:`overlaps` lays a figure out, records each piece of text as it is drawn (titles, axis and tick
  labels, legends, annotations, point labels; a tick label outside the view is not drawn, so not
  counted) and returns the pairs whose boxes overlap.
- :func:`install` makes every figure check itself just before it becomes a picture
  (``FigureCanvasBase.print_figure``: the inline backend's PNG, ``savefig``, the ``Image`` widgets of
  ``figures.interact_figure``); a figure with overlapping text raises :class:`OverlappingText`, which the
  kernel reports as the cell's error, so nbval fails that cell by name (``notebook::Cell N``).
- The hooks install it in the IPython kernels the test run starts: pytest's controller writes an
  IPython profile whose startup file calls :func:`install` into a temporary ``IPYTHONDIR``, which the
  workers, nbval's kernels and the site builder's inherit (a test's own Jupyter server sets its own).
  ``COURSE_FIGURE_CHECK=0`` in the environment leaves it out.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

MIN_PX = 1.0   # two boxes overlap when they share more than this many pixels in both directions
ENV = "IPYTHONDIR"


class OverlappingText(ValueError):
    """A figure's texts print over each other."""


def drawn_texts(fig) -> list:
    """[(text, its box in display pixels)] of every non-empty text drawn when ``fig`` is laid out
    (nothing is rendered); a clipped text counts only its part inside its clip box."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    found, draw = [], Text.draw

    def record(self, renderer):
        draw(self, renderer)
        if not (self.get_visible() and self.get_text().strip() and (self.get_alpha() is None or self.get_alpha() > 0)):
            return
        box = Text.get_window_extent(self, renderer)   # the text alone (an Annotation's also counts its arrow)
        clip = self.get_clip_box() if self.get_clip_on() else None
        if clip is not None:
            box = Bbox.intersection(box, clip)
            if box is None:
                return
        found.append((self, box))

    Text.draw = record
    try:
        fig.draw_without_rendering()
    finally:
        Text.draw = draw
    return found


def overlaps(fig, min_px: float = MIN_PX) -> list[tuple[str, str]]:
    """The pairs of texts of ``fig`` whose boxes overlap by more than ``min_px`` pixels both ways."""
    texts, pairs = drawn_texts(fig), []
    for i, (a, p) in enumerate(texts):
        for b, q in texts[i + 1:]:
            w = min(p.x1, q.x1) - max(p.x0, q.x0)
            h = min(p.y1, q.y1) - max(p.y0, q.y0)
            if w > min_px and h > min_px:
                pairs.append((a.get_text(), b.get_text()))
    return pairs


def describe(fig, pairs) -> str:
    titles = [t for t in [fig.get_suptitle()] + [ax.get_title() for ax in fig.axes] if t]
    where = f"the figure {titles[0]!r}" if titles else "a figure"
    shown = "; ".join(f"{a!r} over {b!r}" for a, b in pairs[:6])
    more = f" and {len(pairs) - 6} more" if len(pairs) > 6 else ""
    return f"{where} prints text over text: {shown}{more}"


def install() -> None:
    """Check every figure just before it becomes a picture: :class:`OverlappingText` if texts overlap."""
    from matplotlib.backend_bases import FigureCanvasBase

    if getattr(FigureCanvasBase.print_figure, "checks_text", False):
        return
    print_figure = FigureCanvasBase.print_figure

    def checked(self, *args, **kwargs):
        pairs = overlaps(self.figure)
        if pairs:
            raise OverlappingText(describe(self.figure, pairs))
        return print_figure(self, *args, **kwargs)

    checked.checks_text = True
    FigureCanvasBase.print_figure = checked


STARTUP = """\
import sys as _sys
_sys.path.insert(0, {tests!r})
import figure_check as _figure_check
_figure_check.install()
del _sys, _figure_check
"""


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get("COURSE_FIGURE_CHECK") == "0":
        return   # an xdist worker inherits the controller's IPYTHONDIR
    home = Path(tempfile.mkdtemp(prefix="course-ipython-"))
    startup = home / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-figure-check.py").write_text(STARTUP.format(tests=str(Path(__file__).resolve().parent)))
    config.figure_check_home = (home, os.environ.get(ENV))
    os.environ[ENV] = str(home)


def pytest_unconfigure(config):
    home, before = getattr(config, "figure_check_home", (None, None))
    if home is None:
        return
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before
    shutil.rmtree(home, ignore_errors=True)


"""The course as a static HTML site, readable without installing anything.

``python notebooks/build_site.py [--chapters 00 02] [--out site] [--jobs 2]`` (``make site`` runs it)
executes every chapter notebook (``NN_*.ipynb``, in file-name order, which is chapter order) in its
default FAST mode and writes one HTML page per chapter plus ``index.html`` (the chapters with their
titles) to ``--out`` (default ``site/`` at the repository's root, which git ignores). Each page links
to the index and to the previous and next chapter. The pages are made from the notebooks as they
are: there is no second copy of the text to keep in step.

How the chapters run: nbclient, one fresh kernel per chapter, cwd ``notebooks/``, with the
environment of ``make lab``'s kernels plus the exercises' reference answers (``COURSE_ANSWERS=1``,
offline models, ``PYTHONPATH=notebooks`` for ``solutions`` and ``figures``, ``TRITON_INTERPRET``
unset so that the kernels take their torch paths on a CPU). The notebooks on disk are read, never
written, so a build leaves ``git status`` clean. Any cell that raises, runs past ``--timeout``, or
prints a traceback (a widget callback's error lands in its Output widget, not in the cell) fails
the build with a RuntimeError naming the chapter and the cell.

Why nbconvert's HTML exporter with its ``lab`` template: the course's pictures are matplotlib PNGs
and HTML outputs, which the exporter writes into the page itself (data URIs, no image files to
copy) with JupyterLab's own CSS, so a page looks like the notebook in the lab; it is already
installed with JupyterLab, and it renders one executed notebook without a site configuration of its
own. Jupyter Book and MyST render through a Node.js theme server (another toolchain to install) and
mkdocs-jupyter would add MkDocs and a second table of contents; both render ipywidgets by loading
the widget manager from a CDN, which a reader offline does not have. Three things the template
would fetch from a CDN are replaced, so a page needs no network and no JavaScript:

- widgets: each widget view becomes a still of its saved state (nbclient records every widget's
  state while it runs the chapter): its controls drawn as disabled HTML inputs at their values,
  then the outputs its Output widget held, or the picture its Image widget showed, at the end of
  the run (the chapter's picture at the widget's defaults, since each chapter's self-test puts the
  controls back);
- math: the ``$...$`` that nbconvert's markdown parser finds becomes MathML (``latex2mathml``),
  which browsers draw natively, instead of waiting for MathJax;
- require.js and mermaid, which no chapter uses, are left out.

Cells tagged ``ci-only`` (the chapters' self-tests of their widgets) run but are not shown; cells
tagged ``remove-input`` show their outputs only.

The file is not called ``site.py``: with ``notebooks/`` on every kernel's PYTHONPATH, that name would
shadow Python's own ``site`` module at interpreter start-up.
"""
from __future__ import annotations

import argparse
import base64
import glob
import html
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type, default

NOTEBOOKS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(NOTEBOOKS)
DEFAULT_OUT = os.path.join(ROOT, "site")
#: seconds a cell may run: ten times the slowest chapter cell on a busy 2-core machine
CELL_TIMEOUT_S = 180
#: a file the builder writes into its output folder: an existing folder without it is not a site this
#: script built, and is never cleared
MARKER = ".course-site"
HIDDEN_TAGS = {"ci-only"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Chapter:
    id: str      #: "00", "04a", ...: the file name up to its first underscore
    path: str    #: the .ipynb
    title: str   #: the first markdown heading, e.g. "00 · Setup, models and the cost of a forward pass"

    @property
    def page(self) -> str:
        return os.path.basename(self.path)[:-len(".ipynb")] + ".html"


def title_of(nb) -> str:
    """The text of the notebook's first markdown heading (its title); "" if it has none."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def chapters(selected: list[str] | None = None, src: str = NOTEBOOKS) -> list[Chapter]:
    """The chapters in order (all, or those whose id is in ``selected``); ValueError naming
    ``chapters`` for an id that matches no chapter notebook."""
    import nbformat

    found = []
    for path in sorted(glob.glob(os.path.join(src, "[0-9][0-9]*_*.ipynb"))):
        cid = os.path.basename(path).split("_", 1)[0]
        if selected is None or cid in selected:
            nb = nbformat.read(path, as_version=4)
            found.append(Chapter(cid, path, title_of(nb) or os.path.basename(path)))
    missing = sorted(set(selected or ()) - {c.id for c in found})
    if missing:
        ids = [os.path.basename(p).split("_", 1)[0] for p in sorted(glob.glob(os.path.join(src, "[0-9][0-9]*_*.ipynb")))]
        raise ValueError(f"chapters: no chapter notebook for {missing} in {src} (chapters: {' '.join(ids)})")
    return found


def kernel_env(base: dict | None = None) -> dict:
    """The kernels' environment: ``base`` (default: this process's) with the reference answers on,
    models offline, ``notebooks/`` on PYTHONPATH, and TRITON_INTERPRET removed (the kernels run their
    torch paths on a CPU; the interpreter would only make the chapters slower)."""
    env = dict(os.environ if base is None else base)
    env.pop("TRITON_INTERPRET", None)
    env.update(COURSE_ANSWERS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([NOTEBOOKS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return env


def describe(nb, index: int) -> str:
    """'cell 12 (In [7], first line: ...)' for error messages: the cell's index in the notebook
    (0-based, as nbformat and nbval count), its execution count and its first line."""
    cell = nb.cells[index]
    first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
    count = f"In [{cell.execution_count}], " if cell.get("execution_count") else ""
    return f"cell {index} ({count}first line: {first[:80]!r})"


class ShellChannel(AsyncZMQSocketChannel):
    """The shell channel of :class:`KernelClient`: it sends through its own asyncio socket.

    jupyter_client's ``Session.send`` writes to a blocking *shadow* of an asyncio socket. libzmq's
    send also processes the socket's pending commands (a reply's arrival among them) and, with them,
    consumes the wake-up on the socket's edge-triggered file descriptor. pyzmq's asyncio socket
    re-checks ``zmq.EVENTS`` after each send it makes itself, but never hears of the shadow's, so a
    reply that arrived just before such a send waits in the socket while the poll for it sleeps until
    its timeout (then nbclient reads it and goes on as if nothing happened). nbclient sends on the
    shell channel while it waits for a reply whenever an Output widget (every ``interact``) receives
    output: it mirrors the widget's new state back to the kernel. A busy machine widens the window
    between the reply's arrival and that send, which is why such cells stalled under load. Sending
    through the asyncio socket keeps pyzmq's bookkeeping, and the reply is read when it arrives
    (tests/test_site.py reproduces both, deterministically)."""

    def send(self, msg: dict) -> None:
        frames = self.session.serialize(msg) + list(msg.get("buffers") or [])
        self.socket.send_multipart(frames)   # a Future, already done unless the socket is full


class KernelClient(AsyncKernelClient):
    """nbclient's kernel client with :class:`ShellChannel`."""

    shell_channel_class = Type(ShellChannel)


class KernelManager(AsyncKernelManager):
    """nbclient's kernel manager, handing out :class:`KernelClient`, its kernels on IPC (Unix sockets under a
    path of the kernel's own in the temporary folder) where the platform has them. Over TCP, jupyter_client picks free
    ports by binding and closing them, and the kernel binds them later: a kernel starting meanwhile in
    another process can take one first (seen: "Address already in use", the kernel dead before its
    first reply, once in 50 two-chapter builds on a busy machine)."""

    @default("client_factory")
    def _client_factory_default(self):
        return KernelClient

    @default("transport")
    def _transport_default(self):
        return "tcp" if os.name == "nt" else "ipc"

    @default("ip")
    def _ip_default(self):  # jupyter_client's IPC default is a relative path, shared by every kernel in a cwd
        if self.transport == "ipc":
            return os.path.join(tempfile.gettempdir(), f"course-kernel-{uuid.uuid4().hex[:16]}")
        return super()._ip_default()


def execute(nb, name: str, timeout: int = CELL_TIMEOUT_S, cwd: str = NOTEBOOKS, env: dict | None = None):
    """Run every cell of ``nb`` (in place) in a fresh kernel; -> ``nb`` with its outputs and its
    widgets' saved state in ``nb.metadata.widgets``. A cell that raises or times out: RuntimeError
    naming ``name`` and the cell, with the error's last lines."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if timeout <= 0:
        raise ValueError(f"timeout: {timeout} s; a positive number of seconds per cell")
    client = NotebookClient(nb, timeout=timeout, kernel_name=nb.metadata.get("kernelspec", {}).get("name", "python3"),
                            resources={"metadata": {"path": cwd}}, store_widget_state=True,
                            kernel_manager_class=KernelManager)
    with client.setup_kernel(env=kernel_env() if env is None else env, cwd=cwd):
        for index, cell in enumerate(nb.cells):
            start = time.monotonic()
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError as e:
                raise RuntimeError(f"{name}: {describe(nb, index)} ran past {timeout} s per cell") from e
            except DeadKernelError as e:
                raise RuntimeError(f"{name}: the kernel died in {describe(nb, index)} (out of memory?)") from e
            except CellExecutionError as e:
                tail = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[-6:])  # no colours
                raise RuntimeError(f"{name}: {describe(nb, index)} raised {e.ename}: {e.evalue}\n{tail}") from e
            if time.monotonic() - start >= timeout:   # nbclient reads a late reply at its deadline and goes on
                raise RuntimeError(f"{name}: {describe(nb, index)} ran past {timeout} s per cell "
                                   "(its reply came only at the deadline)")
        client.set_widgets_metadata()
    return nb


def _outputs_problem(outputs) -> str | None:
    """What in ``outputs`` shows an error: an error output, or a traceback printed to stderr."""
    for out in outputs:
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
        if out.get("output_type") == "stream" and out.get("name") == "stderr" and TRACEBACK in out.get("text", ""):
            return "a traceback on stderr:\n" + out["text"][-1500:]
    return None


def _control_html(model: dict) -> str:
    """A disabled HTML input showing one control of a widget at its saved value."""
    s, name = model["state"], model.get("model_name") or model["state"].get("_model_name", "")
    label = html.escape(str(s.get("description", "")))
    label = f'<span class="widget-still-label">{label}</span> ' if label else ""
    if "Slider" in name and "value" in s:
        value = s["value"]
        lo, hi = (value if isinstance(value, list) else [value, value])[:2]
        readout = f"{lo}" if not isinstance(value, list) else f"{lo} – {hi}"
        return (f'<label class="widget-still-control">{label}<input type="range" disabled min="{s.get("min", "")}" '
                f'max="{s.get("max", "")}" step="{s.get("step") or "any"}" value="{html.escape(str(lo))}"> '
                f'<output>{html.escape(readout)}</output></label>')
    if "Progress" in name:       # a progress bar (tqdm's, say)
        return (f'<label class="widget-still-control">{label}<progress max="{s.get("max", 100)}" '
                f'value="{s.get("value", 0)}"></progress></label>')
    if "_options_labels" in s:   # Dropdown, RadioButtons, ToggleButtons, Select
        index = s.get("index")
        picked = [index] if isinstance(index, int) else list(index or [])
        options = "".join(f'<option{" selected" if i in picked else ""}>{html.escape(str(o))}</option>'
                          for i, o in enumerate(s["_options_labels"]))
        return f'<label class="widget-still-control">{label}<select disabled>{options}</select></label>'
    if name in ("CheckboxModel", "ToggleButtonModel"):
        checked = " checked" if s.get("value") else ""
        return f'<label class="widget-still-control">{label}<input type="checkbox" disabled{checked}></label>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'<div class="widget-still-control">{label}{s.get("value", "")}</div>'
    if name == "ButtonModel":
        return f'<button class="widget-still-control" disabled>{label or html.escape(str(s.get("description", "")))}</button>'
    if "value" in s:             # Text, Textarea, Label, number boxes, ...
        return (f'<label class="widget-still-control">{label}<input type="text" disabled '
                f'value="{html.escape(str(s["value"]))}"></label>')
    return ""


def _image_output(model: dict) -> list[dict]:
    """The picture an Image widget shows, as a display_data output ([] if it has none yet). Its
    bytes travel as a binary buffer, which nbclient saves base64-encoded beside the state."""
    import nbformat

    s = model["state"]
    data = next((b["data"] for b in model.get("buffers", []) if list(b.get("path", [])) == ["value"]), None)
    data = data or (s.get("value") if isinstance(s.get("value"), str) else None)
    if not data:
        return []
    fmt = s.get("format") or "png"
    mime = "image/svg+xml" if fmt.startswith("svg") else f"image/{fmt}"
    if mime == "image/svg+xml":
        data = base64.b64decode(data).decode("utf-8")
    width = str(s.get("width") or "")
    return [nbformat.v4.new_output("display_data", data={mime: data, "text/plain": "(the widget's picture)"},
                                   metadata={mime: {"width": int(width)}} if width.isdigit() else {})]


def widget_still(model_id: str, state: dict, where: str) -> list[dict]:
    """The outputs that stand for widget ``model_id`` on a static page: its controls (one HTML
    output, class ``widget-still``) followed by what its Output widgets hold and the pictures its
    Image widgets show, boxes walked in order. RuntimeError naming ``where`` if the widget has no
    saved state or one of its outputs is an error."""
    import nbformat

    outputs, controls = [], []

    def flush():
        if controls:
            outputs.append(nbformat.v4.new_output("display_data", data={
                "text/html": f'<div class="widget-still" data-model-id="{model_id}">{"".join(controls)}</div>',
                "text/plain": "(the widget's controls at their saved values)"}))
            controls.clear()

    def walk(mid: str):
        if mid not in state:
            raise RuntimeError(f"{where}: widget {mid} has no saved state (nbclient records it while the chapter runs)")
        model = state[mid]
        s = model["state"]
        kind = model.get("model_name") or s.get("_model_name")
        if kind == "OutputModel":
            problem = _outputs_problem(s.get("outputs", []))
            if problem:
                raise RuntimeError(f"{where}: the widget's output is an error: {problem}")
            flush()
            outputs.extend(nbformat.from_dict(o) for o in s.get("outputs", []))
        elif kind == "ImageModel":
            flush()
            outputs.extend(_image_output(model))
        elif isinstance(s.get("children"), list):
            for child in s["children"]:
                walk(str(child).removeprefix("IPY_MODEL_"))
        else:
            piece = _control_html(model)
            if piece:
                controls.append(piece)

    walk(model_id)
    flush()
    if not outputs:   # a widget with nothing to draw still says that a widget stood here
        outputs.append(nbformat.v4.new_output("display_data", data={
            "text/html": f'<div class="widget-still" data-model-id="{model_id}">(an interactive widget: run the '
                         "notebook to use it)</div>", "text/plain": "(an interactive widget)"}))
    return outputs


def prepare(nb, name: str):
    """``nb`` as the page shows it (in place): every widget view replaced by its still
    (:func:`widget_still`), the widget state dropped (no widget manager is loaded), ``ci-only`` cells
    hidden, ``remove-input`` cells' source hidden. RuntimeError naming ``name`` and the cell for an
    error or a printed traceback in any output."""
    from nbconvert.preprocessors import TagRemovePreprocessor

    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        problem = _outputs_problem(cell.outputs)
        if problem:
            raise RuntimeError(f"{name}: {describe(nb, index)} shows an error: {problem}")
        shown = []
        for out in cell.outputs:
            view = out.get("data", {}).get(WIDGET_VIEW)
            shown.extend(widget_still(view["model_id"], state, f"{name}: {describe(nb, index)}") if view else [out])
        cell.outputs = shown
    TagRemovePreprocessor(remove_cell_tags=HIDDEN_TAGS, remove_input_tags={"remove-input"}).preprocess(nb, {})
    return nb


NAV_CSS = """
.course-nav { display: flex; justify-content: space-between; gap: 1em; max-width: 1100px; margin: 0 auto;
  padding: 0.6em 1em; font-family: var(--jp-ui-font-family, sans-serif); font-size: 14px; }
.course-nav a { text-decoration: none; color: #1a5fb4; }
.course-nav a:hover { text-decoration: underline; }
.course-nav .prev, .course-nav .next { flex: 1; }
.course-nav .next { text-align: right; }
.course-nav .up { text-align: center; }
nav.course-nav.top { border-bottom: 1px solid #ddd; }
nav.course-nav.bottom { border-top: 1px solid #ddd; margin-top: 2em; }
.widget-still { display: flex; flex-wrap: wrap; gap: 0.4em 1.5em; padding: 0.4em 0.6em; border: 1px dashed #bbb;
  border-radius: 4px; background: #fafafa; font-size: 13px; }
.widget-still-control { display: inline-flex; align-items: center; gap: 0.4em; }
.widget-still-control output { font-family: var(--jp-code-font-family, monospace); }
"""

TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.course_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}
<nav class="course-nav top">{{ resources.course_nav }}</nav>
{%- endblock body_header -%}
{%- block body_footer -%}
<nav class="course-nav bottom">{{ resources.course_nav }}</nav>
{{ super() }}
{%- endblock body_footer -%}
"""


def math_to_mathml(tex: str, display: bool) -> str:
    """MathML for the LaTeX ``tex`` (``latex2mathml``); ValueError naming ``tex`` if it cannot be read
    or uses a command the converter does not know (it would copy that through as text)."""
    import latex2mathml.converter

    # \arg is the one standard operator name latex2mathml lacks: written as the operator it stands for
    tex = re.sub(r"\\arg(?![A-Za-z])", r"\\operatorname{arg}", tex)
    try:
        mathml = latex2mathml.converter.convert(tex, display="block" if display else "inline")
    except Exception as e:   # the converter raises its own exception types for TeX it cannot parse
        raise ValueError(f"tex: cannot convert {tex!r} to MathML ({type(e).__name__}: {e})") from e
    unknown = re.findall(r">(\\[A-Za-z]+)<", mathml)   # a command it does not know is copied through as text
    if unknown:
        raise ValueError(f"tex: {tex!r} uses {sorted(set(unknown))}, which latex2mathml does not know")
    return mathml


def exporter():
    """nbconvert's HTML exporter with the lab template, less its CDN scripts (:data:`TEMPLATE`), and
    math rendered to MathML by nbconvert's own markdown parser (which keeps code spans and escaped
    dollars out of the math)."""
    import jinja2
    from nbconvert import HTMLExporter
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class MathMLRenderer(IPythonRenderer):
        def inline_math(self, body):
            return math_to_mathml(body, display=False)

        def block_math(self, body):
            return math_to_mathml(body, display=True)

        def latex_environment(self, name, body):
            return math_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

    class CourseExporter(HTMLExporter):
        @jinja2.pass_context
        def markdown2html(self, context, source):
            cell = context.get("cell", {})
            renderer = MathMLRenderer(escape=False, attachments=cell.get("attachments", {}), embed_images=True,
                                      path=NOTEBOOKS, anchor_link_text=self.anchor_link_text,
                                      exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
            return MarkdownWithMath(renderer=renderer).render(source)

    return CourseExporter(template_name="lab", extra_loaders=[jinja2.DictLoader({"course.html.j2": TEMPLATE})],
                          template_file="course.html.j2")


def nav(chapter: Chapter, prev: Chapter | None, nxt: Chapter | None) -> str:
    """The navigation bar of a chapter's page: previous chapter, the index, next chapter."""
    def link(c, cls, arrow_before="", arrow_after=""):
        return (f'<span class="{cls}"><a href="{c.page}" rel="{cls}">{arrow_before}{html.escape(c.title)}{arrow_after}'
                f'</a></span>' if c else f'<span class="{cls}"></span>')
    return (link(prev, "prev", "← ") + '<span class="up"><a href="index.html" rel="index">All chapters</a></span>'
            + link(nxt, "next", "", " →"))


def render(nb, chapter: Chapter, prev: Chapter | None, nxt: Chapter | None) -> str:
    """The chapter's page: ``nb`` (executed and prepared) with the navigation bar above and below."""
    nb.metadata["title"] = chapter.title
    resources = {"metadata": {"name": chapter.title, "path": NOTEBOOKS}, "course_css": NAV_CSS,
                 "course_nav": nav(chapter, prev, nxt)}
    try:
        body, _ = exporter().from_notebook_node(nb, resources=resources)
    except ValueError as e:
        raise ValueError(f"{os.path.basename(chapter.path)}: {e}") from e
    return body


def index_page(chs: list[Chapter]) -> str:
    """index.html: the chapters in order, each a link to its page."""
    items = "\n".join(f'<li><a href="{c.page}">{html.escape(c.title)}</a></li>' for c in chs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>Fast LLM decoding, step by step</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 800px; margin: 2em auto;
  padding: 0 1em; line-height: 1.5; color: #222; }}
a {{ color: #1a5fb4; text-decoration: none; }} a:hover {{ text-decoration: underline; }}
ol.chapters {{ list-style: none; padding: 0; }} ol.chapters li {{ padding: 0.3em 0; border-bottom: 1px solid #eee; }}
</style></head>
<body>
<h1>Fast LLM decoding, step by step</h1>
<p>A notebook course on fast decoding for large language models: every chapter below as it runs, with its
outputs, pictures and widgets (shown at their defaults). To run and change them, clone the repository and
run <code>make lab</code>.</p>
<ol class="chapters">
{items}
</ol>
</body></html>
"""


def build_chapter(chapter: Chapter, prev: Chapter | None, nxt: Chapter | None, out: str, timeout: int) -> str:
    """Execute, prepare and render one chapter into ``out``; -> the page's path."""
    import nbformat

    name = os.path.basename(chapter.path)
    nb = nbformat.read(chapter.path, as_version=4)
    execute(nb, name, timeout=timeout)
    prepare(nb, name)
    page = os.path.join(out, chapter.page)
    with open(page, "w", encoding="utf-8") as f:
        f.write(render(nb, chapter, prev, nxt))
    return page


def clear(out: str) -> None:
    """Empty the output folder ``out`` (create it if absent); ValueError naming ``out`` if it holds
    files and is not a site this script built (no :data:`MARKER`), so that no other folder is ever
    cleared."""
    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"out: {out} is a file, not a folder")
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.exists(os.path.join(out, MARKER)):
            raise ValueError(f"out: {out} is not empty and is not a site built by this script (no {MARKER}); "
                             "name an empty or new folder")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write("built by notebooks/build_site.py; this folder is emptied on the next build\n")


def build(out: str = DEFAULT_OUT, selected: list[str] | None = None, jobs: int = 1,
          timeout: int = CELL_TIMEOUT_S, src: str = NOTEBOOKS) -> list[str]:
    """Build the site of the chapters in ``src`` into ``out``: -> the paths of the pages written,
    index.html first. ``jobs`` chapters run at once (one kernel each); the first failing chapter, in
    chapter order, raises, the chapters still running are stopped and those not started yet are not run."""
    if jobs < 1:
        raise ValueError(f"jobs: {jobs}; at least 1")
    if timeout <= 0:
        raise ValueError(f"timeout: {timeout} s; a positive number of seconds per cell")
    chs = chapters(selected, src)
    clear(out)
    tasks = [(c, chs[i - 1] if i else None, chs[i + 1] if i + 1 < len(chs) else None, out, timeout)
             for i, c in enumerate(chs)]
    if jobs == 1:
        pages = [build_chapter(*t) for t in tasks]
    else:
        # spawned workers (a fork would copy this process's threads mid-flight); leaving the block
        # terminates them, so a failure stops the chapters still running, and their kernels follow
        # their parents out (ipykernel watches its parent's pid)
        with multiprocessing.get_context("spawn").Pool(min(jobs, len(tasks))) as pool:
            running = [pool.apply_async(build_chapter, t) for t in tasks]
            pages = [r.get() for r in running]
    index = os.path.join(out, "index.html")
    with open(index, "w", encoding="utf-8") as f:
        f.write(index_page(chs))
    return [index] + pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chapters", nargs="+", metavar="ID", help="chapter ids (00 02 04a ...); default: all")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: site/ at the repository's root)")
    p.add_argument("--jobs", type=int, default=1, help="chapters executed at once (one kernel each)")
    p.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help=f"seconds a cell may run (default {CELL_TIMEOUT_S})")
    p.add_argument("--src", default=NOTEBOOKS, help="folder of the chapter notebooks (default: notebooks/)")
    args = p.parse_args(argv)
    try:
        pages = build(args.out, args.chapters, args.jobs, args.timeout, args.src)
    except (RuntimeError, ValueError) as e:   # what failed, without this script's own stack
        print(f"make site failed: {e}", file=sys.stderr)
        return 1
    print(f"{len(pages) - 1} chapters written to {os.path.abspath(args.out)}; open {pages[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make site` (notebooks/build_site.py): the executed chapters as static HTML, checked in a real browser.

Two fast chapters (00 and 02, both with a widget) are built into a temporary folder by the script's
own command line, exactly as ``make site`` runs it, and each page is opened in Chromium through
Playwright with every request outside the folder refused: every page loads, makes no network request,
every picture has decoded (``naturalWidth > 0``), no output shows an error or a traceback, every
relative link and in-page anchor resolves, the index lists both chapters, the previous/next links
walk the chapters in order, and each widget is shown as a still at its default values (chapter 00's
plot, chapter 02's coloured text at gamma 4, although the chapter's self-test moves the slider).
The build must leave ``git status`` as it found it (no new untracked file, the notebooks unchanged).

Negative controls: a notebook whose cell raises, and one whose widget's callback raises (the error
lands in its Output widget, not in the cell), each fail the build with an error naming the cell.

The browser tests need a system Chromium (as tests/test_browser.py) and skip without one; the
builder's own checks run everywhere.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import procs
from site_builder import SCRIPT, builder, write_notebook

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ("00", "02")
BUILD_TIMEOUT_S = 240   # CI takes far less; this machine is shared
CELL_TIMEOUT_S = 60     # the slowest cell of 00 and 02 takes a few seconds; shorter than the build's limit
CANDIDATES = ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("google-chrome"))
CHROMIUM = os.environ.get("CHROMIUM") or next((p for p in CANDIDATES if p and os.access(p, os.X_OK)), "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]

pytestmark = pytest.mark.slow




def traces() -> set[str]:
    """What a build could leave in the work tree: untracked files that git does not ignore (a chapter
    writing into its cwd, notebooks/) and changes to the built notebooks (one saved back). Other
    tracked files are left out, so that someone editing them meanwhile does not fail the test."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    built = {os.path.relpath(c.path, ROOT) for c in builder.chapters(list(CHAPTERS))}
    return {ln for ln in out.splitlines() if ln.startswith("??") or ln[3:] in built}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site of chapters 00 and 02, built by the script's command line; -> (folder, pages)."""
    out = tmp_path_factory.mktemp("site") / "site"
    before = traces()
    run = procs.run([sys.executable, str(SCRIPT), "--chapters", *CHAPTERS, "--out", str(out), "--jobs", "2",
                     "--timeout", str(CELL_TIMEOUT_S)], timeout=BUILD_TIMEOUT_S, cwd=ROOT)
    print(f"site of chapters {' '.join(CHAPTERS)} built in {run.seconds:.0f} s")
    assert not run.timed_out, f"the build ran past {BUILD_TIMEOUT_S} s (stopped):\n{run.stderr[-3000:]}"
    assert run.returncode == 0, f"the build failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert not procs.survivors(run.tag), "the build left processes running"
    assert traces() <= before, f"the build changed the work tree: {sorted(traces() - before)}"
    pages = sorted(p.name for p in out.glob("*.html"))
    return out, pages


def test_the_build_writes_the_index_and_one_page_per_chapter(site):
    out, pages = site
    chapters = builder.chapters(list(CHAPTERS))
    assert pages == sorted(["index.html"] + [c.page for c in chapters])
    assert [c.id for c in chapters] == list(CHAPTERS) and all(c.title.startswith(c.id + " ·") for c in chapters)


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium (tried $CHROMIUM, /usr/bin/chromium, chromium and google-chrome on PATH): install "
                    "Debian's package (`apt-get install -y chromium`, as .ci/run does) or set CHROMIUM=/path/to/chrome")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is missing: pip install -e '.[test]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


# what a page shows that it should not, and what it links to
PAGE_REPORT = """() => {
    const errors = [];
    for (const el of document.querySelectorAll('.jp-OutputArea-output')) {
        const text = el.innerText;
        if (text.includes('Traceback (most recent call last)')) errors.push('a traceback: ' + text.slice(-300));
        if (el.dataset.mimeType === 'application/vnd.jupyter.stderr' && /Error|Exception/.test(text))
            errors.push('an error on stderr: ' + text.slice(-300));
    }
    const images = [...document.images].map(i => ({src: i.src.slice(0, 60), ok: i.complete && i.naturalWidth > 0}));
    const links = [...document.querySelectorAll('a[href]')].map(a => ({href: a.getAttribute('href'), url: a.href}));
    const ids = new Set([...document.querySelectorAll('[id]')].map(e => e.id));
    // a fragment names an id as written or percent-decoded (the HTML standard tries both)
    const anchors = links.filter(l => l.href.startsWith('#')).map(l => l.href.slice(1))
        .filter(id => !ids.has(id) && !ids.has(decodeURIComponent(id)));
    return {errors, images, links, missingAnchors: anchors, text: document.body.innerText};
}"""


def open_page(browser, url, requests):
    """A page at ``url`` with every request recorded in ``requests``; requests that leave the site's
    folder (a CDN, say) are refused, so the page is seen as a reader offline sees it."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.on("request", lambda r: requests.append(r.url))
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
               else route.abort())
    page.goto(url, wait_until="load")
    return page


def test_every_page_renders_offline_with_its_pictures_and_no_error(browser, site, tmp_path):
    out, pages = site
    for name in pages:
        requests = []
        page = open_page(browser, (out / name).as_uri(), requests)
        try:
            report = page.evaluate(PAGE_REPORT)
            shot = tmp_path / (name[:-5] + ".png")
            page.screenshot(path=str(shot), full_page=True)
            print(f"{name}: {len(report['images'])} pictures, screenshot {shot}")
        finally:
            page.close()
        assert not report["errors"], f"{name}: {report['errors']}"
        broken = [i["src"] for i in report["images"] if not i["ok"]]
        assert not broken, f"{name}: pictures that did not decode: {broken}"
        outside = [u for u in requests if not u.startswith(("file:", "data:"))]
        assert not outside, f"{name} requests the network (it must render offline): {outside}"
        assert not report["missingAnchors"], f"{name}: in-page links to no element: {report['missingAnchors']}"
        for link in report["links"]:
            if link["href"].startswith(("http:", "https:", "mailto:", "#")):
                continue
            target = Path(unquote(urlparse(link["url"]).path))
            assert target.exists(), f"{name}: the link {link['href']!r} leads nowhere ({target})"
        if name != "index.html":
            assert len(report["images"]) >= 1, f"{name}: a chapter page with no picture"
            assert "CI's self-test" not in report["text"], f"{name}: a ci-only cell is shown"


def test_the_index_lists_the_chapters_and_the_links_walk_them_in_order(browser, site):
    out, pages = site
    chapters = builder.chapters(list(CHAPTERS))
    page = open_page(browser, (out / "index.html").as_uri(), [])
    try:
        listed = page.eval_on_selector_all("ol.chapters a", "as => as.map(a => [a.getAttribute('href'), a.innerText])")
        assert listed == [[c.page, c.title] for c in chapters]
        page.click(f"text={chapters[0].title}")
        page.wait_for_load_state()
        assert page.url.endswith(chapters[0].page)
        assert page.locator("nav.course-nav.top a[rel=prev]").count() == 0, "the first chapter has no previous"
        page.click("nav.course-nav.top a[rel=next]")
        page.wait_for_load_state()
        assert page.url.endswith(chapters[1].page)
        assert page.locator("nav.course-nav.top a[rel=next]").count() == 0, "the last chapter has no next"
        assert page.locator("h1").first.inner_text().startswith(chapters[1].title)
        page.click("nav.course-nav.bottom a[rel=prev]")
        page.wait_for_load_state()
        assert page.url.endswith(chapters[0].page)
        page.click("nav.course-nav.top a[rel=index]")
        page.wait_for_load_state()
        assert page.url.endswith("index.html")
    finally:
        page.close()


# each still (the controls) with what follows it in its cell: the pictures and the text of its Output widget
STILLS = """() => [...document.querySelectorAll('.widget-still')].map(still => {
    const child = still.closest('.jp-OutputArea-child');
    const after = [];
    for (let n = child.nextElementSibling; n; n = n.nextElementSibling) after.push(n);
    return {
        controls: [...still.querySelectorAll('input[type=range]')].map(i => [i.closest('label').innerText.trim(), i.value]),
        disabled: [...still.querySelectorAll('input, select')].every(i => i.disabled),
        images: after.flatMap(n => [...n.querySelectorAll('img')]).map(i => i.naturalWidth),
        text: after.map(n => n.innerText).join('\\n'),
    };
})"""


def test_each_widget_is_shown_as_a_still_at_its_defaults(browser, site):
    out, _ = site
    stills = {}
    for chapter in builder.chapters(list(CHAPTERS)):
        source = Path(chapter.path[:-len(".ipynb")] + ".py").read_text()
        page = open_page(browser, (out / chapter.page).as_uri(), [])
        try:
            stills[chapter.id] = page.evaluate(STILLS)
            assert not page.locator("script[type='application/vnd.jupyter.widget-view+json']").count()
        finally:
            page.close()
        if "import ipywidgets" in source:
            assert stills[chapter.id], f"{chapter.page}: the chapter has a widget and the page no still of it"
            assert all(s["disabled"] for s in stills[chapter.id])
    # 00: the speed-up plot at alpha 0.8, c 0.05 (its self-test moves c to 0.3 and back)
    (s00,) = stills["00"]
    assert [c[1] for c in s00["controls"]] == ["0.8", "0.05"] and s00["images"] and min(s00["images"]) > 0
    # 02: the text coloured by what made each token, at gamma 4 (its self-test moves gamma to 1 and back)
    (s02,) = stills["02"]
    assert s02["controls"][0][1] == "4" and "gamma 4:" in s02["text"] and "target calls" in s02["text"]


def test_a_cell_that_raises_fails_the_build_naming_the_chapter_and_the_cell(tmp_path):
    write_notebook(tmp_path / "src", "98_raises.ipynb", ["x = 1", "raise ZeroDivisionError('no such luck')", "y = 2"])
    with pytest.raises(RuntimeError, match=r"98_raises\.ipynb: cell 2 .*raise ZeroDivisionError.*ZeroDivisionError: no such luck"):
        builder.build(str(tmp_path / "out"), src=str(tmp_path / "src"))


def test_a_widget_whose_callback_raises_fails_the_build_naming_the_cell(tmp_path):
    """interact catches the callback's error and shows it in the widget's Output: the cell itself
    passes, the still would show a traceback, so the build must fail."""
    write_notebook(tmp_path / "src", "97_widget.ipynb", [
        "import ipywidgets as widgets\n\ndef f(k=1):\n    return 1 / (k - 1)\n\nwidgets.interact(f, k=widgets.IntSlider(value=1));"])
    with pytest.raises(RuntimeError, match=r"97_widget\.ipynb: cell 1 .*ZeroDivisionError"):
        builder.build(str(tmp_path / "out"), src=str(tmp_path / "src"))


def test_bad_arguments_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="chapters: .*'99z'"):
        builder.chapters(["00", "99z"])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a site")
    with pytest.raises(ValueError, match="out: .*not a site built by this script"):
        builder.build(str(tmp_path / "mine"), selected=["00"])
    assert (tmp_path / "mine" / "notes.txt").exists(), "a folder that is not a site is never cleared"
    with pytest.raises(ValueError, match="jobs"):
        builder.build(str(tmp_path / "new"), jobs=0)
    with pytest.raises(ValueError, match="tex: "):
        builder.math_to_mathml(r"\frac{1}{", display=False)


def test_a_widget_with_no_saved_state_is_an_error():
    with pytest.raises(RuntimeError, match="where: widget abc has no saved state"):
        builder.widget_still("abc", {}, "where")


def test_a_still_holds_the_controls_then_the_picture_of_an_output_or_image_widget():
    """interact's layout (controls, then an Output widget holding the plot) and an Image widget's
    (controls, then the PNG, which nbclient saves as a base64 buffer beside the state)."""
    png = "iVBORw0KGgo="
    slider = {"model_name": "IntSliderModel", "state": {"_model_name": "IntSliderModel", "description": "k", "value": 3,
                                                         "min": 0, "max": 9, "step": 1}}
    out = {"model_name": "OutputModel", "state": {"_model_name": "OutputModel", "outputs": [
        {"output_type": "display_data", "data": {"image/png": png, "text/plain": "<Figure>"}, "metadata": {}}]}}
    image = {"model_name": "ImageModel", "state": {"_model_name": "ImageModel", "format": "png", "width": "320"},
             "buffers": [{"path": ["value"], "data": png, "encoding": "base64"}]}
    for last in (out, image):
        state = {"box": {"model_name": "VBoxModel", "state": {"_model_name": "VBoxModel",
                                                              "children": ["IPY_MODEL_s", "IPY_MODEL_last"]}},
                 "s": slider, "last": last}
        controls, picture = builder.widget_still("box", state, "here")
        assert 'class="widget-still"' in controls["data"]["text/html"] and 'value="3"' in controls["data"]["text/html"]
        assert picture["data"]["image/png"] == png
    bad = dict(out, state=dict(out["state"], outputs=[{"output_type": "error", "ename": "KeyError", "evalue": "'x'",
                                                       "traceback": []}]))
    with pytest.raises(RuntimeError, match="here: the widget's output is an error: KeyError"):
        builder.widget_still("o", {"o": bad}, "here")

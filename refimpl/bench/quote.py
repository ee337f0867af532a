"""Tables quoted in the README and docs/, generated from the committed results in ``bench_results/``.

``python -m refimpl.bench.quote`` rewrites every block between ``<!-- quote:NAME -->`` and
``<!-- /quote -->`` in README.md and docs/*.md with the table :data:`QUOTES` makes for NAME from its
JSON file; ``--check`` writes nothing and exits 1 when a block differs (``tests/test_docs.py`` runs
it). A number quoted in a table therefore cannot drift from the file it comes from: re-run a suite,
commit its JSON, run this command.

A single figure in prose is quoted inline, on one line, in the same files and in the chapters
(``notebooks/NN_*.py``: a markdown cell renders the comments invisible)::

    the dynamic tree runs at <!-- quote:capstone/capstone_smollm2-135m|dynamic_tree [cpu]|speedup -->1.04x<!-- /quote --> AR

``FILE|ROW|FIELD``: FILE is a JSON under ``bench_results/`` without ``.json``; ROW picks exactly one of its
``rows``, either by method name or by ``key=value`` pairs joined with ``&`` (``k=16``,
``model=tiny-cllm&method=jacobi (window 16)``), empty for the file's top level; FIELD is a key, dotted
into nested dicts (``per_category_tau.chat``), or ``a/b``, a ratio of two keys. The text between the
markers is ``[~]NUMBER[x|%]``: ``--check`` fails unless the field, rounded to the decimals written
(times 100 for ``%``), gives NUMBER, and a rewrite writes the JSON's figure at those decimals.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

from .decode import category_speedups
from .decode import markdown_table as table  # (rows, [(key, header, format)]) -> markdown; None prints '-'

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench_results")
BLOCK = re.compile(r"(<!-- quote:([\w-]+) -->\n)(.*?)(<!-- /quote -->)", re.S)
INLINE = re.compile(r"(<!-- quote:([^|>\n]+)\|([^|>\n]*)\|([^|>\n]+) -->)([^<\n]*)(<!-- /quote -->)")
FIGURE = re.compile(r"(~?)(-?\d+(?:\.(\d+))?)(x|%)?")

#: method families of the headline table: (label, chapters)
FAMILIES = [("draft model (ch 02-04)", ("02", "03", "04a", "04b")), ("token tree (ch 05)", ("05",)),
            ("heads and feature drafts (ch 06a-06b)", ("06", "06a", "06b")), ("Jacobi / lookahead (ch 07-08)", ("07", "08")),
            ("retrieval (ch 09)", ("09",)), ("parallel drafters (ch 15b)", ("15b",))]


def load(rel: str) -> dict:
    with open(os.path.join(RESULTS, rel)) as f:
        return json.load(f)


CAPSTONE_COLS = [("chapter", "ch", ""), ("method", "method", ""), ("tokens_per_s", "tokens/s", ".1f"),
                 ("speedup", "speed-up vs AR", ".2f"), ("tau", "tau", ".2f"),
                 ("target_nfe_per_token", "target NFE/token", ".2f"), ("draft_calls_per_step", "draft calls / step", ".2f"),
                 ("step_cost", "step cost (AR steps)", ".2f"), ("exact", "exact vs AR greedy", ".0%")]
DECODE_COLS = [("method", "method", ""), ("speedup", "speed-up vs AR", ".2f"), ("tau", "tau", ".2f"),
               ("target_nfe_per_token", "target NFE/token", ".2f"), ("exact", "exact vs AR greedy", ".0%")]
TREE_COLS = [("method", "method", ""), ("tokens_per_s", "tokens/s", ".1f"), ("speedup", "speed-up vs AR", ".2f"),
             ("tau", "tau", ".2f"), ("draft_calls_per_step", "draft calls / step", ".2f"),
             ("step_cost", "step cost (AR steps)", ".2f"), ("exact", "exact vs AR greedy", ".0%")]
PRODUCTION_COLS = [("method", "method", ""), ("engine", "engine", ""), ("tokens_per_s", "tokens/s", ".1f"),
                   ("speedup_vs_own_ar", "speed-up vs own AR", ".2f"), ("tau", "tau", ".2f"),
                   ("step_ms", "ms / step", ".1f"), ("step_cost_ar_steps", "step cost (own AR steps)", ".2f"),
                   ("exact", "tokens == our AR", ".0%"),
                   ("mean_acceptance_length", "vLLM mean acceptance length", ".2f")]
DLLM_COLS = [("task", "task", ""), ("method", "method", ""), ("nfe_per_row", "NFE/row", ".2f"),
             ("tokens_per_s", "tokens/s", ".0f"), ("accuracy", "accuracy", ".1%"),
             ("perplexity", "ppl under tiny", ".1f"), ("repetition", "repeated 3-grams", ".1%")]
LEARNED_COLS = [("task", "task", ""), ("model", "model", ""), ("method", "method", ""),
                ("tokens_per_call", "tokens / call", ".2f"), ("speedup", "speed-up vs AR", ".2f"),
                ("exact", "= own AR greedy", ""), ("perplexity", "ppl under tiny", ".2f"),
                ("repetition", "repeated 3-grams", ".1%")]


def lossless_greedy(r: dict) -> bool:
    """A row of ours that decodes greedily and equals AR greedy on every prompt (no HF row, no lossy one)."""
    return r.get("exact") == 1.0 and not r.get("lossy") and not r["method"].startswith("hf ")


def capstone(rel: str) -> str:
    return table(load(rel)["rows"], CAPSTONE_COLS)


def categories(rel: str) -> str:
    """Speed-up vs AR / tau per prompt category, every row of the run."""
    rows = load(rel)["rows"]
    ar = next(r for r in rows if r["method"] == "ar (cache)")
    base = ar["per_category_tokens_per_s"]
    out = []
    for r in rows:
        row, speedups = {"method": r["method"]}, category_speedups(r, ar)
        for c in base:
            tau = (r.get("per_category_tau") or {}).get(c)
            row[c] = f"{speedups[c]:.2f}x / " + ("-" if tau is None else f"{tau:.2f}")
        out.append(row)
    return table(out, [("method", "method (speed-up / tau)", "")] + [(c, c, "") for c in base])


def winners(rel: str) -> str:
    """The fastest lossless greedy method per prompt category, with the runner-up."""
    rows = [r for r in load(rel)["rows"] if lossless_greedy(r) and r["method"] != "ar (cache)"]
    ar = next(r for r in load(rel)["rows"] if r["method"] == "ar (cache)")
    speedups = {r["method"]: category_speedups(r, ar) for r in rows}
    out = []
    for c in ar["per_category_tokens_per_s"]:
        ranked = sorted(rows, key=lambda r: -speedups[r["method"]][c])
        sp = [speedups[r["method"]][c] for r in ranked[:2]]
        out.append({"category": c, "winner": ranked[0]["method"], "speed-up": f"{sp[0]:.2f}x",
                    "runner-up": f"{ranked[1]['method']} ({sp[1]:.2f}x)"})
    return table(out, [("category", "category", ""), ("winner", "fastest lossless method", ""),
                       ("speed-up", "speed-up vs AR", ""), ("runner-up", "runner-up", "")])


def headline(rel: str, production_rel: str) -> str:
    """The best lossless greedy method of each family next to AR and HF ``generate`` (the capstone run), and
    vLLM's AR and fastest speculative method next to our AR (the ``make production`` run: another run, fewer
    prompts, so each block compares within its own run)."""
    result = load(rel)
    rows = result["rows"]
    later = {name: run for run in result.get("added_runs", []) for name in run["rows"]}
    ar = next(r for r in rows if r["method"] == "ar (cache)")
    out = [{"family": "autoregressive (ch 01)", **ar}, {"family": "Hugging Face", **next(r for r in rows if r["method"] == "hf generate")}]
    for label, chapters in FAMILIES:
        best = max((r for r in rows if r["chapter"] in chapters and lossless_greedy(r)), key=lambda r: r["speedup"])
        out.append({"family": label, **best})
    n = len(rows[0].get("per_category_tokens_per_s", {})) and rows[0]["prompts"]
    for r in out:
        run = later.get(r["method"])
        r["run"] = f"capstone, {n} prompts" + (f", a later run (its AR {run['ar_tokens_per_s']:.1f} tok/s)" if run else "")
    prod = load(production_rel)
    ours = next(r for r in prod["rows"] if r["engine"] == "ours" and r["method"] == "ar")
    vllm = [r for r in prod["rows"] if r["engine"] == "vllm" and "error" not in r]
    spec = max((r for r in vllm if r["method"] != "ar"), key=lambda r: r["tokens_per_s"])
    for r, label in ((next(r for r in vllm if r["method"] == "ar"), "vLLM AR"), (spec, "vLLM speculative")):
        out.append({"family": label, "method": f"vLLM {r['method']}", "tokens_per_s": r["tokens_per_s"],
                    "speedup": r["tokens_per_s"] / ours["tokens_per_s"], "tau": r["tau"], "exact": r["exact"],
                    "run": f"production, {len(prod['prompts'])} prompts (our AR {ours['tokens_per_s']:.1f} tok/s)"})
    return table(out, [("family", "family", ""), ("method", "best lossless method", ""), ("tokens_per_s", "tokens/s", ".1f"),
                       ("speedup", "speed-up vs our AR", ".2f"), ("tau", "tau", ".2f"),
                       ("exact", "== AR greedy", ".0%"), ("run", "run", "")])


def production(rel: str) -> str:
    return table(load(rel)["rows"], PRODUCTION_COLS)


def production_map(rel: str) -> str:
    from .production import production_map as render  # the one table of the map

    return render(load(rel))


#: NAME -> (what makes the table, its arguments: files under bench_results/)
QUOTES = {
    "headline": (headline, ("capstone/capstone_smollm2-135m.json", "production/production.json")),
    "capstone_smollm2": (capstone, ("capstone/capstone_smollm2-135m.json",)),
    "capstone_smollm2_categories": (categories, ("capstone/capstone_smollm2-135m.json",)),
    "capstone_smollm2_winners": (winners, ("capstone/capstone_smollm2-135m.json",)),
    "capstone_tiny": (capstone, ("capstone/capstone_tiny.json",)),
    "capstone_tiny_cllm": (capstone, ("capstone_cllm/capstone_tiny.json",)),
    "production": (production, ("production/production.json",)),
    "production_map": (production_map, ("production/production.json",)),
    "eagle3_smollm2": (lambda rel: table(load(rel)["rows"], TREE_COLS), ("eagle3_smollm2-135m/decode_smollm2-135m.json",)),
    "eagle3_smollm2_categories": (categories, ("eagle3_smollm2-135m/decode_smollm2-135m.json",)),
    "retrieval_smollm2": (lambda rel: table(load(rel)["rows"], DECODE_COLS),
                          ("retrieval_jacobi_lookahead/decode_smollm2-135m.json",)),
    "retrieval_smollm2_categories": (categories, ("retrieval_jacobi_lookahead/decode_smollm2-135m.json",)),
    "dllm_tiny": (lambda rel: table(load(rel)["rows"], DLLM_COLS), ("dllm_bdlm/dllm_tiny.json",)),
    "learned_tiny": (lambda rel: table(load(rel)["rows"], LEARNED_COLS), ("learned/learned_tiny.json",)),
}


def render(name: str) -> str:
    if name not in QUOTES:
        raise ValueError(f"name: no quoted table {name!r}; known: {sorted(QUOTES)}")
    fn, files = QUOTES[name]
    return fn(*files)


def pick(rows: list[dict], selector: str) -> dict:
    """The one row ``selector`` names: a method name, or ``key=value`` pairs joined by ``&``."""
    pairs = [re.match(r"(\w+)=(.*)$", part).groups() if re.match(r"\w+=", part) else ("method", part)
             for part in selector.split("&")]
    hits = [r for r in rows if all(str(r.get(k)) == v for k, v in pairs)]
    if len(hits) != 1:
        raise ValueError(f"row {selector!r} matches {len(hits)} rows, not 1")
    return hits[0]


def figure(source: str, selector: str, field: str) -> float:
    """The number an inline quote ``source|selector|field`` names (see the module's docstring)."""
    data = load(source + ".json")
    row = pick(data["rows"], selector) if selector else data
    if "/" in field:
        a, b = field.split("/", 1)
        return figure(source, selector, a) / figure(source, selector, b)
    value = row
    for key in field.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"field {field!r}: no {key!r} in {source}.json's row {selector!r}")
        value = value[key]
    if not isinstance(value, (int, float)):
        raise ValueError(f"field {field!r} of {source}.json's row {selector!r} is {value!r}, not a number")
    return float(value)


def written(value: float, text: str) -> str:
    """``value`` written the way ``text`` writes its figure: the same ``~``, decimals and ``x`` / ``%``."""
    m = FIGURE.fullmatch(text)
    if not m:
        raise ValueError(f"quoted text {text!r} is not [~]NUMBER[x|%]")
    digits = len(m.group(3) or "")
    return f"{m.group(1)}{value * (100 if m.group(4) == '%' else 1):.{digits}f}{m.group(4) or ''}"


def inline(m: re.Match) -> str:
    """What an inline quote's text should be (raises ValueError for a source, row or field that does not exist)."""
    return written(figure(m.group(2), m.group(3), m.group(4)), m.group(5))


def documents(root: str = ROOT) -> list[str]:
    """The files whose quotes this command owns: README.md, docs/*.md, bench_results/README.md and its
    folders' READMEs (tables and inline figures), and the chapters' jupytext sources (inline figures)."""
    paths = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    paths.append(os.path.join(root, "bench_results", "README.md"))
    paths += sorted(glob.glob(os.path.join(root, "bench_results", "*", "README.md")))
    paths += sorted(glob.glob(os.path.join(root, "notebooks", "[0-9][0-9]*_*.py")))
    return [p for p in paths if os.path.exists(p)]


def rewrite(text: str) -> str:
    """``text`` with every quote block's body replaced by its generated table and every inline figure by its JSON's."""
    text = BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + "\n" + m.group(4), text)
    return INLINE.sub(lambda m: m.group(1) + inline(m) + m.group(6), text)


def stale(paths: list[str]) -> list[str]:
    """``path: NAME`` for every quote block whose body differs from what :func:`rewrite` would write, and
    ``path:line: FILE|ROW|FIELD ...`` for every inline figure that differs from its JSON or names nothing."""
    out = []
    for p in paths:
        text, rel = open(p).read(), os.path.relpath(p, ROOT)
        for m in BLOCK.finditer(text):
            if m.group(3) != render(m.group(2)) + "\n":
                out.append(f"{rel}: {m.group(2)}")
        for m in INLINE.finditer(text):
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(2)}|{m.group(3)}|{m.group(4)}"
            try:
                want = inline(m)
            except (ValueError, OSError) as e:
                out.append(f"{where}: {e}")
                continue
            if m.group(5) != want:
                out.append(f"{where} says {m.group(5)!r}, the JSON gives {want!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m refimpl.bench.quote", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a quoted table or figure differs from its JSON")
    args = ap.parse_args(argv)
    paths = documents()
    if args.check:
        bad = stale(paths)
        for b in bad:
            print("differs from its JSON:", b)
        return 1 if bad else 0
    for p in paths:
        text = open(p).read()
        new = rewrite(text)
        if new != text:
            with open(p, "w") as f:
                f.write(new)
            print("rewrote", os.path.relpath(p, ROOT), "(a chapter: then `make notebooks`)" if p.endswith(".py") else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

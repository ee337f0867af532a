"""The one table of decode-benchmark rows: every method the course builds, next to Hugging Face's
own implementation where it has one (same model, same prompts, same process).

A row is a :class:`refimpl.bench.decode.Method`: ``run(ctx, prompt_ids, max_new_tokens) ->
Generation`` on one prompt, the roles it needs (``"draft"``: the zoo's draft for the target,
:data:`DRAFT_FOR`) and whether its greedy output must equal AR greedy (``exact``). A new chapter
adds its rows to :func:`decode_rows`.
"""
from __future__ import annotations

import os

from .. import (adaptive, autoregressive, dllm_draft, drafts, dynamic_tree, eagle, eagle3, jacobi, lookahead, medusa,
               models, retrieval, speculative, tree)
from ..copy_prior import ContextCopyLM
from ..lm import LM
from ..models.lean_draft import lean
from .decode import Context, Method, hf_assisted, hf_generate

#: the draft model paired with each target in the zoo
DRAFT_FOR = {"tiny": "tiny-draft", "smollm2-135m": "smollm2-135m-draft"}

#: the block-diffusion drafter paired with a target (chapter 14)
DLLM_FOR = {"tiny": "tiny-bdlm"}

#: the best (W, N, G) of the lookahead sweep on SmolLM2-135M, this CPU (README, chapter 08)
LOOKAHEAD_BEST = {"window": 1, "ngram": 4, "guesses": 3}


def default_exit_layer(num_layers: int) -> int:
    """A reasonable early exit for gamma = 4: a quarter of the layers (at least 1)."""
    return max(1, num_layers // 4)


def self_spec(ctx: Context, ids, n):
    """Greedy speculative decoding with the target's own first layers as the draft (built once per target)."""
    key = ("exit", id(ctx.target))
    if key not in ctx.memo:
        ctx.memo[key] = drafts.early_exit(ctx.target, default_exit_layer(ctx.target.num_layers))
    return speculative.generate(ctx.target, ctx.memo[key], [ids], gamma=4, max_new_tokens=n)


def hf_forward_ar(ctx: Context, ids, n):
    """Our AR loop on the same weights through Hugging Face's forward (``models.load(fast=False)``'s
    path): with the ``ar (cache)`` row it measures the lean forward's gain in one process."""
    plain = LM(ctx.target.model, ctx.target.tokenizer, name=ctx.target.name)
    return autoregressive.generate(plain, ids, max_new_tokens=n)


def without_copy_prior(ctx: Context, ids, n):
    """The zoo draft without its copy prior (the ablation of :class:`refimpl.copy_prior.ContextCopyLM`)."""
    inner = ctx.draft.lm if isinstance(ctx.draft, ContextCopyLM) else ctx.draft
    return speculative.generate(ctx.target, inner, [ids], gamma=4, max_new_tokens=n)


def adaptive_row(policy: str, threshold: float):
    def run(ctx: Context, ids, n):
        return adaptive.generate(ctx.target, ctx.draft, [ids], max_gamma=8, threshold=threshold, policy=policy,
                                 max_new_tokens=n)
    return run


def dllm_row(gamma: int, draft_steps: int = 1):
    """Speculative decoding with the zoo's block-diffusion drafter for the target (loaded once per run)."""
    def run(ctx: Context, ids, n):
        key = ("dlm", ctx.model_name)
        if key not in ctx.memo:
            ctx.memo[key] = models.load(DLLM_FOR[ctx.model_name], device=ctx.target.device)
        return dllm_draft.generate(ctx.target, ctx.memo[key], [ids], gamma=gamma, draft_steps=draft_steps,
                                   max_new_tokens=n)
    return run


def dynamic_row(total: int, depth: int, topk: int, floor: float):
    """The draft model's dynamic tree (:mod:`refimpl.dynamic_tree`): EAGLE-2's growth rule, the
    draft's KV cache kept across steps."""
    def run(ctx: Context, ids, n):
        return dynamic_tree.generate(ctx.target, ctx.draft, [ids], max_new_tokens=n, total=total, depth=depth,
                                     topk=topk, floor=floor)
    return run


def has_heads(model_name: str, kind: str = "medusa") -> bool:
    """Are Medusa heads (``kind="medusa"``), an EAGLE draft (``"eagle"``) or an EAGLE-3 one (``"eagle3"``) trained for this target
    (``models/<kind>-<name>``)?"""
    return os.path.exists(medusa.weights_file(medusa.heads_folder(kind, model_name), kind))


def medusa_row(tree_size: int, acceptance: str = "lossless", temperature: float = 0.0):
    """Medusa decoding with the zoo's heads for the target (loaded once per run), the tree of
    ``tree_size`` nodes chosen from the heads' measured accuracies."""
    def run(ctx: Context, ids, n):
        key = ("medusa", id(ctx.target))
        if key not in ctx.memo:
            ctx.memo[key] = medusa.load_heads(ctx.target)
        return medusa.generate(ctx.target, [ids], heads=ctx.memo[key], tree_size=tree_size, acceptance=acceptance,
                               max_new_tokens=n, temperature=temperature, generator=ctx.generator)
    return run


def eagle_row(total: int, depth: int, topk: int, module=eagle, int8: bool = False, **tree):
    """EAGLE-style decoding with the zoo's draft for the target (loaded once per run), a dynamic tree
    of ``total`` nodes grown ``depth`` levels deep from the ``topk`` most confident nodes per level;
    ``module``: :mod:`refimpl.eagle` or :mod:`refimpl.eagle3` (``tree``: its extra options, ``floor``).
    The draft runs its products on the lean kernel (:func:`refimpl.models.lean_draft.lean`; ``int8``:
    on int8 panels)."""
    def run(ctx: Context, ids, n):
        key = (module.__name__, id(ctx.target), int8)
        if key not in ctx.memo:
            ctx.memo[key] = lean(module.load_draft(ctx.target), int8=int8)  # its products on cpu_gemv's panels
        return module.generate(ctx.target, [ids], draft=ctx.memo[key], max_new_tokens=n, total=total, depth=depth,
                               topk=topk, **tree)
    return run


def decode_rows() -> list[Method]:
    """Every row, in table order (``--methods`` picks by substring)."""
    T, D = ("target",), ("target", "draft")
    return [
        Method("ar (cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n)),
        Method("ar (hf forward)", hf_forward_ar),
        Method("ar (no cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n,
                                                                       use_cache=False), max_prompts=3),
        Method("hf generate", lambda c, p, n: hf_generate(c, p, n)),
        Method("hf assisted (draft)", hf_assisted, needs=D),
        Method("speculative greedy (gamma=4)",
               lambda c, p, n: speculative.generate(c.target, c.draft, [p], gamma=4, max_new_tokens=n), needs=D),
        Method("speculative sampling T=0.7 (gamma=4)",
               lambda c, p, n: speculative.generate(c.target, c.draft, [p], gamma=4, max_new_tokens=n,
                                                    temperature=0.7, generator=c.generator), needs=D, exact=False),
        Method("speculative greedy, draft without copy prior (gamma=4)", without_copy_prior, needs=D),
        Method("tree speculative (draft top-k tree, widths 2x2)",
               lambda c, p, n: tree.generate(c.target, c.draft, [p], max_new_tokens=n, widths=(2, 2)), needs=D),
        Method("tree speculative (draft top-k tree, widths 3x2x1)",
               lambda c, p, n: tree.generate(c.target, c.draft, [p], max_new_tokens=n, widths=(3, 2, 1)), needs=D),
        Method("tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)",
               dynamic_row(10, 6, 3, 0.1), needs=D),
        Method("tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0 = EAGLE-2's rule, cached)",
               dynamic_row(10, 6, 3, 0.0), needs=D),
        Method("tree speculative (draft's dynamic tree 16 nodes, depth 6, top-4, floor 0.1, cached)",
               dynamic_row(16, 6, 4, 0.1), needs=D),
        Method("medusa (lossless, 8-node tree)", medusa_row(8), needs=("target", "medusa")),
        Method("medusa (lossless, 16-node tree)", medusa_row(16), needs=("target", "medusa")),
        Method("medusa (lossless, 32-node tree)", medusa_row(32), needs=("target", "medusa")),
        Method("medusa typical acceptance T=0.7 (LOSSY, 16-node tree)", medusa_row(16, "typical", 0.7),
               needs=("target", "medusa"), exact=False),
        Method("eagle (dynamic tree 16 nodes, depth 5, top-4)", eagle_row(16, 5, 4), needs=("target", "eagle")),
        Method("eagle (dynamic tree 8 nodes, depth 4, top-2)", eagle_row(8, 4, 2), needs=("target", "eagle")),
        Method("eagle-3 (dynamic tree 10 nodes, depth 6, top-3, floor 0.1)", eagle_row(10, 6, 3, eagle3, floor=0.1),
               needs=("target", "eagle3")),
        Method("eagle-3 (dynamic tree 16 nodes, depth 7, top-4, floor 0.05)", eagle_row(16, 7, 4, eagle3, floor=0.05),
               needs=("target", "eagle3")),
        Method("eagle-3 + copy prior (dynamic tree 10 nodes, depth 6, top-3, floor 0.1, bias 6)",
               eagle_row(10, 6, 3, eagle3, floor=0.1, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + copy prior (dynamic tree 4 nodes, depth 4, top-2, floor 0, bias 6)",
               eagle_row(4, 4, 2, eagle3, floor=0.0, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + copy prior (dynamic tree 16 nodes, depth 7, top-4, floor 0.05, bias 6)",
               eagle_row(16, 7, 4, eagle3, floor=0.05, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + copy prior (dynamic tree 3 nodes, depth 3, top-2, floor 0, bias 6)",
               eagle_row(3, 3, 2, eagle3, floor=0.0, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + copy prior, int8 draft (dynamic tree 4 nodes, depth 4, top-2, floor 0, bias 6)",
               eagle_row(4, 4, 2, eagle3, int8=True, floor=0.0, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + copy prior, int8 draft (dynamic tree 3 nodes, depth 3, top-2, floor 0, bias 6)",
               eagle_row(3, 3, 2, eagle3, int8=True, floor=0.0, copy=6.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (dynamic tree 3 nodes, depth 3, top-2, floor 0.1, bias 12)",
               eagle_row(3, 3, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (dynamic tree 4 nodes, depth 4, top-2, floor 0.1, bias 12)",
               eagle_row(4, 4, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (dynamic tree 5 nodes, depth 5, top-2, floor 0.1, bias 12)",
               eagle_row(5, 5, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (dynamic tree 6 nodes, depth 5, top-2, floor 0.1, bias 12)",
               eagle_row(6, 5, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (dynamic tree 2 nodes, depth 2, top-2, floor 0.1, bias 12)",
               eagle_row(2, 2, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("eagle-3 + strong copy prior, int8 draft (1 node, top-2, bias 12)",
               eagle_row(1, 1, 2, eagle3, int8=True, floor=0.1, copy=12.0), needs=("target", "eagle3")),
        Method("self-spec (early exit, gamma 4)", self_spec, needs=T),
        Method("adaptive gamma (confidence < 0.3 stops, max 8)", adaptive_row("threshold", 0.3), needs=D),
        Method("adaptive gamma (cumulative < 0.05 stops, max 8)", adaptive_row("cumulative", 0.05), needs=D),
        Method("hf prompt lookup (10 tokens, ngram <= 2)",
               lambda c, p, n: hf_generate(c, p, n, prompt_lookup_num_tokens=10)),
        Method("prompt lookup (10 tokens, ngram 3..1)",
               lambda c, p, n: retrieval.generate(c.target, [p], max_new_tokens=n, method="prompt_lookup")),
        Method("prompt lookup sampling T=0.7",
               lambda c, p, n: retrieval.generate(c.target, [p], max_new_tokens=n, temperature=0.7,
                                                  generator=c.generator), exact=False),
        Method("jacobi (window 8)", lambda c, p, n: jacobi.generate(c.target, [p], max_new_tokens=n, window=8)),
        Method("lookahead (W=7, N=5, G=7)", lambda c, p, n: lookahead.generate(c.target, [p], max_new_tokens=n)),
        Method(f"lookahead (W={LOOKAHEAD_BEST['window']}, N={LOOKAHEAD_BEST['ngram']}, "
               f"G={LOOKAHEAD_BEST['guesses']}, prompt n-grams)",
               lambda c, p, n: lookahead.generate(c.target, [p], max_new_tokens=n, pool_from_prompt=True,
                                                  **LOOKAHEAD_BEST)),
        Method("sam (16 tokens)", lambda c, p, n: retrieval.generate(c.target, [p], max_new_tokens=n, method="sam")),
        Method("token recycling (80 nodes, k=8)",
               lambda c, p, n: retrieval.generate(c.target, [p], max_new_tokens=n, method="recycling")),
        Method("sam + token recycling",
               lambda c, p, n: retrieval.generate(c.target, [p], max_new_tokens=n, method="sam+recycling")),
        Method("dLLM drafter (tiny-bdlm, gamma 4, 1 step)", dllm_row(4), needs=("target", "dlm")),
        Method("dLLM drafter (tiny-bdlm, gamma 8, 2 steps)", dllm_row(8, 2), needs=("target", "dlm")),
    ]


#: (W, N, G) points of the lookahead sweep: the repository's README and MT-bench settings, and smaller
#: windows, which matter on a CPU where every extra scored token costs time
LOOKAHEAD_GRID = [(7, 5, 7), (15, 5, 15), (5, 5, 5), (3, 5, 3), (3, 4, 3), (5, 4, 5), (3, 3, 3), (7, 3, 7), (1, 4, 3)]


def lookahead_sweep_rows() -> list[Method]:
    """AR plus lookahead at every :data:`LOOKAHEAD_GRID` point, with and without prompt n-grams."""
    def row(w, n, g, prompt):
        return Method(f"lookahead W={w} N={n} G={g}{' +prompt' if prompt else ''}",
                      lambda c, p, k: lookahead.generate(c.target, [p], max_new_tokens=k, window=w, ngram=n,
                                                         guesses=g, pool_from_prompt=prompt))
    return [decode_rows()[0]] + [row(w, n, g, pr) for w, n, g in LOOKAHEAD_GRID for pr in (False, True)]

"""What the greedy-equality tests of the proposers share: prompts that repeat themselves and ones
that do not, where an accepted draft token can be turned into EOS, and every decoding entry point
as one call (the device audit and the GPU checks run them all)."""
import torch

#: a refrain (drafts get accepted), short prompts, and a one-token prompt: a ragged batch
TEXTS = ["And God said, Let there be light: and there was light. And God said, Let there be", "In the beginning",
         "The LORD is my shepherd; I shall not want. He maketh me", "And"]


def first_accepted_draft(free, limit=None):
    """(row, token, position) of a token that some step accepted as a draft (not the target's own),
    at its first occurrence in the row's output and before ``limit``; None if there is none. Making
    that token the EOS stops the row inside an accepted run of drafts."""
    for r, tokens in enumerate(free.tokens):
        start = 0
        for step in free.stats.accepted:
            for j in range(step[r]):  # the accepted drafts of this step; the target's token follows
                pos = start + j
                if tokens.index(tokens[pos]) == pos and (limit is None or pos < limit):
                    return r, tokens[pos], pos
            start += step[r] + 1
            if start >= len(tokens):
                break
    return None


def gen(seed=0):
    return torch.Generator(device="cpu").manual_seed(seed)  # a host generator works on any device


def entry_points(m):
    """name -> call, for every decoding entry point the notebooks use (``m`` from
    :func:`entry_point_models`). Greedy unless the name says ``sampled`` or ``typical``."""
    from refimpl import (adaptive, autoregressive, block_diffusion, diffusion, dllm_draft, dynamic_tree, eagle,
                         eagle3, jacobi, lookahead, medusa, retrieval, speculative, tree)

    lm, dr, p, N = m["tiny"], m["tiny-draft"], m["prompts"], 10
    T = dict(temperature=0.8, generator=gen())
    return {
        "ar": lambda: autoregressive.generate(lm, p, max_new_tokens=N),
        "ar sampled": lambda: autoregressive.generate(lm, p, max_new_tokens=N, **T),
        "ar no cache": lambda: autoregressive.generate(lm, p, max_new_tokens=N, use_cache=False),
        "speculative": lambda: speculative.generate(lm, p, draft=dr, gamma=3, max_new_tokens=N),
        "speculative sampled": lambda: speculative.generate(lm, p, draft=dr, gamma=3, max_new_tokens=N, **T),
        "adaptive": lambda: adaptive.generate(lm, p, draft=dr, max_new_tokens=N),
        "tree": lambda: tree.generate(lm, p, draft=dr, max_new_tokens=N, widths=(2, 2)),
        "tree sampled": lambda: tree.generate(lm, p, draft=dr, max_new_tokens=N, widths=(2, 2), **T),
        "dynamic tree": lambda: dynamic_tree.generate(lm, p, draft=dr, max_new_tokens=N),
        "medusa": lambda: medusa.generate(lm, p, heads=m["medusa"], max_new_tokens=N),
        "medusa typical": lambda: medusa.generate(lm, p, heads=m["medusa"], max_new_tokens=N, acceptance="typical", **T),
        "eagle": lambda: eagle.generate(lm, p, draft=m["eagle"], max_new_tokens=N),
        "eagle sampled": lambda: eagle.generate(lm, p, draft=m["eagle"], max_new_tokens=N, **T),
        "eagle-3": lambda: eagle3.generate(lm, p, draft=m["eagle3"], max_new_tokens=N),
        "eagle-3 sampled": lambda: eagle3.generate(lm, p, draft=m["eagle3"], max_new_tokens=N, **T),
        "jacobi": lambda: jacobi.generate(lm, p, max_new_tokens=N, window=4),
        "jacobi sampled": lambda: jacobi.generate(lm, p, max_new_tokens=N, window=4, **T),
        "lookahead": lambda: lookahead.generate(lm, p, max_new_tokens=N, window=3, ngram=3, guesses=3, pool_from_prompt=True),
        "prompt lookup": lambda: retrieval.generate(lm, p, max_new_tokens=N),
        "sam + recycling": lambda: retrieval.generate(lm, p, max_new_tokens=N, method="sam+recycling"),
        "llada": lambda: diffusion.generate(m["dllm"], p[:2], gen_length=8, steps=8, block_length=4),
        "fast-dllm dual cache": lambda: diffusion.generate(m["dllm"], p[:2], gen_length=8, steps=8, block_length=4,
                                                           threshold=0.5, cache="dual"),
        "freedave": lambda: diffusion.generate(m["dllm"], p[:2], gen_length=8, steps=8, block_length=4, draft_steps=2),
        "block diffusion": lambda: block_diffusion.generate(m["bdlm"], p, gen_length=8, block_length=4, threshold=0.5),
        "dllm draft": lambda: dllm_draft.generate(lm, p, dlm=m["bdlm"], gamma=3, max_new_tokens=N),
    }


def entry_point_models(device):
    """The models :func:`entry_points` calls, on ``device``, and the ragged prompts."""
    from refimpl import models
    from refimpl.models import drafters

    lm = models.load("tiny", device=device)
    return {"tiny": lm, "tiny-draft": models.load("tiny-draft", device=device),
            "prompts": [lm.encode(t) for t in TEXTS[1:]], "medusa": drafters.load(lm, "medusa"),
            "eagle": drafters.load(lm, "eagle"), "eagle3": drafters.load(lm, "eagle3"),
            "dllm": models.load("tiny-dllm", device=device),
            "bdlm": models.load("tiny-bdlm", device=device)}


#: every entry point's name; those that are exact greedy decoders of ``tiny`` (== AR greedy)
ENTRY_POINTS = list(entry_points({"tiny": None, "tiny-draft": None, "prompts": None}))
EXACT_GREEDY = [n for n in ENTRY_POINTS if n in {"ar no cache", "speculative", "adaptive", "tree", "dynamic tree",
                                                 "medusa", "eagle", "eagle-3", "jacobi", "lookahead", "prompt lookup",
                                                 "sam + recycling", "dllm draft"}]


def kjv_contexts(lm) -> torch.Tensor:
    """(3, L) three King James openings cut to the shortest one's length (the dLLM chapters' contexts)."""
    texts = ["And God said, Let there be light", "In the beginning God created the", "The LORD is my shepherd; I"]
    ids = [lm.encode(t) for t in texts]
    L = min(len(i) for i in ids)
    return torch.tensor([i[:L] for i in ids])

"""Reference answers for chapter 08 (lookahead decoding). Shown only on request (``SHOW_SOLUTIONS``)."""
from __future__ import annotations


def tokens_scored(levels, width, guesses):
    """The root + the window's levels x width nodes + one trie node per distinct non-empty prefix."""
    prefixes = {tuple(g[:i]) for g in guesses for i in range(1, len(g) + 1)}
    return 1 + levels * width + len(prefixes)


def greedy_walk(tokens, parents, best):
    """Descend from the root (-1): take the child whose token is the target's argmax, while there is one."""
    node, accepted = -1, []
    while True:
        want = best[node + 1]                      # the target's argmax after ``node``
        child = next((i for i, p in enumerate(parents) if p == node and tokens[i] == want), None)
        if child is None:
            return accepted, want
        accepted.append(tokens[child])
        node = child

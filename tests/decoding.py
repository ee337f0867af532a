"""What the greedy-equality tests of the proposers share: prompts that repeat themselves and ones
that do not, and where an accepted draft token can be turned into EOS."""

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

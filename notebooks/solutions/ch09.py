"""Reference answers for chapter 09 (retrieval drafting). Shown only when the learner asks."""


def lookup(tokens, max_ngram=3, min_ngram=1):
    """Prompt lookup as a plain scan: the position after the latest earlier occurrence of the last
    ``n`` tokens, trying ``n = max_ngram .. min_ngram``; -1 when none matches."""
    L = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if L <= n:                                   # the suffix is the whole text: nothing earlier
            continue
        suffix = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):           # latest first; tokens[i:i+n] ends at i+n-1 < L-1
            if tokens[i:i + n] == suffix:
                return i + n
    return -1


def draft_tree(succ, template, root, cap):
    """Token recycling's draft: follow the template's rank paths through the successor table."""
    tokens, parents, node_of = [], [], {(): -1}      # rank path -> node index (-1 = the root)
    for path in template:                            # parents come before their children
        if len(path) > cap or path[:-1] not in node_of:
            continue
        parent = node_of[path[:-1]]
        row = succ.get(root if parent == -1 else tokens[parent])
        if row is None or path[-1] >= len(row):
            continue
        node_of[path] = len(tokens)
        tokens.append(row[path[-1]])
        parents.append(parent)
    return tokens, parents

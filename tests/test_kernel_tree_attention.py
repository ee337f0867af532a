"""tree_attention: Triton (interpreter) == torch reference on random trees, ragged caches and odd
shapes; the reference == a brute-force gather and == decode attention with the dense mask; the
kernel on the q/k/v of `tiny` scoring a real token tree == the model's own dense-mask attention."""
import pytest
import torch

import kernels.tree_attention as ta
from kernels.decode_attention import decode_attention_reference
from kernels.tree_attention import (tree_attention, tree_attention_reference, tree_attention_triton,
                                    tree_mask)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def random_parents(m: int, g: torch.Generator) -> list[int]:
    """A random tree listed parents first: parents[i] in [-1, i) (-1: a child of the root)."""
    return [int(torch.randint(-1, i, (1,), generator=g)) for i in range(m)]


def closure(parents: list[int]) -> torch.Tensor:
    """(m, m) bool by brute force: walk up from every node to the root."""
    m = len(parents)
    anc = torch.zeros(m, m, dtype=torch.bool)
    for i in range(m):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


def ragged_slots(B: int, P: int, g: torch.Generator) -> torch.Tensor:
    """(B, P) bool: row 0 full, the others left padding of random length plus random holes."""
    ok = torch.rand(B, P, generator=g) > 0.2
    ok[0] = True
    for b in range(1, B):
        ok[b, : int(torch.randint(0, P + 1, (1,), generator=g))] = False
    return ok


def make(B, Hq, Hkv, m, P, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, m, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, P + m, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, P + m, D, generator=g).to(dtype)
    anc = torch.stack([closure(random_parents(m, g)) for _ in range(B)])
    return q, k, v, ragged_slots(B, P, g), anc


CASES = [  # B, Hq, Hkv, m, P, D, dtype, num_splits
    (1, 1, 1, 1, 0, 16, torch.float32, None),     # one node, empty cache
    (2, 4, 2, 5, 37, 64, torch.float32, 3),       # GQA, split-K
    (3, 6, 2, 9, 70, 48, torch.float32, 2),       # G = 3, D not a power of two
    (2, 8, 1, 13, 5, 80, torch.float32, None),    # MQA, D = 80, short cache
    (1, 2, 2, 80, 20, 24, torch.float32, 2),      # a big tree: two row tiles of 64
    (2, 4, 2, 17, 33, 64, torch.float16, 2),
    (2, 4, 4, 6, 50, 40, torch.bfloat16, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x).replace("torch.", "") for x in c))
def test_random_trees_match_reference(case):
    *shape, dtype, splits = case
    q, k, v, slot_ok, anc = make(*shape, dtype, seed=sum(shape))
    out = tree_attention_triton(q, k, v, slot_ok, anc, num_splits=splits)
    assert out.dtype == dtype and out.shape == q.shape
    ref = tree_attention_reference(q.float(), k.float(), v.float(), slot_ok, anc)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def brute_force(q, k, v, slot_ok, anc, scale):
    """Row by row: gather the allowed keys, softmax, weighted sum (zeros if none)."""
    B, Hq, m, _ = q.shape
    G, P = Hq // k.shape[1], slot_ok.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(Hq):
            for i in range(m):
                keys = [j for j in range(P) if slot_ok[b, j]] + [P + j for j in range(m) if anc[b, i, j]]
                if keys:
                    w = torch.softmax(k[b, h // G, keys] @ q[b, h, i] * scale, 0)
                    out[b, h, i] = w @ v[b, h // G, keys]
    return out


def test_reference_equals_brute_force_and_a_masked_row_is_zero():
    q, k, v, slot_ok, anc = make(2, 4, 2, 6, 9, 16, torch.float32, seed=5)
    slot_ok[1] = False
    anc[1, 3] = False  # row 1, node 3: nothing allowed at all
    ref = tree_attention_reference(q, k, v, slot_ok, anc, scale=0.3)
    torch.testing.assert_close(ref, brute_force(q, k, v, slot_ok, anc, 0.3), atol=1e-5, rtol=1e-5)
    out = tree_attention_triton(q, k, v, slot_ok, anc, scale=0.3, num_splits=2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(out[1, :, 3] == 0), "a row with nothing allowed returns zeros"
    assert torch.all(out[1, :, :3].abs().sum(-1) > 0)


def test_equals_decode_attention_with_the_dense_mask():
    q, k, v, slot_ok, anc = make(3, 4, 2, 11, 25, 32, torch.float32, seed=7)
    slot_ok = slot_ok.long()  # int masks work as well as bool
    dense = tree_mask(slot_ok, anc)
    assert dense.shape == (3, 1, 11, 36)
    want = decode_attention_reference(q, k, v, dense)
    torch.testing.assert_close(tree_attention_reference(q, k, v, slot_ok, anc), want, atol=1e-5, rtol=1e-5)
    out = tree_attention_triton(q, k, v, slot_ok, anc)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # negative control: the same nodes with a plain causal mask over the tree give another answer
    chain = torch.ones(11, 11, dtype=torch.bool).tril().expand(3, 11, 11)
    assert not torch.allclose(tree_attention_triton(q, k, v, slot_ok, chain), out, atol=1e-3)


def test_broadcast_tree_and_dispatcher(monkeypatch):
    q, k, v, slot_ok, _ = make(2, 2, 1, 7, 12, 16, torch.float32, seed=9)
    anc = closure([-1, 0, 0, 1, 1, 2, -1])[None]  # one tree for the whole batch
    ref = tree_attention_reference(q, k, v, slot_ok, anc)
    torch.testing.assert_close(tree_attention(q, k, v, slot_ok, anc), ref, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(ta, "INTERPRET", False)  # a CPU tensor without the interpreter: the reference
    assert torch.equal(tree_attention(q, k, v, slot_ok, anc), ref)


def test_bad_shapes_raise():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    ok, anc = torch.ones(1, 4, dtype=torch.bool), torch.eye(3, dtype=torch.bool)[None]
    with pytest.raises(ValueError, match="multiple"):
        tree_attention(torch.randn(1, 3, 3, 8), k, v, ok, anc)
    with pytest.raises(ValueError, match="slot_ok"):
        tree_attention(q, k, v, torch.ones(1, 5, dtype=torch.bool), anc)
    with pytest.raises(ValueError, match="anc"):
        tree_attention(q, k, v, ok, torch.eye(4, dtype=torch.bool)[None])
    with pytest.raises(ValueError, match="fewer"):
        tree_attention(q, k[:, :, :2], v[:, :, :2], ok[:, :0], anc)


def test_tiny_scoring_a_token_tree(monkeypatch, tiny_prompts):
    """`tiny` scores a ragged batch of trees through its dense 4-D mask (refimpl.tree.Tree.feed);
    on every layer's q/k/v the kernel, given only the slot bits and the ancestor bits, agrees."""
    from refimpl import models
    from refimpl.models import attention
    from refimpl.speculative import SlotCache
    from refimpl.tree import Tree

    lm = models.load("tiny", device="cpu", attn="triton")
    calls = []

    def spy(q, k, v, mask=None, scale=None, causal=True):  # the dense-mask path, recorded
        out = decode_attention_reference(q, k, v, mask, scale, causal)
        calls.append((q, k, v, mask, scale, out))
        return out

    monkeypatch.setattr(attention, "decode_attention", spy)
    prompts = [tiny_prompts[1], tiny_prompts[2]]
    L = max(len(p) for p in prompts) - 1
    ids = torch.tensor([[1] * (L - len(p) + 1) + p[:-1] for p in prompts])  # left padded, last token held
    fmask = torch.tensor([[0] * (L - len(p) + 1) + [1] * (len(p) - 1) for p in prompts])
    slots = SlotCache(lm, 2, "cpu")
    slots.feed(ids, fmask)
    trees = [[-1, -1, 0, 0, 1, 2, 2, 4], [-1, 0, 1, 2, -1, 4, 0, 6]]
    calls.clear()
    x = torch.randint(2, 4096, (2, 8), generator=torch.Generator().manual_seed(0))
    Tree(torch.tensor(trees)).feed(slots, torch.tensor([[p[-1]] for p in prompts]), None, x,
                                  valid=torch.tensor([8, 8]))
    assert len(calls) == 4, "one attention call per layer"
    want_anc = torch.stack([closure(t) for t in trees])
    for q, k, v, mask, scale, out in calls:
        allow = mask[:, 0, :, : k.shape[2]] == 0  # (B, 1 + m, P + 1 + m): root row, then the nodes
        P = k.shape[2] - 8
        slot_ok, anc = allow[:, 1, :P], allow[:, 1:, P:]
        assert torch.equal(allow[:, 1:, :P], slot_ok[:, None].expand(-1, 8, -1)), "one cache mask per row"
        assert torch.equal(anc, want_anc) and not slot_ok.all(), "the ancestor mask over a ragged cache"
        got = tree_attention_triton(q[:, :, 1:], k, v, slot_ok, anc, scale)
        torch.testing.assert_close(got, out[:, :, 1:], atol=1e-5, rtol=1e-5)

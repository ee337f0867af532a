"""refimpl.export: the layouts vLLM loads, checked in plain torch against our own drafters.

vLLM itself lives in another environment (``make production``); here its model code is re-stated
in plain torch from the vLLM 0.32 files the exporters cite (medusa.py's ``ResidualBlock`` + one
shared head; llama_eagle.py's ``fc`` without bias, layer 0 without input norm, vLLM's fused
add + RMSNorm, the final ``hidden + residual``), and fed the exported tensors: its greedy
proposals must be ours. Negative controls: the naive exports (zeros for the non-kept rows, no bias
layer in front of the EAGLE layer) are caught.

The parallel drafters (refimpl/export/parallel.py) likewise: DFlash through qwen3_dflash.py's forward
(fc over the target streams in layer order, context K/V, the non-causal block, ``d2t``) and its
``load_weights`` name mapping; PARD as a plain Hugging Face Llama fed vLLM's
[context, bonus, MASK x (K - 1)].
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from refimpl import eagle, export, medusa, models, prompts
from refimpl.models import drafters
from refimpl.primitives import rope


@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", prepack=False)


@pytest.fixture(scope="module")
def hidden(smol):
    """(N, H) SmolLM2's final (normed) hidden states and (N,) next tokens over two benchmark prompts
    and its greedy answers to them (what a drafter sees while decoding)."""
    from refimpl import autoregressive

    ids = [prompts.encode_prompt(smol, t) for _, t in prompts.prompt_set(1)[:2]]
    g = autoregressive.generate(smol, ids, max_new_tokens=24)
    hs, toks = [], []
    for p, t in zip(ids, g.tokens):
        x = torch.tensor([p + t])
        with torch.no_grad():
            out = smol.model(x, output_hidden_states=True)
        hs.append(out.hidden_states[-1][0])
        toks.append(x[0])
    return torch.cat(hs).float(), torch.cat(toks)


def test_full_head_argmax_equals_the_kept_argmax():
    g = torch.Generator().manual_seed(0)
    V, H = 300, 16
    rows = torch.randn(V, H, generator=g)
    kept = torch.randperm(V, generator=g)[:40].sort().values
    kept[0] = 0  # the smallest kept id is 0: every non-kept row is a copy of row 0
    feats = torch.randn(2000, H, generator=g) * 3
    full = export.full_head(rows, kept, V)
    assert export.head_agreement(rows[kept], full, kept, feats) == 1.0
    # negative control: zero rows for the non-kept tokens win where every kept logit is negative
    rows, kept, f = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([0, 1]), torch.tensor([[-1.0]])
    naive = rows.clone()
    naive[2] = 0
    assert export.head_agreement(rows[kept], export.full_head(rows, kept, 3), kept, f) == 1.0
    assert export.head_agreement(rows[kept], naive, kept, f) == 0.0
    # ties resolve to the first index, which the copies rely on
    assert int(torch.tensor([[1.0, 3.0, 3.0]]).argmax(-1)) == 1


def test_full_head_rejects_a_wrong_row_count():
    with pytest.raises(ValueError, match="rows"):
        export.full_head(torch.zeros(5, 2), torch.tensor([1, 2]), 7)


def test_export_rejects_an_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="name"):
        export.export("medusa-nothing", str(tmp_path))


def test_medusa_export_proposes_our_top1_chain(smol, hidden, tmp_path):
    info = export.export("medusa-smollm2-135m", str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["model_type"] == "medusa" and cfg["original_lm_head"] and cfg["truncated_vocab_size"] == cfg["vocab_size"]
    assert info["speculative_config"]["method"] == "medusa"
    w = load_file(str(tmp_path / "model.safetensors"))
    heads = drafters.load(smol, "medusa")
    h, _ = hidden
    theirs = []
    for k in range(cfg["num_heads"]):  # vLLM's ResidualBlock, then the one shared head, then argmax
        x = h + torch.nn.functional.silu(h @ w[f"blocks.{k}.layers.0.weight"].T + w[f"blocks.{k}.layers.0.bias"])
        theirs.append((x @ w["lm_heads.0.weight"].T).argmax(-1))
    ours = heads.top(h, 1)[..., 0]  # (N, K)
    assert torch.equal(torch.stack(theirs, 1), ours)
    # negative control: the target's own head over the full vocabulary (what a plain conversion gives)
    # proposes tokens outside the kept ones, which our heads never do
    x = h + torch.nn.functional.silu(h @ w["blocks.1.layers.0.weight"].T + w["blocks.1.layers.0.bias"])
    W = smol.model.get_output_embeddings().weight.detach().float()
    assert export.head_agreement(heads.lm_head, W, heads.kept, x) < 0.95


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def vllm_eagle(w: dict, cfg: dict, tok: torch.Tensor, feat: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """llama_eagle.py's forward in plain torch for one sequence: (T,) tokens, (T, H) features -> (T, V)
    logits. fc (no bias) over cat(embed, feature); each layer: input norm (Identity in layer 0) fused
    with the residual add, attention (GQA, neox rotary, causal), fused add + post-attention norm, SiLU MLP;
    the model returns hidden + residual and the draft's own lm_head scores it."""
    eps, nh, nkv = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    theta = cfg["rope_parameters"]["rope_theta"]
    T = tok.shape[0]
    h, res = torch.cat([embed[tok], feat], -1) @ w["fc.weight"].T, None
    pos = torch.arange(T)[None]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        if res is None:
            res = h
        else:
            res = h + res
            h = rms(res, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, nh, -1).transpose(0, 1)[None]
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, nkv, -1).transpose(0, 1)[None]
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, nkv, -1).transpose(0, 1)[None]
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)[0].transpose(0, 1).reshape(T, -1)
        h = a @ w[p + "self_attn.o_proj.weight"].T + w.get(p + "self_attn.o_proj.bias", 0)
        res = h + res
        h = rms(res, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        h = (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    return (h + res) @ w["lm_head.weight"].T  # vLLM: the target's head, shared


def test_eagle_export_is_our_draft_in_vllms_layout(smol, hidden, tmp_path):
    export.export("eagle-smollm2-135m", str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    d = drafters.load(smol, "eagle")
    h, toks = hidden
    T = 40
    tok, feat = toks[1:T + 1], h[:T]  # EAGLE's input pairs (x_{t+1}, f_t)
    E = smol.model.get_input_embeddings().weight.detach().float()
    w = {**w, "lm_head.weight": smol.model.get_output_embeddings().weight.detach().float()}
    with torch.no_grad():
        f = d(tok[None], feat[None])[0]
        ours_logits = d.logits(f)  # (T, V') the kept tokens
        theirs_logits = vllm_eagle(w, cfg, tok, feat, E)  # (T, V) the full vocabulary
    assert torch.allclose(theirs_logits[:, d.kept], ours_logits, atol=2e-3, rtol=1e-4)
    # over the full vocabulary (vLLM shares the target's head) the greedy proposal is ours on >= 95%
    agree = float((theirs_logits.argmax(-1) == d.full(ours_logits.argmax(-1))).float().mean())
    assert agree >= 0.95, agree
    # negative control: the naive layout (our layer as vLLM's layer 0: no input norm, no fc bias) moves the logits
    naive = {k.replace("layers.1.", "layers.0."): v for k, v in w.items() if not k.startswith("layers.0.")}
    wrong = vllm_eagle(naive, {**cfg, "num_hidden_layers": 1}, tok, feat, E)
    assert not torch.allclose(wrong[:, d.kept], ours_logits, atol=2e-3, rtol=1e-4)


def test_chain_draft_export_is_a_plain_llama_with_the_trimmed_heads_argmax(smol, tmp_path):
    from transformers import AutoModelForCausalLM

    export.export("smollm2-135m-draft", str(tmp_path))
    assert os.path.exists(tmp_path / "tokenizer.json")
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    draft = models.load("smollm2-135m-draft", prepack=False)
    lm = draft.lm
    ids = torch.tensor([prompts.encode_prompt(smol, prompts.prompt_set(1)[0][1])])
    with torch.no_grad():
        a = hf(ids).logits[0]
        b = lm.model(ids).logits[0]  # (T, K) the trimmed head
    assert torch.equal(a.argmax(-1), lm.kept_ids[b.argmax(-1)])
    assert torch.allclose(a[:, lm.kept_ids], b, atol=1e-4)


def vllm_eagle3(w: dict, cfg: dict, tok: torch.Tensor, aux: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """llama_eagle3.py's forward in plain torch for one sequence, vLLM's defaults (no norm before fc,
    norm after the residual, ``norm_output`` false): (T,) tokens, (T, 3H) tapped target streams ->
    (T, V) logits. fc fuses the streams; layer 0 concatenates input_layernorm(embeds) with
    hidden_norm(g) for attention and keeps g as the residual; compute_logits scatters the draft
    vocabulary's logits to ``index + d2t[index]`` (-inf elsewhere)."""
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    T, p = tok.shape[0], "midlayer."
    g = aux @ w["fc.weight"].T
    res = g
    x = torch.cat([rms(embed[tok], w[p + "input_layernorm.weight"], eps), rms(g, w[p + "hidden_norm.weight"], eps)], -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)[None]
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)[None]
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)[None]
    pos = torch.arange(T)[None]
    q, k = rope(q, pos, theta), rope(k, pos, theta)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)[0].transpose(0, 1).reshape(T, -1)
    res = a @ w[p + "self_attn.o_proj.weight"].T + res
    h = rms(res, w[p + "post_attention_layernorm.weight"], eps)
    h = (torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    logits = rms(h + res, w["norm.weight"], eps) @ w["lm_head.weight"].T  # (T, draft vocab)
    if "d2t" not in w:  # draft_id_to_target_id is None: the logits are the full vocabulary's, in token order
        assert logits.shape[1] == cfg["vocab_size"]
        return logits
    full = torch.full((T, cfg["vocab_size"]), -torch.inf)
    full[:, torch.arange(cfg["draft_vocab_size"]) + w["d2t"]] = logits
    return full


def test_eagle3_export_is_our_draft_in_vllms_layout(smol, tmp_path):
    from refimpl import eagle3

    info = export.export("eagle3-smollm2-135m", str(tmp_path))
    assert info["speculative_config"]["method"] == "eagle3"
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    d = drafters.load(smol, "eagle3")
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(d.taps)
    assert int(w["t2d"].sum()) == cfg["draft_vocab_size"] and "embed_tokens.weight" not in w
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's default for 30 layers
    ids = torch.tensor([prompts.encode_prompt(smol, prompts.prompt_set(1)[0][1])])
    with torch.no_grad():
        _, _, aux = smol.forward(ids, output_hidden_states=d.taps)
        tok, aux = ids[0, 1:], aux[0, :-1].float()  # inputs (x_{t+1}, streams_t)
        ours = d.logits(eagle3.unroll(d, tok[None], d.fuse(aux[None]), torch.ones_like(tok)[None], 1)[0][0])
        E = smol.model.get_input_embeddings().weight.detach().float()
        theirs = vllm_eagle3(w, cfg, tok, aux, E)
        kept = d.kept if d.kept is not None else torch.arange(cfg["vocab_size"])
        assert torch.allclose(theirs[:, kept], ours, atol=2e-3, rtol=1e-4)
        assert torch.equal(theirs.argmax(-1), d.full(ours.argmax(-1)))
        # negative control: the two input norms swapped (a wrong key mapping) moves the logits
        p = "midlayer."
        swapped = {**w, p + "input_layernorm.weight": w[p + "hidden_norm.weight"],
                   p + "hidden_norm.weight": w[p + "input_layernorm.weight"]}
        assert not torch.allclose(vllm_eagle3(swapped, cfg, tok, aux, E)[:, kept], ours, atol=2e-3, rtol=1e-4)


def test_eagle3_export_refuses_a_tap_vllm_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="final normed state"):
        export.export("eagle3-tiny", str(tmp_path))  # tiny's draft reads layer 4 = L


def vllm_eagle3_load(w: dict, cfg: dict) -> None:
    """vLLM 0.32's ``Eagle3LlamaForCausalLM.load_weights`` name check: ``t2d`` is skipped, ``d2t`` loads into
    ``draft_id_to_target_id``, which exists only when ``draft_vocab_size`` differs from the target's vocabulary
    (None otherwise); a tensor with no parameter to go to fails the load."""
    params = {"draft_id_to_target_id"} if cfg["draft_vocab_size"] != cfg["vocab_size"] else set()
    for name in w:
        if name == "d2t" and "draft_id_to_target_id" not in params:
            raise ValueError("There is no module or parameter named 'draft_id_to_target_id'")


@pytest.mark.parametrize("kept", ["all tokens (None)", "all tokens (shuffled)", "a subset"])
def test_eagle3_export_of_a_full_vocabulary_draft_has_no_d2t(kept, tmp_path):
    """A draft over the whole vocabulary (``kept`` None, as ``tiny``'s zoo draft) is written without ``d2t`` /
    ``t2d`` and with its head rows in token order; vLLM's forward on the written tensors is ours. A subset
    keeps its ``d2t``. Negative controls: the old layout (``d2t`` written for a full draft) fails vLLM's load,
    and a shuffled full head written in draft order moves the logits."""
    from refimpl import eagle3

    tiny = models.load("tiny", prepack=False)
    V = tiny.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = {"all tokens (None)": None, "all tokens (shuffled)": torch.randperm(V, generator=g),
           "a subset": torch.randperm(V, generator=g)[:500].sort().values}[kept]
    torch.manual_seed(0)
    d = eagle3.new_draft(tiny, taps=(1, 2, 3), kept=ids).eval()  # (tap 3 < L = 4: vLLM reads the same stream)
    export.write_eagle3(tiny, d, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    full = ids is None or len(ids) == V
    assert ("d2t" in w, "t2d" in w) == (not full, not full)
    assert cfg["vocab_size"] == V and cfg["draft_vocab_size"] == (V if full else 500)
    assert w["lm_head.weight"].shape == (cfg["draft_vocab_size"], d.hidden_size)
    vllm_eagle3_load(w, cfg)
    if full:
        with pytest.raises(ValueError, match="draft_id_to_target_id"):
            vllm_eagle3_load({**w, "d2t": torch.zeros(V, dtype=torch.long)}, cfg)
    ids_ = torch.tensor([tiny.tokenizer.encode("In the beginning God created the heaven and the earth. And the")])
    with torch.no_grad():
        _, _, aux = tiny.forward(ids_, output_hidden_states=d.taps)
        tok, aux = ids_[0, 1:], aux[0, :-1].float()
        ours = d.logits(eagle3.unroll(d, tok[None], d.fuse(aux[None]), torch.ones_like(tok)[None], 1)[0][0])
        E = tiny.model.get_input_embeddings().weight.detach().float()
        theirs = vllm_eagle3(w, cfg, tok, aux, E)
        cols = d.kept if d.kept is not None else torch.arange(V)
        assert torch.allclose(theirs[:, cols], ours, atol=2e-3, rtol=1e-4)
        assert torch.equal(theirs.argmax(-1), d.full(ours.argmax(-1)))
        if kept == "all tokens (shuffled)":
            naive = {**w, "lm_head.weight": d.lm_head.detach().float()}
            assert not torch.allclose(vllm_eagle3(naive, cfg, tok, aux, E)[:, cols], ours, atol=2e-3, rtol=1e-4)


# -- the parallel drafters (refimpl/export/parallel.py): DFlash and PARD ----------------------------

KJV = ["In the beginning God created the heaven and the earth. And the earth was without form, and void; and",
       "And God said, Let there be light: and there was light. And God saw the light, that it was",
       "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he",
       "And the sons of Noah, that went forth of the ark, were Shem, and Ham, and Japheth: and Ham is"]


@pytest.fixture(scope="module")
def tiny_target():
    return models.load("tiny", prepack=False)


def vllm_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """vLLM's neox rotary (``rotary_embedding/base.py``: ``cos_sin_cache`` from ``theta^(-2i/d)``, the halves
    rotated) of x (T, heads, d) at positions pos (T,)."""
    d = x.shape[-1]
    f = pos.float()[:, None] * (1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))  # (T, d/2)
    cos, sin = f.cos()[:, None], f.sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def vllm_dflash(w: dict, cfg: dict, hidden, block: torch.Tensor, embed: torch.Tensor, causal: bool = False):
    """vLLM 0.32's DFlash draft step (qwen3_dflash.py + v1/spec_decode/dflash.py) in plain torch for one
    request on its first pass: ``hidden`` the target's residual streams at the C context tokens, indexed as
    vLLM's aux layer ids (Hugging Face's ``hidden_states``: entry j = after j layers), ``block`` (Q,) =
    [bonus, MASK x (Q - 1)] -> (Q - 1, V) the logits vLLM samples (the mask slots).

    The target returns the aux streams of layers ``sorted(set(target_layer_ids + 1))``
    (``get_eagle3_aux_layers_from_config``, ``_set_aux_hidden_state_layers``) side by side;
    ``combine_hidden_states`` is ``fc`` (no bias; it refuses a width other than ``len(target_layer_ids)``
    streams); ``precompute_and_store_context_kv`` writes, per layer, ``k_norm(k_proj(hidden_norm(ctx)))``
    rotated at the context's own positions and ``v_proj(hidden_norm(ctx))`` into the cache; the query block
    (``_copy_and_expand_dflash_inputs``: positions last + 1 + offset) runs the Qwen3 layers (fused add +
    RMSNorm, q/k per-head norms before rotary, GQA, scale d^-0.5) attending to the cached context and to
    itself, non-causally (``_resolve_layer_attention``: no ``layer_types`` sliding, no ``is_causal``);
    ``norm(h + residual)`` at the mask slots, ``lm_head``, and ``compute_logits`` scatters the draft
    vocabulary to ``index + draft_id_to_target_id`` (-inf elsewhere) when ``draft_vocab_size`` differs from
    the vocabulary (else the logits are the vocabulary's, in token order)."""
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta, H = cfg["rope_parameters"]["rope_theta"], cfg["hidden_size"]
    assert not cfg.get("attention_bias") and not cfg.get("layer_types") and cfg.get("is_causal") is None
    ids = [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]
    streams = sorted(set(ids))
    assert max(streams) < len(hidden) - 1  # HF's last entry is after the final norm, vLLM's aux never is
    aux = torch.cat([hidden[j] for j in streams], -1)  # (C, n H)
    if aux.shape[-1] != (cfg.get("target_hidden_size") or H) * len(ids):
        raise ValueError("DFlash drafter expects more concatenated aux hidden features")  # combine_hidden_states
    ctx = rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # (C, H)
    C, Q = ctx.shape[0], block.shape[0]
    cpos, qpos = torch.arange(C), C + torch.arange(Q)
    allow = torch.ones(Q, C + Q, dtype=torch.bool)
    if causal:
        allow[:, C:] = torch.ones(Q, Q, dtype=torch.bool).tril()
    x, res = embed[block], None
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        if res is None:
            res, x = x, rms(x, w[p + "input_layernorm.weight"], eps)
        else:
            res = x + res
            x = rms(res, w[p + "input_layernorm.weight"], eps)
        Wk, Wv, kn = w[a + "k_proj.weight"], w[a + "v_proj.weight"], w[a + "k_norm.weight"]
        q = vllm_rope(rms((x @ w[a + "q_proj.weight"].T).view(Q, nh, hd), w[a + "q_norm.weight"], eps), qpos, theta)
        k = vllm_rope(rms((x @ Wk.T).view(Q, nkv, hd), kn, eps), qpos, theta)
        ck = vllm_rope(rms((ctx @ Wk.T).view(C, nkv, hd), kn, eps), cpos, theta)
        K = torch.cat([ck, k]).repeat_interleave(nh // nkv, 1)  # (C + Q, nh, hd): the cache, context first
        V = torch.cat([(ctx @ Wv.T).view(C, nkv, hd), (x @ Wv.T).view(Q, nkv, hd)]).repeat_interleave(nh // nkv, 1)
        s = torch.einsum("qhd,khd->hqk", q, K) * hd ** -0.5
        o = torch.einsum("hqk,khd->qhd", s.masked_fill(~allow, -torch.inf).softmax(-1), V).reshape(Q, nh * hd)
        res = o @ w[a + "o_proj.weight"].T + res
        x = rms(res, w[p + "post_attention_layernorm.weight"], eps)
        x = (torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    logits = rms(x + res, w["norm.weight"], eps)[1:] @ w["lm_head.weight"].T  # (Q - 1, draft vocab)
    dv, V = cfg["draft_vocab_size"], cfg["vocab_size"]
    if dv == V:
        return logits
    d2t = w.get("d2t", torch.zeros(dv, dtype=torch.long))  # an unloaded draft_id_to_target_id stays zeros
    full = torch.full((Q - 1, V), -torch.inf)
    full[:, torch.arange(dv) + d2t] = logits
    return full


def vllm_dflash_params(cfg: dict) -> dict:
    """``DFlashQwen3ForCausalLM``'s parameters for ``cfg`` -> {name: {shard: the tensor shape its weight loader
    takes}}: ``lm_head`` (draft_vocab_size rows), ``model.{embed_tokens, mask_embedding, fc (target_hidden_size x
    len(target_layer_ids) inputs), hidden_norm, norm}``, per layer ``self_attn.{qkv_proj (q, k, v shards), o_proj,
    q_norm, k_norm}``, ``mlp.{gate_up_proj (0, 1), down_proj}``, the two layer norms; ``draft_id_to_target_id``
    only when ``draft_vocab_size`` differs from the (target's) vocabulary."""
    H, I, V, dv = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    one = lambda *s: {None: s}  # noqa: E731
    p = {"lm_head.weight": one(dv, H), "model.embed_tokens.weight": one(V, H), "model.mask_embedding": one(H),
         "model.hidden_norm.weight": one(H), "model.norm.weight": one(H)}
    if cfg["dflash_config"].get("use_aux_hidden_state", True):
        n = len(cfg["dflash_config"]["target_layer_ids"])  # (repeats counted: vLLM's fc input size)
        p["model.fc.weight"] = one(H, (cfg.get("target_hidden_size") or H) * n)
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}."
        p.update({a + "self_attn.qkv_proj.weight": {"q": (nh * hd, H), "k": (nkv * hd, H), "v": (nkv * hd, H)},
                  a + "self_attn.o_proj.weight": one(H, nh * hd), a + "self_attn.q_norm.weight": one(hd),
                  a + "self_attn.k_norm.weight": one(hd), a + "mlp.gate_up_proj.weight": {0: (I, H), 1: (I, H)},
                  a + "mlp.down_proj.weight": one(H, I), a + "input_layernorm.weight": one(H),
                  a + "post_attention_layernorm.weight": one(H)})
    if dv != V:
        p["draft_id_to_target_id"] = one(dv)
    return p


def vllm_dflash_load(w: dict, cfg: dict) -> set:
    """``DFlashQwen3ForCausalLM.load_weights``' names: ``t2d`` skipped, ``d2t`` -> ``draft_id_to_target_id``,
    every other name but ``lm_head`` under ``model.``; dropped: ``embed_tokens`` / ``draft_id_to_target_id``
    when the file has none, ``fc.`` without aux states, ``mask_embedding`` (no ``mask_embedding.pt``); then
    ``DFlashQwen3Model.hf_to_vllm_mapper`` (``midlayer.`` -> ``layers.0.``, q/k/v -> ``qkv_proj`` shards,
    gate/up -> ``gate_up_proj``). A name with no parameter, or a shape its loader does not take, fails
    (``AutoWeightsLoader``). -> the (parameter, shard) pairs loaded."""
    params = vllm_dflash_params(cfg)
    drop = {s for s, keep in (("draft_id_to_target_id", any("d2t" in n for n in w)),
                              ("embed_tokens", any("embed_tokens" in n for n in w)),
                              ("fc.", cfg["dflash_config"].get("use_aux_hidden_state", True)),
                              ("mask_embedding", False)) if not keep}
    stacked = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
               ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
    loaded = set()
    for name, t in w.items():
        assert "mask_hidden" not in name
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name
        if any(s in name for s in drop):
            continue
        for a, b in (("midlayer.", "layers.0."), ("encoder.output_norm_enc.", "hidden_norm."), ("encoder.fc.", "fc.")):
            name = name.replace(a, b, 1)
        shard = None
        for a, (b, s) in stacked.items():
            if a in name:
                name, shard = name.replace(a, b, 1), s
        if shard not in params.get(name, {}):
            raise ValueError(f"There is no module or parameter named {name!r} (shard {shard!r})")
        if tuple(t.shape) != params[name][shard]:
            raise ValueError(f"{name} ({shard}): shape {tuple(t.shape)}, its loader takes {params[name][shard]}")
        loaded.add((name, shard))
    return loaded


def check_dflash_loads(w: dict, cfg: dict) -> None:
    """Every tensor loads (:func:`vllm_dflash_load`) and every parameter of vLLM's model is loaded, all shards,
    but the two vLLM fills itself: ``embed_tokens`` (the target's, ``_maybe_share_embeddings``) and
    ``mask_embedding`` (unused without ``mask_embedding.pt``). (vLLM's own load does not check this: its
    ``load_weights`` returns None, so an absent tensor would stay uninitialised.)"""
    loaded = vllm_dflash_load(w, cfg)
    want = {(n, s) for n, shards in vllm_dflash_params(cfg).items() for s in shards}
    assert want - loaded == {("model.embed_tokens.weight", None), ("model.mask_embedding", None)}, want - loaded


def dflash_case(target, d, text: str):
    """The target's streams on ``text``, its greedy next token as the bonus: -> (hidden (L + 1) x (C, H), our
    taps' streams (C, n H) in our order, block [bonus, MASK x (block - 1)])."""
    ids = torch.tensor([target.encode(text)])
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
        _, _, aux = target.forward(ids, output_hidden_states=d.taps)
    block = torch.full((d.block,), d.mask_id)
    block[0] = out.logits[0, -1].argmax()
    return [h[0].float() for h in out.hidden_states], aux[0].float(), block


def our_dflash(d, aux: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Our drafter's first call (:class:`refimpl.dflash.DFlashProposer`): the context at 0..C-1, the block
    after it, every slot sees all -> (block - 1, V) the mask slots' logits, -inf outside the kept tokens."""
    C, Q = aux.shape[0], block.shape[0]
    with torch.no_grad():
        out, _ = d.step(block[None], d.context(aux[None]), torch.arange(C + Q)[None],
                        torch.ones(1, Q, C + Q, dtype=torch.bool))
        return d.vocab_logits(out[0, 1:], d.embed.shape[0]).float()


def test_dflash_export_is_our_drafter_in_vllms_layout(tiny_target, tmp_path):
    """The committed ``dflash-tiny`` (one layer, tap 3 = target_layer_ids [2], every token kept): vLLM's DFlash
    forward on the exported tensors gives our block logits on real target streams of King James prompts,
    hence our greedy proposals. Negative controls: the block attending causally, and the streams read one
    layer early (target_layer_ids taken as our taps, without vLLM's + 1), move the logits."""
    info = export.export("dflash-tiny", str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    d = drafters.load(tiny_target, "dflash")
    V = tiny_target.config.vocab_size
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": d.mask_id, "target_layer_ids": [t - 1 for t in d.taps]} == \
        {"mask_token_id": 2, "target_layer_ids": [2]}
    assert info["speculative_config"] == {"method": "dflash", "model": str(tmp_path), "num_speculative_tokens": 7}
    assert cfg["block_size"] == d.block == 8 and cfg["vocab_size"] == cfg["draft_vocab_size"] == V
    assert "d2t" not in w and "t2d" not in w and "embed_tokens.weight" not in w
    check_dflash_loads(w, cfg)
    E = tiny_target.model.get_input_embeddings().weight.detach().float()
    early = {**cfg, "dflash_config": {**cfg["dflash_config"], "target_layer_ids": [t - 2 for t in d.taps]}}
    for text in KJV[:2]:
        hidden, aux, block = dflash_case(tiny_target, d, text)
        ours = our_dflash(d, aux, block)
        theirs = vllm_dflash(w, cfg, hidden, block, E)
        assert torch.allclose(theirs, ours, atol=1e-4, rtol=1e-4), (theirs - ours).abs().max()
        assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
        assert not torch.allclose(vllm_dflash(w, cfg, hidden, block, E, causal=True), ours, atol=1e-2)
        assert not torch.allclose(vllm_dflash(w, early, hidden, block, E), ours, atol=1e-2)


@pytest.mark.parametrize("kept", ["a subset", "all tokens (shuffled)"])
def test_dflash_export_of_a_multi_tap_drafter(kept, tiny_target, tmp_path):
    """A fresh two-layer drafter over taps (3, 1, 2) (norm weights randomised, so a swapped norm shows):
    vLLM concatenates the streams in layer order, so the export writes fc's blocks in that order; a kept
    subset travels as ``lm_head`` rows + ``d2t``, every token (shuffled) as rows in token order without
    ``d2t``. vLLM's forward gives our logits mapped to token ids. Negative controls: fc's blocks in our tap
    order, and (a subset) the logits without ``d2t`` (draft index i read as token i)."""
    from refimpl import dflash

    V = tiny_target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(V, generator=g)
    ids = ids[:600].sort().values if kept == "a subset" else ids
    torch.manual_seed(0)
    d = dflash.new_draft(tiny_target, num_layers=2, block=5, mask_id=2, taps=(3, 1, 2), kept=ids).eval()
    with torch.no_grad():
        for n, p in d.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    info = export.write_dflash(tiny_target, d, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    assert info["target_layer_ids"] == cfg["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert cfg["num_hidden_layers"] == 2 and info["speculative_config"]["num_speculative_tokens"] == 4
    assert ("d2t" in w) == (kept == "a subset") and cfg["draft_vocab_size"] == len(ids)
    check_dflash_loads(w, cfg)
    E = tiny_target.model.get_input_embeddings().weight.detach().float()
    hidden, aux, block = dflash_case(tiny_target, d, KJV[2])
    ours = our_dflash(d, aux, block)  # (4, V), -inf outside the kept tokens
    theirs = vllm_dflash(w, cfg, hidden, block, E)
    assert torch.allclose(theirs, ours, atol=1e-4, rtol=1e-4)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
    H = d.hidden_size
    ours_order = {**w, "fc.weight": d.fc.weight.detach().float()}  # blocks in tap order (3, 1, 2)
    assert torch.equal(w["fc.weight"], torch.cat([d.fc.weight[:, i * H:(i + 1) * H] for i in (1, 2, 0)], 1))
    assert not torch.allclose(vllm_dflash(ours_order, cfg, hidden, block, E), ours, atol=1e-2)
    if kept == "a subset":
        no_map = {k: v for k, v in w.items() if k != "d2t"}
        assert not torch.equal(vllm_dflash(no_map, cfg, hidden, block, E).argmax(-1), ours.argmax(-1))


def test_dflash_load_check_catches_a_wrong_layout(tiny_target, tmp_path):
    """Negative controls of :func:`check_dflash_loads` on the exported ``dflash-tiny``: our module's own names
    (``layers.0.gate``...), a ``d2t`` for a drafter over every token (no ``draft_id_to_target_id`` to load
    into), a missing ``hidden_norm``, a head of 600 rows where the config says every token."""
    export.export("dflash-tiny", str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    d = drafters.load(tiny_target, "dflash")
    with pytest.raises(ValueError, match="no module or parameter"):
        check_dflash_loads({k: v for k, v in d.state_dict().items() if k != "embed"}, cfg)
    with pytest.raises(ValueError, match="draft_id_to_target_id"):
        check_dflash_loads({**w, "d2t": torch.zeros(cfg["vocab_size"], dtype=torch.long)}, cfg)
    with pytest.raises(AssertionError, match="hidden_norm"):
        check_dflash_loads({k: v for k, v in w.items() if k != "hidden_norm.weight"}, cfg)
    with pytest.raises(ValueError, match="shape"):
        check_dflash_loads({**w, "lm_head.weight": w["lm_head.weight"][:600]}, cfg)


@pytest.mark.parametrize("taps,match", [((2, 4), "final normed state"), ((2, 2), "distinct"), ((0, 2), "distinct")])
def test_dflash_export_refuses_taps_vllm_cannot_read(taps, match, tiny_target, tmp_path):
    """Tap 4 = L is tiny's final normed state (vLLM's layer 3 stream is before the norm); a repeated tap is
    read once by vLLM's target, so its fc would expect more streams than arrive."""
    from refimpl import dflash

    d = dflash.new_draft(tiny_target, num_layers=1, block=4, mask_id=2, taps=taps)
    with pytest.raises(ValueError, match=match):
        export.write_dflash(tiny_target, d, str(tmp_path))
    assert not os.path.exists(tmp_path / "config.json")


def test_pard_export_proposes_our_parallel_drafts(tiny_target, tmp_path):
    """``tiny-pard`` -> a plain Hugging Face Llama folder with ``pard_token``; vLLM's ``draft_model`` with
    ``parallel_drafting`` (``copy_and_expand_eagle_inputs_kernel``) feeds it [context..., bonus, MASK x (K - 1)]
    at consecutive positions, causally, and samples the K slots from the bonus on: their argmaxes are our
    :class:`refimpl.pard.PardProposer`'s greedy proposals (k = K, topk = 1) on King James prompts, the bonus the
    target's greedy next token. Negative control: another token in the mask slots changes the proposals."""
    from transformers import LlamaForCausalLM

    from refimpl import pard, speculative

    info = export.export("tiny-pard", str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    lm = models.load("tiny-pard", prepack=False)
    mask, K = cfg["pard_token"], info["speculative_config"]["num_speculative_tokens"]
    assert mask == lm.model.config.pard_token == info["pard_token"] == 2 and K == pard.CPU_SLOTS
    assert info["speculative_config"]["method"] == "draft_model" and info["speculative_config"]["parallel_drafting"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and not cfg["tie_word_embeddings"]
    assert os.path.exists(tmp_path / "tokenizer.json")
    hf, load = LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32, output_loading_info=True)
    assert not any(load.values()), load  # no missing, unexpected or mismatched tensors
    hf.eval()

    def theirs(ids, fill):
        x = torch.tensor([ids + [fill] * (K - 1)])
        with torch.no_grad():
            return hf(x, position_ids=torch.arange(x.shape[1])[None]).logits[0, -K:]  # causal by default

    changed = 0
    for text in KJV:
        ctx = tiny_target.encode(text)
        with torch.no_grad():
            bonus = int(tiny_target.model(torch.tensor([ctx])).logits[0, -1].argmax())
        ids = ctx + [bonus]
        prop = pard.PardProposer(lm, mask_id=mask, k=K, topk=1, total=K, target=tiny_target)
        prop.start(torch.tensor([ids]), None, speculative.Sampling())
        ours = prop.propose([K]).tokens[0]  # (K,)
        got = theirs(ids, mask)
        with torch.no_grad():
            assert torch.allclose(got, lm.model(torch.tensor([ids + [mask] * (K - 1)])).logits[0, -K:], atol=1e-4)
        assert torch.equal(got.argmax(-1), ours), (got.argmax(-1), ours)
        changed += not torch.equal(theirs(ids, mask + 1).argmax(-1), ours)
    assert changed >= 1


def test_eagle3_export_writes_fc_in_vllms_layer_order_and_refuses_a_repeated_tap(tmp_path):
    """vLLM keeps a target's tapped layers as a sorted set and concatenates their streams in increasing layer
    order: a draft that taps (3, 1, 2) is written with ``fc``'s column blocks in layer order and the ids sorted,
    and vLLM's forward on the sorted streams is ours. Negative control: ``fc`` as our draft holds it (tap order)
    moves the logits. A draft that taps a layer twice (vLLM reads it once) is refused."""
    from refimpl import eagle3

    tiny = models.load("tiny", prepack=False)
    torch.manual_seed(0)
    d = eagle3.new_draft(tiny, taps=(3, 1, 2)).eval()
    export.write_eagle3(tiny, d, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    w = load_file(str(tmp_path / "model.safetensors"))
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    ids = torch.tensor([tiny.tokenizer.encode("In the beginning God created the heaven and the earth. And the")])
    with torch.no_grad():
        _, _, ours_aux = tiny.forward(ids, output_hidden_states=d.taps)
        _, _, their_aux = tiny.forward(ids, output_hidden_states=(1, 2, 3))
        tok = ids[0, 1:]
        ours = d.logits(eagle3.unroll(d, tok[None], d.fuse(ours_aux[:, :-1].float()), torch.ones_like(tok)[None], 1)[0][0])
        E = tiny.model.get_input_embeddings().weight.detach().float()
        theirs = vllm_eagle3(w, cfg, tok, their_aux[0, :-1].float(), E)
        assert torch.allclose(theirs, ours, atol=2e-3, rtol=1e-4)
        unordered = {**w, "fc.weight": d.fc.weight.detach().float()}
        assert not torch.allclose(vllm_eagle3(unordered, cfg, tok, their_aux[0, :-1].float(), E), ours, atol=2e-3, rtol=1e-4)
    with pytest.raises(ValueError, match="reads each layer once"):
        export.write_eagle3(tiny, eagle3.new_draft(tiny, taps=(1, 1, 2)), str(tmp_path / "twice"))

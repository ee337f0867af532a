"""refimpl.export: the layouts vLLM loads, checked in plain torch against our own drafters.

vLLM itself lives in another environment (``make production``); here its model code is re-stated
in plain torch from the vLLM 0.32 files the exporters cite (medusa.py's ``ResidualBlock`` + one
shared head; llama_eagle.py's ``fc`` without bias, layer 0 without input norm, vLLM's fused
add + RMSNorm, the final ``hidden + residual``), and fed the exported tensors: its greedy
proposals must be ours. Negative controls: the naive exports (zeros for the non-kept rows, no bias
layer in front of the EAGLE layer) are caught.
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

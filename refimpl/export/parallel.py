"""The parallel drafters of chapter 15b (PARD, DFlash) in the layouts vLLM 0.32 loads (``python -m refimpl.export``).

**PARD** (``tiny-pard``, ``smollm2-135m-pard``; :mod:`refimpl.pard`) -> a standalone Hugging Face
``LlamaForCausalLM`` folder (:func:`refimpl.export.common.write_llama_draft`) whose ``config.json`` names the
mask token ``pard_token``; vLLM runs it as ``{"method": "draft_model", "model": DIR, "num_speculative_tokens": K,
"parallel_drafting": true}``. The layout is vLLM's ``draft_model`` method (``vllm/v1/spec_decode/draft_model.py``
on ``vllm/v1/spec_decode/llm_base_proposer.py``; ``parallel_drafting`` in ``vllm/config/speculative.py``):
the proposer reads the mask id from the draft config (``dflash_config.mask_token_id``, ``mask_token_id``,
``dspark_noise_token_id``, then ``pard_token``), feeds the draft the tokens the target just verified, the bonus
token and ``K - 1`` mask tokens at consecutive positions (causal, ``copy_and_expand_eagle_inputs_kernel`` in
``vllm/v1/spec_decode/utils.py``) and takes the ``K`` argmaxes at the bonus and mask slots: our
:class:`refimpl.pard.PardProposer` with ``k = K``, ``topk = 1``. Differences: vLLM writes the mask slots' keys
into cache slots the next tokens overwrite, ours drops them (the same attention); vLLM's draft scores the whole
vocabulary (a ``draft_model`` has no ``d2t``), so SmolLM2's head over 8,192 kept tokens travels as
:func:`~refimpl.export.common.full_head` (same argmax) and the context tokens our trimmed draft adds to its head
do not travel; a PARD draft's first proposal in vLLM comes after the target's prefill, ours with it.

**DFlash** (``dflash-tiny``, ``dflash-smollm2-135m``; :mod:`refimpl.dflash`) -> vLLM's
``DFlashQwen3ForCausalLM`` (``vllm/model_executor/models/qwen3_dflash.py``, registered as ``DFlashDraftModel``
in ``vllm/model_executor/models/registry.py``): ``config.json`` a Qwen3 config (``model_type: qwen3``,
``architectures: ["DFlashDraftModel"]``) of the draft's own layers plus ``dflash_config`` =
``{"mask_token_id", "target_layer_ids"}``, ``block_size`` and ``draft_vocab_size``; weights ``fc``,
``hidden_norm``, ``layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``norm``, ``lm_head`` and, for a kept subset, ``d2t``
(draft index -> token id offset; ``t2d`` is skipped by vLLM's loader, so none is written). vLLM runs it as
``{"method": "dflash", "model": DIR, "num_speculative_tokens": block - 1}``. The same model, piece by piece:
vLLM's ``combine_hidden_states`` is our ``fc``, ``precompute_and_store_context_kv`` applies ``hidden_norm`` and
each layer's ``k_proj`` / ``k_norm`` / rotary and ``v_proj`` to the context (our ``k_proj([ctx; norm(x)])``),
the query block ``[bonus, MASK x K]`` (``_copy_and_expand_dflash_inputs``) attends non-causally (no
``layer_types`` sliding, no ``is_causal``: ``_resolve_layer_attention``) to the cached context and itself,
and the K mask slots are sampled after ``norm`` and ``lm_head``. Differences, each handled here:

- *Taps.* ``target_layer_ids`` are zero-based layer indices: vLLM reads the residual stream after layer ``i``
  (``eagle3_utils.get_eagle3_aux_layers_from_config`` adds 1: our tap ``i + 1``). Our tap ``L`` (the target's
  last) is the final *normed* state, vLLM's stream after layer ``L - 1`` is before the final norm: refused.
  vLLM concatenates the streams in layer order, so ``fc``'s input blocks are written in that order; a repeated
  tap (vLLM reads each layer once) is refused.
- *Head.* Ours scores the target's head rows ``kept`` (None: all); vLLM's ``lm_head`` has ``draft_vocab_size``
  rows and maps them through ``d2t`` only when that differs from the target's vocabulary (else
  ``draft_id_to_target_id`` is None and a ``d2t`` has no parameter to load into): a draft over every token is
  written in token order without ``d2t``.
- *Embedding.* Not written: vLLM shares the target's (``_maybe_share_embeddings``), as ours; the mask slots
  embed ``mask_token_id``'s row (no ``mask_embedding.pt``).
- *Norms.* vLLM has one ``rms_norm_eps`` for every norm: a draft whose norms differ is refused.
"""
import os

import torch

from .common import target_folder, target_name, write_json, write_llama_draft, write_safetensors


def export_pard(name: str, out: str) -> dict:
    """The zoo's PARD draft ``name`` (``tiny-pard``, ``smollm2-135m-pard``) -> a Hugging Face Llama folder with
    ``pard_token`` (see the module doc); the target's tokenizer files travel with it."""
    from .. import models
    from ..models.drafters import KINDS
    from ..pard import CPU_SLOTS

    pards = KINDS["pard"].models
    if name not in pards.values():
        raise ValueError(f"name must be one of {sorted(pards.values())}, got {name!r}")
    target = next(t for t, p in pards.items() if p == name)
    lm = models.load(name, prepack=False)
    mask_id = getattr(lm.model.config, "pard_token", None)
    if mask_id is None:
        raise ValueError(f"{name}: its config names no pard_token (train it for PARD first)")
    info = write_llama_draft(lm, out, target_folder(models.load(target, prepack=False)), {"pard_token": int(mask_id)})
    return {"speculative_config": {"method": "draft_model", "model": out, "num_speculative_tokens": CPU_SLOTS,
                                   "parallel_drafting": True}, "pard_token": int(mask_id), **info}


def export_dflash(name: str, out: str) -> dict:
    """The zoo's DFlash drafter ``name`` (``dflash-<target>``) -> vLLM's DFlash folder (:func:`write_dflash`)."""
    from .. import models
    from ..models import drafters

    target = models.load(target_name(name, "dflash"), prepack=False)
    return write_dflash(target, drafters.load(target, "dflash"), out, name)


def write_dflash(target, d, out: str, name: str = "the drafter") -> dict:
    """A DFlash drafter ``d`` (:class:`refimpl.dflash.DFlashDraft`) of ``target`` -> vLLM's ``DFlashDraftModel``
    folder ``out`` (see the module doc). -> what it wrote: the ``speculative_config``, ``target_layer_ids``, the
    kept vocabulary."""
    L = target.num_layers
    taps = list(d.taps)
    if max(taps) >= L:
        raise ValueError(f"{name}: the drafter taps layer {max(taps)}, which is the target's final normed state here; "
                         f"vLLM's target_layer_ids {L - 1} is the residual stream before the final norm, a different "
                         f"tensor (taps 1..{L - 1} are the same in both)")
    if min(taps) < 1 or len(set(taps)) != len(taps):
        raise ValueError(f"{name}: taps must be distinct layer ids in [1, {L - 1}] for vLLM, got {taps}")
    eps = d.norm.eps
    norms = [d.hidden_norm] + [n for layer in d.layers for n in (layer.input_norm, layer.post_norm, layer.q_norm,
                                                                 layer.k_norm)]
    if any(n.eps != eps for n in norms):
        raise ValueError(f"{name}: vLLM's DFlash layer has one rms_norm_eps; this drafter's norms differ")
    H = d.hidden_size
    order = sorted(range(len(taps)), key=lambda i: taps[i])  # vLLM concatenates the streams in layer order
    fc = torch.cat([d.fc.weight[:, i * H:(i + 1) * H] for i in order], 1)
    V = int(d.embed.shape[0])
    kept = torch.arange(V, device="cpu") if d.kept is None else d.kept.cpu()
    head = d.head.weight
    full = len(kept) == V
    if full:  # every token kept: row t must be token t's (no d2t to map it)
        head = head[torch.argsort(kept).to(head.device)]
    state = {"fc.weight": fc, "hidden_norm.weight": d.hidden_norm.weight, "norm.weight": d.norm.weight,
             "lm_head.weight": head}
    for i, layer in enumerate(d.layers):
        p = f"layers.{i}."
        state.update({p + "input_layernorm.weight": layer.input_norm.weight,
                      p + "post_attention_layernorm.weight": layer.post_norm.weight,
                      p + "self_attn.q_proj.weight": layer.q_proj.weight, p + "self_attn.k_proj.weight": layer.k_proj.weight,
                      p + "self_attn.v_proj.weight": layer.v_proj.weight, p + "self_attn.o_proj.weight": layer.o_proj.weight,
                      p + "self_attn.q_norm.weight": layer.q_norm.weight, p + "self_attn.k_norm.weight": layer.k_norm.weight,
                      p + "mlp.gate_proj.weight": layer.gate.weight, p + "mlp.up_proj.weight": layer.up.weight,
                      p + "mlp.down_proj.weight": layer.down.weight})
    if not full:
        state["d2t"] = (kept - torch.arange(len(kept), device="cpu")).long()
    ids = sorted(t - 1 for t in taps)
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "vocab_size": V,
           "draft_vocab_size": int(len(kept)), "target_hidden_size": H, "num_hidden_layers": len(d.layers),
           "num_attention_heads": d.num_heads, "num_key_value_heads": d.num_kv_heads, "head_dim": d.head_dim,
           "intermediate_size": d.intermediate, "hidden_act": "silu", "rms_norm_eps": eps, "attention_bias": False,
           "rope_parameters": {"rope_theta": float(d.rope_theta), "rope_type": "default"},
           "max_position_embeddings": int(target.config.max_position_embeddings), "tie_word_embeddings": False,
           "block_size": d.block, "dflash_config": {"mask_token_id": int(d.mask_id), "target_layer_ids": ids},
           "dtype": "float32"}
    os.makedirs(out, exist_ok=True)
    write_safetensors(out, "model.safetensors", state)
    write_json(out, "config.json", cfg)
    return {"speculative_config": {"method": "dflash", "model": out, "num_speculative_tokens": d.block - 1},
            "target_layer_ids": ids, "mask_token_id": int(d.mask_id), "kept": int(len(kept)), "vocab": V}

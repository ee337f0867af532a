"""What every exporter of :mod:`refimpl.export` shares: the full-vocabulary head, the files, the Hugging Face Llama
folder of a draft model (the chain draft, the PARD drafts).

**The kept vocabulary.** Our heads score only the tokens their training answers used (VocabTrim,
chapter 04a: 5,951 of SmolLM2's 49,152 for Medusa and EAGLE, 8,192 for the chain draft). Where vLLM 0.32 has no
path for a head over a subset (Medusa's ``token_map`` does not load, a ``draft_model`` has none), an export
carries a **full-vocabulary head whose non-kept rows can never win an argmax** (:func:`full_head`): the row of a
non-kept token is a copy of the row of the smallest kept token id ``k0``, so its logit equals ``k0``'s and
``argmax`` (first index on ties) returns ``k0`` or a kept token; non-kept ids below ``k0`` get a zero row
(logit 0: they could win only where every kept logit is negative, which :func:`head_agreement` measures).
Greedy proposals over the full vocabulary then equal ours over the kept one.
"""
import json
import os
import shutil

import torch


def full_head(rows: torch.Tensor, kept: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """A (vocab, H) LM head from ``rows`` (vocab, H) whose argmax over all ``vocab`` tokens equals the
    argmax over ``kept`` (token ids) alone: kept rows as they are, a non-kept token above the smallest kept
    id ``k0`` copies ``k0``'s row (ties resolve to the lower index, ``k0``), one below it gets zeros."""
    if kept is None:
        return rows.clone()
    if rows.shape[0] != vocab:
        raise ValueError(f"rows has {rows.shape[0]} rows, expected the vocabulary size {vocab}")
    kept = kept.long().to(rows.device)
    k0 = int(kept.min())
    out = rows[k0].expand(vocab, -1).clone()  # (vocab, H)
    out[:k0] = 0
    out[kept] = rows[kept]
    return out


def head_agreement(head: torch.Tensor, full: torch.Tensor, kept: torch.Tensor | None, feats: torch.Tensor) -> float:
    """Fraction of ``feats`` (N, H) whose argmax over ``full`` (V, H) equals the kept-head argmax
    (``head`` (V', H) = rows ``kept`` of the original) mapped back to token ids."""
    ours = head.float() @ feats.float().T  # (V', N)
    idx = ours.argmax(0)
    want = idx if kept is None else kept.long().to(idx.device)[idx]
    got = (feats.float() @ full.float().T).argmax(-1)  # (N,)
    return float((got == want).float().mean())


def target_name(name: str, kind: str) -> str:
    """``"medusa-smollm2-135m"`` -> ``"smollm2-135m"``."""
    if not name.startswith(kind + "-"):
        raise ValueError(f"name must start with {kind!r}-, got {name!r}")
    return name[len(kind) + 1:]


def write_safetensors(folder: str, file: str, state: dict) -> None:
    """``state`` as host tensors, weights in fp32; integer / bool tensors (index tables) keep their dtype."""
    from safetensors.torch import save_file

    save_file({k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
               for k, v in state.items()}, os.path.join(folder, file), metadata={"format": "pt"})


def write_json(folder: str, file: str, obj: dict) -> None:
    with open(os.path.join(folder, file), "w") as f:
        json.dump(obj, f, indent=1)


def target_folder(target) -> str | None:
    """The Hugging Face folder a target was loaded from (its config and tokenizer), if it has one."""
    path = getattr(target.model.config, "_name_or_path", None)
    return path if path and os.path.isdir(path) else None


def copy_tokenizer(src: str | None, out: str) -> None:
    """The tokenizer and generation files of folder ``src`` (if any) into ``out``."""
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if src and os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))


def write_llama_draft(lm, out: str, tokenizer_from: str | None, extra: dict | None = None) -> dict:
    """A draft model ``lm`` (an :class:`refimpl.lm.LM` over a Hugging Face ``LlamaForCausalLM``; a trimmed one
    scores its ``kept_ids`` only) -> a standalone fp32 ``LlamaForCausalLM`` folder ``out``: its layers and
    embedding as they are, its head as a full-vocabulary ``lm_head`` (:func:`full_head` of the kept rows; an
    untrimmed draft's own head, untied), ``config.json`` updated with ``extra``, the tokenizer files of folder
    ``tokenizer_from``. -> ``{"kept": kept tokens or None, "vocab": V}``."""
    m = lm.model
    kept = getattr(lm, "kept_ids", None)
    E = m.model.embed_tokens.weight.detach().float()  # (V, H)
    W = m.lm_head.weight.detach().float()  # (V', H): the kept rows, or every row
    if kept is None:
        head = W.clone()
    else:
        rows = torch.zeros_like(E)
        rows[kept.to(E.device)] = W
        head = full_head(rows, kept, E.shape[0])
    state = {k: v for k, v in m.state_dict().items() if not k.startswith("lm_head")}
    state["lm_head.weight"] = head
    cfg = m.config.to_dict()
    cfg.update({"tie_word_embeddings": False, "vocab_size": E.shape[0], "architectures": ["LlamaForCausalLM"],
                "dtype": "float32", **(extra or {})})
    cfg.pop("torch_dtype", None)
    os.makedirs(out, exist_ok=True)
    write_safetensors(out, "model.safetensors", state)
    write_json(out, "config.json", cfg)
    copy_tokenizer(tokenizer_from, out)
    return {"kept": None if kept is None else int(kept.numel()), "vocab": int(E.shape[0])}

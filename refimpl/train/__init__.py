"""Layer 4: train every model of the zoo on this CPU, ``python -m refimpl.train NAME``.

Nothing below this layer imports it. :data:`TRAINERS` is the one table of trainers
(``"module:function"``, imported only when that model is trained); each takes
``(out_dir, **options)`` and writes the weights plus ``train_report.json``:

- ``tiny``, ``tiny-draft``: :mod:`refimpl.train.ar`;
- ``tiny-dllm``, ``tiny-dllm-rev``, ``tiny-bdlm`` (adapted from ``tiny``): :mod:`refimpl.train.dllm`;
- ``smollm2-135m-draft``: :mod:`refimpl.train.smol_draft` on the data of
  :mod:`refimpl.train.distill_data`;
- ``medusa-tiny``, ``medusa-smollm2-135m`` (heads on a frozen target): :mod:`refimpl.train.medusa`;
- ``eagle-tiny``, ``eagle-smollm2-135m`` (a feature-level draft on a frozen target): :mod:`refimpl.train.eagle`;
- ``eagle3-tiny``, ``eagle3-smollm2-135m`` (EAGLE-3: multi-layer features, training-time test):
  :mod:`refimpl.train.eagle3`;
- ``tiny-cllm`` (``tiny`` on its Jacobi trajectories), ``tiny-cllm-onpolicy`` (``tiny-cllm`` again, on
  contexts of its own text), ``tiny-bdlm-dparallel`` (``tiny-bdlm`` with
  certainty forcing), ``learn2pd-tiny-bdlm-dparallel`` / ``learn2pd-tiny-bdlm`` (Learn2PD's filter):
  :mod:`refimpl.train.cllm` (chapter 15);
- ``tiny-pard`` (``tiny-draft`` adapted for parallel drafting): :mod:`refimpl.train.pard`; ``dflash-tiny``,
  ``dflash-smollm2-135m`` (a block-diffusion drafter on a frozen target): :mod:`refimpl.train.dflash`
  (chapter 15b).

A drafter for any other model (``python -m refimpl.train {eagle3,dflash,pard} --target PATH``):
:mod:`refimpl.train.own`. The rows SmolLM2's drafters train on and their one held-out set:
:mod:`refimpl.train.smollm2_data`.

The helpers every trainer shares (token streams, the optimisation loop, fp16 files) are
:mod:`refimpl.train.common`, re-exported here.
"""
from .common import (causal_lm_perplexity, cosine_lr, encode_docs, random_windows, save_fp16, save_half,  # noqa: F401
                     tiny_config, train_loop, train_tokenizer, wrap_tokenizer)

#: name -> "module:function"; each function takes ``(out_dir, **options)``.
TRAINERS: dict[str, str] = {
    "tiny": "refimpl.train.ar:train_tiny",
    "tiny-draft": "refimpl.train.ar:train_tiny_draft",
    "tiny-dllm": "refimpl.train.dllm:train_tiny_dllm",
    "tiny-dllm-rev": "refimpl.train.dllm:train_tiny_dllm_rev",
    "tiny-bdlm": "refimpl.train.dllm:train_tiny_bdlm",
    "smollm2-135m-draft": "refimpl.train.smol_draft:train_smollm2_draft_recipe",
    "medusa-tiny": "refimpl.train.medusa:train_medusa_tiny",
    "medusa-smollm2-135m": "refimpl.train.medusa:train_medusa_smollm2",
    "eagle-tiny": "refimpl.train.eagle:train_eagle_tiny",
    "eagle-smollm2-135m": "refimpl.train.eagle:train_eagle_smollm2",
    "eagle3-tiny": "refimpl.train.eagle3:train_eagle3_tiny",
    "eagle3-smollm2-135m": "refimpl.train.eagle3:train_eagle3_smollm2",
    "eagle3-smollm2-135m-cpu": "refimpl.train.eagle3:train_eagle3_smollm2_cpu",
    "tiny-cllm": "refimpl.train.cllm:train_tiny_cllm",
    "tiny-cllm-onpolicy": "refimpl.train.cllm:train_tiny_cllm_onpolicy",
    "tiny-bdlm-dparallel": "refimpl.train.cllm:train_tiny_bdlm_dparallel",
    "learn2pd-tiny-bdlm-dparallel": "refimpl.train.cllm:train_learn2pd",
    "learn2pd-tiny-bdlm": "refimpl.train.cllm:train_learn2pd_bdlm",
    "tiny-pard": "refimpl.train.pard:train_tiny_pard",
    "smollm2-135m-pard": "refimpl.train.pard:train_smollm2_pard",
    "dflash-tiny": "refimpl.train.dflash:train_dflash_tiny",
    "dflash-smollm2-135m": "refimpl.train.dflash:train_dflash_smollm2",
}

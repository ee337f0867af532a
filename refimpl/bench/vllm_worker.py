"""The vLLM side of ``make production``: run in vLLM's own environment (``.venv-vllm/bin/python
refimpl/bench/vllm_worker.py JOB.json OUT.json``), it imports vLLM (with its transformers) and the standard
library only, never ``refimpl`` (vLLM 0.32 pins ``transformers<5.20``; ours is 5.23).

The job (written by :mod:`refimpl.bench.production`): ``{"target": folder, "speculative_config": dict or
null, "prompts": [[token ids], ...], "max_new_tokens": N, "repeats": R}``. One ``vllm.LLM`` is built
(greedy fp32, ``enforce_eager``), then every prompt is generated alone (one request at a time, no EOS stop)
``R`` times after one warm-up request. The result: the load time, per prompt the tokens, the seconds of
each repeat and vLLM's own speculative-decoding counters for that prompt's first repeat
(``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
``..._num_accepted_tokens_per_pos``, read with ``LLM.get_metrics()``). Where vLLM refuses the
configuration, ``error`` holds its exception type and message.
"""
import json
import os
import sys
import time
import traceback

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos")


def counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (absent ones: 0)."""
    out = {c: 0 for c in COUNTERS}
    for m in llm.get_metrics():
        if m.name in COUNTERS:
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def delta(after: dict, before: dict) -> dict:
    out = {}
    for k, a in after.items():
        b = before.get(k, 0)
        if isinstance(a, list):
            b = b if isinstance(b, list) else [0] * len(a)
            out[k.split(":")[1]] = [x - y for x, y in zip(a, b)]
        else:
            out[k.split(":")[1]] = a - b
    return out


def target_args(folder: str, max_model_len: int = 2048) -> dict:
    """``LLM`` arguments for the target in ``folder``: ``max_model_len`` at most its ``max_position_embeddings``
    and, where its ``config.json`` names no ``architectures`` (``tiny``'s: vLLM would resolve the bare
    ``LlamaModel``), the causal-LM class of its ``model_type`` (transformers' table) as ``hf_overrides``."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    out = {"model": folder, "max_model_len": min(max_model_len, cfg.get("max_position_embeddings", max_model_len))}
    if not cfg.get("architectures"):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        out["hf_overrides"] = {"architectures": [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg["model_type"]]]}
    return out


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    try:
        llm = LLM(**target_args(job["target"], job.get("max_model_len", 2048)), dtype="float32", enforce_eager=True,
                  speculative_config=job.get("speculative_config"), disable_log_stats=False, seed=0)
    except Exception as e:  # vLLM refused the configuration: record exactly what it said
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    load = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], sp, use_tqdm=False)  # warm-up
    rows = []
    for ids in job["prompts"]:
        before, secs, tokens, spec = counters(llm), [], None, None
        for r in range(job.get("repeats", 1)):
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
            secs.append(time.perf_counter() - t)
            if r == 0:
                tokens, spec = list(out[0].outputs[0].token_ids), delta(counters(llm), before)
        rows.append({"tokens": tokens, "seconds": secs, "spec": spec})
    return {"load_seconds": load, "rows": rows, "threads": os.environ.get("OMP_NUM_THREADS")}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = run(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)

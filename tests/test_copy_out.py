"""Copy an algorithm out: the module and the files it imports (followed from its import statements,
kernels included) go into an empty folder, as a package of another name, and run there on a plain
transformers ``LlamaForCausalLM`` (a tiny random config) through the ``LM`` adapter, with ``refimpl``
and ``triton`` unimportable (Triton has no wheel on macOS or Windows; the CPU path never needs it).
The tokens must equal the package's own, for seven algorithms: speculative sampling, EAGLE-2's dynamic
tree, the EAGLE-3 draft's tree, SAM decoding, Fast-dLLM's threshold sampler, and the parallel drafters
PARD (greedy and sampled) and DFlash."""
import ast
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from refimpl import dflash, diffusion, dynamic_tree, eagle3, models, pard, retrieval, speculative

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("torch_kernels")


def project_files(module: str) -> set[str]:
    """``module`` (``"refimpl.eagle3"``) and every project file its import statements reach, as paths
    relative to the repository (a copy needs the lazy imports inside functions too)."""
    todo, seen = [module], set()
    while todo:
        name = todo.pop()
        path = os.path.join(*name.split(".")) + ".py"
        if not os.path.exists(os.path.join(ROOT, path)):
            path = os.path.join(*name.split("."), "__init__.py")
        if path in seen:
            continue
        seen.add(path)
        if "." in name and not name.startswith("refimpl"):  # a package's own __init__ comes with its modules
            todo.append(name.rsplit(".", 1)[0])
        pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1]) if node.level else ""
                target = ".".join(p for p in (base, node.module) if p)
                for a in node.names:
                    for cand in (f"{target}.{a.name}", target):
                        if cand.split(".")[0] in ("refimpl", "kernels") and cand != "refimpl" and (
                                os.path.exists(os.path.join(ROOT, *cand.split(".")) + ".py")
                                or os.path.exists(os.path.join(ROOT, *cand.split("."), "__init__.py"))):
                            todo.append(cand)
                            break
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "kernels"]
    return seen


def copy_out(module: str, dest) -> str:
    """The files of ``module`` under ``dest``, ``refimpl/`` renamed ``copied/`` (with an empty
    ``__init__``): -> the copied module's import name."""
    os.makedirs(dest / "copied", exist_ok=True)
    (dest / "copied" / "__init__.py").write_text("")
    for path in project_files(module):
        rel = path.replace("refimpl" + os.sep, "copied" + os.sep, 1)
        os.makedirs(os.path.dirname(dest / rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), dest / rel)
    return "copied." + module.split(".", 1)[1]


def run_copied(dest, module: str, script: str) -> list:
    """Run ``script`` with ``M`` = the copied module and ``L`` = the copied ``lm``, refimpl and triton
    unimportable, the copy first on the path; -> the JSON it prints."""
    pre = (f"import sys, json, torch\nsys.modules['triton'] = None\nsys.modules['refimpl'] = None\n"
           f"sys.path.insert(0, {str(dest)!r})\nimport kernels\nassert kernels.__file__.startswith({str(dest)!r})\n"
           f"import {module} as M\nimport copied.lm as L\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    out = subprocess.run([sys.executable, "-c", pre + script], capture_output=True, text=True, env=env, cwd=dest,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llamas(tmp_path_factory, tiny):
    """A random 4-layer Llama target and a random 1-layer draft (``tiny``'s tokenizer), saved."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("llamas")
    for name, layers, seed in (("target", 4, 0), ("draft", 1, 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=tiny.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id, bos_token_id=0)
        LlamaForCausalLM(cfg).save_pretrained(folder / name)
        tiny.tokenizer.save_pretrained(folder / name)
    return folder


LOAD = ("from transformers import AutoTokenizer, LlamaForCausalLM\n"
        "def load(path):\n    return L.LM(LlamaForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))\n")


def prompts_for(tiny):
    return [tiny.encode("And God said, Let there be light: and there was light. And God said, Let there be"),
            tiny.encode("In the beginning")]


def test_speculative_sampling_copied_out(tmp_path, llamas, tiny):
    prompts = prompts_for(tiny)
    t, d = (models.load(str(llamas / n), device="cpu") for n in ("target", "draft"))
    want = speculative.generate(t, prompts, draft=d, gamma=3, max_new_tokens=16, temperature=0.8,
                                generator=torch.Generator().manual_seed(5), eos_token_id=[]).tokens
    mod = copy_out("refimpl.speculative", tmp_path)
    got = run_copied(tmp_path, mod, LOAD + f"t, d = load({str(llamas / 'target')!r}), load({str(llamas / 'draft')!r})\n"
                     f"g = M.generate(t, {prompts!r}, draft=d, gamma=3, max_new_tokens=16, temperature=0.8, "
                     "generator=torch.Generator().manual_seed(5), eos_token_id=[])\nprint(json.dumps(g.tokens))")
    assert got == want


def test_dynamic_tree_copied_out(tmp_path, llamas, tiny):
    prompts = prompts_for(tiny)
    t, d = (models.load(str(llamas / n), device="cpu") for n in ("target", "draft"))
    want = dynamic_tree.generate(t, prompts, draft=d, max_new_tokens=16, eos_token_id=[]).tokens
    mod = copy_out("refimpl.dynamic_tree", tmp_path)
    got = run_copied(tmp_path, mod, LOAD + f"t, d = load({str(llamas / 'target')!r}), load({str(llamas / 'draft')!r})\n"
                     f"g = M.generate(t, {prompts!r}, draft=d, max_new_tokens=16, eos_token_id=[])\n"
                     "print(json.dumps(g.tokens))")
    assert got == want


def fresh_draft_copied_out(tmp_path, llamas, tiny, module, **kw):
    """A fresh random drafter (``module.new_draft(target, **kw)``, seeded) on the random target: the copied
    module's greedy tokens against the package's."""
    prompts = prompts_for(tiny)
    t = models.load(str(llamas / "target"), device="cpu")
    torch.manual_seed(3)
    draft = module.new_draft(t, **kw)
    torch.save(draft.state_dict(), tmp_path / "draft.pt")
    want = module.generate(t, prompts, draft=draft, max_new_tokens=16, eos_token_id=[]).tokens
    mod = copy_out(module.__name__, tmp_path)
    got = run_copied(tmp_path, mod, LOAD + f"t = load({str(llamas / 'target')!r})\nd = M.new_draft(t, **{kw!r})\n"
                     f"d.load_state_dict(torch.load({str(tmp_path / 'draft.pt')!r}))\n"
                     f"g = M.generate(t, {prompts!r}, draft=d, max_new_tokens=16, eos_token_id=[])\n"
                     "print(json.dumps(g.tokens))")
    assert got == want


def test_eagle3_copied_out(tmp_path, llamas, tiny):
    fresh_draft_copied_out(tmp_path, llamas, tiny, eagle3)


def test_pard_copied_out(tmp_path, llamas, tiny):
    """The random draft as a PARD draft (its mask token: tiny's MASK), greedy and sampled."""
    prompts, mask = prompts_for(tiny), tiny.tokenizer.mask_token_id
    t, d = (models.load(str(llamas / n), device="cpu") for n in ("target", "draft"))
    want = [pard.generate(t, prompts, draft=d, mask_id=mask, k=4, max_new_tokens=16, eos_token_id=[], temperature=temp,
                          generator=torch.Generator().manual_seed(5)).tokens for temp in (0.0, 0.8)]
    mod = copy_out("refimpl.pard", tmp_path)
    got = run_copied(tmp_path, mod, LOAD + f"t, d = load({str(llamas / 'target')!r}), load({str(llamas / 'draft')!r})\n"
                     f"g = [M.generate(t, {prompts!r}, draft=d, mask_id={mask}, k=4, max_new_tokens=16, eos_token_id=[], "
                     "temperature=temp, generator=torch.Generator().manual_seed(5)).tokens for temp in (0.0, 0.8)]\n"
                     "print(json.dumps(g))")
    assert got == want


def test_dflash_copied_out(tmp_path, llamas, tiny):
    """A random two-layer DFlash drafter on the random target (its taps, its block of 5)."""
    fresh_draft_copied_out(tmp_path, llamas, tiny, dflash, num_layers=2, block=5, mask_id=tiny.tokenizer.mask_token_id)


def test_sam_copied_out(tmp_path, llamas, tiny):
    prompts = prompts_for(tiny)
    t = models.load(str(llamas / "target"), device="cpu")
    want = retrieval.generate(t, prompts, method="sam", max_new_tokens=16, eos_token_id=[]).tokens
    mod = copy_out("refimpl.retrieval", tmp_path)
    got = run_copied(tmp_path, mod, LOAD + f"t = load({str(llamas / 'target')!r})\n"
                     f"g = M.generate(t, {prompts!r}, method='sam', max_new_tokens=16, eos_token_id=[])\n"
                     "print(json.dumps(g.tokens))")
    assert got == want


def test_fast_dllm_threshold_sampler_copied_out(tmp_path, tiny):
    """The Fast-dLLM sampler with the zoo's ``tiny-dllm`` (read by the copied ``diffusion_lm.load_dir``)."""
    dlm = models.load("tiny-dllm", device="cpu")
    prompts = prompts_for(tiny)
    want = diffusion.generate(dlm, prompts, gen_length=16, steps=16, block_length=8, threshold=0.9).tokens
    mod = copy_out("refimpl.diffusion", tmp_path)
    copy_out("refimpl.diffusion_lm", tmp_path)
    got = run_copied(tmp_path, mod, "import copied.diffusion_lm as D\n"
                     f"m = D.load_dir({os.path.join(ROOT, 'models', 'tiny-dllm')!r}, device='cpu')\n"
                     f"g = M.generate(m, {prompts!r}, gen_length=16, steps=16, block_length=8, threshold=0.9)\n"
                     "print(json.dumps(g.tokens))")
    assert got == want


def test_the_copied_files_are_the_core_and_the_chain():
    """What a copy takes: EAGLE-3 needs the verification core, the primitives, its chain (eagle,
    dynamic_tree) and two kernel files, nothing else."""
    got = {os.path.basename(p)[:-3] if "kernels" not in p else "kernels/" + os.path.basename(p)[:-3]
           for p in project_files("refimpl.eagle3")}
    assert got == {"eagle3", "eagle", "dynamic_tree", "speculative", "tree", "slot_cache", "lm", "generation",
                   "sampling", "primitives", "kernels/__init__", "kernels/verify_greedy", "kernels/rejection_sample"}

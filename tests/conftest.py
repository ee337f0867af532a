"""Shared fixtures. TRITON_INTERPRET must be set before any kernel module is imported."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # pytest-xdist runs one worker per core


@pytest.fixture(scope="session")
def tiny():
    from refimpl import models

    return models.load("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_prompts(tiny):
    texts = [
        "And God said",
        "In the beginning",
        "The LORD is my shepherd; I shall not want. He maketh me",
        "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that",
        "And",
    ]
    return [tiny.encode(t) for t in texts]


@pytest.fixture(scope="session")
def spec_prompts(tiny):
    """tests/decoding.py's TEXTS encoded for tiny: a ragged batch with a refrain."""
    from decoding import TEXTS

    return [tiny.encode(t) for t in TEXTS]


@pytest.fixture(scope="session")
def spec_ar_free(tiny, spec_prompts):
    """AR greedy continuations of ``spec_prompts``: 20 tokens, no EOS stop (the ground truth)."""
    from refimpl import autoregressive

    return autoregressive.generate(tiny, spec_prompts, max_new_tokens=20, eos_token_id=[]).tokens


@pytest.fixture(scope="module")
def torch_kernels():
    """Run the kernels' torch references (the interpreter costs ~0.1 s a call); the kernel tests
    check Triton == reference. Use with ``pytestmark = pytest.mark.usefixtures("torch_kernels")``.
    (The kernel files are imported while TRITON_INTERPRET=1: their jit functions are built for the
    interpreter, which later tests in this process use.)"""
    import kernels

    with kernels.references():
        yield

"""The zoo's parallel drafters for SmolLM2 (PARD and DFlash) give AR's greedy tokens under every preset of
their modules, through the front door, on a chat prompt and a copy prompt."""
import pytest

import refimpl
from refimpl import autoregressive, dflash, models, pard
from refimpl.models import drafters
from refimpl.prompts import encode_prompt


@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def prompts(smol):
    return [encode_prompt(smol, "Why do cats like boxes?"),
            encode_prompt(smol, "Repeat exactly: red, green, blue, red, green, blue.")]


@pytest.mark.parametrize("method,module", [("pard", pard), ("dflash", dflash)])
def test_every_preset_equals_ar_greedy_on_smollm2(smol, prompts, method, module):
    assert drafters.has(smol, method), f"the zoo has no {method} drafter for smollm2-135m"
    ar = autoregressive.generate(smol, prompts, max_new_tokens=8).tokens
    for preset in module.PRESETS:
        g = refimpl.generate(smol, prompts, method=method, preset=preset, max_new_tokens=8)
        assert g.tokens == ar, (method, preset)
        assert g.stats.draft_calls <= g.stats.target_calls, "one draft call per target call at most"

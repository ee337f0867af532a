"""The prompt pool for distilling ``smollm2-135m-draft`` (:mod:`refimpl.train.distill_data` asks the
target to answer it). Built here from word lists, random arithmetic, King James passages and
standard-library docstrings, with the benchmark's prompts (:mod:`refimpl.prompts`) excluded:
stage 1 asks for paragraphs and functions, stage 2 reuses them as source texts for summary / copy /
edit / QA / code tasks, stage 3 copies human text, stage 4's questions come from the target itself
(:func:`clean_question` filters them).
"""
from __future__ import annotations

import random

from .. import data
from ..prompts import PROMPTS

#: Topics for chat questions and for the stage-1 paragraphs (everyday, science, history, skills).
TOPICS = [
    "the moon", "volcanoes", "honeybees", "the internet", "recycling", "the Roman Empire", "rainbows",
    "electric cars", "coffee", "the human heart", "black holes", "gardening", "chess", "the ocean",
    "democracy", "vaccines", "music", "friendship", "time management", "dinosaurs", "bread baking",
    "solar energy", "the Great Wall of China", "penguins", "exercise", "social media", "the brain",
    "earthquakes", "photography", "libraries", "trees", "money", "airplanes", "the desert", "tea",
    "robots", "snow", "bicycles", "the printing press", "cats", "dogs", "rivers", "mountains",
    "the weather", "clouds", "lightning", "the seasons", "birds", "butterflies", "whales", "sharks",
    "forests", "rain", "wind power", "nuclear energy", "plastic pollution", "climate change",
    "the solar system", "Mars", "stars", "telescopes", "microscopes", "bacteria", "viruses", "sleep",
    "healthy eating", "vitamins", "running", "swimming", "yoga", "football", "the Olympic Games",
    "painting", "poetry", "novels", "theatre", "movies", "video games", "board games", "cooking",
    "pizza", "chocolate", "rice", "farming", "cities", "villages", "trains", "ships", "bridges",
    "castles", "ancient Egypt", "the pyramids", "ancient Greece", "the Vikings", "the Middle Ages",
    "the Renaissance", "the Industrial Revolution", "the steam engine", "electricity", "magnets",
    "computers", "smartphones", "programming", "artificial intelligence", "the stock market",
    "saving money", "budgeting", "shopping", "advertising", "newspapers", "radio", "television",
    "languages", "learning a new language", "writing letters", "public speaking", "teamwork",
    "leadership", "kindness", "patience", "happiness", "stress", "meditation", "holidays", "camping",
    "hiking", "the beach", "islands", "maps", "compasses", "clocks", "calendars", "gold", "diamonds",
    "glass", "paper", "cotton", "wool", "water", "salt", "sugar", "bees and flowers", "frogs",
    "elephants", "lions", "horses", "owls", "ants", "spiders", "the rainforest", "the Arctic",
    "glaciers", "tides", "the Amazon river", "the Nile", "deserts at night", "caves", "fossils",
]
#: Chat question templates ({} = a topic).
CHAT_TEMPLATES = [
    "Explain {} in simple terms.",
    "Give me three interesting facts about {}.",
    "What are the pros and cons of {}?",
    "Write a short poem about {}.",
    "Why is {} important? Answer briefly.",
    "Tell me something surprising about {}.",
    "How would you explain {} to a child?",
    "What is the history of {} in a few sentences?",
    "List five words related to {} and explain each.",
    "Write a short story that involves {}.",
    "What are common questions people ask about {}? Answer two of them.",
    "Give me a fun quiz question about {} and its answer.",
]
#: Stage-1 passage templates: the answers become source texts for stage 2.
PASSAGE_TEMPLATES = [
    "Write a short paragraph about {}.",
    "Write a short news report about {}.",
]
#: Everyday requests (no topic slot).
ADVICE = [
    "How do I write a thank-you note to a teacher?", "What should I bring to a picnic?",
    "Suggest a name for a bakery and explain why.", "How can I save money on groceries?",
    "Give me a short plan for learning to cook in one month.", "How do I prepare for a job interview?",
    "How do I politely ask a neighbor to turn down the music?", "Give me tips for a first day at a new school.",
    "What are some fun things to do on a rainy day?", "How can I stay focused while working from home?",
    "What are good habits for staying healthy at work?", "How do I make a cup of green tea?",
    "Give me a recipe for pancakes.", "How can I make new friends in a new city?",
    "What should I do if I cannot fall asleep?", "How do I start running as a beginner?",
    "Suggest three gifts for a friend who loves books.", "How do I keep a houseplant alive?",
    "What is a good way to organize my week?", "How can I become a better listener?",
    "Write a polite email asking my manager for a day off.", "How do I apologize to a friend?",
    "Plan a simple birthday party for a seven-year-old.", "What should I know before adopting a dog?",
    "How do I clean a cast iron pan?", "Give me a short packing list for a beach holiday.",
    "How can I reduce my screen time?", "Write a short speech to welcome new students.",
    "Suggest a weekend itinerary for a small town.", "How do I change a flat bicycle tire?",
]
#: Python function tasks ("Write a Python function that ...").
CODE_TASKS = [
    "returns the sum of a list of numbers", "finds the largest number in a list", "reverses a string",
    "removes duplicates from a list", "returns the n-th Fibonacci number", "checks whether a number is prime",
    "counts the words in a sentence", "converts Celsius to Fahrenheit", "sorts a list of dictionaries by a key",
    "returns the average of a list", "capitalizes the first letter of every word", "checks whether a year is a leap year",
    "returns the greatest common divisor of two numbers", "flattens a list of lists",
    "counts how often each character appears in a string", "returns the second largest number in a list",
    "checks whether two strings are anagrams", "converts a number to binary", "returns the product of a list",
    "finds the index of an item in a list", "returns all even numbers from a list", "squares every number in a list",
    "checks whether a list is sorted", "returns the length of the longest word in a sentence",
    "reads a text file and returns its lines", "writes a list of strings to a file",
    "returns the minimum and maximum of a list", "computes the power of a number without using **",
    "returns a dictionary of word counts", "splits a list into chunks of size n", "rotates a list by k positions",
    "returns the digits of a number as a list", "checks whether a string contains only digits",
    "computes the area of a circle", "converts kilometers to miles", "returns the median of a list",
    "merges two dictionaries", "returns the common elements of two lists", "removes all spaces from a string",
    "counts the lines in a file", "returns the last n items of a list", "generates a multiplication table",
    "checks whether a number is even", "returns the sum of the digits of a number",
    "finds the shortest string in a list", "replaces every vowel in a string with a star",
    "implements binary search", "implements bubble sort", "returns the transpose of a matrix",
    "adds two matrices", "returns the first non-repeated character in a string",
    "converts a list of strings to uppercase", "checks whether a number is a perfect square",
    "computes compound interest", "returns the number of days between two dates",
    "validates a simple email address", "returns a random password of length n",
    "counts the negative numbers in a list", "returns the cumulative sum of a list",
    "groups words by their first letter",
]
CODE_TEMPLATES = [
    "Write a Python function that {}.",
    "Write a short Python function that {}, with a docstring.",
    "How do I write a function in Python that {}? Show the code.",
]
#: Stage-2 edits of a function the target wrote ({} = the code).
CODE_EDITS = [
    "Add a docstring and type hints to this function:\n\n{}",
    "Explain what this function does:\n\n{}",
    "Copy this code exactly and add a comment to each line:\n\n{}",
    "Rewrite this code with clearer variable names:\n\n{}",
    "Write two test cases for this function:\n\n{}",
]
#: Stage-2 tasks on a passage ({} = the passage; {w} = a word of it, {n} = a replacement).
PASSAGE_TASKS = [
    "Summarize the following text in two sentences.\n\n{}",
    "Write a one-sentence summary of this text.\n\n{}",
    "Repeat the following text word for word.\n\n{}",
    "Rewrite the following text, replacing '{w}' with '{n}' and keeping everything else the same.\n\n{}",
    "Copy the following text exactly, but change the word '{w}' to '{n}'.\n\n{}",
    "Fix any spelling mistakes and otherwise copy the text unchanged.\n\n{}",
    "{}\n\nQuestion: What is this text about?",
    "{}\n\nQuestion: What is the most important fact in this text?",
    "List the key facts in this text as bullet points.\n\n{}",
    "Rewrite this text for a young child.\n\n{}",
    "Give this text a short title.\n\n{}",
    "Translate this text into simpler English.\n\n{}",
]
REPLACEMENTS = ["it", "the thing", "this", "something", "the place", "people", "a lot", "that"]
#: the passage tasks that copy the text (word for word, with one word changed, or spelling fixed)
COPY_TASKS = [t for t in PASSAGE_TASKS if "word for word" in t or "{w}" in t or "spelling" in t]
KJV_TASKS = [
    "Explain this Bible passage in modern English.\n\n{}",
    "Summarize this passage in one sentence.\n\n{}",
    "Repeat the following text word for word.\n\n{}",
    "{}\n\nQuestion: Who is speaking in this passage, and what do they say?",
    "What lesson can we learn from this passage?\n\n{}",
]


def _math_problems(rng: random.Random, n: int) -> list[str]:
    """``n`` word problems with random numbers, in a dozen shapes."""
    names = ["Anna", "Ben", "Carlos", "Dina", "Eli", "Fatima", "George", "Hana", "Ivan", "Julia", "Kofi", "Lena"]
    things = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "coins", "cards", "eggs", "flowers"]
    vehicles = ["car", "bus", "cyclist", "boat", "plane", "runner", "truck"]
    shapes = [
        lambda: f"What is {rng.randint(5, 60)}% of {rng.randint(2, 40) * 10}? Show your work.",
        lambda: f"A {rng.choice(vehicles)} travels {rng.randint(3, 60) * 10} km in {rng.randint(2, 6)} hours. "
                f"What is its average speed? Explain step by step.",
        lambda: f"Solve for x: {rng.randint(2, 9)}x + {rng.randint(1, 30)} = {rng.randint(31, 99)}. Show each step.",
        lambda: f"If a rectangle is {rng.randint(2, 30)} m long and {rng.randint(2, 30)} m wide, "
                f"what are its area and perimeter?",
        lambda: f"{rng.choice(names)} has {rng.randint(10, 90)} {rng.choice(things)} and gives away "
                f"{rng.randint(2, 9)} of them. How many are left? Explain.",
        lambda: f"What is {rng.randint(11, 99)} times {rng.randint(11, 99)}? Show your steps.",
        lambda: f"What is {rng.randint(2, 40) * 12} divided by {rng.choice([2, 3, 4, 6, 12])}? Show your steps.",
        lambda: f"A shop sells {rng.choice(things)} for {rng.randint(2, 9)} dollars each. How much do "
                f"{rng.randint(3, 20)} of them cost? Explain.",
        lambda: f"What is the average of {', '.join(str(rng.randint(1, 50)) for _ in range(rng.randint(3, 5)))}? "
                f"Show your work.",
        lambda: f"Convert {rng.randint(2, 12)}.5 hours into minutes. Explain.",
        lambda: f"What is the area of a circle with radius {rng.randint(2, 20)} cm?",
        lambda: f"{rng.choice(names)} reads {rng.randint(5, 40)} pages a day. How many pages in "
                f"{rng.randint(2, 14)} days? Explain.",
        lambda: f"A recipe needs {rng.randint(2, 5)} eggs for {rng.randint(2, 6)} people. How many eggs "
                f"for {rng.randint(7, 20)} people? Explain.",
        lambda: f"What is {rng.randint(100, 999)} + {rng.randint(100, 999)} - {rng.randint(10, 99)}? Show each step.",
    ]
    return [rng.choice(shapes)() for _ in range(n)]


def _kjv_passages(rng: random.Random, n: int) -> list[str]:

    verses = data.kjv_verses()
    out = []
    for _ in range(n):
        i = rng.randrange(len(verses) - 3)
        out.append(" ".join(v["text"].strip() for v in verses[i : i + rng.randint(2, 3)]))
    return out


def stage1_prompts() -> list[str]:
    """Paragraph and function requests whose answers become stage-2 source texts."""
    return ([t.format(x) for x in TOPICS for t in PASSAGE_TEMPLATES]
            + [f"Write a Python function that {task}." for task in CODE_TASKS])


def passage_task(rng: random.Random, template: str, passage: str) -> str:
    """``template`` (one of :data:`PASSAGE_TASKS`) on ``passage``: ``{w}`` a word of it (longer than 4
    letters) drawn with ``rng``, ``{n}`` a replacement drawn next (both drawn whatever the template)."""
    words = [w.strip(".,;:!?'\"") for w in passage.split() if len(w) > 4 and w.isalpha()]
    w = rng.choice(words) if words else "the"
    return template.replace("{w}", w).replace("{n}", rng.choice(REPLACEMENTS)).format(passage)


def bench_texts() -> set[str]:

    return {t for texts in PROMPTS.values() for t in texts}


def stage2_prompts(passages: list[str], functions: list[str], seed: int = 0, n_math: int = 600,
                   n_kjv: int = 300) -> list[str]:
    """Chat, advice, code, math, passage tasks on ``passages``, code edits of ``functions``, KJV."""
    rng = random.Random(seed)
    out = [t.format(x) for x in TOPICS for t in CHAT_TEMPLATES] + list(ADVICE)
    out += [t.format(task) for task in CODE_TASKS for t in CODE_TEMPLATES[1:]]
    out += _math_problems(rng, n_math)
    for p in passages:
        out += [passage_task(rng, t, p) for t in PASSAGE_TASKS]
    for f in functions:
        out += [t.format(f) for t in CODE_EDITS]
    for p in _kjv_passages(rng, n_kjv):
        out.append(rng.choice(KJV_TASKS).format(p))
    bench = bench_texts()
    return [t for t in out if t not in bench]


def prompt_pool(seed: int = 0) -> list[str]:
    """Stage-1 prompts (the pool that needs no model); stage 2 is built from their answers."""
    pool = stage1_prompts()
    if set(pool) & bench_texts():
        raise AssertionError("the distillation pool must not contain benchmark prompts")
    return pool


ASK_KINDS = ["questions", "requests for advice", "questions asking for a list or a plan", "requests to write something",
             "questions starting with 'How' or 'Why'", "questions a student asked"]
ASK_PROMPT = "Here are some {} about {} that people typed into a helpful AI chatbot:\n\n1."
#: first words of a request that is not phrased as a question
REQUEST_VERBS = ("Write", "Give", "Suggest", "Tell", "Explain", "List", "Describe", "Help", "Create", "Plan",
                 "Make", "Recommend", "Share", "Compose", "Draft", "Summarize", "Compare", "Name", "Teach", "Show")


def clean_question(line: str) -> str | None:
    """One sampled list item as a user question (number and quotes removed); None if it is not one."""
    import re

    line = re.sub(r"^\s*\d+[.)]\s*", "", line.strip()).strip().strip('"').strip()
    for prefix in ("Question:", "Request:", "User:", "Q:"):
        if line.startswith(prefix):
            line = line[len(prefix):].strip()
    if not (15 <= len(line) <= 220) or not line[0].isupper():
        return None
    if not (line.endswith("?") or (line.startswith(REQUEST_VERBS) and line[-1] in ".!")):
        return None
    return line


DOC_MODULES = ["argparse", "asyncio", "calendar", "collections", "csv", "datetime", "decimal", "difflib", "email",
               "fractions", "ftplib", "functools", "gettext", "glob", "gzip", "heapq", "html", "http.client",
               "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "locale", "logging", "mailbox",
               "multiprocessing", "os", "pathlib", "pickle", "platform", "poplib", "queue", "random", "re",
               "shutil", "smtplib", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile",
               "tempfile", "textwrap", "threading", "time", "tkinter", "turtle", "unittest", "urllib.request",
               "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "zipfile"]


def prose_paragraphs(texts) -> list[str]:
    """The prose paragraphs of ``texts`` (split at blank lines, whitespace joined), each once, in order:
    120-600 characters, over 90% letters and plain punctuation, no doctest, a capital first, a full stop last."""
    import re

    seen, out = set(), []
    for doc in texts:
        for para in doc.split("\n\n"):
            text = " ".join(para.split())
            letters = sum(ch.isalpha() or ch in " ,.;:'-()" for ch in text)
            if (120 <= len(text) <= 600 and letters > 0.9 * len(text) and ">>>" not in text
                    and re.match(r"[A-Z]", text) and text.endswith(".") and text not in seen):
                seen.add(text)
                out.append(text)
    return out


def human_passages(seed: int = 0, limit: int = 1500) -> list[str]:
    """Prose paragraphs from standard-library docstrings (human text the target did not write).

    Copying text the target could not have predicted is what a draft must learn for copy /
    summary / question-answer prompts; the target's own paragraphs do not teach it.
    """
    import importlib
    import inspect

    def docs():
        for name in DOC_MODULES:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module missing on this Python is simply skipped
                continue
            objs = [mod] + [v for _, v in sorted(vars(mod).items()) if inspect.isfunction(v) or inspect.isclass(v)]
            yield from (inspect.getdoc(obj) or "" for obj in objs)

    out = prose_paragraphs(docs())
    random.Random(seed).shuffle(out)
    return out[:limit]


def human_copy_prompts(seed: int = 0, limit: int = 1500) -> list[str]:
    """Two tasks per human passage (a copy / edit task and any passage task), plus KJV copies."""
    rng = random.Random(seed)
    out = []
    for p in human_passages(seed, limit):
        out += [passage_task(rng, t, p) for t in (rng.choice(COPY_TASKS), rng.choice(PASSAGE_TASKS))]
    out += [rng.choice(COPY_TASKS).replace("{w}", "unto").replace("{n}", "to").format(p)
            for p in _kjv_passages(rng, limit // 4)]
    bench = bench_texts()
    return [t for t in out if t not in bench]


def reference_passages() -> list[str]:
    """Prose paragraphs of the Python language reference that ships with the interpreter
    (``pydoc_data.topics``): more human text the target did not write, as :func:`human_passages`."""
    from pydoc_data.topics import topics

    return prose_paragraphs(topics[name] for name in sorted(topics))


#: chat templates of the pool's second part ({} = a topic), none of :data:`CHAT_TEMPLATES`
MORE_CHAT_TEMPLATES = [
    "Explain in one paragraph what {} means to people.", "Describe {} in three sentences.",
    "What are the main things to know about {}? Explain each briefly.", "Write a short blog post introduction about {}.",
    "What would the world be like without {}?", "Compare {} with something similar and explain the difference.",
    "Give me a beginner's guide to {} in five steps.", "What are some myths about {}, and what is true?",
    "Write a haiku about {} and explain it.", "Why do people find {} interesting?",
    "What should every student know about {}?", "Write a short dialogue between two friends talking about {}.",
]


def more_prompts(seed: int = 0, n_kjv: int = 2500, n_math: int = 800) -> list[str]:
    """The pool's second part, drawn from a random stream of its own (the first part, and every answer cached
    for it, stays as it was): chat on the topics in :data:`MORE_CHAT_TEMPLATES`, one passage task
    (summary, copy, edit, question) on each of ``n_kjv`` King James passages and on each of Python's
    language-reference paragraphs (:func:`reference_passages`), a copy / edit task on each reference
    paragraph again, ``n_math`` more word problems."""
    rng = random.Random(10_000 + seed)
    out = [t.format(x) for x in TOPICS for t in MORE_CHAT_TEMPLATES]
    out += [passage_task(rng, rng.choice(PASSAGE_TASKS), p) for p in _kjv_passages(rng, n_kjv)]
    for p in reference_passages():
        out += [passage_task(rng, t, p) for t in (rng.choice(PASSAGE_TASKS), rng.choice(COPY_TASKS))]
    out += _math_problems(rng, n_math)
    return out


def general_pool(seed: int = 0) -> list[str]:
    """Every prompt this module builds with no model, once each: first stage 1's paragraph and code
    requests, stage 2's chat, advice, code, arithmetic and KJV tasks (those that need no source text) and
    stage 3's copy / edit tasks on human text, shuffled with ``seed``; then :func:`more_prompts` not among
    them, shuffled alike (so a prefix of the pool is the same whether the second part is there or not).
    The prompt pool of a drafter for any model (:mod:`refimpl.train.own`, SmolLM2's corpus); the
    benchmark's prompts are never among them."""
    first = list(dict.fromkeys(prompt_pool(seed) + stage2_prompts([], [], seed) + human_copy_prompts(seed)))
    random.Random(seed).shuffle(first)
    bench, had = bench_texts(), set(first)
    second = [t for t in dict.fromkeys(more_prompts(seed)) if t not in had and t not in bench]
    random.Random(seed).shuffle(second)
    return first + second

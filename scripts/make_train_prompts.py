"""Training prompts beyond ../shared/data/train: written from templates, for the default's
drafters (scripts/long_train.sh). Never from the evaluation sets (Spec-Bench, the agent
suite): the templates and word lists are specgen's own, and the texts that summarisation,
extraction, translation and RAG-style prompts quote are the target's own earlier answers
to the training prompts (data/smollm2-135m/answers.jsonl), the kind of text such prompts
carry and the kind the target then copies from.

    python scripts/make_train_prompts.py [N] > data/smollm2-135m/generated-prompts.jsonl

Deterministic (seeded): the same N gives the same file. Each line: {"category", "turns"}.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

TOPICS = """the ocean at night, a city after rain, learning to cook, an old bicycle, a first job,
moving to a new country, a lost dog, the last day of school, a mountain village, a robot that
paints, a library at midnight, a long train journey, a garden in winter, a small bakery,
friendship, a power cut, a chess tournament, the first snow, a lighthouse keeper, a market
morning, a broken phone, a music lesson, a desert road, a family recipe, an empty stadium,
an unexpected letter, a rainy weekend, a science fair, a night shift, a hiking trip""".split(",")
FORMS = ["poem", "short story", "email to a friend", "blog post introduction", "diary entry",
         "product description", "two-paragraph essay", "speech for a small event", "haiku",
         "news headline and summary"]  # fmt: skip
ROLES = [
    "a travel guide in Lisbon",
    "a patient math teacher",
    "a ship captain in a storm",
    "a coffee shop owner",
    "a detective",
    "a museum guide",
    "a football coach",
    "a librarian",
    "a chef",
    "a tech support agent",
    "a park ranger",
    "a news anchor",
]
REQUESTS = [
    "Introduce yourself to a newcomer.",
    "Give three tips for a beginner.",
    "Describe a typical day at work.",
    "Answer a customer who is unhappy.",
    "Explain the most important rule of your job.",
    "Tell a short story from work.",
    "Recommend something for a rainy day.",
    "Say what you would change first.",
]
CONCEPTS = """photosynthesis, inflation, the water cycle, gravity, supply and demand, the
immune system, plate tectonics, compound interest, the French Revolution, democracy,
electric circuits, evolution, the greenhouse effect, vaccines, black holes, the Roman Empire,
machine learning, binary numbers, the printing press, climate and weather, the human heart,
recycling, the stock market, the Renaissance, sound waves, friction, the moon's phases,
probability, the internet, taxes""".split(",")
TASKS = """reverses a string, checks whether a number is prime, counts the vowels in a text,
returns the largest of three numbers, merges two sorted lists, removes duplicates from a list
keeping order, computes the factorial of n, converts Celsius to Fahrenheit, finds the most
common word in a sentence, checks whether a string is a palindrome, flattens a nested list,
returns the n-th Fibonacci number, sums the digits of an integer, splits a list into chunks of
size k, capitalizes every word of a sentence, counts how many times each character appears,
returns the second largest number in a list, validates an email address with a simple rule,
computes the average of a list ignoring None values, rotates a list by k positions""".split(",")
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lea"]
ITEMS = ["apples", "books", "pencils", "stickers", "marbles", "cookies", "cards", "shells"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Kenya", "Norway", "Egypt", "India",
             "Mexico", "Australia", "Peru", "Vietnam"]  # fmt: skip


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(2, 9)
    who, other, item = rng.sample(NAMES, 2) + [rng.choice(ITEMS)]
    forms = [
        f"{who} has {a} {item}. {other} gives {who} {b} more, then {who} shares them equally "
        f"among {c} friends. How many does each friend get, and how many are left?",
        f"A shop sells {item} at {b} dollars each. {who} buys {a} of them and pays with "
        f"{a * b + c * 5} dollars. How much change does {who} get?",
        f"{who} reads {b} pages a day. The book has {a * b + c} pages. How many days does "
        f"{who} need to finish it?",
        f"A train travels {a * 5} km in {c} hours. At the same speed, how far does it go in "
        f"{c + b} hours?",
    ]
    return rng.choice(forms) + " Explain step by step."


def _reasoning(rng: random.Random) -> str:
    a, b, c = rng.sample(NAMES, 3)
    forms = [
        f"{a} is older than {b}, and {b} is older than {c}. Who is the youngest? Explain.",
        f"If {a} finishes a race before {b} but after {c}, who came first?",
        f"{a} says {b} is lying. {b} says {c} is lying. {c} says both {a} and {b} are lying. "
        "Who is telling the truth?",
    ]
    return rng.choice(forms)


def _sentences(text: str) -> list[str]:
    parts = [p.strip() for p in text.replace("\n", " ").split(". ")]
    return [p + "." for p in parts if 30 <= len(p) <= 200]


def prompts(n: int, texts: list[str], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    passages = [t for t in texts if 300 <= len(t) <= 1500]
    sentences = [s for t in texts for s in _sentences(t)]
    makers = {
        "writing": lambda: f"Write a {rng.choice(FORMS)} about {rng.choice(TOPICS).strip()}.",
        "roleplay": lambda: f"You are {rng.choice(ROLES)}. {rng.choice(REQUESTS)}",
        "reasoning": lambda: _reasoning(rng),
        "math": lambda: _math(rng),
        "coding": lambda: f"Write a Python function that {rng.choice(TASKS).strip()}.",
        "stem": lambda: f"Explain {rng.choice(CONCEPTS).strip()} to a high-school student.",
        "qa": lambda: rng.choice([f"What is the capital of {rng.choice(COUNTRIES)}?",
                                  f"What language is spoken in {rng.choice(COUNTRIES)}?",
                                  f"Name three facts about {rng.choice(COUNTRIES)}."]),
        "translation": lambda: f"Translate into {rng.choice(LANGUAGES)}: "
        f"{rng.choice(sentences)}",
        "summarization": lambda: "Summarize the following text in two sentences:\n\n"
        f"{rng.choice(passages)}",
        "extraction": lambda: "List the key points of the text below as bullet points:\n\n"
        f"{rng.choice(passages)}",
        "rag": lambda: "Use only the passage to answer.\n\nPassage:\n"
        f"{rng.choice(passages)}\n\nQuestion: What is the main idea of the passage?",
        "rewrite": lambda: "Rewrite the text below in simpler words, keeping its "
        f"structure:\n\n{rng.choice(passages)}",
    }  # fmt: skip
    names = list(makers)
    out, seen, misses = [], set(), dict.fromkeys(names, 0)
    while len(out) < n and names:
        category = names[len(out) % len(names)]
        text = makers[category]()
        if text in seen:  # a category whose templates are used up leaves the rotation
            misses[category] += 1
            if misses[category] > 50:
                names.remove(category)
            continue
        seen.add(text)
        misses[category] = 0
        out.append({"category": category, "turns": [text]})
    return out


def main() -> None:
    from specgen.hub import resolve_model
    from specgen.text.codec import TextCodec

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    answers = Path(__file__).parents[1] / "data" / "smollm2-135m" / "answers.jsonl"
    resolved = resolve_model("smollm2-135m")
    codec = TextCodec(resolved.path, resolved.name, ())
    rows = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    texts = [codec.decode(row["response_ids"]) for row in rows]
    for row in prompts(n, texts):
        print(json.dumps(row))


if __name__ == "__main__":
    main()

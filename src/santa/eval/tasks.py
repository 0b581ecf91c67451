"""Seeded, offline long-context tasks built on the Paul Graham essays.

A task is a :class:`Prompt`: chat-formatted text of a target length in the model's tokens, and the
expected answer. Generators are deterministic given ``seed``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from santa.assets import essays


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str  # the full prompt after the chat template
    answers: tuple[str, ...]  # what a correct answer must contain
    n_tokens: int
    seed: int
    meta: dict = field(default_factory=dict)


def haystack_sentences(seed: int) -> list[str]:
    """Essay sentences in a seeded order of essays (each essay kept in order)."""
    texts = essays()
    random.Random(seed).shuffle(texts)
    sentences: list[str] = []
    for text in texts:
        sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]
    return sentences


def fill_to_length(tokenizer, sentences: list[str], n_tokens: int) -> list[str]:
    """The longest prefix of ``sentences`` whose text has at most ``n_tokens`` tokens."""
    lengths = [len(tokenizer.encode(" " + s, add_special_tokens=False)) for s in sentences]
    total, kept = 0, []
    for sentence, length in zip(sentences, lengths, strict=True):
        if total + length > n_tokens:
            break
        kept.append(sentence)
        total += length
    if total < n_tokens * 0.9:
        raise ValueError(f"the essays hold only {total} tokens, fewer than the {n_tokens} asked for")
    return kept


def chat(tokenizer, user_message: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )


def needle_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0, depth: float = 0.5) -> Prompt:
    """Single needle: a 7-digit magic number hidden at ``depth`` (0 = start, 1 = end) of the essays.

    ``n_tokens`` is the length of the whole prompt in the model's tokens (template included,
    within a few tokens).
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    rng = random.Random(seed)
    key = rng.choice(["apple", "river", "lantern", "violet", "harbor", "falcon", "meadow", "copper"])
    number = str(rng.randrange(1_000_000, 10_000_000))
    needle = f"One of the special magic numbers for {key} is: {number}."
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    instruction = "Read the text below and answer the question that follows it.\n\n"
    frame = chat(tokenizer, instruction + needle + "\n\n" + question + " The special magic number is")
    budget = n_tokens - len(tokenizer.encode(frame, add_special_tokens=False))
    filler = fill_to_length(tokenizer, haystack_sentences(seed), budget)
    at = round(depth * len(filler))
    haystack = " ".join(filler[:at] + [needle] + filler[at:])
    text = chat(tokenizer, instruction + haystack + "\n\n" + question + " The special magic number is")
    return Prompt(
        task="niah_single",
        text=text,
        answers=(number,),
        n_tokens=len(tokenizer.encode(text, add_special_tokens=False)),
        seed=seed,
        meta={"key": key, "depth": depth},
    )


def contains_all(answer: str, expected: tuple[str, ...]) -> float:
    """1.0 when every expected string occurs in the answer, else 0.0."""
    return float(all(e in answer for e in expected))

"""Graders: a model's answer text and a prompt's expected answers → a score in [0, 1].

RULER tasks follow the paper's Appendix N (Table 22); GSM8K and MMLU follow its Llama-8B
protocol (Tables 20, 21). PRM800K's numeric grader is replaced by a normalised numeric compare:
both sides parsed as numbers (commas dropped) and compared exactly (|a − b| < 1e-6); a final
``\\boxed{N}`` in a GSM8K answer is read before the paper's last-line rule.
"""

from __future__ import annotations

import re

from santa.eval.tasks import Prompt, contains_all

INTEGER = re.compile(r"-?\d[\d,]*")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def multivalue_score(answer: str, expected: tuple[str, ...]) -> float:
    """niah multivalue: the first four unique integers of the answer, each in the gold set, /4."""
    found: list[str] = []
    for token in re.findall(r"\d+", answer):
        if token not in found:
            found.append(token)
        if len(found) == 4:
            break
    return sum(token in expected for token in found) / 4


def word_set_score(answer: str, expected: tuple[str, ...]) -> float:
    """fwe, cwe: share of gold words present in the answer (case-insensitive word match)."""
    words = set(re.findall(r"[a-z]+", answer.lower()))
    return sum(e.lower() in words for e in expected) / len(expected)


def string_match_all(answer: str, expected: tuple[str, ...]) -> float:
    """Share of gold strings that occur in the answer, case-insensitive (RULER string_match_all)."""
    text = answer.lower()
    return sum(e.lower() in text for e in expected) / len(expected)


BOXED = re.compile(r"\\boxed\{\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)")


def gsm8k_extract(answer: str) -> str | None:
    """The number a GSM8K answer ends on.

    A final ``\\boxed{N}`` wins (the convention of math-tuned models such as Qwen2.5, which put it
    above a closing ``\\]`` line where the rule below would find no number). Otherwise the
    paper's Llama-8B extraction: the first integer-looking token (commas allowed, optional minus)
    of the last non-empty line; failing that, of the final 25 whitespace-separated tokens.
    """
    boxed = BOXED.findall(answer)
    if boxed:
        return boxed[-1]
    lines = [line for line in answer.splitlines() if line.strip()]
    for chunk in ([lines[-1]] if lines else []) + [" ".join(answer.split()[-25:])]:
        match = INTEGER.search(chunk)
        if match:
            return match.group(0)
    return None


def numbers_equal(predicted: str | None, gold: str) -> bool:
    """Normalised numeric compare (our stand-in for PRM800K's grader)."""
    if predicted is None:
        return False
    try:
        return abs(float(predicted.replace(",", "")) - float(gold.replace(",", ""))) < 1e-6
    except ValueError:
        return False


def mmlu_extract(answer: str) -> str | None:
    """The paper's Llama-8B extraction: the first A–D (case-insensitive, as a whole word) after the
    last newline; failing that, the final 10 tokens scanned right to left."""
    tail = answer.strip().rsplit("\n", 1)[-1]
    match = re.search(r"\b([ABCDabcd])\b", tail)
    if match:
        return match.group(1).upper()
    for token in reversed(answer.split()[-10:]):
        match = re.search(r"\b([ABCDabcd])\b", token)
        if match:
            return match.group(1).upper()
    return None


def grade(prompt: Prompt, answer: str) -> float:
    """Score of ``answer`` for ``prompt`` by the task's grader."""
    task, expected = prompt.task, prompt.answers
    if task == "niah_multivalue":
        return multivalue_score(answer, expected)
    if task in ("fwe", "cwe"):
        return word_set_score(answer, expected)
    if task == "variable_tracking":
        return string_match_all(answer, expected)
    if task == "gsm8k":
        return float(numbers_equal(gsm8k_extract(answer), expected[0]))
    if task == "mmlu":
        return float(mmlu_extract(answer) == expected[0])
    return contains_all(answer, expected)


# Score a method reaching no answer at all would get by guessing (for "clearly above chance").
CHANCE = {"mmlu": 0.25}

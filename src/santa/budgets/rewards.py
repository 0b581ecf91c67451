"""Episode rewards: a schedule ``[L]`` and an episode seed → one number, higher is better.

- ``"kl"``: ``−mean KL(dense ‖ schedule)`` over the episode's prompts (:class:`~santa.budgets.scorers.KLScorer`).
  Small models earn it at any budget, and it is the least noisy signal per second of compute.
- a task of :data:`santa.eval.tasks.TASKS` (``niah_multivalue``, ``variable_tracking`` — retrieval
  that SmolLM2 can answer at 0.5–1k tokens — or ``gsm8k``/``mmlu`` for larger models): the mean
  graded score of the episode's questions (the paper's reward: accuracy on 16 questions).
- ``"synthetic"``: a cheap reward with a known optimum (no model) for testing a cluster.

An episode draws ``questions`` prompt seeds from the training ``pool`` (without replacement,
seeded by the episode) and samples with the episode seed. When the pool holds exactly
``questions`` seeds every episode reuses the same prompts, and their dense prefill is computed
once per worker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from santa.checks import integer
from santa.schedule_file import as_layer_budgets

TINY = "tiny-random"


@dataclass(frozen=True)
class RewardSpec:
    """What a worker evaluates; picklable, so each Ray worker builds its own model from it once."""

    kind: str = "kl"  # "kl", a task name, or "synthetic"
    model: str = "smollm2-135m"  # a bundled model of santa.assets, or "tiny-random"
    length: int = 1024  # prompt tokens (ignored by gsm8k / mmlu)
    questions: int = 16  # prompts per episode
    pool: tuple[int, ...] = tuple(range(1000, 2000))  # training prompt seeds
    sampler: str = "systematic"
    prefill: str = "dense"  # task rewards: "dense" (decode-only sampling) or "sampled"
    kl_tokens: int = 32
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("length", "questions", "kl_tokens", "max_new_tokens"):
            object.__setattr__(self, name, integer(name, getattr(self, name), low=1))
        object.__setattr__(self, "pool", tuple(integer("pool[]", p, low=0) for p in self.pool))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["pool"] = list(self.pool)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> RewardSpec:
        return cls(**{**data, "pool": tuple(data["pool"])})


def load(model: str, device: str = "cpu"):
    """(model, tokenizer): a bundled model, or the offline ``tiny-random`` Llama."""
    if model == TINY:
        from santa.budgets.tiny import tiny_model

        return tiny_model(device=device)
    from santa.assets import load_model

    return load_model(model, device=device)


def load_tokenizer(model: str):
    """The model's tokenizer alone (no weights): to check prompts before any worker starts."""
    if model == TINY:
        from santa.budgets.tiny import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    from santa.assets import cached_model

    return AutoTokenizer.from_pretrained(cached_model(model))  # built (or rebuilt) when missing or damaged


def check_prompts(model: str, *, metric: str, length: int, prompt: int) -> None:
    """Build one prompt of the metric at ``length`` tokens; ValueError when it cannot be built (too short)."""
    from santa.eval.runner import make_batch

    make_batch(metric, load_tokenizer(model), length, [prompt], "cpu")


def model_layers(model: str) -> int:
    """Number of decoder layers of a model, read from its config (the bundled cache, or tiny-random)."""
    if model == TINY:
        return 2
    from transformers import AutoConfig

    from santa.assets import cached_model

    return int(AutoConfig.from_pretrained(cached_model(model)).num_hidden_layers)  # verified cache, built once


def synthetic_target(n_layers: int) -> np.ndarray:
    """The synthetic reward's best share per layer ``[L]``: more in the first and the middle layers."""
    layers = np.arange(integer("n_layers", n_layers, low=1))
    weight = 0.3 + np.exp(-(((layers - (n_layers - 1) / 2) / max(n_layers / 6, 1)) ** 2))
    weight[0] += 1.0
    return weight / weight.sum()


class SyntheticReward:
    """``1 − ½‖s/N − target‖₁`` plus N(0, noise²) noise from the episode seed: in [0, 1] before noise."""

    def __init__(self, n_layers: int, *, noise: float = 0.02) -> None:
        self.target, self.noise = synthetic_target(n_layers), noise

    def __call__(self, schedule: Sequence[int], seed: int) -> float:
        s = np.asarray(schedule, dtype=np.float64)
        gap = 0.5 * np.abs(s / s.sum() - self.target).sum()
        return float(1.0 - gap + self.noise * np.random.default_rng(seed).standard_normal())


class ScorerReward:
    """Mean score of a scorer over the episode's prompts, negated for lower-is-better metrics (KL)."""

    def __init__(self, scorer, *, pool: Sequence[int], questions: int, sign: float) -> None:
        questions = integer("questions", questions, low=1)
        if questions > len(pool):
            raise ValueError(f"questions ({questions}) exceed the training pool ({len(pool)} prompts)")
        self.scorer, self.pool, self.questions, self.sign = scorer, list(pool), questions, sign

    def prompts(self, seed: int) -> list[int]:
        if self.questions == len(self.pool):
            return sorted(self.pool)
        return sorted(random.Random(seed).sample(self.pool, self.questions))

    def __call__(self, schedule: Sequence[int], seed: int) -> float:
        scores = self.scorer.scores(as_layer_budgets(schedule), prompts=self.prompts(seed), seed=seed % (1 << 62))
        return self.sign * float(np.mean(list(scores.values())))


def build_reward(spec: RewardSpec, *, n_layers: int, device: str = "cpu", threads: int | None = None):
    """The callable ``reward(schedule [L], episode seed) → float`` a worker runs (loads the model)."""
    if spec.kind == "synthetic":
        return SyntheticReward(n_layers)
    import torch

    from santa.budgets.scorers import LOWER_IS_BETTER, make_scorer

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load(spec.model, device)
    scorer = make_scorer(
        model, tokenizer, metric=spec.kind, length=spec.length, kl_tokens=spec.kl_tokens,
        max_new_tokens=spec.max_new_tokens, sampler=spec.sampler, prefill=spec.prefill,
    )
    return ScorerReward(scorer, pool=spec.pool, questions=spec.questions, sign=-1.0 if spec.kind in LOWER_IS_BETTER else 1.0)

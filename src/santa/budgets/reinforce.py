"""REINFORCE over per-layer budgets (the paper's Algorithm 1), as plain functions of numpy arrays.

Policy: logits ``θ ∈ R^L`` (θ = 0 at the start), ``p = softmax θ``. A schedule is
``s = floor + n`` with ``n ~ Multinomial(N′, p)`` and ``N′ = N − floor·L`` free samples: the paper
draws all ``N`` from the multinomial (``floor = 0``), but a layer with S = 0 cannot run sampled
attention, so the default keeps one sample per layer and draws the rest. The score function is

    ∇θ log Multinomial(n; N′, softmax θ) = n − N′·p          [L]

and one update from a batch of K episodes ``(s_k, r_k)``, each drawn from policy version
``v_k`` with probabilities ``p_k`` (Algorithm 1, lines 12–14), is

    g = (1/K) Σ_k (r_k − b)(n_k − N′·p_k),      θ ← θ + α g.

``p_k`` is the policy that drew episode k (with asynchronous workers it can be a version or two
behind; its score function is the one whose expectation is the policy gradient). Baseline ``b``:
``"running"`` (default) is the mean of every reward accepted before this batch (the batch's own
mean for the first one); ``"batch"`` is the batch's mean (Algorithm 1, line 12 as written).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from santa.checks import integer

BASELINES = ("running", "batch")


def softmax(theta: Sequence[float]) -> np.ndarray:
    """``softmax θ``: ``[L]`` → ``[L]`` float64."""
    z = np.asarray(theta, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def free_samples(*, n_layers: int, total: int, floor: int) -> int:
    """``N′ = N − floor·L``, the samples the multinomial spreads."""
    n_layers, total, floor = integer("n_layers", n_layers, low=1), integer("total", total), integer("floor", floor)
    free = total - floor * n_layers
    if floor < 0 or free < 0:
        raise ValueError(f"need floor ≥ 0 and total ≥ floor·layers, got total {total}, floor {floor}, {n_layers} layers")
    return free


def sample_schedule(theta: Sequence[float], *, total: int, floor: int, rng: np.random.Generator) -> np.ndarray:
    """``floor + Multinomial(N′, softmax θ)``: ``[L]`` int64 summing to ``total``."""
    p = softmax(theta)
    free = free_samples(n_layers=p.size, total=total, floor=floor)
    return floor + rng.multinomial(free, p)


def log_prob(counts: Sequence[int], theta: Sequence[float], n: int) -> float:
    """``log Multinomial(counts; n, softmax θ)``."""
    from math import lgamma

    n = integer("n", n, low=0)
    c = np.asarray(counts, dtype=np.float64)
    if c.sum() != n:
        raise ValueError(f"counts sum to {c.sum()}, not n = {n}")
    logp = np.log(softmax(theta))
    return float(lgamma(n + 1) - sum(lgamma(x + 1) for x in c) + (c * logp).sum())


def score_function(counts: Sequence[int], theta: Sequence[float], n: int) -> np.ndarray:
    """``∇θ log Multinomial(counts; n, softmax θ) = counts − n·softmax θ``: ``[L]`` float64."""
    return np.asarray(counts, dtype=np.float64) - n * softmax(theta)


@dataclass(frozen=True)
class Episode:
    """One evaluated schedule. ``version``: the policy version (update count) that drew it.

    Where it ran (records only; the update does not read them): ``worker`` (its name),
    ``device`` (the worker's kind: ``"cuda"`` or ``"cpu"``), ``pid`` (its process), ``seconds``
    (the reward's evaluation time) and ``finished`` (wall-clock time at its end, Unix seconds).
    Histories written before a field existed hold its default.
    """

    id: str
    schedule: tuple[int, ...]
    reward: float
    version: int
    worker: str = ""
    seconds: float = 0.0
    device: str = ""
    pid: int = 0
    finished: float = 0.0


@dataclass(frozen=True)
class PolicyState:
    """The aggregator's state: logits after ``version`` updates and the running reward sums."""

    theta: tuple[float, ...]
    version: int = 0
    reward_sum: float = 0.0
    reward_count: int = 0

    @classmethod
    def initial(cls, n_layers: int) -> PolicyState:
        return cls(theta=(0.0,) * integer("n_layers", n_layers, low=1))

    @property
    def running_mean(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None


@dataclass(frozen=True)
class Update:
    """What one REINFORCE step did: the new state, the baseline used and the gradient ``[L]``."""

    state: PolicyState
    baseline: float
    gradient: tuple[float, ...]


def baseline_for(state: PolicyState, rewards: Sequence[float], kind: str = "running") -> float:
    """The baseline ``b`` of the next update (see the module docstring)."""
    if kind not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {kind!r}")
    if kind == "running" and state.reward_count:
        return state.running_mean
    return float(np.mean(rewards))


def reinforce_step(
    state: PolicyState,
    episodes: Sequence[Episode],
    *,
    theta_of: Callable[[int], Sequence[float]],
    total: int,
    floor: int,
    alpha: float,
    baseline: str = "running",
) -> Update:
    """One aggregator update from a batch of episodes (Algorithm 1, lines 11–15).

    theta_of(version) → the logits ``[L]`` that drew an episode of that version.
    """
    if not episodes:
        raise ValueError("an update needs at least one episode")
    n_layers = len(state.theta)
    free = free_samples(n_layers=n_layers, total=total, floor=floor)
    rewards = [e.reward for e in episodes]
    b = baseline_for(state, rewards, baseline)
    g = np.zeros(n_layers)
    for e in episodes:
        counts = np.asarray(e.schedule, dtype=np.float64) - floor  # n_k, the multinomial draw
        g += (e.reward - b) * score_function(counts, theta_of(e.version), free)
    g /= len(episodes)
    theta = np.asarray(state.theta) + alpha * g
    new = PolicyState(
        theta=tuple(float(x) for x in theta),
        version=state.version + 1,
        reward_sum=state.reward_sum + float(sum(rewards)),
        reward_count=state.reward_count + len(rewards),
    )
    return Update(state=new, baseline=b, gradient=tuple(float(x) for x in g))


def episode_seed(seed: int, episode_id: str) -> int:
    """A 63-bit seed unique to (run seed, episode id): the schedule draw and the sampler's seed."""
    seed = integer("seed", seed, low=0)
    if not isinstance(episode_id, str):
        raise TypeError(f"episode_id must be a str, got {type(episode_id).__name__} {episode_id!r}")
    digest = hashlib.sha256(f"{seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1

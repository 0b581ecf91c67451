"""The tuning run's folder: its configuration, its append-only history, the policy and the schedule.

``OUT/run.json``: what the run tunes (the :class:`TuneSpec`); a resume must ask for the same.
``OUT/history.jsonl``: one line per accepted update, written with one fsync'd ``O_APPEND`` write
(``santa.eval.runner.append_record``)::

    {"key": "update 7", "update": 7, "session": 1, "theta": [...L], "baseline": b, "gradient": [...L],
     "reward_sum": Σr, "reward_count": n, "episodes": [{"id": "1-12-3", "schedule": [...L],
     "reward": r, "version": 6, "worker": "1-w2", "seconds": 3.1, "device": "cuda", "pid": 4711,
     "finished": t}, ...], "dropped": [...], "workers": 2, "devices": {"cuda": 1, "cpu": 1}, "time": t}

``dropped``: episodes that arrived since the last update but were drawn more than
``TuneSpec.max_staleness`` policy versions ago: recorded (their ids are used), not in the gradient.

An update is accepted exactly when its line is in the file: the driver applies an update, writes
its line, and only then dispatches work with the new policy. A killed driver therefore resumes
from the last line (θ, the running reward sums) with every accepted episode kept once; a line
cut mid-write is skipped, and its episodes were never accepted. Episode ids are
``"{session}-{run}-{episode}"`` with a new session number per driver start, so ids never repeat.
``OUT/policy.json`` (the newest θ) and ``OUT/schedule.json`` are rewritten atomically after every update.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from santa.budgets.reinforce import Episode, PolicyState, reinforce_step
from santa.budgets.rewards import RewardSpec
from santa.budgets.schedule import write_json_atomic

RUN, HISTORY, POLICY, SCHEDULE = "run.json", "history.jsonl", "policy.json", "schedule.json"


@dataclass(frozen=True)
class TuneSpec:
    """What a tuning run optimises; fixed for the life of its folder."""

    reward: RewardSpec
    n_layers: int
    total: int  # N, samples summed over layers
    floor: int = 1  # samples every layer keeps (the multinomial spreads N − floor·L)
    alpha: float = 0.02
    episodes: int = 10  # E, episodes per worker run (one policy snapshot)
    baseline: str = "running"
    seed: int = 0
    max_staleness: int | None = None  # drop episodes drawn more than this many versions ago (None: keep all)

    def to_dict(self) -> dict:
        return {**asdict(self), "reward": self.reward.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> TuneSpec:
        return cls(**{**data, "reward": RewardSpec.from_dict(data["reward"])})


class CheckpointError(ValueError):
    """A run folder that cannot be resumed as asked; the message names the file."""


def prepare(out: str | Path, spec: TuneSpec) -> None:
    """Write ``run.json`` for a new run, or check that a resumed run asks for the same spec."""
    path = Path(out) / RUN
    if path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: cannot read it ({error})") from error
        new = spec.to_dict()
        diff = sorted(k for k in set(saved) | set(new) if saved.get(k) != new.get(k))
        if diff:
            details = "; ".join(f"{k}: saved {saved.get(k)!r}, asked {new.get(k)!r}" for k in diff)
            raise CheckpointError(f"{path}: this folder holds a run with other settings ({details}); use another --out")
        return
    write_json_atomic(path, spec.to_dict())


@dataclass(frozen=True)
class Resumed:
    """The driver's state rebuilt from the history."""

    state: PolicyState
    thetas: dict[int, tuple[float, ...]]  # policy version → θ (0: the zeros it starts from)
    episode_ids: frozenset[str]
    session: int  # the number of the driver session starting now
    updates: list[dict]  # the history records, in update order


def resume(out: str | Path, n_layers: int) -> Resumed:
    """Rebuild the state from ``history.jsonl`` (an empty state when there is none)."""
    from santa.eval.runner import read_records  # imported here: a worker needs no torch for the synthetic reward

    path = Path(out) / HISTORY
    records = sorted(read_records(path), key=lambda r: r["update"]) if path.exists() else []
    state = PolicyState.initial(n_layers)
    thetas = {0: state.theta}
    ids: set[str] = set()
    for expected, record in enumerate(records, start=1):
        if record["update"] != expected:
            raise CheckpointError(f"{path}: update {record['update']} where {expected} was expected (a gap or a duplicate)")
        for e in record["episodes"] + record.get("dropped", []):
            if e["id"] in ids:
                raise CheckpointError(f"{path}: episode {e['id']} is accepted twice (update {expected})")
            ids.add(e["id"])
        thetas[expected] = tuple(record["theta"])
    if records:
        last = records[-1]
        state = PolicyState(tuple(last["theta"]), last["update"], last["reward_sum"], last["reward_count"])
    session = 1 + max((r["session"] for r in records), default=-1)
    return Resumed(state, thetas, frozenset(ids), session, records)


def update_record(
    *, state: PolicyState, session: int, baseline: float, gradient, episodes: list[Episode], workers: int, time: float,
    devices: dict[str, int] | None = None, dropped: list[Episode] = (),
) -> dict:
    """One history line. devices: workers per kind when it was written, e.g. ``{"cuda": 1, "cpu": 3}``;
    dropped: the too-stale episodes that arrived since the last update (not in the gradient)."""
    return {
        "key": f"update {state.version}",
        "update": state.version,
        "session": session,
        "theta": list(state.theta),
        "baseline": baseline,
        "gradient": list(gradient),
        "reward_sum": state.reward_sum,
        "reward_count": state.reward_count,
        "episodes": [asdict(e) | {"schedule": list(e.schedule)} for e in episodes],
        "dropped": [asdict(e) | {"schedule": list(e.schedule)} for e in dropped],
        "workers": workers,
        "devices": dict(devices or {}),
        "time": time,
    }


def append_update(out: str | Path, record: dict) -> None:
    """Accept an update: one fsync'd line appended to ``history.jsonl``."""
    from santa.eval.runner import append_record

    append_record(Path(out) / HISTORY, record)


def replay(updates: list[dict], spec: TuneSpec) -> list[PolicyState]:
    """Recompute every update of a history from θ = 0 and its accepted episodes: the states after
    each update. A history whose recorded θ differs from its replay counted something twice or lost it."""
    state = PolicyState.initial(spec.n_layers)
    thetas = {0: state.theta}
    states = []
    for record in updates:
        episodes = [Episode(**{**e, "schedule": tuple(e["schedule"])}) for e in record["episodes"]]
        state = reinforce_step(
            state, episodes, theta_of=thetas.__getitem__, total=spec.total, floor=spec.floor, alpha=spec.alpha, baseline=spec.baseline
        ).state
        thetas[state.version] = state.theta
        states.append(state)
    return states

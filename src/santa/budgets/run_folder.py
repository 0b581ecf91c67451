"""The tuning run's folder: its configuration, its append-only history, the policy and the schedule.

``OUT/run.json``: what the run tunes (the :class:`TuneSpec`); a resume must ask for the same.
``OUT/history.jsonl``: one line per accepted update, written with one fsync'd ``O_APPEND`` write
(:func:`santa.sweep_files.append_record`)::

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

One driver per folder: it holds an exclusive lock on ``history.jsonl`` (:func:`history_lock`, the
lock of every resumable santa command) for its whole run. A resume checks ``run.json`` and every
history line before anything starts (:func:`resume`); a line that does not hold (hand-edited, cut
and pasted, written by two drivers) raises :class:`CheckpointError` naming the file and the line.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

from santa.budgets.reinforce import Episode, PolicyState, reinforce_step
from santa.budgets.rewards import RewardSpec
from santa.checks import integer
from santa.schedule_file import write_json_atomic
from santa.sweep_files import SweepFileError, append_record, load_sweep
from santa.writer_lock import writer_lock

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

    def __post_init__(self) -> None:
        for name, low in (("n_layers", 1), ("total", 1), ("floor", 0), ("episodes", 1), ("seed", 0)):
            object.__setattr__(self, name, integer(name, getattr(self, name), low=low))
        if self.max_staleness is not None:
            object.__setattr__(self, "max_staleness", integer("max_staleness", self.max_staleness, low=0))

    def to_dict(self) -> dict:
        return {**asdict(self), "reward": self.reward.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> TuneSpec:
        return cls(**{**data, "reward": RewardSpec.from_dict(data["reward"])})


class CheckpointError(ValueError):
    """A run folder that cannot be used: a corrupt ``run.json`` or history line, or a folder another
    driver holds; the message names the file (and the line)."""


class RunLocked(CheckpointError):
    """Another driver is writing this run folder's history."""


class RunMismatch(CheckpointError):
    """The folder holds a run with other settings than the ones asked for."""


def history_lock(out: str | Path) -> AbstractContextManager[None]:
    """One driver per run folder: an exclusive lock on ``OUT/history.jsonl`` (created if missing)
    for the ``with`` block; a second driver gets :class:`RunLocked` at once."""
    return writer_lock(Path(out) / HISTORY, holder="`santa tune budgets`", locked=RunLocked, unusable=CheckpointError)


def saved_spec(out: str | Path) -> dict | None:
    """The settings in ``OUT/run.json`` as a dict (None when there is none); :class:`CheckpointError`
    naming the file when it cannot be read, is not a JSON object, or its ``max_staleness`` is not
    an int ≥ 0 or null."""
    path = Path(out) / RUN
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: cannot read it ({error})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("reward"), dict):
        raise CheckpointError(f"{path}: not a run file (a JSON object with a \"reward\" object); use another --out")
    staleness = saved.get("max_staleness")
    if staleness is not None and (not _is_int(staleness) or staleness < 0):
        raise CheckpointError(f"{path}: max_staleness must be an integer ≥ 0 or null, got {staleness!r}")
    return saved


def prepare(out: str | Path, spec: TuneSpec) -> None:
    """Write ``run.json`` for a new run, or check that a resumed run asks for the same spec
    (:class:`RunMismatch` when not; :class:`CheckpointError` for a file that cannot be read)."""
    path = Path(out) / RUN
    saved = saved_spec(out)
    if saved is not None:
        new = spec.to_dict()
        diff = sorted(k for k in set(saved) | set(new) if saved.get(k) != new.get(k))
        if diff:
            details = "; ".join(f"{k}: saved {saved.get(k)!r}, asked {new.get(k)!r}" for k in diff)
            raise RunMismatch(f"{path}: this folder holds a run with other settings ({details}); use another --out")
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


def resume(out: str | Path, n_layers: int, *, spec: TuneSpec | None = None) -> Resumed:
    """Rebuild the state from ``history.jsonl`` (an empty state when there is none or it is empty).

    Every line is checked (a line cut mid-write by a killed driver is skipped): its keys and their
    types, update numbers 1, 2, … in file order, sessions that never go back, θ and every episode's
    schedule of ``n_layers`` entries, episode ids used once, episode versions of earlier updates,
    and the reward count and sum carried from line to line. With ``spec``, every schedule must
    sum to ``spec.total`` with ``spec.floor`` in each layer, and every θ must equal the REINFORCE
    step replayed from the line before. A line that fails raises :class:`CheckpointError`
    naming the file and the line.
    """
    n_layers = integer("n_layers", n_layers, low=1)
    path = Path(out) / HISTORY
    try:
        lines = load_sweep(path).records if path.exists() else []
    except SweepFileError as error:
        raise CheckpointError(str(error)) from None
    check = HistoryCheck(path, n_layers, spec)
    for number, record in lines:
        check.line(number, record)
    return Resumed(check.state, check.thetas, frozenset(check.ids), check.session + 1, [r for _, r in lines])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


FIELD_KINDS = {  # kind → (check, what it expects)
    "int": (_is_int, "an integer"),
    "number": (_is_number, "a finite number"),
    "str": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "list": (lambda v: isinstance(v, list), "a list"),
}


class HistoryCheck:
    """Reads history lines in file order, checks each against the lines before it, and keeps the state."""

    def __init__(self, path: Path, n_layers: int, spec: TuneSpec | None) -> None:
        self.path, self.n_layers, self.spec = path, n_layers, spec
        self.state = PolicyState.initial(n_layers)
        self.thetas = {0: self.state.theta}
        self.ids: set[str] = set()
        self.session = -1  # the newest session seen
        self.number = 0  # the line being checked

    def fail(self, what: str) -> None:
        raise CheckpointError(f"{self.path}, line {self.number}: {what}; not a history this run can resume")

    def field(self, record: dict, key: str, kind: str, where: str = "") -> object:
        """``record[key]``, which must be of a kind of :data:`FIELD_KINDS`."""
        if key not in record:
            self.fail(f"{where}no {key!r}")
        value = record[key]
        check, expected = FIELD_KINDS[kind]
        if not check(value):
            self.fail(f"{where}{key!r} must be {expected}, got {value!r:.60}")
        return value

    def vector(self, record: dict, key: str, kind: str, where: str = "") -> list:
        """``record[key]``: a list of ``n_layers`` values of ``kind`` (the model's layer count)."""
        values = self.field(record, key, "list", where)
        if len(values) != self.n_layers:
            self.fail(f"{where}{key!r} has {len(values)} entries, the model has {self.n_layers} layers")
        check = _is_int if kind == "int" else _is_number
        if not all(check(v) for v in values):
            self.fail(f"{where}{key!r} must hold {'integers' if kind == 'int' else 'finite numbers'}, got {values!r:.60}")
        return values

    def line(self, number: int, record: dict) -> None:
        self.number = number
        update = self.field(record, "update", "int")
        if update != self.state.version + 1:
            self.fail(f"update {update} where {self.state.version + 1} was expected (a gap, a duplicate or a second writer)")
        session = self.field(record, "session", "int")
        if session < max(self.session, 0):
            self.fail(f"session {session} after session {self.session}")
        theta = self.vector(record, "theta", "number")
        episodes = [self.episode(e, update, f"episode {i}: ") for i, e in enumerate(self.field(record, "episodes", "list"))]
        if not episodes:
            self.fail("an update without episodes")
        dropped = record.get("dropped", [])  # histories written before the staleness limit have none
        if not isinstance(dropped, list):
            self.fail(f"'dropped' must be a list, got {dropped!r:.60}")
        for i, e in enumerate(dropped):
            self.episode(e, update, f"dropped episode {i}: ")
        state = self.counted(record, episodes, theta)
        self.session, self.state = session, state
        self.thetas[update] = state.theta

    def episode(self, e: object, update: int, where: str) -> Episode:
        if not isinstance(e, dict):
            self.fail(f"{where}not a JSON object")
        episode_id = self.field(e, "id", "str", where)
        if episode_id in self.ids:
            self.fail(f"{where}episode {episode_id} is accepted twice")
        self.ids.add(episode_id)
        schedule = self.vector(e, "schedule", "int", where)
        if self.spec is not None and (sum(schedule) != self.spec.total or min(schedule) < self.spec.floor):
            self.fail(f"{where}schedule {schedule} does not sum to {self.spec.total} with ≥ {self.spec.floor} per layer")
        version = self.field(e, "version", "int", where)
        if not 0 <= version < update:
            self.fail(f"{where}version {version}, expected one of the policies 0…{update - 1} before update {update}")
        return Episode(episode_id, tuple(schedule), self.field(e, "reward", "number", where), version)

    def counted(self, record: dict, episodes: list[Episode], theta: list[float]) -> PolicyState:
        """The state after this line: its θ and reward sums, checked against the line before (and the replay, with a spec)."""
        count, total = self.field(record, "reward_count", "int"), self.field(record, "reward_sum", "number")
        if count != self.state.reward_count + len(episodes):
            self.fail(f"reward_count {count}, expected {self.state.reward_count} + {len(episodes)} episodes")
        rewards = self.state.reward_sum + sum(e.reward for e in episodes)
        if not math.isclose(total, rewards, rel_tol=1e-9, abs_tol=1e-9):
            self.fail(f"reward_sum {total}, expected {rewards} (the last line's sum plus this update's rewards)")
        state = PolicyState(tuple(float(x) for x in theta), self.state.version + 1, float(total), count)
        if self.spec is not None:
            spec = self.spec
            replayed = reinforce_step(
                self.state, episodes, theta_of=self.thetas.__getitem__, total=spec.total, floor=spec.floor, alpha=spec.alpha, baseline=spec.baseline
            ).state.theta
            if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(theta, replayed, strict=True)):
                self.fail("theta differs from the update replayed from the line before and this line's episodes")
        return state


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

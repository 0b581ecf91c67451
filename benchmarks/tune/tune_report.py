"""Episodes per minute per kind of worker, and the kill-and-recover check, from `santa tune budgets` run folders.

Used by ``benchmarks/tune/gpu_tune.sh`` (issue 15); works on any run folder, CPU runs included::

    python benchmarks/tune/tune_report.py sessions RUN     # the number the next driver session of RUN gets
    python benchmarks/tune/tune_report.py kill RUN --session S [--device cuda] [--after 5] [--wait 120] --record kill.json
    python benchmarks/tune/tune_report.py summary --run a=RUN_A --run b=RUN_B [--kill kill.json] [--eval eval.jsonl] --out summary.json

``kill`` waits until session S of RUN has accepted an episode of a ``--device`` worker, waits
``--after`` seconds more, then sends SIGKILL to the process that evaluated the newest such
episode (the ``pid`` every episode records) and writes what it killed, and when, to ``--record``.
It refuses a pid whose command line is not a Ray worker's.

``summary`` reads each run's ``history.jsonl`` and writes one JSON (and prints a short table):

- per run and driver session, per kind of worker (the ``device`` each episode records): workers,
  episodes, mean seconds per episode, and episodes per minute = Σ over that kind's workers of
  (episodes − 1) / (last end − first end) · 60, the steady rate of each worker after its model
  has loaded (a worker with one episode adds nothing); ``all`` sums the kinds;
- the whole-session rate: episodes / (last end − first end of any episode) · 60;
- checks of the history: updates 1…n contiguous, every episode id once, and every line's θ equal
  to a replay of the accepted episodes from θ = 0 (an episode lost or counted twice changes θ);
- with ``--kill``: the killed worker by its pid, whether it finished anything after the kill,
  and whether a worker of the same kind that started later finished episodes after it;
- with ``--eval``: the `santa tune evaluate` comparison (each schedule against uniform).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

from santa.provenance import run_record

KILL_SLACK_S = 0.5  # an episode that ended this close after the kill had finished before it (clock reads)


def read_history(run: Path) -> list[dict]:
    """The run's update records, in update order (a torn last line is skipped)."""
    from santa.sweep_files import read_records

    path = Path(run) / "history.jsonl"
    return sorted(read_records(path), key=lambda r: r["update"]) if path.exists() else []


def episodes_of(updates: list[dict], session: int | None = None) -> list[dict]:
    """Accepted episodes (of one driver session, if given), each with its update's session."""
    return [e | {"session": u["session"]} for u in updates if session is None or u["session"] == session for e in u["episodes"]]


def worker_index(name: str) -> int:
    """``"1-w7"`` → 7: workers are numbered in the order a driver session started them."""
    return int(name.rsplit("-w", 1)[1])


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of intervals ``[(start, end), …]``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def rates(episodes: list[dict]) -> dict:
    """Per kind of worker (and ``all``): workers, episodes, mean seconds, steady episodes per minute.

    A worker's steady span runs from its first episode's end to its last's (its start-up and model
    load are outside it) and holds its episodes − 1. A kind's rate: those episodes over the union of
    its workers' spans, so workers side by side add up and a replacement continues its victim.
    """
    by_worker: dict[str, list[float]] = defaultdict(list)
    kind_of: dict[str, str] = {}
    seconds: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        by_worker[e["worker"]].append(e.get("finished", 0.0))
        kind_of[e["worker"]] = e.get("device") or "?"
        seconds[kind_of[e["worker"]]].append(e["seconds"])
    workers = {
        w: {"device": kind_of[w], "episodes": len(ends), "span_s": max(ends) - min(ends),
            "per_min": (len(ends) - 1) / (max(ends) - min(ends)) * 60 if max(ends) > min(ends) else None}
        for w, ends in sorted(by_worker.items(), key=lambda kv: worker_index(kv[0]))
    }
    kinds: dict[str, dict] = {}
    for kind in dict.fromkeys(kind_of[w] for w in workers):
        mine = [w for w in workers if kind_of[w] == kind]
        span = union_length([(min(by_worker[w]), max(by_worker[w])) for w in mine])
        steady = sum(workers[w]["episodes"] - 1 for w in mine)
        kinds[kind] = {
            "workers": mine, "episodes": sum(workers[w]["episodes"] for w in mine),
            "mean_seconds": sum(seconds[kind]) / len(seconds[kind]), "span_s": span,
            "per_min": steady / span * 60 if span > 0 else 0.0,
        }
    ends = [e.get("finished", 0.0) for e in episodes]
    span = max(ends) - min(ends) if ends else 0.0
    return {
        "workers": workers,
        "kinds": kinds,
        "all": {
            "workers": sum(len(k["workers"]) for k in kinds.values()),
            "episodes": len(episodes),
            "per_min": sum(k["per_min"] for k in kinds.values()),
            "span_s": span,
            "session_per_min": len(episodes) / span * 60 if span > 0 else None,
        },
    }


def check_history(run: Path, updates: list[dict]) -> dict:
    """Updates contiguous, episode ids unique (accepted and dropped together), θ of every line equal to
    its replay, each worker run's episodes a prefix 0…m−1 of its E (a run cut short: its worker died),
    and how stale the accepted episodes were per kind of worker (versions behind the update that
    used them) beside the number dropped as too stale."""
    from santa.budgets.run_folder import TuneSpec, replay

    spec = TuneSpec.from_dict(json.loads((Path(run) / "run.json").read_text()))
    ids = [e["id"] for e in episodes_of(updates)]
    dropped = [e for u in updates for e in u.get("dropped", [])]
    every = ids + [e["id"] for e in dropped]
    runs: dict[str, list[int]] = defaultdict(list)
    for episode_id in every:  # "{session}-{run}-{episode}"
        session, run_id, k = episode_id.split("-")
        runs[f"{session}-{run_id}"].append(int(k))
    lag: dict[str, list[int]] = defaultdict(list)
    for u in updates:
        for e in u["episodes"]:
            lag[e.get("device") or "?"].append(u["update"] - 1 - e["version"])
    states = replay(updates, spec)
    worst = max((abs(a - b) for u, s in zip(updates, states, strict=True) for a, b in zip(u["theta"], s.theta, strict=True)), default=0.0)
    return {
        "updates": len(updates),
        "episodes": len(ids),
        "dropped": len(dropped),
        "max_staleness": spec.max_staleness,
        "staleness": {kind: {"mean": sum(v) / len(v), "max": max(v)} for kind, v in lag.items()},
        "sessions": sorted({u["session"] for u in updates}),
        "updates_contiguous": [u["update"] for u in updates] == list(range(1, len(updates) + 1)),
        "episode_ids_unique": len(every) == len(set(every)),
        "replay_max_abs_diff": worst,
        "replay_matches": worst <= 1e-9,
        "runs": len(runs),
        "runs_are_prefixes": all(sorted(ks) == list(range(len(ks))) for ks in runs.values()),
        "short_runs": {r: len(ks) for r, ks in runs.items() if len(ks) < spec.episodes},
    }


def kill_check(updates: list[dict], kill: dict) -> dict:
    """What became of the killed worker (found by its pid in its session) and whether one of its kind replaced it."""
    session, at = kill["session"], kill["time"]
    mine = episodes_of(updates, session)
    victims = {e["worker"] for e in mine if e.get("pid") == kill["pid"]}
    out = {"pid": kill["pid"], "device": kill["device"], "session": session, "worker": None, "replaced": False}
    if len(victims) != 1:
        out["problem"] = f"pid {kill['pid']} evaluated episodes of {len(victims)} workers in session {session}"
        return out
    (victim,) = victims
    theirs = [e for e in mine if e["worker"] == victim]
    later = [e for e in mine if e.get("device") == kill["device"] and worker_index(e["worker"]) > worker_index(victim) and e.get("finished", 0) > at]
    out |= {
        "worker": victim,
        "episodes_before_kill": sum(e.get("finished", 0) <= at + KILL_SLACK_S for e in theirs),
        "episodes_after_kill": sum(e.get("finished", 0) > at + KILL_SLACK_S for e in theirs),
        "replacements": sorted({e["worker"] for e in later}, key=worker_index),
        "replacement_episodes": len(later),
        "first_replacement_episode_after_s": min(e["finished"] for e in later) - at if later else None,
    }
    out["replaced"] = bool(later)
    return out


def summary(runs: dict[str, Path], *, kill: dict | None, eval_path: Path | None) -> dict:
    out: dict = {"runs": {}}
    for label, run in runs.items():
        updates = read_history(run)
        sessions = sorted({u["session"] for u in updates})
        out["runs"][label] = {
            "folder": str(run),
            "check": check_history(run, updates),
            "sessions": {str(s): rates(episodes_of(updates, s)) for s in sessions},
            "devices": sorted({json.dumps(u.get("devices", {}), sort_keys=True) for u in updates}),
        }
        schedule = Path(run) / "schedule.json"
        if schedule.exists():
            out["runs"][label]["schedule"] = json.loads(schedule.read_text())
        if kill is not None and Path(kill["run"]).resolve() == Path(run).resolve():
            out["runs"][label]["kill"] = kill | {"check": kill_check(updates, kill)}
    if eval_path is not None and eval_path.exists():
        from santa.budgets.sweep import compare, existing_records, table

        comparisons = compare(existing_records(eval_path))
        out["evaluate"] = {"table": table(comparisons, metric="kl"), "cells": [c.__dict__ | {"differs": c.differs} for c in comparisons]}
    return out


def print_summary(result: dict) -> None:
    for label, run in result["runs"].items():
        c = run["check"]
        stale = ", ".join(f"{kind} {v['mean']:.2f} (max {v['max']})" for kind, v in c["staleness"].items())
        print(f"run {label} ({run['folder']}): {c['updates']} updates, {c['episodes']} episodes (+{c['dropped']} dropped, "
              f"limit {c['max_staleness']}; versions stale: {stale}), sessions {c['sessions']}; "
              f"contiguous {c['updates_contiguous']}, ids unique {c['episode_ids_unique']}, replay matches {c['replay_matches']}, "
              f"{c['runs']} worker runs, each a prefix {c['runs_are_prefixes']}, cut short {c['short_runs']}")
        for session, r in run["sessions"].items():
            kinds = ", ".join(f"{kind}: {len(k['workers'])} workers, {k['episodes']} episodes, {k['mean_seconds']:.3f} s each, "
                              f"{k['per_min']:.1f}/min" for kind, k in r["kinds"].items())
            a = r["all"]
            whole = f"{a['session_per_min']:.1f}" if a["session_per_min"] else "–"
            print(f"  session {session}: {kinds}; steady sum {a['per_min']:.1f}/min, whole session {whole}/min over {a['span_s']:.0f} s")
        if "kill" in run:
            k = run["kill"]["check"]
            print(f"  kill: pid {k['pid']} ({k['device']}, worker {k['worker']}) in session {k['session']}: "
                  f"{k.get('episodes_after_kill')} episodes after the kill, replaced {k['replaced']} by {k.get('replacements')} "
                  f"(first episode {k.get('first_replacement_episode_after_s')} s after){'; ' + k['problem'] if 'problem' in k else ''}")
    if "evaluate" in result:
        print(result["evaluate"]["table"])


# --- kill ---------------------------------------------------------------------------------------


def is_ray_worker(pid: int) -> bool:
    """Whether process ``pid`` is a Ray worker (its title ``ray::…``, or Ray's default_worker.py)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return cmdline.startswith("ray::") or "default_worker.py" in cmdline


def kill_worker(run: Path, *, session: int, device: str, after: float, wait: float) -> dict:
    """SIGKILL the process of the newest accepted ``device`` episode of ``session`` (see the module docstring)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = [e for e in episodes_of(read_history(run), session) if e.get("device") == device and e.get("pid")]
        if found:
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"kill: no {device} episode of session {session} in {run} after {wait:.0f} s")
    time.sleep(after)
    newest = max((e for e in episodes_of(read_history(run), session) if e.get("device") == device and e.get("pid")), key=lambda e: e["finished"])
    pid = newest["pid"]
    if not is_ray_worker(pid):
        raise SystemExit(f"kill: pid {pid} (worker {newest['worker']}) is not a Ray worker process now; nothing killed")
    os.kill(pid, signal.SIGKILL)
    return {"run": str(run), "session": session, "device": device, "pid": pid, "worker": newest["worker"], "time": time.time()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kill", help="SIGKILL the worker of the newest DEVICE episode of SESSION")
    k.add_argument("run", type=Path)
    k.add_argument("--session", type=int, required=True)
    k.add_argument("--device", default="cuda")
    k.add_argument("--after", type=float, default=5.0, help="seconds to wait after the first such episode")
    k.add_argument("--wait", type=float, default=120.0, help="give up after this many seconds without one")
    k.add_argument("--record", type=Path, required=True, help="JSON file: what was killed, and when")
    n = sub.add_parser("sessions", help="print the number of the next driver session of RUN (0 for a new folder)")
    n.add_argument("run", type=Path)
    s = sub.add_parser("summary", help="episodes/min per kind, history checks, kill check, evaluation → JSON")
    s.add_argument("--run", action="append", required=True, help="LABEL=FOLDER (repeat)")
    s.add_argument("--kill", type=Path, default=None, help="the JSON `kill` wrote")
    s.add_argument("--eval", type=Path, default=None, help="the JSONL of `santa tune evaluate`")
    s.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "kill":
        record = kill_worker(args.run, session=args.session, device=args.device, after=args.after, wait=args.wait)
        args.record.write_text(json.dumps({"run": run_record(), **record}, indent=1))
        print(f"killed pid {record['pid']} (worker {record['worker']}, {record['device']}) of {record['run']} session {record['session']}")
        return 0
    if args.command == "sessions":
        print(1 + max((u["session"] for u in read_history(args.run)), default=-1))
        return 0
    runs = {}
    for item in args.run:
        label, _, folder = item.partition("=")
        if not folder:
            parser.error(f"--run wants LABEL=FOLDER, got {item!r}")
        runs[label] = Path(folder)
    kill = json.loads(args.kill.read_text()) if args.kill and args.kill.exists() else None
    result = summary(runs, kill=kill, eval_path=args.eval)
    args.out.write_text(json.dumps({"run": run_record(), **result}, indent=1, default=str))
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

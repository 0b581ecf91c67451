"""benchmarks/kernels/error_target_speed.py's results file without a GPU (the timing replaced): one keyed record per
shape, a run stopped mid-way resumes with only what it lacks, and a second writer on the same file is refused."""

import pytest
import torch
from benchmarks.kernels import error_target_speed as speed

from santa.sweep_files import read_records, sweep_lock


@pytest.fixture
def no_gpu(monkeypatch):
    """time_case returns a fake entry (and can be told to stop after some shapes, as a killed run does)."""
    timed = []

    def fake_time_case(batch, n_keys, *rest):
        if len(timed) == fake_time_case.stop_after:
            raise KeyboardInterrupt  # the call's time limit
        timed.append((batch, n_keys))
        return {"cudnn_us": 1.0, "targets": []}

    fake_time_case.stop_after = None
    monkeypatch.setattr(speed, "time_case", fake_time_case)
    monkeypatch.setattr(speed, "Flusher", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test device")
    return timed, fake_time_case


def shape_keys(path):
    return [r["key"] for r in read_records(path) if not r["key"].startswith("run/")]


def test_a_stopped_run_resumes_with_only_the_shapes_it_lacks(tmp_path, no_gpu):
    timed, fake = no_gpu
    out = tmp_path / "speed.jsonl"
    fake.stop_after = 2
    with pytest.raises(KeyboardInterrupt):
        speed.main([str(out)])
    assert len(shape_keys(out)) == 2
    fake.stop_after = None
    assert speed.main([str(out)]) == 0
    keys = shape_keys(out)
    assert len(keys) == len(speed.CASES) == len(set(keys)) and len(timed) == len(speed.CASES)
    assert speed.main([str(out)]) == 0 and len(timed) == len(speed.CASES)  # nothing left: nothing timed
    assert speed.main([str(out), "--cap", "128"]) == 0 and len(timed) == 2 * len(speed.CASES)  # other settings: new keys


def test_a_second_writer_is_refused_in_one_line(tmp_path, no_gpu, capsys):
    out = tmp_path / "speed.jsonl"
    with sweep_lock(out, holder="error_target_speed.py"):
        assert speed.main([str(out)]) == 1
    assert "error_target_speed.py: error:" in capsys.readouterr().err and not shape_keys(out)

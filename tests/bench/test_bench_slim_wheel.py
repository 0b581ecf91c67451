"""benchmarks/device/slim_wheel.py: vLLM's wheel without what Hopper never loads, the same bytes on every host
(prepare.sh checks the tar's SHA-256, and the device checks it again after unpacking)."""

import zipfile

import pytest
from benchmarks.device.slim_wheel import main, slim

RECORD = "pkg-1.0.dist-info/RECORD"
MEMBERS = {"pkg/__init__.py": b"x = 1\n", "pkg/_fa2.so": b"\0" * 64, "pkg/_fa3.so": b"\1" * 32}


def make_wheel(path, date):
    record = "".join(f"{name},sha256=abc,{len(data)}\n" for name, data in MEMBERS.items()) + f"{RECORD},,\n"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in {**MEMBERS, RECORD: record.encode()}.items():
            info = zipfile.ZipInfo(name, date_time=date)
            info.external_attr = 0o755 << 16
            wheel.writestr(info, data)


def test_dropped_members_leave_the_wheel_and_its_record_the_rest_stored_unchanged(tmp_path):
    make_wheel(tmp_path / "in.whl", (2025, 7, 25, 2, 9, 0))
    assert slim(str(tmp_path / "in.whl"), str(tmp_path / "out.whl"), ["pkg/_fa2.so"]) == 64
    with zipfile.ZipFile(tmp_path / "out.whl") as out:
        assert out.namelist() == ["pkg/__init__.py", "pkg/_fa3.so", RECORD]
        assert {info.compress_type for info in out.infolist()} == {zipfile.ZIP_STORED}
        assert {info.external_attr for info in out.infolist()} == {0o755 << 16}
        assert out.read("pkg/_fa3.so") == MEMBERS["pkg/_fa3.so"]
        record = out.read(RECORD).decode().splitlines()
    assert [line.split(",")[0] for line in record] == ["pkg/__init__.py", "pkg/_fa3.so", RECORD]


def test_the_output_depends_on_the_members_only_not_their_dates(tmp_path):
    make_wheel(tmp_path / "a.whl", (2025, 7, 25, 2, 9, 0))
    make_wheel(tmp_path / "b.whl", (2026, 1, 2, 3, 4, 6))
    for name in "ab":
        slim(str(tmp_path / f"{name}.whl"), str(tmp_path / f"{name}.slim.whl"), ["pkg/_fa2.so"])
    assert (tmp_path / "a.slim.whl").read_bytes() == (tmp_path / "b.slim.whl").read_bytes()


def test_a_member_not_in_the_wheel_stops_it_in_one_line(tmp_path, capsys):
    make_wheel(tmp_path / "in.whl", (2025, 7, 25, 2, 9, 0))
    with pytest.raises(ValueError, match="not in .*in.whl: pkg/_fa4.so"):
        slim(str(tmp_path / "in.whl"), str(tmp_path / "out.whl"), ["pkg/_fa2.so", "pkg/_fa4.so"])
    assert main([str(tmp_path / "in.whl"), str(tmp_path / "out.whl"), "pkg/_fa4.so"]) == 1
    assert main([str(tmp_path / "missing.whl"), str(tmp_path / "out.whl"), "pkg/_fa2.so"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("slim_wheel: not in") and "missing.whl" in err[1]

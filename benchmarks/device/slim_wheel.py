"""A wheel rewritten without named members: stored uncompressed, with fixed dates, reproducible (prepare.sh vllm).

    python benchmarks/device/slim_wheel.py IN.whl OUT.whl MEMBER [MEMBER ...]

vLLM 0.26.0's wheel is 304 MB, 709 MB unpacked; a Hopper run of dense models never loads its FlashAttention-2
library (FA3 serves sm_90 unless a model uses ALiBi), its MoE library (imported under ``suppress(ImportError)``)
or DeepGEMM's builds for other Pythons. Without them, and with members stored rather than deflated, the tar
of the 21 wheels packs with xz into 113.9 MB: 4 device pieces instead of 10 (prepare.sh; installed, and vLLM's engine,
server and backend tests run from it, on an H100 on 2026-12-06). Every MEMBER must be in IN.whl, so
a new vLLM whose names moved stops here rather than travelling whole. The RECORD loses the dropped lines.
"""
from __future__ import annotations

import argparse
import sys
import zipfile

FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip holds: the output depends on the members only


def slim(source: str, target: str, drop: list[str]) -> int:
    """Copies ``source`` to ``target`` without the members in ``drop``; returns the bytes dropped (unpacked)."""
    with zipfile.ZipFile(source) as wheel:
        infos = wheel.infolist()
        names = {info.filename for info in infos}
        missing = sorted(set(drop) - names)
        if missing:
            raise ValueError(f"not in {source}: {', '.join(missing)}")
        dropped = sum(info.file_size for info in infos if info.filename in drop)
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as out:
            for info in infos:
                if info.filename in drop:
                    continue
                data = wheel.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in drop).encode()
                member = zipfile.ZipInfo(info.filename, date_time=FIXED_DATE)
                member.external_attr = info.external_attr
                member.create_system = 3  # unix, whatever the host: the same bytes everywhere
                out.writestr(member, data, compress_type=zipfile.ZIP_STORED)
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="the wheel as downloaded")
    parser.add_argument("target", help="the slim wheel to write")
    parser.add_argument("drop", nargs="+", help="members to leave out (paths inside the wheel)")
    args = parser.parse_args(argv)
    try:
        dropped = slim(args.source, args.target, args.drop)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        print(f"slim_wheel: {error}", file=sys.stderr)
        return 1
    print(f"{args.target}: {len(args.drop)} members ({dropped / 1e6:.1f} MB unpacked) left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())

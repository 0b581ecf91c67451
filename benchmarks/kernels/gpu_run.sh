#!/usr/bin/env bash
# One device call for the kernel issue: the CUDA tests, then `python -m benchmarks.bench.kernels` on the
# Llama-3.1-8B, SmolLM2-135M and Qwen2.5-0.5B attention shapes, raw JSON and logs under $OUT.
# FlashInfer travels as wheels in the ignored folder .whl (`bash benchmarks/device/prepare.sh flashinfer`;
# `ab` also carries .old43, from `prepare.sh old43`; `e2ehouse` carries .old41, from `prepare.sh old41`).
# `trial` times a trial tree (main + unmerged branches, checked out here) against main's own, carried as .mainsrc/src
# (`git archive main src | tar -x -C .mainsrc`, `.mainsrc` in .git/info/exclude and in the call's carry; MAIN_COMMIT=<sha>).
#   bash benchmarks/kernels/gpu_run.sh [trial] [trialpaged] [trialhf] [firstkey] [hndstream] [tests] [smoke] [stream] [onelaunch] [onelaunchptx] [onelaunchplans] [onelaunchncu] [livencu] [g2ncu] [contiguous] [shortslices] [e2eone] [covered] [paged] [live] [gate] [target] [ab] [fp8] [fp8ab] [llama] [small] [tune] [host] [hf] [hfq] [hfprof] [hfshort] [e2e] [e2ehouse]
# Prefix the command with SANTA_COMMIT=<short sha> (the device copy's .git can be stale): the JSON records it.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
if [ -d .whl ] && [ ! -d /tmp/site/flashinfer ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || true
fi
tree_env() {  # TREE (main or trial): SRC, its source folder (main's carried as .mainsrc/src), and C, its commit to record
  if [ "$1" = main ]; then SRC=$PWD/.mainsrc/src C=${MAIN_COMMIT:-}; else SRC=$PWD/src C=${SANTA_COMMIT:-}; fi
}
for stage in "$@"; do
  case $stage in
    trial)  # one call that decides a branch: the one-launch, op and HF GPU tests on the trial tree, then paged_ab.py --quick
            # and santa's compiled generate() (hf_generate.py --backends santa-prop, Llama 30k, B = 1 and 6) on both trees
      [ -d .mainsrc/src ] || { echo "trial: carry main's src/ as .mainsrc/src"; exit 1; }
      timeout 190 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_one_launch.py tests/kernels/test_ops.py \
        tests/hf/test_hf_cuda.py 2>&1 | tail -25 | tee "$OUT/tests_trial.log" | tail -3
      # main's tree first, then the trial's: the order is the same in every trial call (the 34th session's ran the trial
      # first); one generate() per batch size, so a slow first compile cannot cut the other batch's figure
      for TREE in main trial; do
        tree_env "$TREE"
        SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout 70 python3 benchmarks/kernels/paged_ab.py "$OUT/quick_$TREE.jsonl" \
          --quick > "$OUT/quick_$TREE.log" 2>&1
        for B in 1 6; do
          SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout 90 python3 benchmarks/kernels/hf_generate.py \
            --out "$OUT/hf${B}_$TREE.json" --shape llama-3.1-8b --lengths 30000 --batches $B --cache static --compile \
            --backends santa-prop 2>&1 | grep "ms/token"
        done
      done ;;
    trialpaged)  # a kernel trial on paged caches (a trial tree checked out here, main's carried as .mainsrc/src as for trial):
                 # the trial's one-launch GPU tests (TRIAL_TESTS), then paged_ab.py (TRIAL_PAGED_ARGS, default "--models qwen
                 # smollm2": every d = 64 case) on main's tree and the trial's in turn, main first, TRIAL_PAGED_LIMIT s each
                 # (default 150; a cut run resumes in the next call); files paged_main.jsonl / paged_trial.jsonl
      [ -d .mainsrc/src ] || { echo "trialpaged: carry main's src/ as .mainsrc/src"; exit 1; }
      timeout 150 python3 -m pytest -q -p no:cacheprovider ${TRIAL_TESTS:-tests/kernels/test_one_launch.py} 2>&1 | tail -25 \
        | tee "$OUT/tests_trial.log" | tail -3
      for TREE in main trial; do
        tree_env "$TREE"
        # shellcheck disable=SC2086
        SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout "${TRIAL_PAGED_LIMIT:-150}" python3 benchmarks/kernels/paged_ab.py \
          "$OUT/paged_$TREE.jsonl" ${TRIAL_PAGED_ARGS:---models qwen smollm2} > "$OUT/paged_$TREE.log" 2>&1
        echo "$TREE: $(grep -c . "$OUT/paged_$TREE.jsonl") lines"
      done ;;
    trialhf)  # santa's compiled generate() on main's carried tree and the trial's, alternating twice (main, trial, main,
              # trial): the first run in a call fills torch.compile's cache, and identical kernels have measured 1.08x apart
              # (TRIAL_BATCH, default 6; TRIAL_SHAPE, default llama-3.1-8b; TRIAL_LENGTH, default 30000; each run its own
              # 120 s limit; carry .mainsrc as for trial). The kernel calls differ most at qwen2.5-0.5b 16 x 32768 (the one
              # launch 0.897x the Triton prop's time, 35th session) and not at Llama 6 x 30k (1.003x)
      [ -d .mainsrc/src ] || { echo "trialhf: carry main's src/ as .mainsrc/src"; exit 1; }
      for ROUND in 1 2; do
        for TREE in main trial; do
          tree_env "$TREE"
          SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout 120 python3 benchmarks/kernels/hf_generate.py \
            --out "$OUT/hf_${TREE}_$ROUND.json" --shape ${TRIAL_SHAPE:-llama-3.1-8b} --lengths ${TRIAL_LENGTH:-30000} \
            --batches ${TRIAL_BATCH:-6} --cache static --compile --backends santa-prop > "/tmp/hf_${TREE}_$ROUND.log" 2>&1
          # a run without a figure shows why (main's runs stopped silently in the 35th session: a cudagraph pool error)
          { grep "ms/token" "/tmp/hf_${TREE}_$ROUND.log" || tail -4 "/tmp/hf_${TREE}_$ROUND.log"; } | sed "s/^/$TREE $ROUND /"
        done
      done ;;
    firstkey)  # the Triton prop's tiles from each run's first key (b7c0834) and the op's plans on the Triton prop (11dc053), on a
               # GPU: the test files the 35th session's run of every kernel test did not reach in 330 s (test_ops.py onwards,
               # santa.hf's CUDA tests with its compiled generate()), then compiled generate() at Llama 30k B = 6 (main stopped
               # there with "tensors in the cudagraph pool not tracked as outputs" before 11dc053); HF_CALLS=1 adds santa.hf's
               # kernel calls (HND, starts) on the one launch against the Triton prop (contiguous_ab.py --hf, run at 07db016)
      # the compiled paths 11dc053 fixed first, then generate(), then the other unreached files (each part bounded)
      timeout 150 python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/kernels/test_ops_compile.py \
        tests/kernels/test_sm90_compile.py tests/hf/test_hf_cuda.py 2>&1 | tail -25 | tee "$OUT/tests_compiled.log" | tail -3
      timeout 130 python3 benchmarks/kernels/hf_generate.py --out "$OUT/hf6.json" --shape llama-3.1-8b --lengths 30000 \
        --batches 6 --cache static --compile --backends santa-prop > "$OUT/hf6.log" 2>&1
      grep "ms/token" "$OUT/hf6.log" || tail -5 "$OUT/hf6.log"
      timeout 120 python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/kernels/test_ops.py \
        tests/kernels/test_plan_checks.py tests/kernels/test_request_keys.py 2>&1 | tail -25 | tee "$OUT/tests_firstkey.log" | tail -3
      if [ "${HF_CALLS:-0}" = 1 ]; then
        timeout 150 python3 benchmarks/kernels/contiguous_ab.py "$OUT/hf_calls.jsonl" --hf > "$OUT/hf_calls.log" 2>&1
        tail -3 "$OUT/hf_calls.log"
      fi ;;
    tests)
      python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/kernels tests/hf/test_hf_cuda.py \
        tests/model/test_model_real.py 2>&1 | tail -25 | tee "$OUT/tests.log" ;;
    llama)
      python3 -m benchmarks.bench.kernels --sizes 8192 32768 131072 --prop-budgets 128 --flash-budgets 2048 --no-tune \
        --out /tmp/llama > "$OUT/llama.log" 2>&1; cp /tmp/llama/kernels.json "$OUT/llama.json" ;;
    small)
      python3 -m benchmarks.bench.kernels --heads 9 --kv-heads 3 --head-dim 64 --sizes 4096 8192 --prop-budgets 64 \
        --flash-budgets 2048 --batches 16 64 --batch-keys 8192 --no-tune --out /tmp/smollm2 > "$OUT/smollm2.log" 2>&1
      cp /tmp/smollm2/kernels.json "$OUT/smollm2.json"
      python3 -m benchmarks.bench.kernels --heads 14 --kv-heads 2 --head-dim 64 --sizes 4096 32768 --prop-budgets 128 \
        --flash-budgets 2048 --batches 16 --batch-keys 32768 --no-tune --out /tmp/qwen > "$OUT/qwen.log" 2>&1
      cp /tmp/qwen/kernels.json "$OUT/qwen.json" ;;
    tune)  # the prop Tuning sweep on the three models' shapes
      V="--tune-variants default tile_searchscan tile_searchbisect samples_per_program64_tile_searchbisect samples_per_program128_tile_searchbisect samples_per_program64 block_n64"
      python3 -m benchmarks.bench.kernels --only-tune --no-flashinfer $V --out /tmp/tune > "$OUT/tune.log" 2>&1
      cp /tmp/tune/kernels.json "$OUT/tune.json"
      python3 -m benchmarks.bench.kernels --only-tune --no-flashinfer $V --heads 9 --kv-heads 3 --head-dim 64 \
        --tune-cases 1x4096,1x8192,16x8192,64x8192 --out /tmp/tune_s > "$OUT/tune_small.log" 2>&1
      python3 -m benchmarks.bench.kernels --only-tune --no-flashinfer $V --heads 14 --kv-heads 2 --head-dim 64 \
        --tune-cases 1x4096,1x32768,16x32768 --out /tmp/tune_q >> "$OUT/tune_small.log" 2>&1
      cp /tmp/tune_s/kernels.json "$OUT/tune_smollm2.json"; cp /tmp/tune_q/kernels.json "$OUT/tune_qwen.json" ;;
    fp8ab)  # one bounded call: the fp8 GPU spec tests, then the fp8 table on Llama shapes with FlashInfer's fp8 decode in the
            # same process (santa prop and flash on fp8, prop bf16, cuDNN bf16)
      timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels -k "fp8" 2>&1 | tail -6 \
        | tee "$OUT/tests_fp8ab.log"
      timeout 270 python3 -m benchmarks.bench.kernels --only-fp8 --sizes 32768 131072 --batches 8 32 --out /tmp/fp8ab \
        > "$OUT/fp8ab.log" 2>&1; cp /tmp/fp8ab/kernels.json "$OUT/fp8ab.json" ;;
    stream)  # issue 24's first check in CUDA C++: the stream phase alone (nvcc on the device) beside pass 1 and prop
      timeout 300 python3 benchmarks/kernels/cuda_stream_check.py "$OUT/stream.jsonl" "${SANTA_COMMIT:-}" 2>&1 | tail -8 ;;
    onelaunch)  # issue 24: prop in one cooperative CUDA launch against santa's prop (bounded: a barrier bug would hang)
      timeout 420 python3 benchmarks/kernels/cuda_one_launch_check.py "$OUT/one_launch.jsonl" "${SANTA_COMMIT:-}" \
        ${ONE_LAUNCH_ONLY:+--only $ONE_LAUNCH_ONLY} 2>&1 | tail -8 ;;
    onelaunchptx)  # issue 24: the same check with the kernels loaded as PTX the driver compiles (shipping without nvcc)
      timeout 420 python3 benchmarks/kernels/cuda_one_launch_check.py "$OUT/one_launch_ptx.jsonl" "${SANTA_COMMIT:-}" --ptx \
        ${ONE_LAUNCH_ONLY:+--only $ONE_LAUNCH_ONLY} 2>&1 | tail -8 ;;
    onelaunchplans)  # issue 24: SmolLM2 B = 64's one-launch plans, one process each (a plan that breaks the CUDA context
                     # takes only itself down)
      for PLAN in C4 C4s C8 C8s C16 C16s C1; do
        timeout 80 python3 benchmarks/kernels/cuda_one_launch_check.py "$OUT/smollm2_b64_$PLAN.jsonl" "${SANTA_COMMIT:-}" \
          --only smollm2_B=64_x_8k --plans $PLAN 2>&1 | tail -1 | cut -c1-400
      done ;;
    onelaunchncu)  # issue 24: Nsight Compute on the one-launch prop (the second launch of each plan: the first fills
                   # counts), full set, with the stall samples per SASS instruction (ncu_phases.py sums them per phase)
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
      for CASE_PLAN in llama_8k:C33 llama_32k:C33 llama_B=32_x_32k:C8s; do
        CASE=${CASE_PLAN%%:*}; PLAN=${CASE_PLAN##*:}; TAG=$(echo "$CASE" | tr -d '=')
        timeout 200 "$NCU" --clock-control none -k regex:'^prop1_d' --launch-skip 1 --launch-count 1 --set full \
          --import-source yes -f -o "/tmp/ncu_$TAG" python3 benchmarks/kernels/cuda_one_launch_check.py "/tmp/ncu_$TAG.jsonl" \
          "${SANTA_COMMIT:-}" --only "$CASE" --plans "$PLAN" > "/tmp/ncu_$TAG.log" 2>&1; tail -3 "/tmp/ncu_$TAG.log"
        "$NCU" -i "/tmp/ncu_$TAG.ncu-rep" --page details --csv > "$OUT/ncu_${TAG}_details.csv" 2>&1
        "$NCU" -i "/tmp/ncu_$TAG.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${TAG}_sass.csv" 2>&1
      done
      cp /tmp/santa_one_launch.cubin "$OUT/"  # the profiled binary: benchmarks/kernels/ncu_phases.py maps its SASS to phases
      ;;
    livencu)  # issue 39: Nsight Compute on the live schedule's kernel through the product path (ncu_drive.py: a paged plan's
              # third run; LIVE_NCU_CASES "B KEYS" pairs, Llama heads, S = 128, 16-key pages), full set with the stall samples
              # per SASS instruction; ncu_phases.py sums them per phase against a -lineinfo cubin of the same one_launch.cu.
              # LIVE_NCU_HEADS "H H_KV D" (default Llama's "32 8 128"; G <= 2's question: "16 8 64"), LIVE_NCU_PAGE (default
              # 16; "0": a contiguous cache, whose plan takes host rounds where they fit, with LIVE_NCU_KERNEL '^prop1').
              # LIVE_NCU_DRIVE: ncu_drive.py's flags ("--ordered": pages in order; "--schedule rounds|live"), and
              # LIVE_NCU_TAG a name for the files, so that profiles of one case with other flags do not overwrite each other
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
      PAGE_ARG=${LIVE_NCU_PAGE:-16}; [ "$PAGE_ARG" = 0 ] && PAGE_ARG=
      for CASE in ${LIVE_NCU_CASES:-64x2048 32x32768}; do
        B=${CASE%%x*}; KEYS=${CASE##*x}; NAME=ncu_live_${CASE}${LIVE_NCU_TAG:+_$LIVE_NCU_TAG}
        timeout 240 "$NCU" --clock-control none -k regex:"${LIVE_NCU_KERNEL:-^prop1l}" --launch-skip 2 --launch-count 1 --set full \
          -f -o "/tmp/$NAME" python3 benchmarks/kernels/ncu_drive.py "$B" "$KEYS" ${LIVE_NCU_HEADS:-32 8 128} 128 $PAGE_ARG \
          ${LIVE_NCU_DRIVE:-} > "/tmp/$NAME.log" 2>&1; tail -3 "/tmp/$NAME.log"
        "$NCU" -i "/tmp/$NAME.ncu-rep" --page details --csv > "$OUT/${NAME}_details.csv" 2>&1
        "$NCU" -i "/tmp/$NAME.ncu-rep" --page source --csv --print-source sass | gzip > "$OUT/${NAME}_sass.csv.gz"
      done ;;
    g2ncu)  # issue 39, G <= 2: where the paged live kernel's stream time goes (1.70x contiguous host rounds' at d64-g2 16 x 32k,
            # 37th session): the same case on ordered pages (the memory system's share), on host-built rounds over shuffled
            # pages (the live schedule's share) and on both; ncu_phases.py against a -lineinfo cubin reads each
      for V in "ordered:--ordered" "rounds:--schedule rounds" "orderedrounds:--ordered --schedule rounds"; do
        LIVE_NCU_TAG=${V%%:*} LIVE_NCU_DRIVE="${V#*:}" LIVE_NCU_CASES=16x32768 LIVE_NCU_HEADS="16 8 64" LIVE_NCU_KERNEL='^prop1' \
          bash "$0" livencu
      done ;;
    hndstream)  # issue 39, branch hnd-stream: the contiguous kernels read an HND cache in place (santa.hf's static cache),
                # no longer the paged kernels one page a sequence. The one-launch and santa.hf GPU tests (the HND = NHD bit
                # for bit test among them), then contiguous_ab.py --hf (santa.hf's calls: `plan` should now equal `nhd`) and
                # --quick (NHD contiguous: the stream's addressing changed, so no NHD case may get slower) on main's carried
                # tree and the branch's, then compiled generate() at Qwen 16 x 32k on both (carry .mainsrc as for trial)
      [ -d .mainsrc/src ] || { echo "hndstream: carry main's src/ as .mainsrc/src"; exit 1; }
      timeout 240 python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/kernels/test_one_launch.py \
        tests/hf/test_hf_cuda.py 2>&1 | tail -25 | tee "$OUT/tests_hnd.log" | tail -3
      for TREE in main branch; do
        tree_env "$TREE"
        SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout 90 python3 benchmarks/kernels/contiguous_ab.py "$OUT/hf_$TREE.jsonl" \
          --hf > /tmp/hf_$TREE.log 2>&1 || tail -3 /tmp/hf_$TREE.log
        SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC timeout 90 python3 benchmarks/kernels/contiguous_ab.py \
          "$OUT/quick_$TREE.jsonl" --quick > /tmp/quick_$TREE.log 2>&1 || tail -3 /tmp/quick_$TREE.log
      done
      for TREE in main branch; do
        tree_env "$TREE"
        SANTA_COMMIT=$C PYTHONPATH=/tmp/site:$SRC PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 python3 \
          benchmarks/kernels/hf_generate.py --out "$OUT/qwen16_$TREE.json" --shape qwen2.5-0.5b --lengths 32768 \
          --batches 16 --cache static --compile --backends santa-prop 2>&1 | grep "ms/token" | sed "s/^/$TREE /"
      done ;;
    contiguous)  # issue 39: contiguous caches sized past their live keys (HF's static cache): host rounds against the live
                 # schedule, the Triton prop and cuDNN (contiguous_ab.py; CONTIGUOUS_LIMIT seconds), then its fp8 quick cases
      timeout ${CONTIGUOUS_LIMIT:-200} python3 benchmarks/kernels/contiguous_ab.py "$OUT/contiguous.jsonl" > "$OUT/contiguous.log" 2>&1
      timeout 90 python3 benchmarks/kernels/contiguous_ab.py "$OUT/contiguous_fp8.jsonl" --quick --fp8 > "$OUT/contiguous_fp8.log" 2>&1 ;;
    shortslices)  # issue 39's short cells: one-wave host plans of 1-66 slices per group against the rule and cuDNN
      timeout ${SHORT_SLICES_LIMIT:-240} python3 benchmarks/kernels/short_slices.py "$OUT/short_slices.jsonl" > "$OUT/short_slices.log" 2>&1 ;;
    smoke)  # the prop spec tests on the GPU, bounded (a group barrier that never opens would hang)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels.py -k "prop or graph or large" \
        2>&1 | tail -15 | tee "$OUT/smoke.log" ;;
    covered)  # issue 44: the GPU tests of the decode rule and checks, then prop at S = 128 (Triton, and a plan's run with
              # lengths: the one-launch path plus the covered-sequence launch) against the last landed tree (.oldab, carried:
              # `git archive <commit> src | tar -x -C .oldab`), cuDNN in each
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_covered_exact.py tests/kernels/test_plan_checks.py \
        tests/kernels/test_kernels.py tests/kernels/test_one_launch.py tests/kernels/test_fp8.py tests/hf/test_hf_cuda.py \
        tests/hf/test_hf_request_keys.py 2>&1 | tail -25 | tee "$OUT/tests_covered.log"
      PYTHONPATH=$PWD/.oldab/src timeout 200 python3 benchmarks/kernels/prop_ab.py "$OUT/covered_old.json" "${OLD_COMMIT:-old}" \
        > "$OUT/covered_old.log" 2>&1
      PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/kernels/prop_ab.py "$OUT/covered_new.json" "${SANTA_COMMIT:-new}" \
        > "$OUT/covered_new.log" 2>&1 ;;
    paged)  # issue 39: the one-launch prop on paged caches: its GPU tests (and vLLM's decoder's), then benchmarks/kernels/paged_ab.py
            # (one launch, Triton, FlashInfer paged and cuDNN in the same call), then prop_ab.py on this tree and the last landed
            # one (.oldab, carried: `git archive <commit> src | tar -x -C .oldab`): the contiguous path before and after
      # PAGED_TESTS (default: the paged-cache ones) and PAGED_JSONL (default $OUT/paged.jsonl: a copy carried in the tree
      # resumes a run cut at its limit; the file comes back under $OUT either way)
      timeout 200 python3 -m pytest -q -p no:cacheprovider ${PAGED_TESTS:-tests/kernels/test_one_launch.py tests/kernels/test_head_offset.py \
        tests/kernels/test_covered_exact.py tests/vllm_backend/test_vllm_decode.py} 2>&1 | tail -25 | tee "$OUT/tests_paged.log"
      PYTHONPATH=/tmp/site:$PWD/.oldab/src timeout 150 python3 benchmarks/kernels/prop_ab.py "$OUT/contig_old.json" "${OLD_COMMIT:-old}" \
        > "$OUT/contig_old.log" 2>&1
      PYTHONPATH=/tmp/site:$PWD/src timeout 150 python3 benchmarks/kernels/prop_ab.py "$OUT/contig_new.json" "${SANTA_COMMIT:-new}" \
        > "$OUT/contig_new.log" 2>&1
      [ -n "${PAGED_JSONL:-}" ] && cp "$PAGED_JSONL" "$OUT/paged.jsonl"
      timeout ${PAGED_LIMIT:-300} python3 benchmarks/kernels/paged_ab.py "$OUT/paged.jsonl" ${PAGED_ARGS:-} > "$OUT/paged.log" 2>&1 ;;
    live)  # issue 39: the GPU tests (LIVE_TESTS, default every kernel test and the vLLM decoder's; paged plans take the live
           # schedule), then paged_ab.py --rounds (LIVE_ARGS, default --quick: Llama 1 × 8k, 64 × 2k on 2k and 128k plans,
           # 32 × 32k); with LIVE_FP8_LIMIT its fp8 cases, with LIVE_FULL_LIMIT the full grid (short cells first)
           # without the --rounds arms
      timeout ${LIVE_TESTS_LIMIT:-240} python3 -m pytest -q -p no:cacheprovider ${LIVE_TESTS:-tests/kernels tests/vllm_backend/test_vllm_decode.py} \
        2>&1 | tail -25 | tee "$OUT/tests_live.log"
      timeout ${LIVE_LIMIT:-300} python3 benchmarks/kernels/paged_ab.py "$OUT/live.jsonl" --rounds ${LIVE_ARGS:---quick} > "$OUT/live.log" 2>&1
      [ -n "${LIVE_FP8_LIMIT:-}" ] && timeout $LIVE_FP8_LIMIT python3 benchmarks/kernels/paged_ab.py "$OUT/live_fp8.jsonl" --rounds --fp8 \
        > "$OUT/live_fp8.log" 2>&1
      [ -n "${LIVE_FULL_LIMIT:-}" ] && timeout $LIVE_FULL_LIMIT python3 benchmarks/kernels/paged_ab.py "$OUT/live_full.jsonl" \
        > "$OUT/live_full.log" 2>&1 ;;
    gate)  # the gate (DecodePlan.run's enabled, santa.vllm's short steps): its GPU tests, prop_ab.py of the last tree before it
           # (.oldgate, carried: `mkdir .oldgate && git archive 50142b8 src | tar -x -C .oldgate`) against this one (the
           # default path's time after the one launch's rebuilt module), then paged_ab.py --gate (open, closed, ungated)
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gate.py tests/kernels/test_one_launch.py \
        tests/vllm_backend/test_vllm_decode.py 2>&1 | tail -15 | tee "$OUT/tests_gate.log"
      PYTHONPATH=/tmp/site:$PWD/.oldgate/src timeout 150 python3 benchmarks/kernels/prop_ab.py "$OUT/gate_old.json" \
        "${OLD_COMMIT:-50142b8}" > "$OUT/gate_old.log" 2>&1
      PYTHONPATH=/tmp/site:$PWD/src timeout 150 python3 benchmarks/kernels/prop_ab.py "$OUT/gate_new.json" "${SANTA_COMMIT:-new}" \
        > "$OUT/gate_new.log" 2>&1
      timeout ${GATE_LIMIT:-240} python3 benchmarks/kernels/paged_ab.py "$OUT/gate.jsonl" --gate ${GATE_ARGS:---quick} \
        > "$OUT/gate_paged.log" 2>&1 ;;
    target)  # issue 42: the error target's GPU tests, then its step against fixed S at equal reads (error_target_speed.py),
             # and prop_ab.py of an older tree (.oldab, carried: `git archive <commit> src | tar -x -C .oldab`) and this one
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_error_target_kernels.py 2>&1 | tail -3 \
        | tee "$OUT/tests_target.log"
      timeout 150 python3 benchmarks/kernels/error_target_speed.py "$OUT/error_target_speed.jsonl" > "$OUT/error_target_speed.log" 2>&1
      if [ -d .oldab ]; then
        PYTHONPATH=$PWD/.oldab/src timeout 120 python3 benchmarks/kernels/prop_ab.py "$OUT/ab_old.json" "${OLD_COMMIT:-old}" \
          > "$OUT/ab_old.log" 2>&1
        timeout 120 python3 benchmarks/kernels/prop_ab.py "$OUT/ab_new.json" "${SANTA_COMMIT:-new}" > "$OUT/ab_new.log" 2>&1
      fi ;;
    ab)  # prop at S=128: this tree and 43cc084's (.old43, carried), cuDNN in each
      PYTHONPATH=$PWD/.old43/src timeout 240 python3 benchmarks/kernels/prop_ab.py "$OUT/ab_old.json" 43cc084 > "$OUT/ab_old.log" 2>&1
      PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/kernels/prop_ab.py "$OUT/ab_new.json" "${SANTA_COMMIT:-new}" \
        > "$OUT/ab_new.log" 2>&1 ;;
    fp8)  # fp8 caches (issue 25): the fp8 GPU tests, then santa on e4m3 K/V beside cuDNN and prop on bf16 (no FlashInfer),
          # then FlashInfer's fp8 decode (it JIT-compiles its kernels on first use: bounded)
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tail -6 | tee "$OUT/tests_fp8.log"
      timeout 150 python3 -m benchmarks.bench.kernels --only-fp8 --no-flashinfer --sizes 8192 32768 131072 --batches 8 32 \
        --out /tmp/fp8 > "$OUT/fp8.log" 2>&1; cp /tmp/fp8/kernels.json "$OUT/fp8.json"
      timeout 60 python3 -m benchmarks.bench.kernels --only-fp8 --no-flashinfer --heads 14 --kv-heads 2 --head-dim 64 --sizes 32768 \
        --batches 16 --out /tmp/fp8_qwen >> "$OUT/fp8.log" 2>&1; cp /tmp/fp8_qwen/kernels.json "$OUT/fp8_qwen.json"
      timeout 60 python3 -m benchmarks.bench.kernels --only-fp8 --no-flashinfer --heads 9 --kv-heads 3 --head-dim 64 --sizes 8192 \
        --batches 64 --batch-keys 8192 --out /tmp/fp8_smollm2 >> "$OUT/fp8.log" 2>&1; cp /tmp/fp8_smollm2/kernels.json "$OUT/fp8_smollm2.json"
      timeout "${FI_SECONDS:-200}" python3 -m benchmarks.bench.kernels --only-fp8 --sizes 32768 --batches 8 \
        --out /tmp/fp8_fi > "$OUT/fp8_fi.log" 2>&1; cp /tmp/fp8_fi/kernels.json "$OUT/fp8_fi.json" ;;
    hf)  # HF generate() ms/token, static cache + compiled decode: SDPA against santa prop S=128, Llama-3.1-8B shapes
      timeout 560 python3 benchmarks/kernels/hf_generate.py --out "$OUT/hf_llama.json" --shape llama-3.1-8b --lengths 30000 \
        --batches 1 6 --cache static --compile > "$OUT/hf_llama.log" 2>&1 ;;
    hfq)  # the same on Qwen2.5-0.5B shapes at 32k, then santa.model's ms/token on the same shapes (the 15 % target)
      timeout 240 python3 benchmarks/kernels/hf_generate.py --out "$OUT/hf_qwen.json" --shape qwen2.5-0.5b --lengths 32000 \
        --batches 1 --cache static --compile > "$OUT/hf_qwen.log" 2>&1
      timeout 200 python3 -m benchmarks.bench.e2e --batches 1,6 --prompts 30000 --new-tokens 64 --backends sdpa,santa-prop \
        --no-prefill --out /tmp/e2e_llama > "$OUT/e2e_ref.log" 2>&1; cp /tmp/e2e_llama/e2e.json "$OUT/e2e_ref_llama.json"
      timeout 100 python3 -m benchmarks.bench.e2e --config qwen2.5-0.5b --batches 1 --prompts 32000 --new-tokens 64 \
        --backends sdpa,santa-prop --no-prefill --out /tmp/e2e_qwen >> "$OUT/e2e_ref.log" 2>&1; cp /tmp/e2e_qwen/e2e.json "$OUT/e2e_ref_qwen.json" ;;
    hfprof)  # where compiled HF generate's time goes (torch.profiler), then santa.model's e2e on fp8 caches for Qwen and SmolLM2
      timeout 200 python3 benchmarks/kernels/hf_generate.py --out "$OUT/hf_prof_qwen.json" --shape qwen2.5-0.5b --lengths 32000 \
        --batches 1 --cache static --compile --repeats 1 --profile "$OUT/hf_prof.txt" > "$OUT/hf_prof.log" 2>&1
      timeout 200 python3 benchmarks/kernels/hf_generate.py --out "$OUT/hf_prof_llama.json" --shape llama-3.1-8b --lengths 30000 \
        --batches 1 --cache static --compile --repeats 1 --profile "$OUT/hf_prof.txt" >> "$OUT/hf_prof.log" 2>&1
      timeout 80 python3 -m benchmarks.bench.e2e --config qwen2.5-0.5b --batches 1,16 --prompts 32000 --new-tokens 64 --kv-cache-dtype fp8 \
        --backends flashinfer,santa-prop --no-prefill --out /tmp/e2e_qwen8 > "$OUT/e2e_fp8_small.log" 2>&1
      timeout 80 python3 -m benchmarks.bench.e2e --config smollm2-135m --batches 1,16,64 --prompts 8000 --new-tokens 64 --budget-prop 64 \
        --kv-cache-dtype fp8 --backends flashinfer,santa-prop --no-prefill --out /tmp/e2e_smol8 >> "$OUT/e2e_fp8_small.log" 2>&1 ;;
    host)  # where the host time of eager decode() and plan.run goes (cProfile)
      python3 benchmarks/kernels/host_profile.py > "$OUT/host.log" 2>&1 ;;
    stash1)  # the SmolLM2 GGUF travels in ignored folders .gguf1 … .ggufN, one per call (`prepare.sh smollm2` cuts as many
             # as fit beside the tree), with .pkgs and .whlgg in a call of their own: each call keeps what it carried
      bash benchmarks/eval/gpu_sweeps.sh stash | grep "chunks here" ;;
    real)  # keep this call's chunk, join the GGUF (refused when a chunk is missing), then santa bench real on SmolLM2 at 8k,
           # batch 1 and 16
      bash benchmarks/eval/gpu_sweeps.sh join_smollm2 || exit 1
      PYTHONPATH=/tmp/pkgs:$PYTHONPATH SANTA_CACHE=/tmp/santa HF_HUB_OFFLINE=1 python3 -m benchmarks.bench.real \
        --lengths 4096,8192 --batches 1,16 --budget 128 --out /tmp/real > "$OUT/real.log" 2>&1
      cp /tmp/real/real.json "$OUT/real.json" ;;
    e2eone)  # issue 24: santa bench e2e, santa-prop (the one-launch CUDA prop) beside its two Triton launches, cuDNN (sdpa) and
             # weights-only, each model in its own bounded process; E2E_ONE_MODELS picks (default: llama qwen smollm2)
      B=sdpa,santa-prop,santa-prop-2launch,weights-only
      for model in ${E2E_ONE_MODELS:-llama qwen smollm2}; do
        case $model in
          llama) args="--batches 1,6,16 --prompts 30000" ;;
          qwen) args="--config qwen2.5-0.5b --batches 1,16 --prompts 32000" ;;
          smollm2) args="--config smollm2-135m --batches 1,16,64 --prompts 8000 --budget-prop 64" ;;
        esac
        timeout 240 python3 -m benchmarks.bench.e2e $args --new-tokens 64 --backends $B --no-prefill --out /tmp/e2e1_$model \
          > "$OUT/e2e1_$model.log" 2>&1
        cp /tmp/e2e1_$model/e2e.json "$OUT/e2e1_$model.json" 2>/dev/null; tail -12 "$OUT/e2e1_$model.log"
      done ;;
    hfshort)  # santa.hf on short prompts, whole steps: transformers' compiled generate() with SDPA against santa-prop
              # (dense_below 0, every step sampled) at Llama-3.1-8B's shape, 512 and 2k keys (batch 1), 2k (batch 16), and
              # Qwen2.5-0.5B's at 4k (batch 16): whether santa.hf's dense_below default (0) holds beyond Qwen's 512-2k,
              # where sampling measured 1.08-1.28x faster than SDPA (H200, 2026-12-07, results/2026-12-07-short-default)
      for CASE in "llama-3.1-8b 1 512 2048" "llama-3.1-8b 16 2048" "qwen2.5-0.5b 16 4096"; do
        set -- $CASE
        SHAPE=$1 BATCH=$2; shift 2
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout ${HF_SHORT_LIMIT:-200} python3 \
          benchmarks/kernels/hf_generate.py --out "$OUT/hfshort_${SHAPE}_b$BATCH.json" --shape $SHAPE --lengths "$@" \
          --batches $BATCH --cache static --compile --backends sdpa santa-prop 2>&1 | grep "ms/token"
      done ;;
    e2e)  # whole decode step in one CUDA graph, random weights: Llama-3.1-8B at 30k, SmolLM2 at 8k, Qwen2.5-0.5B at 32k
      python3 -m benchmarks.bench.e2e --batches 6,16 --prompts 30000 --new-tokens 64 --backends sdpa,santa-prop,weights-only \
        --no-prefill --out /tmp/e2e_llama > "$OUT/e2e.log" 2>&1
      python3 -m benchmarks.bench.e2e --config smollm2-135m --batches 1,16,64 --prompts 8000 --new-tokens 64 --budget-prop 64 \
        --backends sdpa,santa-prop,weights-only --no-prefill --out /tmp/e2e_smollm2 >> "$OUT/e2e.log" 2>&1
      python3 -m benchmarks.bench.e2e --config qwen2.5-0.5b --batches 1,16 --prompts 32000 --new-tokens 64 \
        --backends sdpa,santa-prop,weights-only --no-prefill --out /tmp/e2e_qwen >> "$OUT/e2e.log" 2>&1
      python3 - "$OUT/e2e.json" /tmp/e2e_llama/e2e.json /tmp/e2e_smollm2/e2e.json /tmp/e2e_qwen/e2e.json <<'PY'
import json, sys
out = {}
for path in sys.argv[2:]:
    try:
        out[path.split("/")[2]] = json.load(open(path))
    except OSError as exc:
        out[path.split("/")[2]] = {"error": str(exc)}
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
      ;;
    e2ehouse)  # issue 41's check: santa bench e2e of 283cdaf's tree (.old41, carried) and of this one, model by model in
               # one call (old, then new), santa-prop against cuDNN in each run; Llama at B = 6 fits an H100 too.
               # Each run's e2e.json comes back as it ends ($OUT/e2ehouse_<tree>_<model>.json: a call cut short keeps
               # what ran), with one log
      for model in llama qwen smollm2; do
        case $model in
          llama) args="--batches 6 --prompts 30000" ;;
          qwen) args="--config qwen2.5-0.5b --batches 16 --prompts 32000" ;;
          smollm2) args="--config smollm2-135m --batches 64 --prompts 8000 --budget-prop 64" ;;
        esac
        for tree in old new; do
          dir=$PWD; [ "$tree" = old ] && dir=$PWD/.old41
          echo "== $model $tree" >> "$OUT/e2ehouse.log"
          (cd "$dir" && PYTHONPATH=/tmp/site:$dir/src timeout 90 python3 -m benchmarks.bench.e2e $args --new-tokens 32 \
            --backends sdpa,santa-prop --no-prefill --out "/tmp/e2eh/$tree/$model") >> "$OUT/e2ehouse.log" 2>&1
          cp "/tmp/e2eh/$tree/$model/e2e.json" "$OUT/e2ehouse_${tree}_${model}.json" 2>/dev/null
          tail -4 "$OUT/e2ehouse.log"
        done
      done
      ;;
  esac
done

#!/usr/bin/env bash
# santa inside vLLM 0.26.0 on the lent H200 (issue 27), offline. vLLM and the 20 wheels it needs to import
# (VLLM_WHEELS in benchmarks/device/prepare.sh; vLLM's without what Hopper never loads) travel as one xz-packed tar in
# 4 pieces of 28.5 MB, one ignored folder each (.vw1 … .vw4, one per device call while the machine stays warm), joined
# and installed under /tmp.
#
# The pieces are made on the host by `bash benchmarks/device/prepare.sh vllm` (its VLLM_WHEELS
# as one reproducible tar, SHA-256 checked there and here after joining and unpacking).
#
#   bash benchmarks/vllm/gpu_vllm.sh stash          # keep this call's piece in /tmp/vw (carry one .vwN)
#   bash benchmarks/vllm/gpu_vllm.sh install        # join, check, install under /tmp/vsite, santa's entry point beside it, then
#                                                   # the CPU-speed vLLM tests (INSTALL_TESTS=0: none)
#                                                   # (and `vllm serve`'s wheels where the call carries .vs: prepare.sh serve)
#   bash benchmarks/vllm/gpu_vllm.sh models         # the random-weight model folders under /tmp (before the timed stages)
#   bash benchmarks/vllm/gpu_vllm.sh smoke          # tiny random Llama: FLASH_ATTN, CUSTOM dense, CUSTOM prop (eager)
#   bash benchmarks/vllm/gpu_vllm.sh capacity       # santa's step on 2k/8k sequences planned for 32k/128k keys (no vLLM)
#   bash benchmarks/vllm/gpu_vllm.sh llama          # Llama-3.1-8B shapes at 30k, batch 16: FLASH_ATTN against CUSTOM prop S=128
#   bash benchmarks/vllm/gpu_vllm.sh llama_fp8      # the same on fp8 caches
#   bash benchmarks/vllm/gpu_vllm.sh short          # Llama-3.1-8B shapes, 2k prompts, batch 16/64/256: FLASH_ATTN against the
#                                                   # SHORT_ARMS (default "gate prop"): gate = CUSTOM with dense_below's default,
#                                                   # prop = CUSTOM sampling every step, flash2 = FLASH_ATTN again (the tokens'
#                                                   # control), dense = CUSTOM with kernel dense (santa's backend without its
#                                                   # kernels); SHORT_BATCHES (16 64 256), SHORT_MAX_MODEL_LEN (32768),
#                                                   # PROFILE_STEPS (0; 16: the kernels each arm runs, side by side),
#                                                   # SHORT_MODEL (llama-3.1-8b; qwen2.5-0.5b), SHORT_PROMPT_TOKENS
#                                                   # (2048; several share each arm's engine), SHORT_ARM_LIMIT (190 s)
#   bash benchmarks/vllm/gpu_vllm.sh qwen           # Qwen2.5-0.5B shapes at 32k, batch 1, 16 and 64 (one engine per backend)
#   bash benchmarks/vllm/gpu_vllm.sh qwen_fp8       # the same on fp8 caches
#   bash benchmarks/vllm/gpu_vllm.sh needles        # the bundled Qwen's needle tasks at 16k/32k, 50 prompts, through vLLM
#   bash benchmarks/vllm/gpu_vllm.sh needles_fp8    # the same on fp8 caches
#                                                   # (after `gpu_sweeps.sh stash` calls carrying .pkgs + .whlgg, then .qw1 … .qwN one each)
#   bash benchmarks/vllm/gpu_vllm.sh needles_serve  # issue 40: the needles through `vllm serve` and the OpenAI client
#   bash benchmarks/vllm/gpu_vllm.sh serve          # issue 40: vllm serve + vllm bench serve, FLASH_ATTN against CUSTOM (SERVE_ARGS:
#                                                   # serve.py's flags; SERVE_LIMIT: seconds; SERVE_MODEL: qwen2.5-0.5b, records
#                                                   # apart); servetest: its GPU test
#   bash benchmarks/vllm/gpu_vllm.sh invariant      # vLLM's VLLM_BATCH_INVARIANT=1, tiny model, 2k prompts: each backend's greedy
#                                                   # tokens of request 0 alone and in a batch of 8 (one engine each; santa samples
#                                                   # every step there, on the Triton prop)
#   bash benchmarks/vllm/gpu_vllm.sh vtests         # vLLM 0.26.0's own backend tests against santa (backend_test.py; carry
#                                                   # .vt from `prepare.sh vllmtests`); VT_PASSES picks passes (default: all)
# Every engine start costs ~1-2 min (torch.compile, CUDA-graph capture): budget the device calls for it.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/vw
export PYTHONPATH=/tmp/vsite:$PWD/src PYTHONUNBUFFERED=1
TAR_SHA=ba04ac98123e1ee0fdfd2d48343d9b03d470324822a15b5779fa44364241cbad  # = prepare.sh's VLLM_TAR_SHA
run() {  # one offline.py process, bounded; its lock files do not come back (they would count against $OUT's 8 files)
  local seconds=$1; shift
  timeout "$seconds" python3 benchmarks/vllm/offline.py "$@" 2>&1 | grep -v "^DEBUG" | tail -n 25
  rm -f "$OUT"/*.lock
}
for stage in "$@"; do
  case $stage in
    stash)
      for d in .vw*; do [ -d "$d" ] && cp "$d/p" "/tmp/vw/${d#.}"; done
      ls -la /tmp/vw ;;
    install)
      # the pieces are one xz file (prepare.sh vllm); Python's lzma unpacks it where no xz is installed
      cat $(ls /tmp/vw/vw* | sort -V) | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
        > /tmp/vllm_wheels.tar 2> /dev/null
      [ "$(sha256sum /tmp/vllm_wheels.tar | cut -d' ' -f1)" = "$TAR_SHA" ] || { echo "the joined tar is incomplete: $(ls /tmp/vw)"; exit 1; }
      mkdir -p /tmp/vwheels && tar xf /tmp/vllm_wheels.tar -C /tmp/vwheels
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vwheels/*.whl
      if [ -d .vs ]; then  # the server's and the client's wheels (prepare.sh serve), carried by this call
        (cd .vs && sha256sum --quiet -c SHA256SUMS) || { echo ".vs: a wheel does not match its SHA-256"; exit 1; }
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite .vs/*.whl
      fi
      # santa from the source tree, with its vllm.general_plugins entry point where importlib.metadata finds it
      mkdir -p /tmp/vsite/santa_attention-0.1.0.dist-info
      printf 'Metadata-Version: 2.1\nName: santa-attention\nVersion: 0.1.0\n' > /tmp/vsite/santa_attention-0.1.0.dist-info/METADATA
      printf '[vllm.general_plugins]\nsanta = santa.vllm.plugin:register\n' > /tmp/vsite/santa_attention-0.1.0.dist-info/entry_points.txt
      python3 -c "import vllm, santa.vllm.backend; print('vllm', vllm.__version__, 'and santa.vllm.backend import')" 2>&1 | tail -3
      [ "${INSTALL_TESTS:-1}" = 0 ] || python3 -m pytest -q -m "not slow" -p no:cacheprovider tests/vllm_backend 2>&1 | tail -3 | tee "$OUT/tests_vllm.log" ;;
    models)  # the random-weight folders, once per machine (Llama-3.1-8B's 16 GB take ~1-2 min), so no timed stage makes one
      for m in "tiny /tmp/tiny" "llama-3.1-8b /tmp/llama8b" "qwen2.5-0.5b /tmp/qwen_random"; do
        read -r shape folder <<< "$m"
        timeout 200 python3 benchmarks/vllm/offline.py --folder "$folder" --make "$shape" --make-only 2>&1 | tail -2
      done ;;
    smoke)  # exact mode first: CUSTOM with SANTA_VLLM_KERNEL=dense must give FLASH_ATTN's greedy tokens
      A="--folder /tmp/tiny --make tiny --prompt-tokens 2000 --batch 8 --new-tokens 16 --repeats 1 --enforce-eager"
      run 200 $A --backend FLASH_ATTN --out "$OUT/smoke_flash.json"
      SANTA_VLLM_KERNEL=dense run 200 $A --backend CUSTOM --out "$OUT/smoke_dense.json"
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=64 run 200 $A --backend CUSTOM --out "$OUT/smoke_prop.json"
      python3 benchmarks/vllm/offline.py --compare "$OUT/smoke_flash.json" "$OUT/smoke_dense.json"
      python3 benchmarks/vllm/offline.py --compare "$OUT/smoke_flash.json" "$OUT/smoke_prop.json" ;;
    capacity)  # what a large max_model_len costs santa's step on short sequences, cut pass-1 grid against uncut (no vLLM needed)
      timeout 300 python3 benchmarks/vllm/capacity_ab.py "$OUT/capacity.jsonl" 2>&1 | tail -n 8 ;;
    llama)
      A="--folder /tmp/llama8b --make llama-3.1-8b --prompt-tokens 30000 --batch 16"
      run 280 $A --backend FLASH_ATTN --out "$OUT/llama_flash.json"
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 run 280 $A --backend CUSTOM --out "$OUT/llama_prop.json"
      python3 benchmarks/vllm/offline.py --compare "$OUT/llama_flash.json" "$OUT/llama_prop.json" ;;
    llama_fp8)
      A="--folder /tmp/llama8b --make llama-3.1-8b --prompt-tokens 30000 --batch 16 --kv-cache-dtype fp8"
      run 280 $A --backend FLASH_ATTN --out "$OUT/llama8_flash.json"
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 run 280 $A --backend CUSTOM --out "$OUT/llama8_prop.json"
      python3 benchmarks/vllm/offline.py --compare "$OUT/llama8_flash.json" "$OUT/llama8_prop.json" ;;
    short)  # dense_below (santa.vllm.config): at Qwen's shape 2k-token prompts decode below the default 8192 keys, so the
            # gate arm gives every step to FlashAttention inside santa's backend; at Llama's (default 1024 since
            # 2026-12-07) the gate arm samples them as prop does; SANTA_VLLM_DENSE_BELOW=0 samples every step. Packed: 9 JSON files
      # --max-model-len 32768: a server's plans and gate (below dense_below the backend would capture FlashAttention alone)
      # SHORT_MODEL=qwen2.5-0.5b: Qwen2.5-0.5B's shapes (folder /tmp/qwen_random, as `models` makes it) instead of Llama's
      # SHORT_PROMPT_TOKENS (default 2048): the prompts' length, or several ("3072 4096": every length and batch in one
      # engine per arm), e.g. where a shape's dense_below is in question; files short<length>x<batch>_<arm>.json
      F="--folder /tmp/llama8b --make llama-3.1-8b"; [ "${SHORT_MODEL:-llama-3.1-8b}" = qwen2.5-0.5b ] && F="--folder /tmp/qwen_random --make qwen2.5-0.5b"
      A="$F --prompt-tokens ${SHORT_PROMPT_TOKENS:-2048} --batch ${SHORT_BATCHES:-16 64 256} --max-model-len ${SHORT_MAX_MODEL_LEN:-32768}"
      A="$A --profile-steps ${PROFILE_STEPS:-0}"  # PROFILE_STEPS=16: each arm's kernels over 16 more tokens (--compare lists them)
      rm -rf /tmp/short; mkdir -p /tmp/short  # no earlier call's files compared or packed
      ARMS=" ${SHORT_ARMS:-gate prop} "
      L=${SHORT_ARM_LIMIT:-190}  # seconds per arm's engine (start, then every cell)
      run "$L" $A --backend FLASH_ATTN --out "/tmp/short/short{prompt}x{batch}_flash.json"
      # arms: gate (santa's default: short steps on FlashAttention), prop (sampling every step, dense_below 0; 283cdaf's
      # 0.76-0.90x), flash2 (FLASH_ATTN's engine again: do two FLASH_ATTN engines keep the same greedy tokens?), dense
      # (santa's backend with SANTA_VLLM_KERNEL=dense: FlashAttention on every step and no santa launch, so what santa's
      # backend costs and changes in tokens without its kernels)
      [[ $ARMS == *" gate "* ]] && SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 run "$L" $A --backend CUSTOM \
        --out "/tmp/short/short{prompt}x{batch}_gate.json"
      [[ $ARMS == *" prop "* ]] && SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 SANTA_VLLM_DENSE_BELOW=0 \
        run "$L" $A --backend CUSTOM --out "/tmp/short/short{prompt}x{batch}_prop.json"
      [[ $ARMS == *" flash2 "* ]] && run "$L" $A --backend FLASH_ATTN --out "/tmp/short/short{prompt}x{batch}_flash2.json"
      [[ $ARMS == *" dense "* ]] && SANTA_VLLM_KERNEL=dense run "$L" $A --backend CUSTOM --out "/tmp/short/short{prompt}x{batch}_dense.json"
      for P in ${SHORT_PROMPT_TOKENS:-2048}; do for B in ${SHORT_BATCHES:-16 64 256}; do for arm in $ARMS; do
        C=/tmp/short/short${P}x${B}
        [ -f "${C}_flash.json" ] && [ -f "${C}_${arm}.json" ] && \
          { echo "${P} x ${B}:"; python3 benchmarks/vllm/offline.py --compare "${C}_flash.json" "${C}_${arm}.json"; }
      done; done; done | tee "$OUT/short_compare.txt"
      rm -f /tmp/short/*.lock; tar czf "$OUT/short.tgz" -C /tmp short ;;
    qwen|qwen_fp8)  # one engine per backend times batch 1, 16 and 64 in turn; qwen_fp8: the same on fp8 caches (files qwen8_*)
      K=""; P=qwen; [ "$stage" = qwen_fp8 ] && { K="--kv-cache-dtype fp8"; P=qwen8; }
      A="--folder /tmp/qwen_random --make qwen2.5-0.5b --prompt-tokens 32000 --batch 1 16 64 $K"
      run 280 $A --backend FLASH_ATTN --out "$OUT/${P}{batch}_flash.json"
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 run 280 $A --backend CUSTOM --out "$OUT/${P}{batch}_prop.json"
      for B in 1 16 64; do python3 benchmarks/vllm/offline.py --compare "$OUT/${P}${B}_flash.json" "$OUT/${P}${B}_prop.json"; done ;;
    needles|needles_fp8)  # the Qwen GGUF's chunks and .pkgs/.whlgg stashed first (gpu_sweeps.sh stash calls)
      bash benchmarks/eval/gpu_sweeps.sh join > /dev/null || { echo "the Qwen GGUF is not here: stash its chunks first"; exit 1; }
      export PYTHONPATH=/tmp/pkgs:$PYTHONPATH:/tmp/site SANTA_CACHE=/tmp/santa HF_HUB_OFFLINE=1
      N="$OUT/$stage"; K="--kv-cache-dtype auto"; [ "$stage" = needles_fp8 ] && K="--kv-cache-dtype fp8"
      timeout 280 python3 benchmarks/vllm/needles.py --folder /tmp/qwen --backend FLASH_ATTN $K --out "${N}_flash.json" 2>&1 | tail -n 3
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 timeout 280 python3 benchmarks/vllm/needles.py --folder /tmp/qwen --backend CUSTOM \
        $K --out "${N}_prop.json" 2>&1 | tail -n 3
      python3 benchmarks/vllm/needles.py --compare "${N}_flash.json" "${N}_prop.json"; rm -f "$OUT"/*.lock ;;
    needles_serve)  # issue 40: the same needles through `vllm serve` and the OpenAI client (after `install` with .vs, and the
                    # Qwen chunks stashed as for `needles`)
      bash benchmarks/eval/gpu_sweeps.sh join > /dev/null || { echo "the Qwen GGUF is not here: stash its chunks first"; exit 1; }
      export PYTHONPATH=/tmp/pkgs:$PYTHONPATH:/tmp/site SANTA_CACHE=/tmp/santa HF_HUB_OFFLINE=1 PATH=/tmp/vsite/bin:$PATH
      N="$OUT/needles_serve"
      timeout 280 python3 benchmarks/vllm/needles.py --folder /tmp/qwen --backend FLASH_ATTN --server --out "${N}_flash.json" 2>&1 | tail -n 3
      SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=128 timeout 280 python3 benchmarks/vllm/needles.py --folder /tmp/qwen --backend CUSTOM \
        --server --out "${N}_prop.json" 2>&1 | tail -n 3
      python3 benchmarks/vllm/needles.py --compare "${N}_flash.json" "${N}_prop.json"; rm -f "$OUT"/*.lock ;;
    serve)  # issue 40: `vllm serve` per backend, the OpenAI client, `vllm bench serve` (benchmarks/vllm/serve.py; after
            # an `install` that carried .vs, the server's extra wheels): results packed as one file (8 come back)
      export PATH=/tmp/vsite/bin:$PATH
      # SERVE_MODEL: the shape (llama-3.1-8b, or qwen2.5-0.5b: folder /tmp/<shape>_serve, records /tmp/serve_<shape>)
      M=${SERVE_MODEL:-llama-3.1-8b}; F=/tmp/llama8b_serve; S=serve
      [ "$M" = llama-3.1-8b ] || { F=/tmp/${M}_serve; S=serve_$M; }
      # shellcheck disable=SC2086
      timeout "${SERVE_LIMIT:-540}" python3 benchmarks/vllm/serve.py "/tmp/$S" --folder "$F" --make "$M" \
        ${SERVE_ARGS:---workloads short long mixed --prompts 64 16 24 --rates inf short:8 long:0.5} 2>&1 | grep -v "^DEBUG" | tail -n 30
      python3 benchmarks/vllm/serve.py "/tmp/$S" --table | tee "$OUT/${S}_table.md"
      tar czf "$OUT/$S.tgz" -C /tmp "$S" ;;
    servetest)  # the GPU test of `vllm serve` with santa and the OpenAI client (tiny model; two server starts)
      timeout 400 python3 -m pytest -q -p no:cacheprovider -m slow tests/vllm_backend/test_vllm_serve.py 2>&1 | tail -n 15 \
        | tee "$OUT/tests_serve.log" ;;
    invariant)  # a request's tokens alone and batched under vLLM's batch-invariant mode: FLASH_ATTN (vLLM's own promise)
                # and CUSTOM (santa: dense_below 0, the Triton prop, as santa.vllm.config.batch_invariant_config sets)
      A="--folder /tmp/tiny --make tiny --prompt-tokens 2000 --batch 1 8 --new-tokens 48 --repeats 1"
      VLLM_BATCH_INVARIANT=1 run 200 $A --backend FLASH_ATTN --out "$OUT/inv{batch}_flash.json"
      VLLM_BATCH_INVARIANT=1 SANTA_VLLM_KERNEL=prop SANTA_VLLM_BUDGET=64 run 200 $A --backend CUSTOM --out "$OUT/inv{batch}_prop.json"
      for arm in flash prop; do python3 benchmarks/vllm/offline.py --invariance "$OUT/inv1_$arm.json" "$OUT/inv8_$arm.json"; done \
        | tee "$OUT/invariance.txt" ;;
    vtests)  # passes: flash dense exact sampled split graph gate; the JSON is rewritten after each one
      # shellcheck disable=SC2086
      timeout 590 python3 benchmarks/vllm/backend_test.py --tests .vt --out "$OUT/backend_test.json" \
        --passes ${VT_PASSES:-flash dense exact sampled split graph gate} 2>&1 | grep -v "^DEBUG" | tail -n 40 ;;
  esac
done

"""Offline vLLM decode throughput and greedy tokens with one attention backend (issue 27): vLLM's own
(``FLASH_ATTN``) or santa's (``CUSTOM``, settings from ``SANTA_VLLM_*``). One process per backend: run it
once per backend and compare the JSON files (``--compare``).

The model folder is made on the device when absent (``--make``): random bf16 weights of a real model's
shape saved as safetensors (the time of a step does not depend on their values), no tokenizer (prompts
are token ids, ``skip_tokenizer_init``). Decode tokens/s is timed on the engine's own steps: the batch's
requests are added together and ``LLMEngine.step()`` is driven by hand; the clock starts once every request
has ``--warm-tokens`` tokens (its prefill is over, so every later step is a decode step of the whole batch,
the steps santa's backend runs) and stops once every request has ``--new-tokens`` more; tokens/s = tokens
generated in between / the time between. Chunked prefill lets early requests decode beside later ones'
prefill chunks (mixed batches, run by vLLM's own attention): those steps are outside the clock. One
prefill per repeat; median of ``--repeats``.

Several batch sizes and prompt lengths share one engine (``--batch 1 16 64 --prompt-tokens 2048 4096``, an engine
start costs 1-2 min): the engine is sized for the largest (``max_num_seqs``, ``max_model_len``), each length and
size is timed in turn, and ``--out`` names one file per cell through ``{batch}`` and ``{prompt}``. One run at a time
per ``--out`` (a second is refused: ``<out>.lock``), and a run picks up where a killed one stopped: a cell whose file
already holds all ``--repeats`` with the same settings (backend, ``SANTA_VLLM_*``, tokens, cache dtype, eager) is not
timed again, and the engine is not started when every cell is done.

    python benchmarks/vllm/offline.py --folder /tmp/llama8b --make llama-3.1-8b --backend CUSTOM \\
        --prompt-tokens 30000 --batch 16 --new-tokens 64 --out custom.json
    python benchmarks/vllm/offline.py --folder /tmp/qwen_random --make qwen2.5-0.5b --backend CUSTOM \\
        --prompt-tokens 32000 --batch 1 16 64 --out custom_b{batch}.json
    python benchmarks/vllm/offline.py --folder /tmp/qwen_random --backend FLASH_ATTN --prompt-tokens 3072 4096 \
        --batch 1 16 64 256 --max-model-len 32768 --out flash_{prompt}x{batch}.json
    python benchmarks/vllm/offline.py --compare flash.json custom.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

from santa.provenance import run_record

SHAPES = {  # transformers configs of the shapes santa's other benchmarks use
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "tiny": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192),
}


def make_folder(folder: Path, shape: str) -> None:
    """Random bf16 weights of ``shape`` as a transformers folder (config.json + safetensors), made on the GPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    torch.cuda.empty_cache()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs=2, metavar=("BASELINE", "OTHER"), help="print OTHER against BASELINE and exit")
    parser.add_argument("--invariance", nargs=2, metavar=("ALONE", "BATCHED"),
                        help="whether the requests of ALONE (a smaller batch) kept their greedy tokens in BATCHED (the same "
                             "engine's larger batch) and exit: status 1 where one did not")
    parser.add_argument("--folder", type=Path, help="the model folder (made with --make when absent)")
    parser.add_argument("--make", choices=sorted(SHAPES), help="the shape of the random weights to make the folder with")
    parser.add_argument("--backend", default="CUSTOM", help="FLASH_ATTN (vLLM's default here) or CUSTOM (santa)")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[30000],
                        help="one or more prompt lengths (tokens), timed in one engine")
    parser.add_argument("--batch", type=int, nargs="+", default=[16], help="one or more batch sizes, timed in one engine")
    parser.add_argument("--new-tokens", type=int, default=128, help="decode tokens per request inside the clock")
    parser.add_argument("--warm-tokens", type=int, default=4, help="tokens per request before the clock starts")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto or fp8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384, help="tokens per engine step (prefill chunks)")
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile, no CUDA graphs (a smoke run)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--max-model-len", type=int, help="the engine's (default: what the run needs, 8 to spare); larger "
                        "sizes santa's plans and its dense_below gate as a server's would be")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, choices=(1, 2, 4, 8),
                        help="vLLM's tensor parallelism (santa keys its draws on the global head: the same tokens at every size)")
    parser.add_argument("--make-only", action="store_true", help="make the folder (--make) and exit, no engine")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after timing a batch size, profile this many more decode tokens per request with vLLM's torch "
                             "profiler and keep each GPU kernel's count and time in the result (\"kernels\"; traces under "
                             "/tmp, not kept)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for name in ("new_tokens", "warm_tokens", "repeats", "max_num_batched_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    if min(args.batch) < 1 or len(set(args.batch)) != len(args.batch):
        parser.error(f"--batch takes distinct sizes ≥ 1, got {args.batch}")
    if min(args.prompt_tokens) < 1 or len(set(args.prompt_tokens)) != len(args.prompt_tokens):
        parser.error(f"--prompt-tokens takes distinct lengths ≥ 1, got {args.prompt_tokens}")
    if not (args.compare or args.invariance) and (args.folder is None or (args.out is None and not args.make_only)):
        parser.error("--folder and --out are required (or --compare, --invariance, or --folder with --make-only)")
    if args.out is not None and len(args.batch) > 1 and "{batch}" not in str(args.out):
        parser.error(f"--out must hold {{batch}} when several batch sizes are timed (one file each), got {args.out}")
    if args.out is not None and len(args.prompt_tokens) > 1 and "{prompt}" not in str(args.out):
        parser.error(f"--out must hold {{prompt}} when several prompt lengths are timed (one file each), got {args.out}")
    if len(args.prompt_tokens) > 1 and args.max_model_len is None:  # else the shorter lengths' engine is not theirs alone
        parser.error("--max-model-len is needed when several prompt lengths share one engine (it is recorded with each "
                     "cell; by default a run sizes it to its longest prompt)")
    return args


def out_path(out: Path, batch: int, prompt_tokens: int) -> Path:
    """The result file of one cell: ``out`` with ``{batch}`` and ``{prompt}`` filled in (``out`` itself when it has
    neither)."""
    return Path(str(out).replace("{batch}", str(batch)).replace("{prompt}", str(prompt_tokens)))


def lock_path(out: Path) -> Path:
    """The one lock of a run's result files: ``out`` without ``{batch}`` and ``{prompt}``, plus ``.lock``."""
    return Path(str(out).replace("{batch}", "").replace("{prompt}", "") + ".lock")


def run_settings(args: argparse.Namespace, santa_settings: dict, *, prompt_tokens: int) -> dict:
    """What the result file of one prompt length must match to count as this run's: a file written with other settings
    is timed again."""
    return {"backend": args.backend, "santa": santa_settings, "folder": str(args.folder), "prompt_tokens": prompt_tokens,
            "new_tokens": args.new_tokens, "warm_tokens": args.warm_tokens, "kv_cache_dtype": args.kv_cache_dtype,
            "enforce_eager": args.enforce_eager, "repeats": args.repeats, "tensor_parallel_size": args.tensor_parallel_size,
            **({"max_model_len": args.max_model_len} if args.max_model_len else {}),
            **({"batch_invariant": True} if batch_invariant_mode() else {})}


def batch_invariant_mode() -> bool:
    """Whether vLLM runs in its batch-invariant mode, read as vLLM 0.26's envs reads ``VLLM_BATCH_INVARIANT`` (an int,
    on unless 0), before vLLM is imported; RuntimeError (one line from main) where it is no int."""
    value = os.environ.get("VLLM_BATCH_INVARIANT", "0")
    try:
        return bool(int(value))
    except ValueError:
        raise RuntimeError(f"VLLM_BATCH_INVARIANT must be an int (vLLM reads it as one; 0: off), got {value!r}") from None


def finished(path: Path, settings: dict) -> bool:
    """Whether ``path`` already holds every repeat of this cell with these settings (a killed run's file holds
    fewer; an unreadable file counts as not finished and is rewritten)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(result, dict) and all(result.get(key) == value for key, value in settings.items())
            and len(result.get("decode_tokens_per_s_all", [])) >= settings["repeats"])


TRACES = Path("/tmp/offline_traces")  # vLLM's torch-profiler traces (--profile-steps), summarised then deleted
KERNELS_KEPT = 40  # the kernels a result keeps from a profile, by total time


def new_traces(before: set[Path], timeout_s: float = 120.0) -> list[Path]:
    """The trace files under :data:`TRACES` not in ``before``, once there is one and none has grown for 2 s (the
    engine's worker writes them as the profiler stops); RuntimeError where none comes in ``timeout_s``."""
    start, sizes = time.perf_counter(), None
    while time.perf_counter() - start < timeout_s:
        found = sorted(set(TRACES.glob("**/*.pt.trace.json*")) - before)
        now = {trace: trace.stat().st_size for trace in found}
        if found and now == sizes:
            return found
        sizes = now
        time.sleep(2.0)
    raise RuntimeError(f"no profiler trace came to {TRACES} in {timeout_s:.0f} s")


def kernel_totals(traces: list[Path]) -> list[dict]:
    """Every GPU kernel of these Chrome traces (torch profiler, ``.json`` or ``.json.gz``: events of category
    ``kernel``, CUDA-graph replays included) as ``{"name", "count", "total_us"}``, the longest total first."""
    totals: dict[str, list[float]] = {}
    for trace in traces:
        opener = gzip.open if trace.suffix == ".gz" else open
        with opener(trace, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        for event in events:
            if event.get("cat") == "kernel" and "dur" in event:
                entry = totals.setdefault(event["name"], [0, 0.0])
                entry[0] += 1
                entry[1] += float(event["dur"])
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    return [{"name": name, "count": count, "total_us": round(total, 3)} for name, (count, total) in ranked]


def kernel_differences(base: list[dict], other: list[dict], most: int = 8) -> list[tuple[str, float, float]]:
    """(name, base µs, other µs) of the kernels whose total time differs most between two profiles (a kernel one of
    them lacks counts 0 there)."""
    a, b = ({k["name"]: k["total_us"] for k in kernels} for kernels in (base, other))
    names = sorted(set(a) | set(b), key=lambda name: -abs(b.get(name, 0.0) - a.get(name, 0.0)))
    return [(name, a.get(name, 0.0), b.get(name, 0.0)) for name in names[:most]]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where two greedy sequences differ (the shorter one's length where one is a prefix
    of the other), None where they are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def compare(baseline_path: str, other_path: str) -> None:
    base, other = (json.loads(Path(p).read_text()) for p in (baseline_path, other_path))
    ratio = other["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    firsts = [first_difference(a, b) for a, b in zip(base["tokens"], other["tokens"], strict=True)]
    differ = sorted(i for i in firsts if i is not None)
    where = f", the others from token {differ[0]}–{differ[-1]} (median {differ[len(differ) // 2]})" if differ else ""
    itself = "".join(f"; {r['backend']} kept {r['repeat_same_tokens']} of {len(r['tokens'])} across its own repeats"
                     for r in (base, other) if "repeat_same_tokens" in r)
    print(f"{other['backend']} {other['santa']} over {base['backend']}: {ratio:.3f}× decode tokens/s "
          f"({other['decode_tokens_per_s']:.0f} against {base['decode_tokens_per_s']:.0f}); "
          f"{len(firsts) - len(differ)} of {len(firsts)} sequences with identical greedy tokens{where}{itself}")
    if "kernels" in base and "kernels" in other:  # profiles of the same tokens: where the time differs, kernel by kernel
        total = [sum(k["total_us"] for k in r["kernels"]) for r in (base, other)]
        print(f"  profiled kernels: {total[0]:.0f} against {total[1]:.0f} µs in all; the largest differences (µs):")
        for name, a, b in kernel_differences(base["kernels"], other["kernels"]):
            print(f"    {b - a:+10.1f}  {a:10.1f} → {b:10.1f}  {name[:110]}")


def invariance(alone_path: str, batched_path: str) -> bool:
    """Print, request by request, whether the greedy tokens of a run at one batch size (``alone_path``, say batch 1)
    equal the same requests' tokens at a larger size in the same engine (``batched_path``: its first rows are the same
    prompts), over the tokens both asked for; return whether every one does. Under vLLM's ``VLLM_BATCH_INVARIANT=1`` a
    request's tokens must not depend on its batch."""
    alone, batched = (json.loads(Path(p).read_text()) for p in (alone_path, batched_path))
    if len(alone["tokens"]) > len(batched["tokens"]):
        raise ValueError(f"{alone_path} holds {len(alone['tokens'])} requests, more than {batched_path} "
                         f"({len(batched['tokens'])}): give the smaller batch first")
    same = True
    for i, (a, b) in enumerate(zip(alone["tokens"], batched["tokens"], strict=False)):
        n = min(len(a), len(b))
        part = first_difference(a[:n], b[:n])
        same = same and part is None
        print(f"request {i}: batch {alone['batch']} against batch {batched['batch']} ({alone['backend']} {alone['santa']}"
              f"{', VLLM_BATCH_INVARIANT=1' if alone.get('batch_invariant') else ''}): "
              + (f"the same {n} tokens" if part is None else f"differs from token {part} of {n}"))
    return same


def tokens_per_request(*, prompt_tokens: int, batch: int, chunk: int, warm_tokens: int, new_tokens: int) -> int:
    """What each request asks for: warm + new tokens, plus the steps by which its prefill may end before the
    last request's (``batch · prompt_tokens`` prefill tokens, ``chunk`` per engine step), plus 8."""
    spread = -(-batch * prompt_tokens // chunk)
    return warm_tokens + new_tokens + spread + 8


def check_fits(*, batch: int, tokens: int, blocks: int | None, block_size: int) -> None:
    """Raise where the KV cache (``blocks`` of ``block_size`` tokens, one of them vLLM's null block; None: not known here)
    cannot hold ``batch`` requests of ``tokens`` tokens at once, each in whole blocks: vLLM would queue some, and the
    batch would not decode together (H100, 2026-12-05: 256 × 2k-token requests on 449,968 tokens)."""
    if blocks is None:
        return
    needed = batch * -(-tokens // block_size)
    if needed > blocks - 1:
        raise RuntimeError(f"the KV cache holds {blocks - 1:,} blocks of {block_size} tokens and {batch} requests of "
                           f"{tokens:,} tokens need {needed:,}: they cannot all decode at once (lower --batch or "
                           "--prompt-tokens, or raise --gpu-memory-utilization)")


def decode_rate(llm, prompts: list, *, new_tokens: int, warm_tokens: int, tag: str) -> tuple[float, list[list[int]]]:
    """Decode tokens/s of the whole batch on the engine's steps (see the module docstring), and each
    request's greedy tokens. ``tag`` keeps request ids unique across repeats. Requests may ask for more
    tokens than the clock needs: one whose prefill ended early decodes beside the others' prefill chunks,
    and none may finish before the clock stops (the batch would shrink)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    longest = max(len(p["prompt_token_ids"]) for p in prompts)
    cap = tokens_per_request(prompt_tokens=longest, batch=len(prompts),
                             chunk=llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens,
                             warm_tokens=warm_tokens, new_tokens=new_tokens)
    cache = llm.llm_engine.vllm_config.cache_config
    check_fits(batch=len(prompts), tokens=longest + cap, blocks=cache.num_gpu_blocks or None, block_size=cache.block_size)
    params = SamplingParams(max_tokens=cap, min_tokens=cap, temperature=0.0, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
    return clocked_steps(llm.llm_engine, prompts, params, warm_tokens=warm_tokens, new_tokens=new_tokens, tag=tag)


def clocked_steps(engine, prompts: list, params, *, warm_tokens: int, new_tokens: int, tag: str,
                  clock=time.perf_counter) -> tuple[float, list[list[int]]]:
    """Drive ``engine`` (``add_request``, ``step``, ``has_unfinished_requests``; outputs in DELTA mode) until
    its requests finish. The clock runs from the step after which every request holds ``warm_tokens`` to
    the one after which every request holds ``new_tokens`` more; returns the tokens generated in between
    over the time between, and every request's tokens. Raises if a request reached ``params.max_tokens``
    inside the window (the later steps would not decode the whole batch)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}x{i}", prompt, params)
    tokens = [[] for _ in prompts]
    start = stop = None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = clock()
        for output in outputs:  # the id is ours, or ours plus vLLM's "-<8 random characters>"
            tokens[int(output.request_id.split("-")[0].split("x")[1])].extend(output.outputs[0].token_ids)
        lengths = [len(t) for t in tokens]
        if start is None and min(lengths) >= warm_tokens:
            start = (now, sum(lengths))
        if start is not None and stop is None:
            if min(lengths) >= warm_tokens + new_tokens:
                stop = (now, sum(lengths))
            elif max(lengths) >= params.max_tokens:
                raise RuntimeError(f"a request finished while the clock ran ({lengths} tokens, max_tokens "
                                   f"{params.max_tokens}): ask for more tokens than warm + new + the prefills' spread, or "
                                   "check that the KV cache holds the whole batch (vLLM's 'Maximum concurrency' line)")
    if start is None or stop is None or stop[0] <= start[0]:
        raise RuntimeError(f"the clock never ran: tokens per request {[len(t) for t in tokens]}, "
                           f"{warm_tokens} + {new_tokens} asked of max_tokens {params.max_tokens}")
    return (stop[1] - start[1]) / (stop[0] - start[0]), tokens


def main() -> None:
    args = parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if args.invariance:
        try:
            same = invariance(*args.invariance)
        except (OSError, ValueError, KeyError) as error:  # a missing or unreadable file, the files in the wrong order
            sys.exit(f"offline.py --invariance: {error}")
        sys.exit(0 if same else 1)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # its top-k/top-p sampler JIT-compiles (no nvcc offline)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (args.folder / "config.json").exists():
        if args.make is None:
            sys.exit(f"{args.folder} holds no config.json: give --make SHAPE to make it")
        t = time.perf_counter()
        make_folder(args.folder, args.make)
        print(f"made {args.folder} ({args.make}) in {time.perf_counter() - t:.0f} s", flush=True)
    if args.make_only:
        return
    from santa.writer_lock import OutputLocked, OutputUnusable, writer_lock

    try:
        with writer_lock(lock_path(args.out), holder="offline.py run"):
            time_batches(args)
    except (OutputLocked, OutputUnusable, RuntimeError) as error:  # RuntimeError: a batch that cannot be timed (one line)
        sys.exit(f"offline.py: {error}")


def time_batches(args: argparse.Namespace) -> None:
    """Start the engine (unless every cell is finished) and time each (prompt length, batch size) not yet finished."""
    santa_settings = {k: v for k, v in os.environ.items() if k.startswith("SANTA_VLLM_")}
    settings = {length: run_settings(args, santa_settings, prompt_tokens=length) for length in args.prompt_tokens}
    todo = []
    for length in args.prompt_tokens:
        for batch in args.batch:
            path = out_path(args.out, batch, length)
            if finished(path, settings[length]):
                print(f"batch {batch} × {length}: {path} already holds this run's {args.repeats} repeats", flush=True)
            else:
                todo.append((length, batch))
    if not todo:
        return
    import torch
    import vllm
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from santa.schedule_file import write_json_atomic

    config = json.loads((args.folder / "config.json").read_text())
    largest, longest = max(args.batch), max(args.prompt_tokens)
    t = time.perf_counter()
    needed = longest + tokens_per_request(prompt_tokens=longest, batch=largest, chunk=args.max_num_batched_tokens,
                                          warm_tokens=args.warm_tokens, new_tokens=args.new_tokens) + 8  # 8 to spare
    if args.max_model_len is not None and args.max_model_len < needed:
        sys.exit(f"--max-model-len {args.max_model_len} is below what this run needs ({needed} tokens per request)")
    llm = LLM(model=str(args.folder), attention_backend=args.backend, kv_cache_dtype=args.kv_cache_dtype, dtype="bfloat16",
              max_model_len=args.max_model_len or needed,
              max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=largest, seed=0,
              gpu_memory_utilization=args.gpu_memory_utilization, skip_tokenizer_init=True, enable_prefix_caching=False,
              enforce_eager=args.enforce_eager, tensor_parallel_size=args.tensor_parallel_size,
              **({} if not args.profile_steps else {"profiler_config": {
                  "profiler": "torch", "torch_profiler_dir": str(TRACES), "torch_profiler_with_stack": False,
                  "ignore_frontend": True}}))
    start_s = time.perf_counter() - t
    print(f"engine up in {start_s:.0f} s", flush=True)

    for length, batch in todo:
        generator = torch.Generator().manual_seed(length)  # batch b's prompts: the first b of the largest batch's
        prompts = [TokensPrompt(prompt_token_ids=torch.randint(10, config["vocab_size"], (length,),
                                                               generator=generator).tolist()) for _ in range(batch)]
        rates, result, first, kept = [], {}, None, None
        for repeat in range(args.repeats):
            rate, tokens = decode_rate(llm, prompts, new_tokens=args.new_tokens, warm_tokens=args.warm_tokens,
                                       tag=f"p{length}b{batch}r{repeat}")
            rates.append(rate)
            if first is None:
                first = tokens
            else:  # the engine against itself: the fewest sequences any later repeat kept from the first
                same = sum(a == b for a, b in zip(first, tokens, strict=True))
                kept = same if kept is None else min(kept, same)
            print(f"batch {batch} × {length}, repeat {repeat}: {rate:.0f} decode tokens/s", flush=True)
            result = {  # written after every repeat: a call cut at its time limit keeps the repeats it finished
                **settings[length], "vllm": vllm.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                "shape": args.make, "batch": batch, "engine_batches": args.batch, "engine_prompt_tokens": args.prompt_tokens,
                "engine_start_s": start_s,
                "decode_tokens_per_s": statistics.median(rates), "decode_tokens_per_s_all": rates, "tokens": tokens,
                **({} if kept is None else {"repeat_same_tokens": kept}),
                "commit": os.environ.get("SANTA_COMMIT"), "run": run_record(),
            }
            write_json_atomic(out_path(args.out, batch, length), result)  # whole or not at all: a kill mid-write leaves the last repeat's
        print(f"{args.backend} {santa_settings}: {result['decode_tokens_per_s']:.0f} decode tokens/s "
              f"({[round(x) for x in rates]}), batch {batch} × {length}", flush=True)
        if args.profile_steps:  # the same batch again under the profiler: which kernels a step runs, and for how long
            before = set(TRACES.glob("**/*.pt.trace.json*"))
            llm.start_profile()
            decode_rate(llm, prompts, new_tokens=args.profile_steps, warm_tokens=args.warm_tokens, tag=f"p{length}b{batch}prof")
            llm.stop_profile()
            traces = new_traces(before)
            result["kernels"] = kernel_totals(traces)[:KERNELS_KEPT]
            result["profiled"] = {"tokens_per_request": args.profile_steps, "traces": len(traces)}
            write_json_atomic(out_path(args.out, batch, length), result)
            for trace in traces:
                trace.unlink()


if __name__ == "__main__":
    main()

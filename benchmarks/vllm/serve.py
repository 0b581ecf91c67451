"""santa served by ``vllm serve``, measured with vLLM's own serving benchmark (issue 40).

For each backend in turn (vLLM's default ``FLASH_ATTN``, then santa's ``CUSTOM``, and where asked ``CUSTOM-sampled``:
santa sampling every decode step, ``dense_below`` 0, or ``CUSTOM-dense``: santa's backend with its kernel off, what the
backend itself costs; :data:`ARMS`), one server is started on a model
folder, asked a few questions by the OpenAI client (completions and chat, streamed and not: :func:`client_check`),
warmed up untimed on ``--warmup-prompts`` prompts of the mixed spread (:func:`warm_up`), measured with ``vllm bench serve`` on each workload and rate, and shut down. One JSON per (backend, workload, rate)
under OUT (vLLM's own result file) plus ``serve.jsonl`` (one record per run: the command, the server's settings,
the metrics); a re-run skips what OUT already holds, so a call cut at its time limit resumes.

    python benchmarks/vllm/serve.py OUT --folder /tmp/llama8b_serve --make llama-3.1-8b \\
        --workloads short long mixed --rates inf 4 --backends FLASH_ATTN CUSTOM --max-model-len 33024
    python benchmarks/vllm/serve.py OUT --table        # the comparison table of what OUT holds

The model folder holds a config of a real model's shape and, in its ``tokenizer`` folder, a synthetic tokenizer
(:func:`write_tokenizer`: word ``t<i>`` is id i, so any id sequence round-trips through text exactly), which the server
and the benchmark are given by ``--tokenizer``; the server makes random weights itself (``--load-format dummy``): the
time of a step does not depend on their values, and nothing is downloaded.
Workloads (``vllm bench serve --dataset-name random``, input lengths uniform in the range, ``--ignore-eos``):
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* as a package
from benchmarks.vllm.offline import SHAPES  # noqa: E402  (the model shapes of the offline benchmark)

from santa.provenance import run_record  # noqa: E402
from santa.schedule_file import write_json_atomic  # noqa: E402
from santa.sweep_files import SweepFileError, append_record, read_records, sweep_lock  # noqa: E402

# the servers a run compares: (vLLM's --attention-backend, what the arm adds to --santa's settings; None: no santa).
# CUSTOM-sampled is santa's backend sampling every decode step (dense_below 0): the backend before short steps went to
# FlashAttention, beside CUSTOM with its default (santa.vllm.config.default_dense_below: by head shape).
# CUSTOM-dense: santa's backend with its kernel off (FlashAttention on every step): what the backend itself costs a server
ARMS = {"FLASH_ATTN": ("FLASH_ATTN", None), "CUSTOM": ("CUSTOM", {}), "CUSTOM-sampled": ("CUSTOM", {"dense_below": 0}),
        "CUSTOM-dense": ("CUSTOM", {"kernel": "dense"})}
WORKLOADS = {  # name: (input tokens low, high); prompts per run at an unbounded rate
    "short": (256, 4096),
    "long": (16384, 32768),
    "mixed": (256, 32768),
}
OUTPUT_TOKENS = (128, 256)  # each request's output length, uniform in this range (and --ignore-eos)
__doc__ += "".join(f"``{name}`` {lo}–{hi} input tokens; " for name, (lo, hi) in WORKLOADS.items()) + (
    f"output {OUTPUT_TOKENS[0]}–{OUTPUT_TOKENS[1]} tokens.\n")
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 of the synthetic tokenizer
SPACE = "\u2581"  # "▁": a word's leading space inside its token (Metaspace), as byte-level BPE tokens carry theirs
TOKENIZER = "tokenizer"  # the model folder's folder of the synthetic tokenizer (no config.json beside it)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
METRICS = ("ttft", "tpot", "itl")
PROMPT_MARGIN = 16  # tokens a workload's longest prompt and output leave free of max_model_len
DEFAULT_MAX_MODEL_LEN = 33024  # the long workload's 32,768-token prompts and 256 output tokens
DETAILS_DROPPED = ("itls", "ttfts", "generated_texts", "start_times")  # --save-detailed's per-request lists not kept


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A fast tokenizer of ``vocab_size`` ids: ``<unk> <s> </s>`` then the words ``t3 … t<vocab_size−1>``, split at
    spaces and joined with single spaces, so ``decode`` then ``encode`` gives back any sequence of ids ≥ 3 (what vLLM's
    random dataset needs for exact prompt lengths). A chat template of ``role: content`` lines.

    Each word's token holds its leading space (``▁t42``, Metaspace), so no text is longer in characters than its tokens
    times the longest token: vLLM 0.26's server refuses a prompt of more characters than (max_model_len − max_tokens) ×
    its tokenizer's longest token (``TokenizeParams._text_len_check``, vllm/renderers/params.py), and with bare ``t42``
    tokens and a space between them a 31,803-token prompt of 6- and 7-character words was 244,732 characters, over its
    229,838 (2 of 24 mixed requests refused, HTTP 400, H200 2026-12-05). :func:`prompt_fits` is that rule."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL)}
    vocab.update({f"{SPACE}t{i}": i for i in range(len(SPECIAL), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL[0]))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    core.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)  # the first word's ▁ dropped
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token=SPECIAL[0], bos_token=SPECIAL[1],
                                        eos_token=SPECIAL[2])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)


def make_folder(folder: Path, shape: str) -> None:
    """``config.json`` of ``shape`` (:data:`offline.SHAPES`, bos 1, eos 2) and the synthetic tokenizer in its own folder
    (:data:`TOKENIZER`); no weights. The tokenizer is not beside the config: transformers (5.x) loads a folder's
    tokenizer by the class its config's ``model_type`` names for some types, whatever ``tokenizer_config.json`` says —
    ``qwen2``'s ``Qwen2Tokenizer`` rebuilds a byte-level BPE from the vocabulary and its merges, and without merges
    every word of ours tokenized to nothing (vLLM: "The decoder prompt cannot be empty", Qwen2.5-0.5B's shape, H200
    2026-12-05). A folder without a config is loaded by ``tokenizer_config.json``'s own class."""
    from transformers import AutoConfig

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", **fields)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    write_tokenizer(folder / TOKENIZER, config.vocab_size)


def tokenizer_folder(folder: Path) -> Path:
    """The tokenizer the server and the benchmark load: the synthetic one :func:`make_folder` wrote, where the model
    folder holds it, else the folder's own (a real model's)."""
    return folder / TOKENIZER if (folder / TOKENIZER / "tokenizer_config.json").exists() else folder


def max_chars_per_token(tokenizer) -> int:
    """The longest token's string, as vLLM 0.26 bounds a prompt's characters by (vllm/tokenizers/hf.py,
    ``get_cached_tokenizer``: the longest key of ``get_vocab()``, special tokens included)."""
    return max(len(token) for token in tokenizer.get_vocab())


def prompt_fits(tokenizer, text: str, max_tokens: int, max_model_len: int) -> bool:
    """Whether vLLM 0.26's server accepts a completion of ``text`` asking ``max_tokens`` tokens: its tokens and
    ``max_tokens`` within ``max_model_len``, and (checked before it tokenizes: ``TokenizeParams._text_len_check``,
    vllm/renderers/params.py) its characters within ``(max_model_len − max_tokens) ×`` :func:`max_chars_per_token`."""
    tokens = len(tokenizer.encode(text, add_special_tokens=True))
    return (tokens + max_tokens <= max_model_len
            and len(text) <= (max_model_len - max_tokens) * max_chars_per_token(tokenizer))


def wait_until_up(port: int, server: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until ``/health`` answers 200; RuntimeError if the server exits or the time runs out."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode} before it was up")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server was not up after {timeout_s:.0f} s")


def server_command(folder: Path, *, port: int, backend: str, max_model_len: int, kv_cache_dtype: str,
                   santa: dict | None, gpu_memory_utilization: float, extra: list[str] = (), load_format: str = "dummy") -> list[str]:
    """``vllm serve`` as a user types it, with random weights (``load_format="dummy"``; ``"auto"`` reads the folder's);
    santa's settings through ``--additional-config`` (vLLM's configuration for plugins)."""
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder), "--port", str(port),
               "--tokenizer", str(tokenizer_folder(folder)), "--attention-backend", backend, "--load-format", load_format,
               "--max-model-len", str(max_model_len),
               "--kv-cache-dtype", kv_cache_dtype, "--gpu-memory-utilization", str(gpu_memory_utilization), "--seed", "0",
               "--served-model-name", "model", "--disable-uvicorn-access-log", *extra]
    if santa is not None:
        command += ["--additional-config", json.dumps({"santa": santa})]
    return command


class Server:
    """A ``vllm serve`` process for the ``with`` block: started, waited for (``/health``), then stopped with SIGINT
    (vLLM's clean shutdown), killed if it has not exited 60 s later. ``log`` receives its output.

    The server runs in its own session, so a run killed without unwinding would leave it holding the GPU and the port
    (the next run refused; seen on the H100, 2026-12-07, when ``timeout`` sent SIGTERM). So while the block runs, SIGTERM
    unwinds the process like an error and the block stops the server; a second SIGTERM during that stop is ignored. The
    previous handler is back once the server is stopped. (Only in the main thread, the one Python delivers signals to.)"""

    def __init__(self, command: list[str], *, port: int, log: Path, env: dict | None = None, timeout_s: float = 600):
        self.command, self.port, self.log, self.env, self.timeout_s = command, port, log, env, timeout_s
        self.startup_s = math.nan
        self.exit_status: int | None = None

    def __enter__(self) -> Server:
        with socket.socket() as probe:  # a server left by a killed run would answer /health for this one
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise RuntimeError(f"port {self.port} is already in use (a server left by an earlier run?): stop it or "
                                   "give another --port")
        self._log = open(self.log, "ab")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True)
        self._previous_sigterm = None
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._unwind)
        try:
            self.startup_s = wait_until_up(self.port, self.process, self.timeout_s)
        except RuntimeError as error:
            self.stop()
            raise RuntimeError(f"{error}: {self.last_error()} (the whole log: {self.log})") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _unwind(self, signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(f"stopped by signal {signum} (SIGTERM): stopping the server on port {self.port}; the records "
                         "written so far stay")

    def last_error(self) -> str:
        """The log's last line that names an error (what stopped the server), or its last line."""
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        named = [line for line in lines if re.search(r"[A-Z]\w*Error:|(^|\s)[Ee]rror[,:]", line)]
        return (named or lines or ["(empty log)"])[-1][:500]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self.exit_status = self.process.returncode
        return self.exit_status

    def __exit__(self, *exc) -> None:
        self.stop()


def client_check(port: int, *, max_tokens: int = 16) -> dict:
    """Completions and chat through the ``openai`` client, streamed and not: each must generate ``max_tokens`` tokens
    (the usage the server reports; a stream's last chunk carries it) and answer some text. Tokens are not counted in
    the text: random weights may generate the synthetic tokenizer's special tokens, which decode to nothing (a chat
    stream answered 8 tokens of text for 16 generated, H200 2026-12-05). Returns what each answered (token counts and
    the first characters)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    prompt, messages = "t5 t9 t40 t7", [{"role": "user", "content": "t11 t12 t13"}]
    extra = dict(max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True})
    stream = dict(stream=True, stream_options={"include_usage": True})
    answers = {}
    done = client.completions.create(model="model", prompt=prompt, **extra)
    answers["completion"] = (done.usage.completion_tokens, done.choices[0].text)
    pieces = list(client.completions.create(model="model", prompt=prompt, **stream, **extra))
    answers["completion_stream"] = (streamed_tokens(pieces),
                                    "".join(p.choices[0].text for p in pieces if p.choices))
    chat = client.chat.completions.create(model="model", messages=messages, **extra)
    answers["chat"] = (chat.usage.completion_tokens, chat.choices[0].message.content)
    pieces = list(client.chat.completions.create(model="model", messages=messages, **stream, **extra))
    answers["chat_stream"] = (streamed_tokens(pieces),
                              "".join(p.choices[0].delta.content or "" for p in pieces if p.choices))
    for name, (tokens, text) in answers.items():
        if tokens != max_tokens or not text.strip():
            raise RuntimeError(f"{name}: expected {max_tokens} tokens and some text, got {tokens}: {text[:80]!r}")
    return {name: {"tokens": tokens, "text": text[:60]} for name, (tokens, text) in answers.items()}


def checked_client(port: int) -> tuple[dict | None, str | None]:
    """:func:`client_check`'s answers and None, or None and why it failed in one line (an error the server answered,
    e.g. ``openai.BadRequestError``, or too few tokens): the caller names the arm, records it and goes on."""
    try:
        return client_check(port), None
    except Exception as error:  # whatever the client raised: one line, never a traceback from the CLI
        lines = str(error).strip().splitlines() or [""]
        return None, f"{type(error).__name__}: {lines[0][:400]}"


def streamed_tokens(pieces: list) -> int:
    """The tokens a stream's usage reports (its last chunk that carries one; 0 where none does, or no chunk came)."""
    return next((p.usage.completion_tokens for p in reversed(pieces) if p.usage is not None), 0)


def default_max_model_len(folder: Path) -> int:
    """33,024 tokens (a 32k prompt and 256 output tokens), or the folder's ``max_position_embeddings`` where that is less."""
    positions = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    return DEFAULT_MAX_MODEL_LEN if positions is None else min(DEFAULT_MAX_MODEL_LEN, int(positions))


def input_range(workload: str, max_model_len: int) -> tuple[int, int]:
    """The workload's input lengths (tokens, inclusive) on a server of ``max_model_len``: its range, the top lowered so
    that the longest prompt and the longest output fit with :data:`PROMPT_MARGIN` to spare (vLLM refuses a request
    whose prompt tokens and max_tokens pass max_model_len; its other bound, on a prompt's characters, the synthetic
    tokenizer meets by construction: :func:`write_tokenizer`, :func:`prompt_fits`). A ValueError where the range's bottom
    does not fit."""
    lo, hi = WORKLOADS[workload]
    top = max_model_len - OUTPUT_TOKENS[1] - PROMPT_MARGIN
    if top < lo:
        raise ValueError(f"--max-model-len {max_model_len} cannot hold the {workload} workload's {lo}-token prompts and "
                         f"{OUTPUT_TOKENS[1]} output tokens (at least {lo + OUTPUT_TOKENS[1] + PROMPT_MARGIN})")
    return lo, min(hi, top)


def prompt_seed(workload: str, rate: str, *, warm_up: bool) -> int:
    """The random dataset's seed for one run: the same for every arm (the same prompts), different for every workload,
    rate and the warm-up, so that no run meets a prompt an earlier run on the same server left in vLLM's prefix cache
    (with one seed for all, the long prompts at 0.5 req/s were the unbounded run's again, answered from the cache)."""
    return zlib.crc32(f"{'warm-up/' if warm_up else ''}{workload}/{rate}".encode()) & 0x7FFFFFFF


def bench_command(*, port: int, folder: Path, workload: str, rate: str, prompts: int, out: Path | None,
                  max_model_len: int) -> list[str]:
    """``vllm bench serve`` on the random dataset: input lengths uniform in :func:`input_range`, outputs in
    :data:`OUTPUT_TOKENS`, prompts drawn with :func:`prompt_seed`; each request's error saved (``--save-detailed``;
    :func:`summary` keeps them) in ``out`` (None: nothing saved, a warm-up)."""
    (middle, ratio), (out_middle, out_ratio) = (((lo + hi) / 2, (hi - lo) / (hi + lo))
                                                for lo, hi in (input_range(workload, max_model_len), OUTPUT_TOKENS))
    ratios = json.dumps({"input": round(ratio, 6), "output": round(out_ratio, 6)})  # lengths uniform in middle·(1 ± ratio)
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", f"http://127.0.0.1:{port}", "--model", "model", "--tokenizer", str(tokenizer_folder(folder)),
            "--dataset-name", "random", "--random-input-len", str(round(middle)), "--random-range-ratio", ratios,
            "--random-output-len", str(round(out_middle)), "--num-prompts", str(prompts), "--request-rate", rate,
            "--ignore-eos", "--seed", str(prompt_seed(workload, rate, warm_up=out is None)), "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", "50,99",
            "--disable-tqdm",
            *([] if out is None else ["--save-result", "--save-detailed", "--result-dir", str(out.parent),
                                      "--result-filename", out.name])]


def summary(result: dict) -> dict:
    """The figures the issue asks for from one of vLLM's result files (ms, requests/s, tokens/s)."""
    keep = {f"{stat}_{metric}_ms" for metric in METRICS for stat in ("mean", "median", "p50", "p99")}
    keep |= {"request_throughput", "output_throughput", "total_token_throughput", "completed", "num_prompts",
             "total_input_tokens", "total_output_tokens", "duration", "request_rate", "max_concurrency"}
    figures = {key: value for key, value in result.items() if key in keep}
    figures["failed"] = result.get("num_prompts", 0) - result.get("completed", 0)
    errors = sorted({error[:300] for error in result.get("errors", []) if error})
    if errors:  # why requests failed: each distinct message once (the first 3)
        figures["errors"] = errors[:3]
    return figures


def trimmed(result: dict) -> dict:
    """A detailed result without its per-request token latencies and texts (kept: the per-request lengths and errors)."""
    return {key: value for key, value in result.items() if key not in DETAILS_DROPPED}


def arm_settings(arm: str, santa: dict) -> tuple[str, dict | None]:
    """An arm's ``--attention-backend`` and santa settings (``santa``, ``--santa``'s, with the arm's own over them; None
    for FLASH_ATTN)."""
    attention, adds = ARMS[arm]
    return attention, None if adds is None else {**santa, **adds}


def bench_key(backend: str, kv_cache_dtype: str, workload: str, rate: str) -> str:
    """A benchmark run's key in ``serve.jsonl`` (a sweep file of :mod:`santa.sweep_files`)."""
    return f"bench/{backend}/{kv_cache_dtype}/{workload}/{rate}"


def done_runs(records: Path) -> set[str]:
    """The keys of the benchmark runs ``records`` already holds (a killed writer's torn line is skipped)."""
    return {r["key"] for r in read_records(records) if r.get("kind") == "bench"} if records.exists() else set()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the results folder (made if absent; a re-run skips what it holds)")
    parser.add_argument("--table", action="store_true", help="print the comparison table of OUT's records and exit")
    parser.add_argument("--folder", type=Path, help="the model folder (made with --make when it has no config.json)")
    parser.add_argument("--make", choices=sorted(SHAPES), help="the shape of the model folder to make")
    parser.add_argument("--backends", nargs="+", default=["FLASH_ATTN", "CUSTOM"], choices=sorted(ARMS),
                        help="the servers to compare (CUSTOM-sampled: santa sampling every decode step, dense_below 0)")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["short", "long", "mixed"])
    parser.add_argument("--rates", nargs="+", default=["inf"],
                        help="requests per second (inf: all at once) for every workload, or WORKLOAD:RATE for one")
    parser.add_argument("--prompts", type=int, nargs="+", default=[64],
                        help="prompts per run: one number, or one per workload in --workloads' order")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="the server's max_model_len (default: 33,024, 32k prompts and their output, or the model's "
                             "max_position_embeddings where that is less: Qwen2.5-0.5B's 32,768)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--santa", default='{"budget": 128, "kernel": "prop"}',
                        help="santa's settings for CUSTOM (--additional-config's \"santa\" entry), JSON")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--startup-timeout", type=float, default=420.0, help="seconds a server may take to come up")
    parser.add_argument("--warmup-prompts", type=int, default=16,
                        help="prompts of the mixed spread each server serves, untimed, before its benchmarks (0: none)")
    args = parser.parse_args()
    if args.table:
        return args
    if args.folder is None:
        parser.error("--folder is required (or --table)")
    if args.warmup_prompts < 0:
        parser.error(f"--warmup-prompts takes a count ≥ 0, got {args.warmup_prompts}")
    if len(args.prompts) not in (1, len(args.workloads)) or min(args.prompts) < 1:
        parser.error(f"--prompts takes one count ≥ 1 or one per workload ({len(args.workloads)}), got {args.prompts}")
    for rate in args.rates:
        workload, _, value = rate.rpartition(":")
        try:
            if float(value) <= 0 or (workload and workload not in WORKLOADS):
                raise ValueError
        except ValueError:
            parser.error(f"--rates takes numbers > 0 or inf, or WORKLOAD:RATE with a workload of {sorted(WORKLOADS)}, "
                         f"got {rate!r}")
    try:
        args.santa_settings = json.loads(args.santa)
    except ValueError as error:
        parser.error(f"--santa must be a JSON object: {error}")
    return args


def table(out: Path) -> None:
    """Each (cache, workload, rate) and arm besides FLASH_ATTN: FLASH_ATTN's figures, the arm's, and arm / FLASH_ATTN,
    with the arm that ran first. A ratio is printed only where both arms come from one invocation of serve.py (the
    protocol's same-call ratio): a row whose arms come from different invocations says so in its ``runs`` cell, and a
    missing arm shows as –."""
    runs, order = {}, {}  # (cache, workload, rate, arm): the record; and the record's place in the file
    invocation = None  # the records of files written before bench records named their run: the last invocation above
    for place, record in enumerate(read_records(out / "serve.jsonl")):
        if record.get("kind") == "invocation":
            invocation = record["run"]["date"]
        elif record.get("kind") == "bench":
            key = (record["kv_cache_dtype"], record["workload"], record["rate"], record["backend"])
            runs[key], order[key] = {**record["figures"], "_run": record.get("run", invocation) or "–"}, place
    # mean, median and P99 of each latency (the median ITL is a decode-only step's time where most steps carry no prompt)
    columns = [f"{stat}_{metric}_ms" for metric in ("tpot", "ttft", "itl") for stat in ("mean", "median", "p99")]
    columns += ["output_throughput", "request_throughput", "failed", "total_output_tokens"]
    print("| cache | workload | rate | arm | runs | first | " + " | ".join(columns) + " |")
    print("|" + "---|" * (6 + len(columns)))
    arms = sorted({key[3] for key in runs} - {"FLASH_ATTN"})
    for cache, workload, rate in sorted({key[:3] for key in runs}):
        flash_key = (cache, workload, rate, "FLASH_ATTN")
        flash = runs.get(flash_key)
        for arm in arms:
            santa = runs.get((cache, workload, rate, arm))
            if santa is None:
                continue
            together = flash is not None and flash["_run"] == santa["_run"]
            if flash is None:
                runs_cell, first = f"{santa['_run']}, no FLASH_ATTN", "–"
            else:
                runs_cell = santa["_run"] if together else f"apart: {flash['_run']} / {santa['_run']}"
                first = "FLASH_ATTN" if order[flash_key] < order[(cache, workload, rate, arm)] else arm
            cells = []
            for column in columns:
                a, b = (None if r is None else r.get(column) for r in (flash, santa))
                ratio = (f" ({b / a:.3f}×)" if together and isinstance(a, (int, float)) and isinstance(b, (int, float)) and a
                         else "")
                cells.append(" / ".join("–" if x is None else str(round(x, 2)) for x in (a, b)) + ratio)
            print(f"| {cache} | {workload} | {rate} | {arm} | {runs_cell} | {first} | " + " | ".join(cells) + " |")


def main() -> None:
    args = parse_args()
    if args.table:
        table(args.out)
        return
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # its sampler JIT-compiles (no nvcc on the device)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # every server compiles its model afresh: at Qwen2.5-0.5B's shapes two servers that loaded vLLM's cached
    # torch.compile artifacts both served short prompts 1.5x slower (mean TPOT 18.1 / 16.8 ms against 11.4 / 10.9 for
    # the same two backends compiled afresh in the same device call; H100, 32nd session), while Llama's were not slowed;
    # so a comparison never mixes a cached server with a fresh one, whatever ran before it on the machine
    os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    if not (args.folder / "config.json").exists():
        if args.make is None:
            sys.exit(f"{args.folder} holds no config.json: give --make SHAPE to make it")
        make_folder(args.folder, args.make)
    if args.max_model_len is None:
        args.max_model_len = default_max_model_len(args.folder)
    args.out.mkdir(parents=True, exist_ok=True)
    records = args.out / "serve.jsonl"
    try:
        with sweep_lock(records, holder="serve.py"):
            serve_all(args, records)
    except (SweepFileError, RuntimeError, ValueError) as error:
        sys.exit(f"serve.py: {error}")


def rates_of(workload: str, rates: list[str]) -> list[str]:
    """The rates ``workload`` runs at: every plain rate, and each ``workload:RATE``'s."""
    return [rate.rpartition(":")[2] for rate in rates if rate.rpartition(":")[0] in ("", workload)]


def warm_up(args: argparse.Namespace) -> float:
    """``--warmup-prompts`` prompts of the mixed spread (every length the workloads draw: prefill chunks, mixed steps,
    decode steps of many batch sizes) at an unbounded rate, nothing saved, so that no timed run pays a server's first
    uses (the protocol's warm-up). Without one, Qwen2.5-0.5B's first timed workload (short prompts, 256) measured 1.114×
    FLASH_ATTN's mean TPOT and 1.19× its TTFT; with 16 warm-up prompts, 0.903× and 0.996× (H100, 2026-12-05, FLASH_ATTN's
    server first both times). Returns its seconds; a RuntimeError if the client fails."""
    command = bench_command(port=args.port, folder=args.folder, workload="mixed", rate="inf", prompts=args.warmup_prompts,
                            out=None, max_model_len=args.max_model_len)
    start = time.perf_counter()
    run_bench(command, "the warm-up")
    return time.perf_counter() - start


def run_bench(command: list[str], what: str) -> None:
    """Run one ``vllm bench serve``; where it fails, print the ends of its output and raise a RuntimeError naming ``what``."""
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        print(finished.stdout[-2000:], finished.stderr[-3000:], sep="\n", flush=True)
        raise RuntimeError(f"vllm bench serve failed on {what} (status {finished.returncode})")


def serve_all(args: argparse.Namespace, records: Path) -> None:
    """Each arm's server, client check and benchmarks; an arm whose client check fails is recorded and its benchmarks
    skipped, the other arms run, and then a RuntimeError names the failed arms (the CLI's one line and status 1)."""
    done = done_runs(records)
    failed = {}  # arm: why its client check failed
    prompts = dict(zip(args.workloads, args.prompts * len(args.workloads) if len(args.prompts) == 1 else args.prompts, strict=True))
    for workload in args.workloads:  # before any server starts: a workload the server cannot hold stops the run here
        lo, hi = input_range(workload, args.max_model_len)
        if hi < WORKLOADS[workload][1]:
            print(f"{workload}: prompts of {lo}–{hi} tokens (the top lowered to fit --max-model-len {args.max_model_len})", flush=True)
    run = run_record()
    append_record(records, {"key": f"run/{run['date']}", "kind": "invocation", "run": run})
    for backend in args.backends:
        todo = [(w, r) for w in args.workloads for r in rates_of(w, args.rates)
                if bench_key(backend, args.kv_cache_dtype, w, r) not in done]
        if not todo:
            print(f"{backend}: every run is in {records}", flush=True)
            continue
        attention, santa = arm_settings(backend, args.santa_settings)
        command = server_command(args.folder, port=args.port, backend=attention, max_model_len=args.max_model_len,
                                 kv_cache_dtype=args.kv_cache_dtype, santa=santa,
                                 gpu_memory_utilization=args.gpu_memory_utilization)
        log = args.out / f"server_{backend}_{args.kv_cache_dtype}.log"
        with Server(command, port=args.port, log=log, timeout_s=args.startup_timeout) as server:
            print(f"{backend}: up in {server.startup_s:.0f} s", flush=True)
            answers, why = checked_client(args.port)
            warmup_s = None if why is not None or not args.warmup_prompts else warm_up(args)
            append_record(records, {"key": f"server/{backend}/{args.kv_cache_dtype}/{run['date']}", "kind": "server", "backend": backend, "kv_cache_dtype": args.kv_cache_dtype, "command": command,
                             "startup_s": server.startup_s, "client_check": answers, "warmup_prompts": args.warmup_prompts,
                             "warmup_s": warmup_s, **({} if why is None else {"client_check_error": why})})
            if why is not None:
                print(f"{backend}: the client check failed, its benchmarks skipped: {why}", flush=True)
                failed[backend], todo = why, []
            for workload, rate in todo:
                name = f"{backend}_{args.kv_cache_dtype}_{workload}_{rate}.json"
                bench = bench_command(port=args.port, folder=args.folder, workload=workload, rate=rate,
                                      prompts=prompts[workload], out=args.out / name, max_model_len=args.max_model_len)
                start = time.perf_counter()
                run_bench(bench, f"{workload} at rate {rate}")
                result = json.loads((args.out / name).read_text())
                write_json_atomic(args.out / name, trimmed(result))  # whole or not at all
                figures = summary(result)
                append_record(records, {"key": bench_key(backend, args.kv_cache_dtype, workload, rate), "kind": "bench", "backend": backend, "kv_cache_dtype": args.kv_cache_dtype,
                                 "workload": workload, "rate": rate, "prompts": prompts[workload], "command": bench,
                                 "wall_s": time.perf_counter() - start, "figures": figures, "santa": santa,
                                 "max_model_len": args.max_model_len, "run": run["date"]})
                print(f"{backend} {workload} rate {rate}: " + json.dumps({k: round(v, 2) for k, v in figures.items()
                                                                          if isinstance(v, (int, float))}), flush=True)
                for error in figures.get("errors", []):
                    print(f"  a failed request: {error}", flush=True)
        print(f"{backend}: stopped (status {server.exit_status})", flush=True)
    if failed:
        raise RuntimeError(f"the client check failed on {', '.join(failed)} (their benchmarks did not run; the server "
                           f"logs are in {args.out}): " + "; ".join(f"{arm}: {why}" for arm, why in failed.items()))


if __name__ == "__main__":
    main()

"""benchmarks/vllm/serve.py without vLLM (issue 40): the synthetic tokenizer round-trips any id sequence through text
(vLLM's random dataset needs exact prompt lengths) and loads as itself for every shape, the benchmark command asks for
the workload's input range, every prompt it can draw passes vLLM 0.26's length checks, a failed client check is one
line, and the records become the comparison table. The server itself runs in tests/vllm_backend/test_vllm_serve.py
(GPU)."""

import json
import math
import random
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from benchmarks.vllm import serve

from santa.sweep_files import append_record


def test_the_synthetic_tokenizer_round_trips_ids_and_has_a_chat_template(tmp_path):
    from transformers import AutoTokenizer

    serve.write_tokenizer(tmp_path, 600)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 600 and tokenizer.all_special_ids == [1, 2, 0]
    rng = random.Random(0)
    ids = [rng.randrange(3, 600) for _ in range(500)]
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    assert tokenizer.decode([5, 9, 40]) == "t5 t9 t40" and tokenizer.encode("t5 t9 t40 t7") == [5, 9, 40, 7]
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "t5 t6"}], tokenize=False, add_generation_prompt=True)
    assert chat == "user: t5 t6\nassistant:"


@pytest.mark.parametrize("shape", sorted(serve.SHAPES))
def test_the_folders_tokenizer_loads_as_itself_whatever_the_models_type(tmp_path, shape):
    # a tokenizer beside a qwen2 config.json loads as transformers' Qwen2Tokenizer (a byte-level BPE of no merges): the
    # smoke prompt tokenized to nothing, and vLLM answered "The decoder prompt cannot be empty" (H200, 2026-12-05)
    from transformers import AutoTokenizer

    serve.make_folder(tmp_path, shape)
    assert serve.tokenizer_folder(tmp_path) == tmp_path / serve.TOKENIZER and not (tmp_path / "tokenizer.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(serve.tokenizer_folder(tmp_path))
    assert type(tokenizer).__name__ == "TokenizersBackend" and len(tokenizer) == serve.SHAPES[shape]["vocab_size"]
    assert tokenizer.encode("t5 t9 t40 t7") == [5, 9, 40, 7]
    command = serve.server_command(tmp_path, port=9, backend="FLASH_ATTN", max_model_len=4096, kv_cache_dtype="auto",
                                   santa=None, gpu_memory_utilization=0.5)
    bench = serve.bench_command(port=9, folder=tmp_path, workload="short", rate="inf", prompts=8, out=tmp_path / "r.json",
                                max_model_len=8192)
    for words in (command, bench):  # the server and the benchmark both load it
        assert words[words.index("--tokenizer") + 1] == str(tmp_path / serve.TOKENIZER)
    assert serve.tokenizer_folder(tmp_path / "real") == tmp_path / "real"  # a folder of a real model keeps its own


def sampled_bounds(command: list[str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (input, output) length bounds, inclusive, vLLM 0.26's random dataset draws for a ``vllm bench serve``
    command (vllm/benchmarks/datasets/utils.py, ``get_sampling_params``: floor and ceil of length × (1 ∓ ratio), the
    output's bottom at least 1; the synthetic tokenizer adds no special tokens)."""
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("--")}
    ratios = json.loads(flag["--random-range-ratio"])
    bounds = []
    for name in ("input", "output"):
        length, ratio = int(flag[f"--random-{name}-len"]), ratios[name]
        bounds.append((max(math.floor(length * (1 - ratio)), name == "output"), math.ceil(length * (1 + ratio))))
    return bounds[0], bounds[1]


@pytest.fixture(scope="module", params=["llama-3.1-8b", "qwen2.5-0.5b"])
def synthetic_tokenizer(request, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(request.param)
    serve.write_tokenizer(folder, serve.SHAPES[request.param]["vocab_size"])
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("workload", sorted(serve.WORKLOADS))
@pytest.mark.parametrize("max_model_len", [32768, 33024, 131072])
def test_every_prompt_the_benchmark_can_draw_passes_the_servers_length_checks(tmp_path, synthetic_tokenizer, workload,
                                                                              max_model_len):
    # the worst prompt: the longest input the dataset can draw, all of the longest words, with the longest output. Its
    # tokens fit beside the output, and so do its characters: vLLM refuses more than (max_model_len − max_tokens) × the
    # longest token's characters, and words joined by spaces outside their tokens were over that (2 of 24 mixed
    # requests refused at 33,024 with HTTP 400, H200 2026-12-05)
    command = serve.bench_command(port=9, folder=tmp_path, workload=workload, rate="inf", prompts=8, out=tmp_path / "r.json",
                                  max_model_len=max_model_len)
    (_, top), (_, out_top) = sampled_bounds(command)
    vocab_size = len(synthetic_tokenizer)
    ids = [vocab_size - 1 - k % 1000 for k in range(top)]  # every word as long as the longest
    text = synthetic_tokenizer.decode(ids)
    assert len(synthetic_tokenizer.encode(text)) == top
    assert serve.prompt_fits(synthetic_tokenizer, text, out_top, max_model_len)


def test_a_prompt_fits_where_its_tokens_and_its_characters_both_do():
    tokenizer = SimpleNamespace(get_vocab=lambda: {"t1": 1, "x": 2}, encode=lambda text, add_special_tokens: text.split())
    assert serve.max_chars_per_token(tokenizer) == 2
    assert serve.prompt_fits(tokenizer, "t1 t1 t1", 6, 10)  # 3 + 6 tokens ≤ 10, 8 characters ≤ (10 − 6) × 2
    assert not serve.prompt_fits(tokenizer, "t1 t1 t1", 7, 10)  # 3 + 7 tokens fit, but 8 characters > 3 × 2
    assert not serve.prompt_fits(tokenizer, "x x x x x", 6, 10)  # 5 characters fit, 5 + 6 tokens do not


@pytest.mark.parametrize("workload", sorted(serve.WORKLOADS))
@pytest.mark.parametrize("max_model_len", [33024, 131072])
def test_the_benchmark_asks_for_the_workloads_input_range_within_max_model_len(tmp_path, workload, max_model_len):
    command = serve.bench_command(port=9, folder=tmp_path, workload=workload, rate="inf", prompts=8, out=tmp_path / "r.json",
                                  max_model_len=max_model_len)
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("--")}
    ratios = json.loads(flag["--random-range-ratio"])
    lo, hi = serve.WORKLOADS[workload]
    want = (lo, min(hi, max_model_len - serve.OUTPUT_TOKENS[1] - serve.PROMPT_MARGIN))
    for name, lengths in (("input", want), ("output", serve.OUTPUT_TOKENS)):
        middle, ratio = float(flag[f"--random-{name}-len"]), ratios[name]
        assert (round(middle * (1 - ratio)), round(middle * (1 + ratio))) == lengths
    # the longest prompt vLLM's random dataset can draw (its bounds: floor and ceil) and the longest output fit
    (_, top), (_, out_top) = sampled_bounds(command)
    assert top + out_top <= max_model_len
    assert flag["--request-rate"] == "inf" and flag["--num-prompts"] == "8" and "--ignore-eos" in command
    assert flag["--result-dir"] == str(tmp_path) and flag["--result-filename"] == "r.json" and "--save-detailed" in command
    warmup = serve.bench_command(port=9, folder=tmp_path, workload=workload, rate="inf", prompts=8, out=None,
                                 max_model_len=max_model_len)
    save, seed = command.index("--save-result"), command.index("--seed") + 1
    # the warm-up: the same command with its own prompts (another seed), nothing saved
    assert warmup[:seed] + warmup[seed + 1:] == command[:seed] + command[seed + 1:save] and warmup[seed] != command[seed]
    assert command[save:] == ["--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "r.json"]


def test_every_run_draws_its_own_prompts_and_every_arm_the_same_ones(tmp_path):
    """One server runs the warm-up and then each workload and rate: a shared seed would repeat prompts that vLLM's
    prefix cache then answers (the long prompts at 0.5 req/s were the unbounded run's again)."""
    def seed(workload, rate, out):
        command = serve.bench_command(port=9, folder=tmp_path, workload=workload, rate=rate, prompts=8, out=out,
                                      max_model_len=32768)
        return command[command.index("--seed") + 1]

    runs = [("long", "inf", tmp_path / "r.json"), ("long", "0.5", tmp_path / "r.json"), ("mixed", "inf", tmp_path / "r.json"),
            ("short", "inf", tmp_path / "r.json"), ("mixed", "inf", None)]
    assert len({seed(*run) for run in runs}) == len(runs)
    assert seed("long", "0.5", tmp_path / "a.json") == seed("long", "0.5", tmp_path / "b.json")  # what any arm draws


@pytest.mark.parametrize("positions,want", [(131072, 33024), (32768, 32768), (None, 33024)])
def test_the_default_max_model_len_is_33024_or_the_models_positions(tmp_path, positions, want):
    (tmp_path / "config.json").write_text(json.dumps({} if positions is None else {"max_position_embeddings": positions}))
    assert serve.default_max_model_len(tmp_path) == want


def test_a_server_too_short_for_a_workload_is_refused_with_the_lengths_it_needs():
    with pytest.raises(ValueError, match=r"--max-model-len 16384 cannot hold the long workload's 16384-token prompts"):
        serve.input_range("long", 16384)
    assert serve.input_range("short", 16384) == serve.WORKLOADS["short"]


def test_failed_requests_keep_their_errors_and_the_saved_result_drops_per_request_latencies():
    result = {"num_prompts": 3, "completed": 1, "errors": ["", "HTTP 400: too long", "HTTP 400: too long"],
              "itls": [[1.0]], "generated_texts": ["x"], "input_lens": [5, 6, 7], "mean_tpot_ms": 2.0}
    figures = serve.summary(result)
    assert figures["failed"] == 2 and figures["errors"] == ["HTTP 400: too long"] and figures["mean_tpot_ms"] == 2.0
    assert serve.trimmed(result) == {"num_prompts": 3, "completed": 1, "errors": result["errors"], "input_lens": [5, 6, 7],
                                     "mean_tpot_ms": 2.0}


def test_the_server_command_carries_santas_settings_in_vllms_plugin_config(tmp_path):
    command = serve.server_command(tmp_path, port=9, backend="CUSTOM", max_model_len=4096, kv_cache_dtype="fp8",
                                   santa={"budget": 64}, gpu_memory_utilization=0.5)
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("--")}
    assert command[3:5] == ["serve", str(tmp_path)] and flag["--attention-backend"] == "CUSTOM"
    assert json.loads(flag["--additional-config"]) == {"santa": {"budget": 64}} and flag["--load-format"] == "dummy"
    assert "--additional-config" not in serve.server_command(tmp_path, port=9, backend="FLASH_ATTN", max_model_len=4096,
                                                             kv_cache_dtype="auto", santa=None, gpu_memory_utilization=0.5)


def test_the_sampled_arm_is_santa_with_dense_below_0_over_the_given_settings():
    assert serve.arm_settings("FLASH_ATTN", {"budget": 64}) == ("FLASH_ATTN", None)
    assert serve.arm_settings("CUSTOM", {"budget": 64}) == ("CUSTOM", {"budget": 64})
    assert serve.arm_settings("CUSTOM-sampled", {"budget": 64, "dense_below": 4096}) == ("CUSTOM", {"budget": 64, "dense_below": 0})
    assert serve.arm_settings("CUSTOM-dense", {"budget": 64}) == ("CUSTOM", {"budget": 64, "kernel": "dense"})


def test_records_become_the_table_with_santa_over_flash_attention(tmp_path, capsys):
    result = {"mean_tpot_ms": 20.0, "p99_tpot_ms": 30.0, "output_throughput": 1000.0, "num_prompts": 8, "completed": 8,
              "total_output_tokens": 1536, "ignored": 1}
    figures = serve.summary(result)
    assert figures["failed"] == 0 and "ignored" not in figures
    for backend, tpot in (("FLASH_ATTN", 20.0), ("CUSTOM", 15.0)):
        append_record(tmp_path / "serve.jsonl", {"key": serve.bench_key(backend, "auto", "long", "inf"), "kind": "bench",
                                                 "backend": backend, "kv_cache_dtype": "auto", "workload": "long", "rate": "inf",
                                                 "figures": {**figures, "mean_tpot_ms": tpot}})
    with open(tmp_path / "serve.jsonl", "a") as f:
        f.write('{"kind": "bench", "backend": "CUS')  # a writer killed mid-line: skipped, and the next record starts afresh
    assert serve.done_runs(tmp_path / "serve.jsonl") == {"bench/FLASH_ATTN/auto/long/inf", "bench/CUSTOM/auto/long/inf"}
    serve.table(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    row = [line for line in lines if "| long |" in line]
    assert len(row) == 1 and "| CUSTOM |" in row[0] and "20.0 / 15.0 (0.750×)" in row[0]
    assert lines[0].startswith("| cache | workload | rate | arm | runs | first | mean_tpot_ms | median_tpot_ms | p99_tpot_ms |")
    assert "| median_itl_ms | p99_itl_ms | output_throughput |" in lines[0]
    append_record(tmp_path / "serve.jsonl", {"key": serve.bench_key("CUSTOM-sampled", "auto", "long", "inf"), "kind": "bench",
                                             "backend": "CUSTOM-sampled", "kv_cache_dtype": "auto", "workload": "long",
                                             "rate": "inf", "figures": {**figures, "mean_tpot_ms": 25.0}})
    serve.table(tmp_path)
    rows = [line for line in capsys.readouterr().out.splitlines() if "| long |" in line]
    assert len(rows) == 2 and "| CUSTOM-sampled |" in rows[1] and "20.0 / 25.0 (1.250×)" in rows[1]


def test_the_table_gives_ratios_only_within_one_invocation_and_names_the_arm_that_ran_first(tmp_path, capsys):
    records = tmp_path / "serve.jsonl"

    def bench(backend, workload, tpot, **run):
        append_record(records, {"key": serve.bench_key(backend, "auto", workload, "inf"), "kind": "bench", "backend": backend,
                                "kv_cache_dtype": "auto", "workload": workload, "rate": "inf", "figures": {"mean_tpot_ms": tpot},
                                **run})

    # an older file: bench records without "run" belong to the invocation above them
    append_record(records, {"key": "run/A", "kind": "invocation", "run": {"date": "A"}})
    bench("CUSTOM", "long", 15.0)
    bench("FLASH_ATTN", "long", 20.0)
    bench("FLASH_ATTN", "short", 10.0)
    bench("CUSTOM", "short", 9.0, run="B")  # a later call's arm: no same-call ratio
    bench("CUSTOM", "mixed", 30.0, run="B")  # FLASH_ATTN never ran it
    serve.table(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| cache | workload | rate | arm | runs | first | mean_tpot_ms |")
    row = {line.split(" | ")[1]: line for line in lines[2:]}
    assert "| A | CUSTOM | 20.0 / 15.0 (0.750×) |" in row["long"]
    assert "| apart: A / B | FLASH_ATTN | 10.0 / 9.0 |" in row["short"] and "×" not in row["short"]
    assert "| B, no FLASH_ATTN | – | – / 30.0 |" in row["mixed"] and "None" not in row["mixed"]


def test_a_rate_can_belong_to_one_workload():
    assert serve.rates_of("long", ["inf", "long:0.5", "short:8"]) == ["inf", "0.5"]
    assert serve.rates_of("mixed", ["inf", "long:0.5", "short:8"]) == ["inf"]


@pytest.mark.parametrize(("flags", "message"), [(["--rates", "0"], "--rates takes numbers > 0"),
                                                (["--rates", "huge:2"], "--rates takes numbers > 0"),
                                                (["--prompts", "4", "5"], "--prompts takes one count"),
                                                (["--santa", "{"], "--santa must be a JSON object"), ([], "--folder is required"),
                                                (["--warmup-prompts", "-1"], "--warmup-prompts takes a count ≥ 0")])
def test_bad_flags_are_one_line_and_status_2(tmp_path, flags, message):
    folder = [] if message == "--folder is required" else ["--folder", str(tmp_path)]
    done = subprocess.run([sys.executable, serve.__file__, str(tmp_path / "out"), *folder, *flags], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_server_that_stops_early_is_reported_with_its_error_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\n(APIServer) pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                   "(APIServer)   Value error, User-specified max_model_len (33024) is greater than the derived one\n"
                   "(APIServer)     For further information visit https://errors.pydantic.dev/2.14/v/value_error\n")
    server = serve.Server([sys.executable, "-c", "raise SystemExit(1)"], port=9, log=log, timeout_s=30)
    sigterm = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match=r"exited with status 1 before it was up: .*Value error, User-specified max_model_len"):
        server.__enter__()
    assert server.exit_status == 1
    assert signal.getsignal(signal.SIGTERM) is sigterm  # the server's SIGTERM handler left with it


def test_a_port_already_answering_is_refused_before_a_server_starts(tmp_path):
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        server = serve.Server([sys.executable, "-c", "raise SystemExit(0)"], port=port, log=tmp_path / "log", timeout_s=5)
        with pytest.raises(RuntimeError, match=f"port {port} is already in use"):
            server.__enter__()
    assert not (tmp_path / "log").exists()  # nothing was started


STAND_IN_SERVER = """
import http.server, os, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
listener = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health)
open(sys.argv[2], "w").write(str(os.getpid()))
listener.serve_forever()
"""

RUN_UNTIL_KILLED = """
import sys, time
from pathlib import Path
from benchmarks.vllm import serve
port, folder = int(sys.argv[1]), Path(sys.argv[2])
command = [sys.executable, "-c", serve_stand_in, str(port), str(folder / "server.pid")]
with serve.Server(command, port=port, log=folder / "server.log", timeout_s=30):
    print("up", flush=True)
    time.sleep(60)
"""


def test_a_run_stopped_by_sigterm_stops_its_server(tmp_path):
    """``timeout`` kills serve.py (or needles.py --server) with SIGTERM; the server, in its own session, must not outlive
    it (it would hold the GPU and the port, and the next run would be refused), and SIGTERM's handler is restored."""
    import os
    import socket
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(serve.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    script = f"serve_stand_in = {STAND_IN_SERVER!r}\n" + RUN_UNTIL_KILLED
    run = subprocess.Popen([sys.executable, "-c", script, str(port), str(tmp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    server_pid = None
    try:
        assert run.stdout.readline() == "up\n", run.stderr.read()
        server_pid = int((tmp_path / "server.pid").read_text())
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=90)
        assert run.returncode == 1 and "stopped by signal 15 (SIGTERM)" in stderr
        with pytest.raises(ProcessLookupError):  # the stand-in server exited (SIGINT) and was reaped by the Server's stop
            os.kill(server_pid, 0)
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # the port is free for the next run
        server_pid = None
    finally:
        run.kill()
        if server_pid is not None:  # a failed check leaves no stand-in server behind
            os.kill(server_pid, signal.SIGKILL)


class FakeOpenAI:
    """The ``openai`` client's two calls as vLLM answers them for random weights: ``generated`` tokens, every other one
    a special token that decodes to nothing (so a stream has empty deltas), the usage on a stream's last chunk."""

    generated = 16

    def __init__(self, base_url, api_key):
        self.completions = SimpleNamespace(create=lambda **kw: self._answer(kw, chat=False))
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=lambda **kw: self._answer(kw, chat=True)))

    def _answer(self, kw, *, chat):
        texts = [" t7" if i % 2 == 0 else "" for i in range(self.generated)]
        usage = SimpleNamespace(completion_tokens=self.generated)
        if not kw.get("stream"):
            choice = SimpleNamespace(message=SimpleNamespace(content="".join(texts))) if chat else SimpleNamespace(text="".join(texts))
            return SimpleNamespace(usage=usage, choices=[choice])
        assert kw["stream_options"] == {"include_usage": True}
        choice = (lambda t: SimpleNamespace(delta=SimpleNamespace(content=t))) if chat else (lambda t: SimpleNamespace(text=t))
        return [SimpleNamespace(usage=None, choices=[choice(t)]) for t in texts] + [SimpleNamespace(usage=usage, choices=[])]


def test_the_client_check_counts_the_tokens_the_server_generated_not_the_pieces_of_text(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", SimpleNamespace(OpenAI=FakeOpenAI))
    answers = serve.client_check(8000, max_tokens=16)
    assert answers["chat_stream"] == {"tokens": 16, "text": " t7" * 8} and set(answers) == {
        "completion", "completion_stream", "chat", "chat_stream"}
    monkeypatch.setattr(FakeOpenAI, "generated", 12)  # a server that stopped short
    with pytest.raises(RuntimeError, match="completion: expected 16 tokens and some text, got 12"):
        serve.client_check(8000, max_tokens=16)
    assert serve.streamed_tokens([]) == 0  # no chunk: nothing reported (client_check then names the stream)
    assert serve.streamed_tokens([SimpleNamespace(usage=None)]) == 0


class BadRequestError(Exception):
    """What the ``openai`` client raises for a 400 (its message as the client writes it)."""


class RefusingOpenAI(FakeOpenAI):
    def _answer(self, kw, *, chat):
        raise BadRequestError("Error code: 400 - {'error': {'message': 'The decoder prompt cannot be empty'}}\nmore")


class FakeServer:
    """:class:`serve.Server` without a process: up at once, stopped with status 0."""

    def __init__(self, command, *, port, log, env=None, timeout_s=600):
        self.startup_s, self.exit_status = 1.0, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exit_status = 0


def test_a_failed_client_check_is_one_line_naming_the_arm_recorded_and_the_other_arms_still_run(tmp_path, monkeypatch,
                                                                                                capsys):
    monkeypatch.setitem(sys.modules, "openai", SimpleNamespace(OpenAI=RefusingOpenAI))
    assert serve.checked_client(8000) == (None, "BadRequestError: Error code: 400 - {'error': {'message': 'The decoder "
                                                "prompt cannot be empty'}}")
    clients = {"FLASH_ATTN": RefusingOpenAI, "CUSTOM": FakeOpenAI}  # FLASH_ATTN's server refuses, CUSTOM's answers
    backends = []

    def fake_server(command, **kw):
        backends.append(command[command.index("--attention-backend") + 1])
        monkeypatch.setitem(sys.modules, "openai", SimpleNamespace(OpenAI=clients[backends[-1]]))
        return FakeServer(command, **kw)

    run = subprocess.run

    warmups = []

    def fake_bench(command, **kw):  # vllm bench serve: a result file of 8 completed requests (git's calls run)
        if "bench" not in command:
            return run(command, **kw)
        if "--result-filename" not in command:  # the warm-up: nothing saved
            warmups.append(command[command.index("--num-prompts") + 1])
            return SimpleNamespace(returncode=0, stdout="", stderr="")
        out = tmp_path / "out" / command[command.index("--result-filename") + 1]
        out.write_text(json.dumps({"num_prompts": 8, "completed": 8, "mean_tpot_ms": 10.0}))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(serve, "Server", fake_server)
    monkeypatch.setattr(serve.subprocess, "run", fake_bench)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["serve.py", str(tmp_path / "out"), "--folder", str(folder), "--workloads", "short",
                                      "--backends", "FLASH_ATTN", "CUSTOM"])
    with pytest.raises(SystemExit) as stop:
        serve.main()
    assert str(stop.value).startswith("serve.py: the client check failed on FLASH_ATTN (their benchmarks did not run")
    assert "FLASH_ATTN: BadRequestError: Error code: 400" in str(stop.value) and "\n" not in str(stop.value)
    assert backends == ["FLASH_ATTN", "CUSTOM"]
    out = capsys.readouterr().out
    assert ("FLASH_ATTN: the client check failed, its benchmarks skipped: BadRequestError: Error code: 400 - {'error': "
            "{'message': 'The decoder prompt cannot be empty'}}\n") in out and "CUSTOM short rate inf" in out
    records = [json.loads(line) for line in (tmp_path / "out" / "serve.jsonl").read_text().splitlines()]
    servers = {r["backend"]: r for r in records if r["kind"] == "server"}
    assert servers["FLASH_ATTN"]["client_check"] is None and "decoder prompt" in servers["FLASH_ATTN"]["client_check_error"]
    assert "client_check_error" not in servers["CUSTOM"] and servers["CUSTOM"]["client_check"]["chat"]["tokens"] == 16
    assert [r["key"] for r in records if r["kind"] == "bench"] == ["bench/CUSTOM/auto/short/inf"]  # a re-run retries FLASH_ATTN
    assert warmups == ["16"] and servers["CUSTOM"]["warmup_s"] >= 0 and servers["FLASH_ATTN"]["warmup_s"] is None

"""``vllm serve`` with santa (issue 40), on a GPU with vLLM 0.26 installed: the server starts with santa's backend and
settings from ``--additional-config``, the OpenAI client's completions and chat (streamed and not) get answers, the
server shuts down cleanly, and a bad santa setting stops it with the setting named. A tiny random-weight model
(benchmarks/vllm/serve.py's folder: a config and a synthetic tokenizer; vLLM makes the weights)."""

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("openai")
if not torch.cuda.is_available():
    pytest.skip("vllm serve needs a GPU", allow_module_level=True)

from benchmarks.vllm import serve  # noqa: E402

pytestmark = pytest.mark.slow  # each server start costs a minute


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    serve.make_folder(path, "tiny")
    return path


def test_a_client_gets_answers_from_santas_server_which_then_stops_cleanly(folder, tmp_path):
    # dense_below 0: a 2048-token server is below the default's 8192 keys, where FlashAttention decodes every step
    command = serve.server_command(folder, port=8331, backend="CUSTOM", max_model_len=2048, kv_cache_dtype="auto",
                                   santa={"budget": 16, "kernel": "prop", "seed": 3, "dense_below": 0},
                                   gpu_memory_utilization=0.3)
    with serve.Server(command, port=8331, log=tmp_path / "server.log", timeout_s=420) as server:
        answers = serve.client_check(8331, max_tokens=24)  # raises unless each generates 24 tokens and answers text
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert set(answers) == {"completion", "completion_stream", "chat", "chat_stream"}
    assert ("santa: budget=16 (--additional-config), kernel=prop (--additional-config), seed=3 (--additional-config), "
            "error_target=None (default), dense_below=0 (--additional-config)") in log
    assert "santa: layer 0 decodes" in log  # decode steps ran santa's kernel
    assert server.exit_status == 0, log[-3000:]


def test_a_bad_santa_setting_stops_the_server_naming_it(folder, tmp_path):
    command = serve.server_command(folder, port=8332, backend="CUSTOM", max_model_len=2048, kv_cache_dtype="auto",
                                   santa={"budget": 16, "kernal": "prop"}, gpu_memory_utilization=0.3, extra=["--enforce-eager"])
    with pytest.raises(RuntimeError, match="exited with status"):
        with serve.Server(command, port=8332, log=tmp_path / "server.log", timeout_s=300):
            pass
    assert "--additional-config santa.kernal: unknown setting" in (tmp_path / "server.log").read_text(errors="replace")

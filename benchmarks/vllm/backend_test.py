"""vLLM 0.26.0's own attention-backend tests run against santa's ``CUSTOM`` backend, on the GPU (issue 44).

vLLM's file ``tests/v1/attention/test_attention_backends.py`` (with its ``tests/v1/attention/utils.py``) builds
each backend's metadata builder and implementation, fills a paged cache in shuffled blocks, writes the new
tokens with the backend's own cache update, calls ``forward`` as the model runner does and compares with
``flex_attention`` on contiguous K and V (``torch.testing.assert_close``, atol = rtol = 1e-2), over decode-only,
prefill and mixed batches of Llama-3-8B's heads at tensor-parallel sizes 1, 2 and 4 (32/8, 16/4, 8/2 heads),
with 16-key blocks and again with 128-key blocks. Those two files are not part of santa: ``bash
benchmarks/device/prepare.sh vllmtests`` takes them from vLLM 0.26.0's source distribution into the ignored
folder ``.vt/`` with their SHA-256, checked here (:data:`SHA256`) before anything runs; a device call carries
``.vt``. Nothing of vLLM's is copied into santa: this script runs the files where they are.

Passes (each one pytest process over the causal and non-causal correctness tests, santa's backend in place of
the file's list of backends: the sliding-window and encoder tests exercise what santa refuses by name):

- ``flash``: vLLM's ``FLASH_ATTN`` alone: the harness itself (offline config, cache, reference) is sound.
- ``dense``: santa's backend with ``SANTA_VLLM_KERNEL=dense`` (FlashAttention on every batch): santa's builder,
  implementation and cache writes under vLLM's tolerance.
- ``exact``: santa's prop with S = 4096, at least every sequence's keys in the file's batches, so every decode
  sequence is computed exactly by santa's kernels (the per-sequence rule of :mod:`santa.kernels.exact`); prefill
  and mixed batches run FlashAttention: vLLM's own tolerance applies unchanged.
- ``sampled``: santa's prop at S = ``--budget`` (128), where decode sequences longer than S are sampled and
  vLLM's 1e-2 cannot hold; the comparison's tolerance is derived from the sampling variance (below).
- ``split``: not vLLM's test: a mixed step of chunked prefill (three requests decoding one token beside two prompt
  chunks, Llama-3-8B's heads, vLLM's test utilities) through santa's backend at S = ``--budget``: its prefill rows
  must equal vLLM's FLASH_ATTN run on the prefill requests alone (bit for bit), its decode rows santa's decode of the
  decode requests alone (bit for bit); FLASH_ATTN on the whole mixed batch is recorded beside them (its prefill rows
  within vLLM's 1e-2: FlashAttention's split schedule may differ with the batch).
- ``graph``: not vLLM's test: one decode batch of Llama-3-8B's heads through santa's builder and ``forward`` with
  vLLM's test utilities, captured in a CUDA graph, the inputs changed in place (longer sequences, new queries),
  replayed; the replay must equal an eager call on the new inputs, for S covering every sequence and at S.
- ``gate``: not vLLM's test: short steps run FlashAttention (``dense_below``). One decode batch captured as vLLM's full
  graphs capture it (FlashAttention, then santa's gated launch), replayed twice after the builder has built the step
  again: with the step shorter than ``dense_below`` the replay must equal FLASH_ATTN's eager call bit for bit (santa's
  launch wrote nothing), with ``dense_below`` below the step it must equal santa's eager call (``dense_below`` 0) bit
  for bit (FlashAttention read zero lengths and santa overwrote its rows).

The passes that test santa's kernels (exact, sampled, split, graph) run with ``SANTA_VLLM_DENSE_BELOW=0``: the file's
sequences hold at most a few thousand keys, which the default gives to FlashAttention.

The sampled tolerance. For a decode token whose sequence has n > S live keys, prop returns
ô = (1/S) Σ_s V[J_s], J_1…J_S drawn by systematic sampling from p = softmax(q·Kᵀ·scale) (the scores are exact).
Each draw's V row has mean o = Σ_j p_j V_j and, per element d, variance σ_d² = Σ_j p_j V_jd² − o_d²; S independent
draws would give Var(ô_d) = σ_d²/S, and systematic draws (one uniform offset, a comb of S points on the CDF)
give no more on average when V does not follow the keys' order (the file's V are i.i.d. normal). So each element
has standard error se_d = σ_d/√S, computed here in float32 from the same context, new keys and queries the
backend was given, and the check is |ô − ref| ≤ z·se + atol + rtol·|ref| with vLLM's atol and rtol (the bf16
rounding of ô and of the reference) and z = Φ⁻¹(1 − α/(2N)) for the comparison's N sampled elements: by the
union bound and the normal approximation (S = 128 draws), a correct backend exceeds some element's bound with
probability at most α (``--alpha``, 1e-3) per comparison. Sequences with n ≤ S are exact (se = 0) and keep
vLLM's tolerance. Each comparison also records mean((ô − ref)²/se²) over its sampled elements (about 1 for
independent draws, less for systematic ones; a biased estimate shows as more) and how many elements vLLM's
1e-2 alone would have failed.

    bash benchmarks/device/prepare.sh vllmtests                         # on the host: .vt/ (two files, ~50 kB)
    bash benchmarks/vllm/gpu_vllm.sh stash … install                    # on the device, carrying .vt as well
    python3 benchmarks/vllm/backend_test.py --tests .vt --out $OUT/backend_test.json

Writes the JSON after each pass: per pass the passed / failed / skipped / error counts (pytest's JUnit XML), the
failures' ids and first lines, and each comparison's statistics. The same module is the pytest plugin of each
pass (``-p backend_test``; it registers santa, provides vLLM's ``default_vllm_config`` fixture and swaps the
backends); vLLM's tests read Llama-3-8B's config from a folder written here (no network on the device).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from santa.provenance import run_record

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FILES = ("tests/v1/attention/test_attention_backends.py", "tests/v1/attention/utils.py")
SHA256 = {  # vLLM 0.26.0's source distribution (vllm-0.26.0.tar.gz); prepare.sh checks the same values
    "tests/v1/attention/test_attention_backends.py": "7cd6f521702e3e68e9b5ea793da92613267d61f264cec2d525e8a169ab4f9817",
    "tests/v1/attention/utils.py": "82bb94667dd89992344efea89c54bb72a9031c9a33e3e665df9f512e0307635c",
}
MODEL = "meta-llama/Meta-Llama-3-8B"  # the name vLLM's tests pass; a folder of that relative path holds its config
LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                 intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, hidden_act="silu",
                 bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False, torch_dtype="bfloat16")
TESTS = "test_causal_backend_correctness or test_non_causal_backend_correctness"
EXACT_BUDGET = 4096  # ≥ the longest sequence of the file's correctness batches (large_prefill: 4096)
PASSES = ("flash", "dense", "exact", "sampled", "split", "graph", "gate")
SCRIPTED = ("graph", "split", "gate")  # passes this script runs itself (not vLLM's test file)

# ---- the runner ----------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_files(tests: Path) -> dict[str, str]:
    """The two files' SHA-256, checked against :data:`SHA256` (SystemExit naming the first that differs)."""
    found = {}
    for name in FILES:
        path = tests / name
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run `bash benchmarks/device/prepare.sh vllmtests` on the host and carry .vt")
        found[name] = sha256(path)
        if found[name] != SHA256[name]:
            raise SystemExit(f"{path}: SHA-256 {found[name]}, expected vLLM 0.26.0's {SHA256[name]}")
    return found


def make_workdir(tests: Path, work: Path) -> None:
    """The two files as the package ``tests.v1.attention`` (empty ``__init__`` files, as in vLLM's tree), an empty
    pytest configuration, and Llama-3-8B's config in the folder named as vLLM's tests name the model."""
    shutil.rmtree(work, ignore_errors=True)
    for package in ("tests", "tests/v1", "tests/v1/attention"):
        (work / package).mkdir(parents=True, exist_ok=True)
        (work / package / "__init__.py").write_text("")
    for name in FILES:
        shutil.copyfile(tests / name, work / name)
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / MODEL).mkdir(parents=True)
    (work / MODEL / "config.json").write_text(json.dumps(LLAMA3_8B, indent=1))


def pass_environment(name: str, budget: int, kernel: str, alpha: float, records: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANTA_VLLM_")}
    env.update(SANTA_BACKEND_TEST_PASS=name, SANTA_BACKEND_TEST_RECORDS=str(records), SANTA_BACKEND_TEST_ALPHA=str(alpha),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    if name == "dense":
        env["SANTA_VLLM_KERNEL"] = "dense"
    elif name in ("exact", "sampled", "split", "graph"):  # santa's kernels on every decode step
        env.update(SANTA_VLLM_KERNEL=kernel, SANTA_VLLM_BUDGET=str(EXACT_BUDGET if name == "exact" else budget),
                   SANTA_VLLM_DENSE_BELOW="0")
    elif name == "gate":  # ≤ the case's max_model_len (2048), so the builder gates; the case moves it per step
        env.update(SANTA_VLLM_KERNEL="prop", SANTA_VLLM_BUDGET=str(budget), SANTA_VLLM_DENSE_BELOW="2001")
    return env


def junit_counts(xml: Path) -> dict:
    """passed / failed / errors / skipped and the failures' ids with their messages' first lines."""
    counts = dict(passed=0, failed=0, errors=0, skipped=0, failures=[])
    if not xml.exists():
        return counts
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]
        counts[key] += 1
        if key != "skipped":
            counts["failures"].append(dict(test=test_id, kind=key, message=(outcome.get("message") or "")[:400]))
    return counts


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_pass(name: str, work: Path, args: argparse.Namespace) -> dict:
    records, xml = work / f"{name}.jsonl", work / f"{name}.xml"
    records.unlink(missing_ok=True)
    env = pass_environment(name, args.budget, args.kernel, args.alpha, records)
    start = time.perf_counter()
    if name in SCRIPTED:
        command = [sys.executable, str(Path(__file__).resolve()), f"--{name}-check", str(records)]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "backend_test", "-c", str(work / "pytest.ini"), "--rootdir", str(work),
                   "-p", "no:cacheprovider", "-q", "-rfE", "--tb=line", f"--junitxml={xml}", "-k", args.k,
                   "tests/v1/attention/test_attention_backends.py"]
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=args.pass_timeout)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stop:
        returncode, output = "timeout", (stop.stdout or b"").decode(errors="replace") if isinstance(stop.stdout, bytes) else (stop.stdout or "")
    (work / f"{name}.log").write_text(output)
    result = dict(returncode=returncode, seconds=round(time.perf_counter() - start, 1),
                  settings={k: v for k, v in env.items() if k.startswith("SANTA_VLLM_")})
    comparisons = read_records(records)
    if name in SCRIPTED:
        result.update(passed=sum(r["ok"] for r in comparisons), failed=sum(not r["ok"] for r in comparisons), checks=comparisons)
        if not comparisons:
            result.update(failed=1, failures=[dict(test=name, kind="error", message=output[-400:])])
    else:
        result.update(junit_counts(xml))
        result["comparisons"] = comparisons
    result["output_tail"] = output[-1500:]
    print(f"== {name}: {result.get('passed')} passed, {result.get('failed')} failed, {result.get('errors', 0)} errors, "
          f"{result.get('skipped', 0)} skipped in {result['seconds']} s (rc {returncode})", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=Path, default=REPO / ".vt", help="the folder prepare.sh's vllmtests stage made")
    parser.add_argument("--out", type=Path, help="the JSON written after each pass (required)")
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES)
    parser.add_argument("--budget", type=int, default=128, help="S of the sampled pass (and of the split and graph checks)")
    parser.add_argument("--kernel", default="prop", choices=("prop", "flash"), help="santa's kernel of the sampled passes")
    parser.add_argument("--alpha", type=float, default=1e-3, help="the chance a correct backend fails one sampled comparison")
    parser.add_argument("-k", default=TESTS, help="pytest's -k over vLLM's test file")
    parser.add_argument("--work", type=Path, default=Path("/tmp/santa_backend_test"), help="where the files are laid out")
    parser.add_argument("--pass-timeout", type=int, default=540, help="seconds per pass (a device command has 600)")
    parser.add_argument("--graph-check", type=Path, help=argparse.SUPPRESS)  # the graph pass's own process
    parser.add_argument("--split-check", type=Path, help=argparse.SUPPRESS)  # the split pass's own process
    parser.add_argument("--gate-check", type=Path, help=argparse.SUPPRESS)  # the gate pass's own process
    args = parser.parse_args(argv)
    if args.gate_check:
        gate_check(args.gate_check)
        return
    if args.graph_check:
        graph_check(args.graph_check)
        return
    if args.split_check:
        split_check(args.split_check)
        return
    if args.out is None:
        parser.error("the following arguments are required: --out")
    hashes = check_files(args.tests)
    make_workdir(args.tests, args.work)
    report = dict(run=run_record(), vllm_files=hashes, tests=args.k, budget=args.budget, kernel=args.kernel, alpha=args.alpha, passes={})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.passes:
        report["passes"][name] = run_pass(name, args.work, args)
        args.out.write_text(json.dumps(report, indent=1))
    summary = {name: {k: p.get(k) for k in ("passed", "failed", "errors", "skipped")} for name, p in report["passes"].items()}
    print(json.dumps(summary))


# ---- the pytest plugin of each pass (``-p backend_test``) --------------------------------------------------------

_current: dict = {}  # the running test's id and the last santa output with its standard errors


def z_value(alpha: float, n: int) -> float:
    """Φ⁻¹(1 − α/(2n)): two-sided, Bonferroni over n elements."""
    return statistics.NormalDist().inv_cdf(1 - alpha / (2 * max(n, 1)))


def standard_errors(query, key, value, kv_cache, common, budget: int, scale: float):
    """Per-element standard error of santa's estimate of each decode token's output (``[T, H, D]`` float32): σ/√S
    from the exact weights and V over the sequence's context in ``kv_cache`` (before the step's write) and its new
    key and value; 0 for a sequence with ≤ S keys (computed exactly) and for a batch that is not decode-only."""
    import torch

    se = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    if common.max_query_len != 1:
        return se
    head_size, kv_heads = query.shape[-1], key.shape[1]
    rows = kv_cache.transpose(1, 2)  # [num_blocks, block_size, H_kv, 2·D]
    block_size = rows.shape[1]
    seq_lens = common.seq_lens.tolist()
    table = common.block_table_tensor
    group = query.shape[1] // kv_heads
    for b, n in enumerate(seq_lens):
        if n <= budget:
            continue
        pages = table[b, : math.ceil(n / block_size)].long()
        context = rows[pages].flatten(0, 1)[: n - 1].float()
        k = torch.cat([context[..., :head_size], key[b: b + 1].float()]).repeat_interleave(group, dim=1)  # [n, H, D]
        v = torch.cat([context[..., head_size:], value[b: b + 1].float()]).repeat_interleave(group, dim=1)
        p = torch.einsum("hd,nhd->hn", query[b].float(), k).mul(scale).softmax(-1)
        mean = torch.einsum("hn,nhd->hd", p, v)
        second = torch.einsum("hn,nhd->hd", p, v * v)
        se[b] = ((second - mean * mean).clamp_min(0) / budget).sqrt()
    return se


def _record(entry: dict) -> None:
    path = os.environ.get("SANTA_BACKEND_TEST_RECORDS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def _pass_name() -> str:
    return os.environ.get("SANTA_BACKEND_TEST_PASS", "")


def pytest_configure(config) -> None:
    if not _pass_name():
        return
    from santa.vllm.plugin import register

    register()  # AttentionBackendEnum.CUSTOM → santa's backend (vLLM's engine would do this through the entry point)


try:
    import pytest
except ImportError:  # the runner's own process needs no pytest
    pytest = None

if pytest is not None:

    @pytest.fixture
    def default_vllm_config():
        """vLLM's tests/conftest.py fixture of that name: a default VllmConfig made current."""
        from vllm.config import VllmConfig, set_current_vllm_config

        config = VllmConfig()
        with set_current_vllm_config(config):
            yield config

    @pytest.fixture(autouse=True)
    def santa_in_place_of_the_backends(request, monkeypatch):
        """Each correctness run of this pass goes to the pass's backend alone (16- and 128-key blocks alike); santa's
        outputs in the sampled pass are checked against the derived tolerance; every comparison is recorded."""
        module = request.module
        name = _pass_name()
        if not name or not hasattr(module, "_test_backend_correctness"):
            yield
            return
        import torch
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        from santa.vllm.config import read_config

        backend = AttentionBackendEnum.FLASH_ATTN if name == "flash" else AttentionBackendEnum.CUSTOM
        config, alpha = read_config(), float(os.environ.get("SANTA_BACKEND_TEST_ALPHA", "1e-3"))
        _current.clear()
        _current["test"] = request.node.nodeid
        correctness, run_backend, assert_close = module._test_backend_correctness, module.run_attention_backend, torch.testing.assert_close

        def only_the_pass_backend(batch_spec, model, backend_to_test, mask_mod, **kwargs):
            _current["block_size"] = kwargs.get("block_size", 16)
            _current["batch"] = dict(seq_lens=list(batch_spec.seq_lens), query_lens=list(batch_spec.query_lens))
            return correctness(batch_spec, model, [backend], mask_mod, **kwargs)

        def recording_run(backend_name, kv_cache_spec, layer_names, vllm_config, device, common, query, key, value, kv_cache,
                          **kwargs):
            se = None
            if name == "sampled" and config.samples:
                head_size = vllm_config.model_config.get_head_size()
                se = standard_errors(query, key, value, kv_cache, common, config.budget, 1.0 / head_size**0.5)
            output = run_backend(backend_name, kv_cache_spec, layer_names, vllm_config, device, common, query, key, value,
                                 kv_cache, **kwargs)
            _current.update(output=output, se=se, decode_only=common.max_query_len == 1)
            return output

        def checked_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
            if actual is not _current.get("output"):
                return assert_close(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)
            se = _current.pop("se")
            diff = (actual.float() - expected.float()).abs()
            floor = atol + rtol * expected.float().abs()
            entry = dict(test=_current["test"], block_size=_current.get("block_size"), batch=_current.get("batch"),
                         decode_only=_current["decode_only"], elements=diff.numel(), max_abs_error=float(diff.max()),
                         over_vllm_tolerance=int((diff > floor).sum()))
            if se is None or not bool((se > 0).any()):
                entry.update(sampled_elements=0, check="vLLM's tolerance")
                try:
                    assert_close(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)
                except AssertionError:
                    _record({**entry, "ok": False})
                    raise
                _record({**entry, "ok": True})
                return None
            sampled = se > 0
            n = int(sampled.sum())
            z = z_value(alpha, n)
            bound = z * se + floor
            ratio = diff / bound
            standardized = diff[sampled] / se[sampled]
            entry.update(check="derived", sampled_elements=n, z=z, max_error_over_bound=float(ratio.max()),
                         mean_z2=float((standardized**2).mean()), mean_z=float(((actual.float() - expected.float())[sampled]
                                                                                 / se[sampled]).mean()),
                         max_abs_z=float(standardized.max()), failed_elements=int((diff > bound).sum()),
                         covered_max_abs_error=float(diff[~sampled].max()) if bool((~sampled).any()) else None)
            entry["ok"] = entry["failed_elements"] == 0
            _record(entry)
            if not entry["ok"]:
                raise AssertionError(f"santa S={config.budget}: {entry['failed_elements']} of {entry['elements']} elements past "
                                     f"z·se + atol + rtol·|ref| (z = {z:.2f}); worst error/bound {entry['max_error_over_bound']:.3f}")
            return None

        monkeypatch.setattr(module, "_test_backend_correctness", only_the_pass_backend)
        monkeypatch.setattr(module, "run_attention_backend", recording_run)
        monkeypatch.setattr(torch.testing, "assert_close", checked_close)
        yield


# ---- the graph pass: santa's decode captured in a CUDA graph and replayed on new inputs --------------------------


def graph_check(records: Path) -> None:
    """One decode batch through santa's builder and forward with vLLM's test utilities, for S covering every sequence
    (4096) and for ``SANTA_VLLM_BUDGET``: eager warm-up, then captured in a CUDA graph and replayed after the inputs
    change in place (longer sequences, new queries); the replay must equal an eager call on the new inputs (and,
    where S covers every sequence, exact attention within vLLM's 1e-2)."""
    budget = int(os.environ.get("SANTA_VLLM_BUDGET", "128"))
    for s in (EXACT_BUDGET, budget):
        os.environ["SANTA_VLLM_BUDGET"] = str(s)
        entry = graph_case(s)
        _record(entry)
        print(json.dumps(entry), flush=True)


def vllm_test_modules():
    """vLLM's ``test_attention_backends`` and its ``utils`` (from the pass's work folder, its current directory), with
    santa registered as the ``CUSTOM`` backend: what the graph and split checks build their steps with."""
    sys.path.insert(0, os.getcwd())
    from tests.v1.attention import test_attention_backends, utils

    from santa.vllm.plugin import register

    register()
    return test_attention_backends, utils


def benchmark_timing():
    """``benchmarks.bench.timing`` (its one capture helper), with the repository's root after everything on the path:
    this process imports vLLM's ``tests`` package from its work folder, which must come first."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    from benchmarks.bench import timing

    return timing


def decode_config():
    """(vllm_config, block, device) of the graph and gate checks: Llama-3-8B's heads, 16-key blocks, 2048 keys."""
    import torch

    _, utils = vllm_test_modules()
    block = 16
    config = utils.create_vllm_config(model_name=MODEL, max_model_len=2048, block_size=block, num_gpu_blocks=2048)
    return config, block, torch.device("cuda:0")


def decode_batch(vllm_config, lengths: list[int], *, block: int, device) -> dict:
    """One decode batch of ``lengths`` keys (every key written to vLLM's test cache, FlashAttention's NHD rows), santa's
    builder and implementation, vLLM's mock layer and a query, made with vLLM's test utilities (call it under
    ``set_current_vllm_config``), seeded."""
    import torch

    from santa.vllm.backend import SantaAttentionImpl, SantaMetadataBuilder

    vt, utils = vllm_test_modules()
    torch.manual_seed(0)
    model = vllm_config.model_config
    heads, kv_heads = model.get_num_attention_heads(vllm_config.parallel_config), model.get_num_kv_heads(vllm_config.parallel_config)
    head_size, dtype = model.get_head_size(), model.dtype
    common = utils.create_common_attn_metadata(utils.BatchSpec(seq_lens=lengths, query_lens=[1] * len(lengths)), block, device)
    contexts = [torch.randn(n, kv_heads, head_size, dtype=dtype, device=device) for n in lengths]
    kv_cache = vt.create_and_prepopulate_kv_cache(contexts, [torch.randn_like(c) for c in contexts], block, kv_heads,
                                                  head_size, dtype, device, 2048, common)
    kv_cache = kv_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # FlashAttention's NHD rows
    builder = SantaMetadataBuilder(utils.create_standard_kv_cache_spec(vllm_config), ["model.layers.0.self_attn.attn"],
                                   vllm_config, device)
    impl = SantaAttentionImpl(num_heads=heads, head_size=head_size, scale=head_size**-0.5, num_kv_heads=kv_heads,
                              alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto")
    layer = vt.MockAttentionLayer(device)
    layer.layer_name = "model.layers.0.self_attn.attn"
    query = torch.randn(len(lengths), heads, head_size, dtype=dtype, device=device)
    unused = torch.empty(len(lengths), kv_heads, head_size, dtype=dtype, device=device)  # K/V: already in the cache
    return dict(common=common, kv_cache=kv_cache, builder=builder, impl=impl, layer=layer, query=query, unused=unused,
                heads=heads, kv_heads=kv_heads, head_size=head_size, scale=head_size**-0.5)


def graph_case(budget: int) -> dict:
    import torch
    from vllm.config import set_current_vllm_config

    first, later = [300, 1024, 77, 2000, 129, 512, 1500, 64], [301, 1030, 90, 2047, 200, 513, 1600, 65]
    vllm_config, block, device = decode_config()
    with set_current_vllm_config(vllm_config):
        d = decode_batch(vllm_config, later, block=block, device=device)
        common, kv_cache, builder, impl, layer, query, unused = (d[k] for k in ("common", "kv_cache", "builder", "impl",
                                                                                "layer", "query", "unused"))
        heads, kv_heads, head_size, scale = d["heads"], d["kv_heads"], d["head_size"], d["scale"]
        common.seq_lens.copy_(torch.tensor(first, dtype=torch.int32, device=device))  # the captured step: shorter
        metadata = builder.build(0, common)
        out = torch.empty_like(query)
        # one eager call first (plans made, kernels compiled), then the capture
        graph = benchmark_timing().captured(lambda: impl.forward(layer, query, unused, unused, kv_cache, metadata, output=out),
                                            warmups=1)
        # the next step, in place: longer sequences, new queries, positions into santa's buffer (as build computes them)
        common.seq_lens.copy_(torch.tensor(later, dtype=torch.int32, device=device))
        builder.santa.positions(metadata.seq_lens)
        query.copy_(torch.randn_like(query))
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone().float()
        eager = impl.forward(layer, query, unused, unused, kv_cache, builder.build(0, common), output=torch.empty_like(query))
    entry = dict(check="graph", budget=budget, seq_lens_captured=first, seq_lens_replayed=later,
                 replay_vs_eager_max_abs=float((replayed - eager.float()).abs().max()))
    if budget >= max(later):
        rows = kv_cache.transpose(1, 2)
        exact = []
        for b, n in enumerate(later):
            keys = rows[common.block_table_tensor[b, : math.ceil(n / block)].long()].flatten(0, 1)[:n].float()
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in keys.split(head_size, dim=-1))
            p = torch.einsum("hd,nhd->hn", query[b].float(), k).mul(scale).softmax(-1)
            exact.append(torch.einsum("hn,nhd->hd", p, v))
        entry["replay_vs_exact_max_abs"] = float((replayed - torch.stack(exact)).abs().max())
    entry["ok"] = entry["replay_vs_eager_max_abs"] == 0 and entry.get("replay_vs_exact_max_abs", 0) <= 1e-2
    return entry


# ---- the gate pass: one captured decode graph, FlashAttention's answer on a short step, santa's on a long one -------


def gate_check(records: Path) -> None:
    """:func:`gate_case` at ``SANTA_VLLM_BUDGET``, recorded."""
    entry = gate_case(int(os.environ.get("SANTA_VLLM_BUDGET", "128")))
    _record(entry)
    print(json.dumps(entry), flush=True)


def gate_case(budget: int) -> dict:
    """A decode batch captured as vLLM's full graphs capture it (FlashAttention, then santa's gated launch: the builder's
    threshold above the step), then replayed after building the step again with the threshold above it (short: must
    equal FlashAttention's eager call, santa's launch writing nothing) and below it (long: must equal santa's eager
    call, FlashAttention reading zero lengths), bit for bit."""
    import torch
    from vllm.config import set_current_vllm_config

    lengths = [300, 1024, 77, 2000, 129, 512, 1500, 64]
    short, long = max(lengths) + 1, 1  # dense_below above and below every sequence
    vllm_config, block, device = decode_config()
    with set_current_vllm_config(vllm_config):
        d = decode_batch(vllm_config, lengths, block=block, device=device)
        common, kv_cache, builder, impl, layer, query, unused = (d[k] for k in ("common", "kv_cache", "builder", "impl",
                                                                                "layer", "query", "unused"))
        if builder.gate is None:
            raise RuntimeError("the builder made no gate: SANTA_VLLM_DENSE_BELOW must be set ≤ the config's max_model_len")

        def eager(threshold: int) -> torch.Tensor:
            builder.dense_below = threshold
            return impl.forward(layer, query, unused, unused, kv_cache, builder.build(0, common), output=torch.empty_like(query))

        builder.dense_below = short
        metadata = builder.build(0, common)  # kept alive: the graph reads its buffers
        out = torch.empty_like(query)
        # the warm-up samples (santa's plan made outside the capture, its kernels and FlashAttention's compiled), then
        # the capture of a short step: both kernels, gated
        graph = benchmark_timing().captured(lambda: impl.forward(layer, query, unused, unused, kv_cache, metadata, output=out),
                                            warmups=1, warm=lambda: (eager(long), eager(short)))
        replays = {}
        for name, threshold in (("short", short), ("long", long)):
            builder.dense_below = threshold
            builder.build(0, common)  # the runner builds every step: the gate and FlashAttention's lengths
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            replays[name] = out.clone()
        flash, santa = eager(short), eager(long)
    entry = dict(check="gate", budget=budget, seq_lens=lengths,
                 short_vs_flash_max_abs=float((replays["short"].float() - flash.float()).abs().max()),
                 long_vs_santa_max_abs=float((replays["long"].float() - santa.float()).abs().max()),
                 flash_vs_santa_max_abs=float((flash.float() - santa.float()).abs().max()))
    entry["ok"] = entry["short_vs_flash_max_abs"] == 0 and entry["long_vs_santa_max_abs"] == 0 and entry["flash_vs_santa_max_abs"] > 0
    return entry



# ---- the split pass: a mixed step's rows against FlashAttention's and santa's decode, each on its own requests ----


def split_check(records: Path) -> None:
    """:func:`split_case` at ``SANTA_VLLM_BUDGET``, recorded."""
    entry = split_case(int(os.environ.get("SANTA_VLLM_BUDGET", "128")))
    _record(entry)
    print(json.dumps(entry), flush=True)


def split_case(budget: int) -> dict:
    """One mixed step (decode requests first, as vLLM's runner orders them) through santa's ``CUSTOM`` backend, and the
    same requests split: FLASH_ATTN on the prefill requests alone, santa on the decode requests alone (each on its
    slice of the step's metadata, vLLM's ``split_attn_metadata``), and FLASH_ATTN on the whole step."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.ubatch_utils import UBatchSlice, split_attn_metadata

    vt, utils = vllm_test_modules()
    device, block = torch.device("cuda:0"), 16
    seq_lens, query_lens = [1500, 300, 2047, 700, 260], [1, 1, 1, 96, 260]  # three decodes, a prompt chunk, a whole prompt
    decodes, tokens = 3, sum(query_lens)
    torch.manual_seed(0)
    vllm_config = utils.create_vllm_config(model_name=MODEL, max_model_len=2048, block_size=block, num_gpu_blocks=1024)
    model = vllm_config.model_config
    heads, kv_heads = model.get_num_attention_heads(vllm_config.parallel_config), model.get_num_kv_heads(vllm_config.parallel_config)
    head_size, dtype = model.get_head_size(), model.dtype
    spec = utils.create_standard_kv_cache_spec(vllm_config)
    with set_current_vllm_config(vllm_config):
        common = utils.create_common_attn_metadata(utils.BatchSpec(seq_lens=seq_lens, query_lens=query_lens), block, device)
        full_k = [torch.randn(n, kv_heads, head_size, dtype=dtype, device=device) for n in seq_lens]
        full_v = [torch.randn_like(k) for k in full_k]
        contexts = [(k[: n - q], v[: n - q]) for k, v, n, q in zip(full_k, full_v, seq_lens, query_lens, strict=True)]
        cache = vt.create_and_prepopulate_kv_cache([k for k, _ in contexts], [v for _, v in contexts], block, kv_heads,
                                                   head_size, dtype, device, 1024, common)
        query = torch.randn(tokens, heads, head_size, dtype=dtype, device=device)
        key = torch.cat([k[n - q:] for k, n, q in zip(full_k, seq_lens, query_lens, strict=True)])
        value = torch.cat([v[n - q:] for v, n, q in zip(full_v, seq_lens, query_lens, strict=True)])

        def run(backend, metadata, rows: slice):
            return vt.run_attention_backend(backend, spec, ["model.layers.0.self_attn.attn"], vllm_config, device, metadata,
                                            query[rows], key[rows], value[rows], cache.clone())

        mixed = run(AttentionBackendEnum.CUSTOM, common, slice(0, tokens)).float()
        decode_part, prefill_part = split_attn_metadata(
            [UBatchSlice(request_slice=slice(0, decodes), token_slice=slice(0, decodes)),
             UBatchSlice(request_slice=slice(decodes, len(seq_lens)), token_slice=slice(decodes, tokens))], common)
        decode_alone = run(AttentionBackendEnum.CUSTOM, decode_part, slice(0, decodes)).float()
        prefill_alone = run(AttentionBackendEnum.FLASH_ATTN, prefill_part, slice(decodes, tokens)).float()
        flash_whole = run(AttentionBackendEnum.FLASH_ATTN, common, slice(0, tokens)).float()
    entry = dict(check="split", budget=budget, seq_lens=seq_lens, query_lens=query_lens,
                 decode_rows_vs_santa_alone_max_abs=float((mixed[:decodes] - decode_alone).abs().max()),
                 prefill_rows_vs_flash_alone_max_abs=float((mixed[decodes:] - prefill_alone).abs().max()),
                 prefill_rows_vs_flash_whole_max_abs=float((mixed[decodes:] - flash_whole[decodes:]).abs().max()),
                 decode_rows_vs_flash_whole_max_abs=float((mixed[:decodes] - flash_whole[:decodes]).abs().max()))
    entry["ok"] = (entry["decode_rows_vs_santa_alone_max_abs"] == 0 and entry["prefill_rows_vs_flash_alone_max_abs"] == 0
                   and entry["prefill_rows_vs_flash_whole_max_abs"] <= 1e-2)
    return entry


if __name__ == "__main__":
    main()

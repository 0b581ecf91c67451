"""Hops from each santa entry point to the decode kernel's launch, for the old and the new tree.

A *hop* is one santa function frame on the Python call stack at the moment the first Triton kernel of a
steady-state decode step is launched (``InterpretedFunction.run`` under ``TRITON_INTERPRET=1``): the chain
of frames, outermost first, whose code file lies inside the ``santa`` package of the tree under test
(transformers, torch, vLLM-stand-in and triton frames do not count). Alongside, *calls per layer*: every
santa function call (all of them, not only the chain; generators' resumptions not counted) made while one
steady-state decode step runs, divided by the layers that decode through the kernel; the kernel bodies that
the interpreter executes (santa's @triton.jit code, inside each launch) are not counted. A second figure leaves
out list/dict/set comprehensions, which are frames of their own on Python 3.11 only (PEP 709 inlines them).

The last hop, ``Launcher.jit``, and its ``tensors()`` call exist under the interpreter only: on CUDA, once a
launch key is compiled, ``Launcher.__call__`` calls the compiled handle itself (one hop and two calls fewer).

Each (entry, tree) runs in a fresh subprocess on the CPU with ``PYTHONPATH=<tree>/src`` and
``TRITON_INTERPRET=1``; a warm-up step runs first, so the measured step is not the first plan.

Entries:
  hf        santa.hf.configure + transformers ``generate`` (tiny random Llama, static cache), kernel="prop"
  hf-dyn    the same with transformers' default DynamicCache (its key length grows: a new plan every step)
  model     santa.model.generate(backend="santa-prop", cuda_graph=False) on CONFIGS["tiny"]
  cli       ``santa generate --path fast --device cpu --kernel prop`` (santa.cli.main, in process) on the bundled
            SmolLM2-135M (30 layers; 256-token needle prompt, S=16): the third sampled decode step is measured
  vllm      SantaAttentionImpl.forward over tests/vllm_backend/vllm_stand_ins.py (no vLLM installed); one layer's
            forward is measured (the metadata build, once per step for every layer, is not counted)

The old tree is ``.old41/src`` (283cdaf's, before issue 41): ``bash benchmarks/device/prepare.sh old41`` makes it.

Run:  .venv/bin/python benchmarks/house/decode_hops.py [--tree old|new|both] [--entry hf,hf-dyn,model,cli,vllm] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = {"old": REPO / ".old41" / "src", "new": REPO / "src"}  # old: commit 283cdaf's src/
ENTRIES = ("hf", "hf-dyn", "model", "cli", "vllm")
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>")  # their own frames on Python 3.11; inlined from 3.12 (PEP 709)
BUDGET = 4  # samples per head: below every measured step's keys, so the kernel samples


class Probe:
    """Arming installs a sys.setprofile hook that counts santa calls and records the santa chain at the first
    launch; disarming removes it (profiling a whole run is slow). ``launches`` counts every launch, armed or not."""

    def __init__(self, santa_dir: str, interp):
        self.santa_dir, self.launch_code = santa_dir, interp.InterpretedFunction.run.__code__
        self.calls, self.chain, self.launch, self.launches, self.step_launches, self.by_name = 0, None, None, 0, 0, {}
        run = interp.InterpretedFunction.run

        def counted(fn, *args, **kwargs):
            self.launches += 1
            self.step_launches += self.armed
            return run(fn, *args, **kwargs)

        interp.InterpretedFunction.run = counted

    @property
    def armed(self) -> bool:
        return sys.getprofile() is self

    @armed.setter
    def armed(self, on: bool) -> None:
        sys.setprofile(self if on else None)

    def name(self, frame) -> str:
        rel = Path(frame.f_code.co_filename).relative_to(self.santa_dir).with_suffix("")
        return ".".join(("santa", *rel.parts)).removesuffix(".__init__") + "." + frame.f_code.co_qualname

    def __call__(self, frame, event, arg):
        if event == "return" and frame is self.launch:
            self.launch = None  # the launch is over
        if event != "call" or self.launch is not None:  # the interpreted kernel's own frames: not counted
            return
        if frame.f_code.co_filename.startswith(self.santa_dir):
            if not frame.f_code.co_flags & 0x20 or frame.f_lasti < 0:  # a generator's resumption is not a call
                self.calls += 1
                name = self.name(frame)
                self.by_name[name] = self.by_name.get(name, 0) + 1
        elif frame.f_code is self.launch_code:
            self.launch = frame
            if self.chain is None:
                chain, f = [], frame.f_back
                while f is not None:
                    if f.f_code.co_filename.startswith(self.santa_dir):
                        chain.append(self.name(f))
                    f = f.f_back
                self.chain = chain[::-1]


def measure(entry: str) -> dict:
    """In this (child) process: run ``entry``'s workload and return its chain, calls and layers."""
    import torch
    import triton.runtime.interpreter as interp

    import santa

    probe = Probe(str(Path(santa.__file__).parent) + os.sep, interp)
    layers = {"hf": hf, "hf-dyn": hf, "model": model, "cli": cli, "vllm": vllm}[entry](probe, entry, torch)
    probe.armed = False
    if probe.chain is None:
        raise RuntimeError(f"{entry}: no kernel launch in the measured step")
    inlined = sum(n for name, n in probe.by_name.items() if name.endswith(COMPREHENSIONS))
    return {"chain": probe.chain, "calls": probe.calls, "inlined": inlined, "layers": layers, "launches": probe.step_launches,
            "by_name": dict(sorted(probe.by_name.items(), key=lambda kv: -kv[1]))}


def arm_on_forward(module, probe, index: int) -> None:
    """Arm the probe for ``module``'s forward call number ``index`` (0: the prefill)."""
    seen = [0]

    def pre(*_):
        if seen[0] == index:
            probe.armed = True
        seen[0] += 1

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(lambda *_: setattr(probe, "armed", False))


def hf(probe, entry, torch) -> int:
    import transformers

    import santa.hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    net = transformers.LlamaForCausalLM(config).eval()
    santa.hf.configure(net, santa.hf.SantaConfig(budget=BUDGET, kernel="prop"))
    arm_on_forward(net, probe, 3)  # forward 0: prefill; 1, 2: warm-up decode steps; 3: measured
    ids = torch.randint(3, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    extra = {"cache_implementation": "static"} if entry == "hf" else {}
    with torch.inference_mode():
        net.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5, **extra)
    return config.num_hidden_layers


def model(probe, entry, torch) -> int:
    from santa.model import CONFIGS, Transformer, generate

    net = Transformer.random(CONFIGS["tiny"], device="cpu", dtype=torch.float32, seed=0).eval()
    arm_on_forward(net, probe, 3)
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    generate(net, [prompt], 5, backend="santa-prop", budget=BUDGET, cuda_graph=False)
    return CONFIGS["tiny"].n_layer


def cli(probe, entry, torch) -> int:
    from santa.cli import main
    from santa.model import Transformer

    sampled = [0]  # santa.model forwards that launched a kernel

    def pre(module, _):
        if isinstance(module, Transformer):
            module.launches_before = probe.launches
            if sampled[0] == 2:
                probe.armed = True

    def post(module, *_):
        if isinstance(module, Transformer):
            probe.armed = False
            sampled[0] += probe.launches > module.launches_before

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post)
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            main(["generate", "--path", "fast", "--device", "cpu", "--kernel", "prop", "--length", "256",
                  "--max-new-tokens", "5", "--budget", "16", "--threads", "8"])
        finally:
            sys.stdout = stdout
    return 30  # SmolLM2-135M's layers


def vllm(probe, entry, torch) -> int:
    import types

    import santa.vllm.config

    os.environ.update(SANTA_VLLM_BUDGET=str(BUDGET), SANTA_VLLM_KERNEL="prop")
    if "SANTA_VLLM_DENSE_BELOW" in Path(santa.vllm.config.__file__).read_text():  # new tree: sample every step
        os.environ["SANTA_VLLM_DENSE_BELOW"] = "0"
    # the stand-ins import the tests' helpers only for DEVICE (helpers itself imports modules the old tree lacks)
    sys.modules["helpers"] = types.SimpleNamespace(DEVICE=torch.device("cpu"))
    sys.path.insert(0, str(REPO / "tests" / "vllm_backend"))
    import vllm_stand_ins as vs

    real = vs.stand_ins

    def stand_ins():  # the old backend also imports vLLM's extract_layer_index
        modules = real()
        for name in ("vllm.model_executor", "vllm.model_executor.models", "vllm.model_executor.models.utils"):
            modules[name] = types.ModuleType(name)
        modules["vllm.model_executor.models.utils"].extract_layer_index = lambda name: int(
            [p for p in name.split(".") if p.isdigit()][0])
        return modules

    vs.stand_ins = stand_ins
    backend = vs.load_backend()
    layer = vs.MockLayer("model.layers.0.self_attn.attn")
    impl = backend.SantaAttentionImpl(num_heads=vs.HEADS, head_size=vs.HEAD_DIM, scale=vs.HEAD_DIM ** -0.5,
                                      num_kv_heads=vs.KV_HEADS, alibi_slopes=None, sliding_window=None,
                                      kv_cache_dtype="auto", attn_type="decoder")
    builder = backend.SantaMetadataBuilder(vs.kv_cache_spec(), [layer.layer_name], vs.vllm_config(), torch.device("cpu"))
    for armed in (False, False, True):  # two warm-up steps, then the measured one
        batch = vs.make_batch([40, 33], [1, 1], seed=1)
        metadata = builder.build(0, batch.common)
        impl.do_kv_cache_update(layer, batch.key, batch.value, batch.kv_cache, metadata.slot_mapping)
        output = torch.empty(batch.query.shape)
        if armed:
            probe.armed = True
        impl.forward(layer, batch.query, batch.key, batch.value, batch.kv_cache, metadata, output=output)
        probe.armed = False
    assert vs.FlashAttentionImpl.calls == 0, "the decode step went to FlashAttention, not santa"
    return 1


def run_child(tree: str, entry: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(TREES[tree]), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, __file__, "--child", entry], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", choices=["old", "new", "both"], default="both")
    parser.add_argument("--entry", default=",".join(ENTRIES), help=f"comma-separated, of {', '.join(ENTRIES)}")
    parser.add_argument("--calls", action="store_true", help="also print the measured step's santa calls by function")
    parser.add_argument("--out", type=Path, help="also write every chain and count as JSON, with the run's command, commit "
                        "and environment (santa.provenance.run_record)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    trees = ["old", "new"] if args.tree == "both" else [args.tree]
    entries = args.entry.split(",")
    results = {(e, t): run_child(t, e) for e in entries for t in trees}
    for (entry, tree), r in results.items():
        print(f"\n## {entry} / {tree}")
        if "error" in r:
            print(f"not measured: {r['error']}")
            continue
        print(f"hops: {len(r['chain'])}; santa calls in the step: {r['calls']} ({r['calls'] - r['inlined']} without "
              f"comprehensions) over {r['layers']} layer(s); {r['launches']} launches")
        for i, name in enumerate(r["chain"], 1):
            print(f"  {i:2d}. {name}")
        if args.calls:
            print("  calls by function:")
            for name, n in r["by_name"].items():
                print(f"    {n:5d}  {name}")
    print("\ncalls/layer: all santa calls (without comprehensions)")
    print("\n| entry | " + " | ".join(f"hops ({t}) | calls/layer ({t}) | launches/layer ({t})" for t in trees) + " |")
    print("|---|" + "---|---|---|" * len(trees))
    for entry in entries:
        cells = []
        for tree in trees:
            r = results[(entry, tree)]
            if "error" in r:
                cells += ["n/a"] * 3
                continue
            layers = r["layers"]
            cells += [str(len(r["chain"])), f"{r['calls'] / layers:.1f} ({(r['calls'] - r['inlined']) / layers:.1f})",
                      f"{r['launches'] / layers:.1f}"]
        print(f"| {entry} | " + " | ".join(cells) + " |")
    if args.out is not None:
        sys.path.insert(0, str(TREES["new"]))
        from santa.provenance import run_record
        from santa.schedule_file import write_json_atomic

        # written whole or not at all: a killed or a concurrent run tears nothing
        rows = [{"entry": entry, "tree": tree, **r} for (entry, tree), r in results.items()]
        write_json_atomic(args.out, {"run": run_record(), "results": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

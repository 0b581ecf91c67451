"""Shared by the kernel experiments (``pass2_ablation.py``, ``cache_hint_ab.py``): edited copies of
santa's kernel sources as importable modules, the experiments' shape flags, and each case's inputs
and plan. Triton reads a kernel's source from its file, so a variant is written to a file first."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch


def load_module(name: str, source: str, folder: Path):
    """``source`` as module ``name`` (written to ``folder/name.py``, importable by that name)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def shape_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", help="JSON file for the timings")
    parser.add_argument("--cases", default="1x8192,1x32768,1x131072,8x32768,32x32768", help="BATCHxKEYS,…")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--budget", type=int, default=128)
    return parser


def case_inputs(args: argparse.Namespace, case: str) -> tuple:
    """``(tag, plan, launch arguments)`` of one ``BATCHxKEYS`` case: random bf16 q, K, V (NHD), the
    default plan, and ``(key, args, tensors)`` as :meth:`DecodePlan._arguments` gives them."""
    from santa.kernels import plan_decode

    batch, n_keys = (int(x) for x in case.split("x"))
    torch.manual_seed(0)
    q = torch.randn(batch, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    plan = plan_decode(batch=batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, n_keys=n_keys,
                       budget=args.budget, dtype=q.dtype, device="cuda")
    return f"b{batch}/n{n_keys}", plan, plan._arguments(q, k, v, None, None, 0, 0, out, None, None)

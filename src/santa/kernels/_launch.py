"""A Triton kernel launch with frozen meta-parameters and little host work per call.

``JITFunction.run`` binds ~30 arguments, computes their specialisation key and looks the compiled
kernel up on every call (~50 µs of host time per launch on the H200 host). :class:`Launcher` goes
through the JIT once per call ``key`` (which the caller builds from everything the specialisation
can depend on: pointer alignment, strides, sizes, integer widths) and afterwards calls the compiled
handle directly. Under ``TRITON_INTERPRET=1`` it simply calls the JIT.
"""

from __future__ import annotations

import os

import torch


class Launcher:
    """Launches ``fn`` on ``grid``. ``meta`` (constexprs, ``num_warps``, ``num_stages``, ``launch_pdl``)
    and ``fixed`` (arguments that are the same on every call of a plan) are frozen at construction;
    each call passes its ``key`` and the other arguments as a dict."""

    def __init__(self, fn, *, grid: tuple[int, ...], meta: dict, fixed: dict):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.meta, self.fixed = dict(meta), dict(fixed)
        names = list(fn.arg_names)
        self.varying = [name for name in names if name not in self.meta and name not in self.fixed]
        self.template = [self.meta.get(name, self.fixed.get(name)) for name in names]
        self.slots = [i for i, name in enumerate(names) if name in self.varying]
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.compiled: dict[tuple, object] = {}
        self.device = torch.cuda.current_device() if torch.cuda.is_available() and not self.interpret else None
        if not self.interpret:
            from triton import knobs
            from triton.runtime.driver import driver

            self.runtime = knobs.runtime
            self.current_stream = driver.active.get_current_stream

    def __call__(self, key: tuple, args: dict) -> None:
        kernel = None if self.interpret else self.compiled.get(key)
        if kernel is None:  # the interpreter, or the first call of this key: through the JIT (compiling if needed)
            kernel = self.fn[self.grid](**args, **self.fixed, **self.meta)
            if not self.interpret:
                self.compiled[key] = kernel
            return
        values = list(self.template)
        for i, name in zip(self.slots, self.varying, strict=True):
            values[i] = args[name]
        stream = self.current_stream(self.device)
        hook = self.runtime.launch_enter_hook
        g0, g1, g2 = self.grid
        kernel.run(
            g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
            None if hook is None else kernel.launch_metadata(self.grid, stream, *values),
            hook, self.runtime.launch_exit_hook, *values,
        )

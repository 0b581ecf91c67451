"""A Triton kernel launch with frozen meta-parameters and little host work per call.

``JITFunction.run`` binds ~30 arguments, computes their specialisation key and looks the compiled
kernel up on every call (~50 µs of host time per launch on the H200 host). :class:`Launcher` goes
through the JIT once per call ``key`` (which the caller builds from everything the specialisation
can depend on: pointer alignment, strides, sizes, integer widths) and afterwards calls the compiled
handle directly, with pointers passed as plain integers. Under ``TRITON_INTERPRET=1`` it simply
calls the JIT.
"""

from __future__ import annotations

import os
from operator import itemgetter

import torch


class Launcher:
    """Launches ``fn`` on ``grid``. ``meta`` (constexprs, ``num_warps``, ``num_stages``, ``launch_pdl``)
    and ``fixed`` (arguments that are the same on every call of a plan) are frozen at construction.

    Each call passes its ``key``, ``args`` (every other argument of ``fn`` by name, pointers as
    ints from ``data_ptr()``; a dict shared by the plan's launches may hold more) and ``tensors``
    (a function giving the pointer arguments as tensors by name, called only when the JIT runs).
    """

    def __init__(self, fn, *, grid: tuple[int, ...], meta: dict, fixed: dict):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.meta, self.fixed = dict(meta), dict(fixed)
        names = list(fn.arg_names)
        self.varying = [name for name in names if name not in self.meta and name not in self.fixed]
        frozen = [name for name in names if name not in self.varying]
        self.constants = tuple(self.meta.get(name, self.fixed.get(name)) for name in frozen)
        # values in the kernel's order = order(constants + pick(args)): two C-level gathers per call
        where = {name: i for i, name in enumerate(frozen + self.varying)}
        self.order = itemgetter(*(where[name] for name in names))
        self.pick = itemgetter(*self.varying) if len(self.varying) > 1 else (lambda args: (args[self.varying[0]],))
        self.interpret = os.environ.get("TRITON_INTERPRET") == "1"
        self.compiled: dict[tuple, object] = {}
        if not self.interpret:
            from triton import knobs

            self.runtime = knobs.runtime

    def jit(self, args: dict, tensors) -> object:
        """Through the JIT (compiling if needed): the compiled kernel."""
        pointers = tensors()
        call = {name: pointers.get(name, args.get(name)) for name in self.varying}
        return self.fn[self.grid](**call, **self.fixed, **self.meta)

    def __call__(self, key: tuple, args: dict, tensors, stream) -> None:
        kernel = None if self.interpret else self.compiled.get(key)
        if kernel is None:  # the interpreter, or the first call of this key
            kernel = self.jit(args, tensors)
            if not self.interpret:
                self.compiled[key] = kernel
            return
        values = self.order(self.constants + self.pick(args))
        hook = self.runtime.launch_enter_hook
        g0, g1, g2 = self.grid
        kernel.run(
            g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
            None if hook is None else kernel.launch_metadata(self.grid, stream, *values),
            hook, self.runtime.launch_exit_hook, *values,
        )


def current_stream(device_index: int | None) -> int:
    """The raw current CUDA stream of ``device_index`` (0 without CUDA: the launcher does not use it)."""
    return 0 if device_index is None else torch._C._cuda_getCurrentRawStream(device_index)

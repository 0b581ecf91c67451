"""A Triton kernel launch with frozen meta-parameters and little host work per call.

``JITFunction.run`` binds ~30 arguments, computes their specialisation key and looks the compiled
kernel up on every call (~15–30 µs of host time each). :class:`Launcher` does that once per
argument specialisation (16-byte alignment of pointers, ``== 1`` / ``% 16`` / width of ints, the
properties Triton specialises on) and afterwards calls the compiled handle directly. Under
``TRITON_INTERPRET=1`` it simply calls the JIT.
"""

from __future__ import annotations

import os

import torch


def _spec(value: object) -> object:
    """What Triton's specialisation can depend on for one argument value."""
    kind = type(value)
    if kind is int:
        return (value == 1, value & 15 == 0, -(2**31) <= value < 2**31, 0 <= value < 2**32)
    if kind is bool or kind is float or value is None:
        return value if kind is bool else kind
    return (value.dtype, value.data_ptr() & 15 == 0)  # a tensor


class Launcher:
    """Launches ``fn`` on ``grid``. ``meta`` (constexprs, ``num_warps``, ``num_stages``, ``launch_pdl``)
    and ``fixed`` (arguments that are the same on every call of a plan) are frozen at construction;
    each call passes the other arguments by keyword, and only those are inspected."""

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

    def __call__(self, **args) -> None:
        if self.interpret:
            self.fn[self.grid](**args, **self.fixed, **self.meta)
            return
        given = [args[name] for name in self.varying]
        key = tuple(map(_spec, given))
        kernel = self.compiled.get(key)
        if kernel is None:  # first call of this specialisation: compile (or find) it through the JIT
            self.compiled[key] = self.fn[self.grid](**args, **self.fixed, **self.meta)
            return
        from triton import knobs
        from triton.runtime.driver import driver

        values = list(self.template)
        for i, value in zip(self.slots, given, strict=True):
            values[i] = value
        stream = driver.active.get_current_stream(self.device)
        hook = knobs.runtime.launch_enter_hook
        g0, g1, g2 = self.grid
        kernel.run(
            g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
            None if hook is None else kernel.launch_metadata(self.grid, stream, *values),
            hook, knobs.runtime.launch_exit_hook, *values,
        )

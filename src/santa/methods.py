"""The one registry of attention methods: what each name means on every path.

A *method* is how one decode step attends: exact (``dense``), a reference sampler of
:func:`santa.sampled_attention` (``iid``, ``stratified``, ``systematic``, ``topk``), or one of
santa's decode kernels (``prop``, ``flash``). The CLI's choices, the sweep's methods, santa.model's
attention backends, santa.hf's kernel choice and the report's labels and colours all read
:data:`METHODS`; a new sampler or kernel is one :class:`Method` here plus its implementation.

Entries say:

- ``sampler``: the :func:`santa.sampled_attention` sampler that computes it (its spec), or None for
  a kernel whose spec is :mod:`santa.kernels.reference` (``kernel_reference``);
- ``kernel``: the :func:`santa.kernels.decode` kernel that runs it on the GPU, or None;
- ``stochastic``: whether it draws random samples (then a seed matters);
- ``paths``: where it runs: ``"hf"`` (transformers + :mod:`santa.hf`) and/or ``"fast"``
  (:mod:`santa.model`, the whole decode step in one CUDA graph);
- ``capturable``: whether santa.model can capture it in a CUDA graph (the reference samplers run
  eagerly: they materialise their draws);
- ``model_backend``: its name among santa.model's attention backends;
- ``label`` and ``colour``: how reports and plots show it.

Paths and the rule that picks one (``fast`` on CUDA with a dense prefill, else ``hf``) are the
engine's business; this module only says which paths *can* run a method.
"""

from __future__ import annotations

from dataclasses import dataclass

PATHS = ("hf", "fast")


@dataclass(frozen=True)
class Method:
    """One attention method (see the module docstring for the fields)."""

    name: str
    label: str
    colour: str | None
    stochastic: bool
    sampler: str | None
    kernel: str | None
    paths: tuple[str, ...]
    capturable: bool
    model_backend: str
    kernel_reference: str | None = None  # the santa.kernels.reference function that specifies a kernel-only method

    @property
    def exact(self) -> bool:
        """Exact attention (the baseline every other method is compared with)."""
        return self.name == "dense"

    @property
    def takes_error_target(self) -> bool:
        """Whether budgets from an error target apply (:mod:`santa.error_target`): a stochastic method with one draw
        over the whole sequence (the reference samplers, prop), which a pilot can size; flash's tiles have none."""
        return self.stochastic and self.kernel in (None, "prop")


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("dense", "dense", None, stochastic=False, sampler="dense", kernel=None, paths=PATHS, capturable=True, model_backend="sdpa"),
        Method("iid", "SANTA (iid)", "tab:orange", stochastic=True, sampler="iid", kernel=None, paths=PATHS, capturable=False,
               model_backend="iid"),
        Method("stratified", "S²ANTA-strat", "tab:green", stochastic=True, sampler="stratified", kernel=None, paths=PATHS,
               capturable=False, model_backend="stratified"),
        Method("systematic", "S²ANTA-sys", "tab:blue", stochastic=True, sampler="systematic", kernel=None, paths=PATHS,
               capturable=False, model_backend="systematic"),
        Method("topk", "top-k", "tab:red", stochastic=False, sampler="topk", kernel=None, paths=PATHS, capturable=False,
               model_backend="topk"),
        Method("prop", "S²ANTA-sys (prop kernel)", "tab:purple", stochastic=True, sampler=None, kernel="prop", paths=("fast",),
               capturable=True, model_backend="santa-prop", kernel_reference="prop_reference"),
        Method("flash", "per-tile systematic (flash kernel)", "tab:brown", stochastic=True, sampler=None, kernel="flash",
               paths=("fast",), capturable=True, model_backend="santa-flash", kernel_reference="flash_reference"),
    )
}

DEFAULT_KERNEL = "prop"  # the kernel that runs sampler "systematic" where a kernel is wanted and none is named


def method(name: object) -> Method:
    """The :class:`Method` called ``name``; ValueError naming the known ones otherwise."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]


def names(*, path: str | None = None, kernels: bool | None = None) -> tuple[str, ...]:
    """Method names in registry order, those that run on ``path`` (None: any), and only kernel
    methods (``kernels=True``) or only the others (``False``)."""
    return tuple(
        m.name for m in METHODS.values()
        if (path is None or path in m.paths) and (kernels is None or (m.kernel is not None) == kernels)
    )


def samplers() -> tuple[str, ...]:
    """The :func:`santa.sampled_attention` samplers of the registry (dense and top-k included)."""
    return tuple(m.sampler for m in METHODS.values() if m.sampler is not None)


def error_target_methods() -> tuple[str, ...]:
    """The methods that take an error target (:attr:`Method.takes_error_target`), in registry order."""
    return tuple(m.name for m in METHODS.values() if m.takes_error_target)


def kernels() -> tuple[str, ...]:
    """santa's decode kernels, in registry order."""
    return tuple(m.kernel for m in METHODS.values() if m.kernel is not None)


def by_model_backend(backend: str) -> Method | None:
    """The method that santa.model's attention backend ``backend`` runs, or None (a benchmark-only backend)."""
    return next((m for m in METHODS.values() if m.model_backend == backend), None)

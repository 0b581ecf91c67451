"""Seed → randomness, in one place: the seed range, the Philox keys and counters of the kernels, and
the torch generators of the reference paths.

Every entry point (the CLI flags, :class:`santa.hf.SantaConfig`, :func:`santa.model.make_context`
and :func:`santa.model.generate`, :func:`santa.decode` and ``DecodePlan.run``, ``santa eval``,
``santa tune``) accepts one seed range, :data:`MAX_SEED`: an int in ``[0, 2**63)``, checked by
:func:`check_seed` before any work. Every seed in that range is legal on every path.

What each path keys its randomness on (callers use the one function of their path, never the
arithmetic; re-keying a path is a change to that function alone):

- santa.hf, kernels and torch reference: request-keyed like santa.model (below), the query's
  position counted from the attention mask (:func:`santa.hf.query_positions`). Bernoulli qKᵀ
  scores alone still draw from a fresh ``torch.Generator`` per attention call, keyed on (seed,
  layer, n_keys, n_queries) — :func:`hf_reference_generator`.
- santa.model, ``santa-*`` backends (kernels and their torch reference): **request-keyed** — Philox
  with key = :func:`layer_key` (seed, layer), one per sequence, and counter = (the query's
  position in its own sequence, query head, stream), keyed on (seed, layer, head, position, sample)
  and on nothing else: not the batch row, the padding, the cache's allocated length or the steps
  taken, so a prompt draws the same uniforms alone or batched, and the same samples (on Hopper's one-launch
  prop up to a sample lying within float32 rounding of a CDF step: its float32 CDF follows the plan's slices, which
  follow the batch and the cache length; benchmarks/KERNEL_NOTES.md run 27 measured a plan-free order 10-13 %
  slower; ``make_context(..., batch_invariant=True)`` runs the Triton prop instead: the same samples, bit for bit).
  santa.hf's HND caches always take the Triton prop.
- santa.model, reference backends (``iid``, ``stratified``, ``systematic``): the same request-keyed
  uniforms as the kernels (:func:`santa.kernels.reference.call_uniforms`), sample m of a head on
  stream m (systematic: its one offset on stream 0), fed to :func:`santa.sampled_attention`.

All keys come from one golden-ratio mixer, :func:`mix`, whose values are those of the former
``santa.hf.stream_id`` (the hf paths draw exactly what they drew before).

Behaviour change (issue 23): santa.model used to key layer ``l`` on ``seed·1000003 + l``, which
limited its seeds to ``< (2**63 − n_layer) // 1000003`` (about 9.2e12; ``--seed 10**13 --path fast``
was refused only after the model had loaded and prefilled). It now keys on
``layer_key(seed, l) = mix(seed, l)``, a bijection of the seed for each layer onto ``[0, 2**63)``, so
every seed is legal; for a given seed, santa.model's sampled backends (``santa-prop``,
``santa-flash`` and the reference backends) now draw different samples than before. The hf paths
are unchanged.

Request-keyed draws (issue 26). :func:`santa.decode` and ``DecodePlan.run`` take ``positions`` (int
``[B]``) and a per-sequence key tensor ``seed`` (int64 ``[B]``); the counter of a draw is then
``(position, head, stream)`` under key ``seed[b]`` (:func:`santa.kernels.reference.call_uniforms`
reproduces it): stream 0 is prop's one offset U per (sequence, head), stream ``t + 1`` flash's for tile
t. Without ``positions`` the counter stays ``(offset, b·H + h, stream)``, the low-level API for callers
that key draws themselves. santa.model's kernel backends use the request-keyed form (behaviour change:
for a given seed they draw other samples than before, and a batched prompt now draws what it draws
alone), and so do its reference backends and santa.hf's samplers (behaviour change there too: the hf
paths used a generator or counter per call mixed from (seed, layer, n_keys, n_queries), which made a
batched or static-cache prompt draw other samples).

Tensor parallelism (issue 43). The counter's head is the model's global head: a call that holds a slice of
the heads (a tensor-parallel rank: H/TP query heads over H_kv/TP KV heads) passes ``head_offset`` (its
first global head, ``rank × H/TP``; :meth:`santa.kernels.DecodePlan.run`, :func:`santa.decode`), and the
counter is ``(position, head_offset + h, stream)``, so TP = 1, 2, 4 draw the same samples. With
``head_offset = 0`` (the default) nothing changes. It is taken with positions only: the batch-row
counter ``(offset, b·H + h, stream)`` counts the call's own heads.
"""

from __future__ import annotations

import torch

from santa.checks import integer

MAX_SEED = 2**63  # seeds are ints in [0, 2**63): a Philox key, and what torch.Generator.manual_seed takes
SEED_RANGE = "[0, 2**63)"
MAX_COUNTER = 2**63  # Philox counters (the kernels' offset) are ints in [0, 2**63) too
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: multiplying by it permutes [0, 2**63)


def check_seed(seed: object, name: str = "seed") -> int:
    """``seed`` as a Python int in ``[0, 2**63)`` (numpy ints accepted); a float, string, bool or None
    is a TypeError, an int outside the range a ValueError, both naming ``name``."""
    value = integer(name, seed)
    if not 0 <= value < MAX_SEED:
        raise ValueError(f"{name} must be an int in {SEED_RANGE}, got {value}")
    return value


def mix(seed: int, *parts: int) -> int:
    """A 63-bit number unique (up to hashing) to ``(seed, *parts)``: the golden-ratio mixer.

    For fixed ``parts`` it is a bijection of ``seed`` on ``[0, 2**63)`` (the multiplier is odd).
    Plain int arithmetic, no checks: callers pass a seed already checked by :func:`check_seed`.
    """
    mixed = seed
    for part in parts:
        mixed = (mixed * _GOLDEN + part + 1) % MAX_SEED
    return mixed


def generator(key: int, device: torch.device | str | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``key`` (an int in ``[0, 2**63)``)."""
    return torch.Generator(device=device).manual_seed(key)


# ---- santa.hf ------------------------------------------------------------------------------------


def hf_stream_id(seed: int, layer: int, n_keys: int, n_queries: int) -> int:
    """The hf reference path's generator seed for one attention call: fresh per layer and step."""
    return mix(seed, layer, n_keys, n_queries)


def hf_reference_generator(seed: int, layer: int, n_keys: int, n_queries: int, device: torch.device | str | None) -> torch.Generator:
    """The generator of one hf reference attention call (layer ``layer``, ``n_keys`` keys, ``n_queries`` rows)."""
    return generator(hf_stream_id(seed, layer, n_keys, n_queries), device)


# ---- every sampled path: the per-layer key -------------------------------------------------------


def layer_key(seed: int, layer: int) -> int:
    """The Philox key of one request's layer on every sampled path (santa.model's kernels and
    reference backends, santa.hf): ``mix(seed, layer)``, in ``[0, 2**63)`` for every legal seed."""
    return mix(seed, layer)

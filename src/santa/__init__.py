"""santa: stochastic sparse attention for memory-bound decoding.

The reference (the spec): :func:`sampled_attention`, :func:`sample_counts`, :func:`variance_trace`,
:func:`unique_keys` and the value-stage accounting; the score-stage companion
:func:`bernoulli_query` (Bernoulli qKᵀ). GPU decode kernels: :func:`decode`.
"""

from santa.attention import sampled_attention
from santa.bernoulli import BernoulliQuery, bernoulli_query
from santa.kernels import decode, make_workspace
from santa.sampling import sample_counts, sample_indices
from santa.stats import ValueStageCost, prefill_cost, unique_keys, value_stage_cost, variance_trace

__all__ = [
    "BernoulliQuery",
    "ValueStageCost",
    "bernoulli_query",
    "decode",
    "make_workspace",
    "prefill_cost",
    "sample_counts",
    "sample_indices",
    "sampled_attention",
    "unique_keys",
    "value_stage_cost",
    "variance_trace",
]
__version__ = "0.1.0"
# the name on the package index (`pip install santa-attention`); the import name stays `santa`
DISTRIBUTION = "santa-attention"


def install_hint(extra: str) -> str:
    """``pip install 'santa-attention[extra]'``: the command that adds an optional dependency group."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"

"""santa.methods, the one registry of attention methods: every list of method names reads it, and
each entry agrees with the implementation it names (issue 23, item 1)."""

import pytest

import santa.attention
import santa.cli
import santa.eval.report
import santa.eval.runner
import santa.hf
import santa.kernels
import santa.kernels.reference
import santa.model
from santa import methods


def test_every_sampler_of_the_registry_is_a_sampler_of_the_reference_and_back():
    assert set(methods.samplers()) == set(santa.attention.ATTENTION_SAMPLERS)


def test_every_kernel_of_the_registry_is_a_decode_kernel_and_back():
    assert set(methods.kernels()) == set(santa.kernels.KERNELS) - {"auto"}
    assert methods.DEFAULT_KERNEL in methods.kernels()


@pytest.mark.parametrize("name", list(methods.METHODS))
def test_each_entry_names_what_implements_it(name):
    m = methods.METHODS[name]
    assert m.name == name and m.label and set(m.paths) <= set(methods.PATHS) and m.paths
    assert (m.sampler is None) != (m.kernel is None) or m.exact  # a reference sampler or a kernel
    if m.kernel is not None:
        assert callable(getattr(santa.kernels.reference, m.kernel_reference))  # its spec
        assert m.capturable and m.stochastic
    else:
        assert m.sampler in santa.attention.ATTENTION_SAMPLERS
    assert m.model_backend in santa.model.BACKENDS + santa.model.REFERENCE_BACKENDS
    assert methods.by_model_backend(m.model_backend) is m
    assert (m.colour is None) == m.exact  # every method but the baseline has a colour in plots


def test_every_entry_point_lists_the_registry():
    assert santa.eval.runner.METHODS == methods.names()
    assert santa.eval.runner.HF_METHODS == methods.names(path="hf")
    assert santa.eval.runner.FAST_ONLY == tuple(n for n in methods.names() if "hf" not in methods.METHODS[n].paths)
    assert santa.eval.runner.FAST_BACKENDS == {m.name: m.model_backend for m in methods.METHODS.values()}
    assert santa.cli.SAMPLERS == methods.names(path="hf")
    assert set(santa.eval.report.COLORS) == set(methods.names()) - {"dense"}
    assert set(santa.hf.KERNEL_CHOICES) == {"auto", "reference", *methods.kernels()}
    assert set(santa.model.REFERENCE_BACKENDS) == {m.model_backend for m in methods.METHODS.values() if m.sampler and not m.exact}


def test_an_unknown_method_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="method must be one of dense, iid"):
        methods.method("santa")
    assert methods.method("prop").kernel == "prop"
    assert methods.by_model_backend("weights-only") is None

"""santa's vLLM configuration from vLLM's --additional-config and the environment (no vLLM needed)."""

import json

import pytest

from santa.vllm.config import (
    DENSE_BELOW,
    ServingConfig,
    batch_invariant_config,
    default_dense_below,
    describe,
    read_config,
)


def test_defaults_sample_with_prop_at_128():
    assert read_config({}) == ServingConfig(budget=128, kernel="prop", seed=0)


def test_an_error_target_comes_from_the_environment_or_vllms_additional_config():
    assert read_config({"SANTA_VLLM_ERROR_TARGET": "0.2"}).error_target == 0.2
    assert read_config({}, additional_config={"santa": {"error_target": 0.1, "budget": 256}}) == ServingConfig(
        budget=256, error_target=0.1)
    assert read_config({}).error_target is None


LLAMA, QWEN = {"head_dim": 128, "group": 4}, {"head_dim": 64, "group": 7}  # Llama-3.1-8B's and Qwen2.5-0.5B's head shapes


def test_short_steps_go_to_flash_attention_below_the_shapes_default_with_prop():
    """1,024 keys at Llama-3.1-8B's shape (measured inside vLLM: sampling wins from 1k-token prompts), 8,192 elsewhere."""
    assert read_config({}).short_steps(**LLAMA) == 1024 and read_config({}).short_steps(**QWEN) == 8192
    assert default_dense_below(head_dim=128, group=8) == DENSE_BELOW == 8192  # a shape never measured inside vLLM
    assert read_config({"SANTA_VLLM_DENSE_BELOW": "0"}).short_steps(**LLAMA) == 0
    assert read_config({}, additional_config={"santa": {"dense_below": 16384}}).short_steps(**LLAMA) == 16384
    assert read_config({"SANTA_VLLM_KERNEL": "flash"}).short_steps(**QWEN) == 0  # flash's launches have no gate
    assert read_config({"SANTA_VLLM_KERNEL": "dense"}).short_steps(**QWEN) == 0  # FlashAttention runs every step anyway
    with pytest.raises(ValueError, match="dense_below must be an int"):
        ServingConfig(dense_below=True)


def test_variables_override_the_file(tmp_path):
    path = tmp_path / "santa.json"
    path.write_text(json.dumps({"budget": 64, "kernel": "flash", "seed": 5}))
    config = read_config({"SANTA_VLLM_CONFIG": str(path), "SANTA_VLLM_BUDGET": "256", "PATH": "/bin"})
    assert config == ServingConfig(budget=256, kernel="flash", seed=5)
    assert read_config({"SANTA_VLLM_KERNEL": "dense"}).samples is False


@pytest.mark.parametrize(
    ("environ", "error", "message"),
    [
        ({"SANTA_VLLM_BUDGET": "12.5"}, ValueError, "SANTA_VLLM_BUDGET must be an integer, got '12.5'"),
        ({"SANTA_VLLM_BUDGET": "0"}, ValueError, "budget"),
        ({"SANTA_VLLM_SEED": "-1"}, ValueError, "seed"),
        ({"SANTA_VLLM_KERNEL": "fast"}, ValueError, "kernel must be one of prop, flash, dense, got 'fast'"),
        ({"SANTA_VLLM_BUGDET": "64"}, ValueError, "unknown santa variable SANTA_VLLM_BUGDET"),
        ({"SANTA_VLLM_CONFIG": "/nonexistent/santa.json"}, ValueError, "cannot read it"),
        ({"SANTA_VLLM_ERROR_TARGET": "small"}, ValueError, "SANTA_VLLM_ERROR_TARGET must be a number > 0"),
        ({"SANTA_VLLM_ERROR_TARGET": "0"}, ValueError, "error_target must be finite and > 0"),
        ({"SANTA_VLLM_ERROR_TARGET": "0.1", "SANTA_VLLM_KERNEL": "flash"}, ValueError, "error_target is implemented by kernel prop"),
        ({"SANTA_VLLM_DENSE_BELOW": "-1"}, ValueError, "dense_below must be an int ≥ 0"),
        ({"SANTA_VLLM_DENSE_BELOW": "8k"}, ValueError, "SANTA_VLLM_DENSE_BELOW must be an integer, got '8k'"),
        ({"SANTA_VLLM_DENSE_BELOW": "4096", "SANTA_VLLM_KERNEL": "flash"}, ValueError, "dense_below needs kernel prop"),
    ],
)
def test_bad_settings_are_refused_by_name(environ, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(".", r"\.")):
        read_config(environ)


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "not JSON"), ("[1, 2]", "expected a JSON object"), ('{"budgets": 64}', "unknown key 'budgets'"),
     ('{"budget": "64"}', "budget")],
)
def test_a_bad_config_file_is_refused_by_name(tmp_path, content, message):
    path = tmp_path / "santa.json"
    path.write_text(content)
    with pytest.raises((TypeError, ValueError), match=message):
        read_config({"SANTA_VLLM_CONFIG": str(path)})


def test_vllms_additional_config_sets_santa_under_the_environment_and_over_the_file(tmp_path):
    """``vllm serve … --additional-config '{"santa": {...}}'``: vLLM's own configuration for plugins. The environment
    overrides it, it overrides the file; the description says where each setting came from."""
    path = tmp_path / "santa.json"
    path.write_text(json.dumps({"budget": 64, "seed": 5}))
    environ = {"SANTA_VLLM_CONFIG": str(path), "SANTA_VLLM_SEED": "9"}
    additional = {"santa": {"budget": 32, "kernel": "flash", "seed": 7}, "other_plugin": {"x": 1}}
    config = read_config(environ, additional)
    assert config == ServingConfig(budget=32, kernel="flash", seed=9)
    assert describe(config, environ, additional, **QWEN) == ("budget=32 (--additional-config), kernel=flash (--additional-config), "
                                                     "seed=9 (SANTA_VLLM_SEED), error_target=None (default), "
                                                     "dense_below=0 (default)")  # flash: no gate, every step sampled
    assert describe(read_config({}, {}), {}, {}, **QWEN) == ("budget=128 (default), kernel=prop (default), seed=0 "
                                                             "(default), error_target=None (default), dense_below=8192 (default)")
    assert describe(read_config({}, {}), {}, {}, **LLAMA).endswith("dense_below=1024 (default)")  # the shape's default


@pytest.mark.parametrize(
    ("additional", "message"),
    [({"santa": {"budgets": 64}}, "--additional-config santa.budgets: unknown setting"),
     ({"santa": [64]}, "expected an object with keys budget, kernel, seed"),
     ({"santa": {"budget": 0}}, r"budget .*\(from --additional-config, the SANTA_VLLM_\* variables\)"),
     ({"santa": {"kernel": "fast"}}, "kernel must be one of prop, flash, dense, got 'fast'")],
)
def test_a_bad_additional_config_is_refused_by_name(additional, message):
    with pytest.raises(ValueError, match=message):
        read_config({}, additional)


def test_batch_invariant_mode_samples_every_step_and_refuses_a_dense_below():
    """Under VLLM_BATCH_INVARIANT=1 a short step's route would follow the batch's longest sequence: dense_below is 0,
    and one set by the user is refused by name; the other settings are kept."""
    config = batch_invariant_config(read_config({"SANTA_VLLM_BUDGET": "64", "SANTA_VLLM_SEED": "3"}))
    assert (config.short_steps(**LLAMA), config.budget, config.seed, config.kernel) == (0, 64, 3, "prop")
    assert batch_invariant_config(read_config({"SANTA_VLLM_DENSE_BELOW": "0"})).short_steps(**LLAMA) == 0
    assert batch_invariant_config(read_config({"SANTA_VLLM_KERNEL": "flash"})).short_steps(**LLAMA) == 0
    with pytest.raises(ValueError, match="dense_below must be 0 under VLLM_BATCH_INVARIANT=1.*got 4096"):
        batch_invariant_config(read_config({"SANTA_VLLM_DENSE_BELOW": "4096"}))

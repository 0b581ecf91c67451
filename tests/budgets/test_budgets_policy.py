"""Per-layer budgets without a model or Ray: the REINFORCE math, schedules and their file, comparisons."""

import json
import math

import numpy as np
import pytest
import torch

from santa.budgets.agreement import spearman
from santa.budgets.reinforce import (
    Episode,
    PolicyState,
    baseline_for,
    episode_seed,
    log_prob,
    reinforce_step,
    sample_schedule,
    score_function,
    softmax,
)
from santa.budgets.schedule import one_hot_schedule, rounded_schedule, uniform_schedule
from santa.budgets.sweep import compare
from santa.schedule_file import load_layer_budgets, write_schedule

THETA = np.log([1.0, 1.0, 2.0])  # softmax θ = (¼, ¼, ½)


def test_score_function_is_counts_minus_n_times_softmax_by_hand():
    # n = (1, 0, 3), N = 4: n − N·p = (1 − 1, 0 − 1, 3 − 2)
    assert score_function([1, 0, 3], THETA, 4) == pytest.approx([0.0, -1.0, 1.0])


def test_score_function_is_the_gradient_of_the_multinomial_log_probability():
    theta = torch.tensor([0.3, -1.2, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([2.0, 0.0, 1.0, 4.0], dtype=torch.float64)
    torch.distributions.Multinomial(7, logits=theta).log_prob(counts).backward()
    assert score_function(counts.numpy(), theta.detach().numpy(), 7) == pytest.approx(theta.grad.numpy())


def test_log_prob_matches_torch():
    expected = torch.distributions.Multinomial(4, probs=torch.tensor(softmax(THETA))).log_prob(torch.tensor([1.0, 0.0, 3.0]))
    assert log_prob([1, 0, 3], THETA, 4) == pytest.approx(float(expected))


def test_update_of_a_two_episode_batch_by_hand():
    # floor 1, N = 7 over 3 layers: N′ = 4 free samples. Free counts (1,0,3) and (0,2,2), rewards 1 and 0.
    state = PolicyState(theta=tuple(THETA), version=3, reward_sum=1.5, reward_count=3)  # running mean 0.5
    episodes = [Episode("a", (2, 1, 4), 1.0, 3), Episode("b", (1, 3, 3), 0.0, 3)]
    step = reinforce_step(state, episodes, theta_of=lambda v: THETA, total=7, floor=1, alpha=0.1)
    # g = ½[(1 − ½)(0, −1, 1) + (0 − ½)(−1, 1, 0)] = ½[(0, −½, ½) + (½, −½, 0)] = (¼, −½, ¼)
    assert step.baseline == 0.5
    assert step.gradient == pytest.approx((0.25, -0.5, 0.25))
    assert step.state.theta == pytest.approx(tuple(THETA + 0.1 * np.array([0.25, -0.5, 0.25])))
    assert (step.state.version, step.state.reward_sum, step.state.reward_count) == (4, 2.5, 5)


def test_update_scores_each_episode_under_the_policy_that_drew_it():
    # An episode of version 0 (θ = 0, p = ⅓ each) arriving after the policy moved on.
    state = PolicyState(theta=tuple(THETA), version=1, reward_sum=0.0, reward_count=1)
    step = reinforce_step(state, [Episode("a", (3, 0, 0), 1.0, 0)], theta_of={0: (0.0, 0.0, 0.0), 1: tuple(THETA)}.__getitem__, total=3, floor=0, alpha=1.0)
    assert step.gradient == pytest.approx((2.0, -1.0, -1.0))  # (3, 0, 0) − 3·(⅓, ⅓, ⅓), r − b = 1


def test_running_baseline_is_the_mean_of_earlier_rewards_and_the_batch_mean_at_first():
    assert baseline_for(PolicyState.initial(2), [0.2, 0.4]) == pytest.approx(0.3)
    assert baseline_for(PolicyState((0.0, 0.0), 1, reward_sum=3.0, reward_count=4), [1.0]) == 0.75
    assert baseline_for(PolicyState((0.0, 0.0), 1, reward_sum=3.0, reward_count=4), [1.0], "batch") == 1.0


def test_gradient_keeps_the_logits_summing_to_zero():
    rng = np.random.default_rng(0)
    episodes = [Episode(str(i), tuple(sample_schedule(np.zeros(5), total=20, floor=1, rng=rng)), float(i), 0) for i in range(4)]
    step = reinforce_step(PolicyState.initial(5), episodes, theta_of=lambda v: np.zeros(5), total=20, floor=1, alpha=0.5)
    assert sum(step.state.theta) == pytest.approx(0.0, abs=1e-12)


def test_sampled_schedules_sum_to_the_total_and_keep_the_floor():
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = sample_schedule([3.0, -3.0, 0.0, 0.0], total=12, floor=2, rng=rng)
        assert s.sum() == 12 and s.min() >= 2


def test_a_seed_gives_the_same_schedule():
    draw = [sample_schedule(np.zeros(6), total=24, floor=1, rng=np.random.default_rng(episode_seed(0, "1-2-3"))) for _ in range(2)]
    assert draw[0].tolist() == draw[1].tolist()
    assert episode_seed(0, "1-2-3") != episode_seed(0, "1-2-4")


def test_a_sample_mean_approaches_the_policy_mean():
    rng = np.random.default_rng(1)
    mean = np.mean([sample_schedule(THETA, total=43, floor=1, rng=rng) for _ in range(4000)], axis=0)
    assert mean == pytest.approx(1 + 40 * softmax(THETA), abs=0.1)


def test_rounded_schedule_sums_to_the_total():
    assert rounded_schedule([0.5, 0.25, 0.25], total=10, floor=1) == [4, 3, 3]  # 1 + (3.5, 1.75, 1.75): the two .75 round up
    assert sum(rounded_schedule(softmax(np.arange(7.0)), total=50, floor=1)) == 50


def test_uniform_and_one_hot_schedules():
    assert uniform_schedule(n_layers=30, total=120) == [4] * 30
    assert uniform_schedule(n_layers=3, total=8) == [3, 3, 2]
    assert one_hot_schedule(n_layers=3, layer=1, base=16) == [16, 1, 16]


def test_schedule_file_round_trip_and_santa_config(tmp_path):
    santa_hf = pytest.importorskip("santa.hf")
    path = write_schedule(tmp_path / "s.json", [3, 5, 1], total=9, model="m")
    assert load_layer_budgets(path) == {0: 3, 1: 5, 2: 1}
    assert json.loads(path.read_text())["total"] == 9
    config = santa_hf.SantaConfig(layer_budgets=load_layer_budgets(path))
    assert [config.budget_for(layer) for layer in range(3)] == [3, 5, 1]


def test_the_readme_path_of_the_schedule_loader_still_loads():
    """The README loads a schedule with santa.budgets.schedule.load_layer_budgets: the loader of santa.schedule_file."""
    import santa.budgets.schedule

    assert santa.budgets.schedule.load_layer_budgets is load_layer_budgets


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{not json", "not valid JSON"),
        ('{"budgets": {"0": 1}}', "'layer_budgets'"),
        ('{"layer_budgets": {}}', "empty"),
        ('{"layer_budgets": {"x": 1}}', "layer 'x'"),
        ('{"layer_budgets": {"0": 0}}', "integer ≥ 1"),
        ('{"layer_budgets": {"0": 2.5}}', "integer ≥ 1"),
        ('{"layer_budgets": {"0": true}}', "integer ≥ 1"),
        ('{"layer_budgets": {"1": 8, "01": 100}}', "layer '01' repeats layer 1"),
    ],
)
def test_loader_refuses_a_bad_file_naming_it(tmp_path, text, complaint):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint) as error:
        load_layer_budgets(path)
    assert str(path) in str(error.value)


def test_loader_refuses_a_missing_file_naming_it(tmp_path):
    with pytest.raises(ValueError, match="missing.json"):
        load_layer_budgets(tmp_path / "missing.json")


def test_paired_comparison_against_the_uniform_cell():
    records = [
        {"name": "uniform", "layer": None, "total": 8, "scores": {"0": 1.0, "1": 2.0, "2": 3.0}},
        {"name": "layer 0", "layer": 0, "total": 5, "scores": {"0": 2.0, "1": 3.0, "2": 4.0}},
    ]
    base, one_hot = compare(records)
    assert base.delta is None and base.mean == pytest.approx(2.0)
    assert (one_hot.delta, one_hot.delta_low, one_hot.delta_high) == pytest.approx((1.0, 1.0, 1.0))  # +1 on every prompt
    assert one_hot.differs


def test_spearman_of_monotone_and_reversed_ranks():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))

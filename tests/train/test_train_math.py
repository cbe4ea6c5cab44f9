"""Advantages, datums and micro-batching: the arithmetic the train loop relies on."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.types import Datum, Trajectory
from searchr1.rl.advantages import AdvantageSettings, batch_advantages, is_degenerate
from searchr1.rl.batching import BatchLimits, MicroBatchError, pack_micro_batches, padded_tokens
from searchr1.rl.datums import DatumTooLongError, trajectory_to_datum


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: tuple[float, ...]
    degenerate: bool


def group_advantages(
    rewards: list[float], *, scale_by_std: bool = False, eps: float = 1e-6
) -> GroupAdvantages:
    """grpo's advantages of one group, through the step's batch estimator."""
    settings = AdvantageSettings("group" if scale_by_std else "none", eps)
    (advantages,) = batch_advantages("grpo", [rewards], [[1] * len(rewards)], settings)
    return GroupAdvantages(advantages, is_degenerate(rewards))


def test_group_relative_advantages() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, -0.1])
    mean = (1.0 + 0.0 + 0.0 - 0.1) / 4
    assert adv.advantages == pytest.approx([1.0 - mean, -mean, -mean, -0.1 - mean])
    assert not adv.degenerate
    assert sum(adv.advantages) == pytest.approx(0.0)


def test_std_scaling_is_optional() -> None:
    plain = group_advantages([1.0, 0.0])
    scaled = group_advantages([1.0, 0.0], scale_by_std=True)
    assert plain.advantages == pytest.approx([0.5, -0.5])
    # unbiased std of (1, 0): sqrt((0.25 + 0.25) / 1) = 1 / sqrt(2)
    assert scaled.advantages == pytest.approx([0.5 * math.sqrt(2), -0.5 * math.sqrt(2)], rel=1e-5)


@pytest.mark.parametrize(
    "rewards",
    [
        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],  # G = 8, binary EM
        [0.9, 0.1, 0.0, -0.1, 0.3, 0.3, 1.0, 0.0],  # G = 8, a shaped reward
        [1.0, 0.0, 0.0],  # G = 3
    ],
)
def test_std_scaling_uses_the_unbiased_std_like_verl_and_trl(rewards: list[float]) -> None:
    """``(r_i - mean) / (sqrt(sum (r_j - mean)^2 / (G - 1)) + 1e-6)``, written out in float64,
    which is ``sqrt(G / (G - 1))`` smaller than with the population std (1.069 at G = 8)."""
    g = len(rewards)
    mean = sum(rewards) / g
    unbiased = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (g - 1))
    population = math.sqrt(sum((r - mean) ** 2 for r in rewards) / g)
    want = [(r - mean) / (unbiased + 1e-6) for r in rewards]
    got = group_advantages(rewards, scale_by_std=True).advantages
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    too_big = [(r - mean) / (population + 1e-6) for r in rewards]
    ratio = max(abs(b) for b in too_big) / max(abs(a) for a in got)
    assert ratio == pytest.approx(math.sqrt(g / (g - 1)), rel=1e-5)
    if g == 8:
        assert round(ratio, 3) == 1.069


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [-0.1, -0.1], [0.0] * 8])
def test_equal_rewards_make_a_degenerate_group(rewards: list[float]) -> None:
    adv = group_advantages(rewards)
    assert adv.degenerate and set(adv.advantages) == {0.0}


@pytest.mark.parametrize("scale_by_std", [False, True])
def test_group_of_one_is_rejected(scale_by_std: bool) -> None:
    """One trajectory has no baseline and no spread (the unbiased std divides by G - 1 = 0):
    an error, never a zero or NaN advantage."""
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0], scale_by_std=scale_by_std)


def _scripted_trajectory() -> Trajectory:
    # prompt (3) | sampled (2) | observation (2) | sampled (2)
    tokens = (10, 11, 12, 20, 21, 30, 31, 40, 41)
    mask = (False, False, False, True, True, False, False, True, True)
    lps = (0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0)
    return Trajectory(
        trajectory_id="q1/0",
        question="q",
        golden_answers=("a",),
        tokens=tokens,
        generated_mask=mask,
        logprobs=lps,
        prompt_len=3,
        turns=(),
        end_reason="answered",
        final_answer="a",
        final_text="",
        search_calls=1,
        search_errors=0,
    )


def test_datum_masks_prompt_and_observation_positions() -> None:
    d = trajectory_to_datum(_scripted_trajectory(), 0.75, max_datum_tokens=64)
    assert d.input_tokens == (10, 11, 12, 20, 21, 30, 31, 40)
    assert d.target_tokens == (11, 12, 20, 21, 30, 31, 40, 41)
    assert d.sampler_logprobs == (0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0)
    assert d.advantages == (0.0, 0.0, 0.75, 0.75, 0.0, 0.0, 0.75, 0.75)
    assert d.trajectory_id == "q1/0"


def test_overlong_datum_names_the_trajectory() -> None:
    with pytest.raises(
        DatumTooLongError, match=r"trajectory q1/0 needs a datum of 8 tokens.*max_datum_tokens = 7"
    ):
        trajectory_to_datum(_scripted_trajectory(), 1.0, max_datum_tokens=7)


def _datum(n: int, i: int) -> Datum:
    return Datum((1,) * n, (1,) * n, (0.0,) * n, (1.0,) * n, trajectory_id=f"t{i}")


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=0, max_size=60),
    max_datums=st.integers(1, 40),
    max_tokens=st.integers(300, 5000),
)
def test_micro_batches_respect_all_three_limits(
    lengths: list[int], max_datums: int, max_tokens: int
) -> None:
    datums = [_datum(n, i) for i, n in enumerate(lengths)]
    limits = BatchLimits(
        max_datum_tokens=300, max_micro_batch_datums=max_datums, max_micro_batch_tokens=max_tokens
    )
    batches = pack_micro_batches(datums, limits)
    assert sorted(d.trajectory_id for b in batches for d in b) == sorted(
        d.trajectory_id for d in datums
    )
    for b in batches:
        assert 1 <= len(b) <= max_datums
        assert padded_tokens(b) <= max_tokens
        assert all(len(d) <= 300 for d in b)


def test_datum_that_never_fits_is_an_error() -> None:
    limits = BatchLimits(
        max_datum_tokens=100, max_micro_batch_datums=4, max_micro_batch_tokens=1000
    )
    with pytest.raises(MicroBatchError, match="trajectory t0: datum of 101 tokens"):
        pack_micro_batches([_datum(101, 0)], limits)

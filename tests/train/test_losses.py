"""The built-in policy losses against values computed by hand on a few tokens.

Formulas (docs/protocols.md §5): r = exp(lp - lp_sampler);
importance_sampling = -sum(r * A); ppo = -sum(min(r * A, clip(r, 1-eps_lo, 1+eps_hi) * A));
cispo = -sum(sg(clip(r, ...)) * lp * A).
"""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.types import LossInputs
from searchr1.plugins import losses

# Three trained tokens and one prompt position (advantage 0, sampler log-prob 0).
# ratios: exp(0) = 1, exp(ln 1.5) = 1.5, exp(ln 0.5) = 0.5
SAMPLER = [math.log(0.5), math.log(0.2), math.log(0.4), 0.0]
NEW = [math.log(0.5), math.log(0.3), math.log(0.2), -3.0]
ADV = [2.0, 1.0, -1.0, 0.0]


def _inputs() -> tuple[torch.Tensor, LossInputs]:
    lp = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    return lp, LossInputs(
        sampler_logprobs_T=torch.tensor(SAMPLER, dtype=torch.float64),
        advantages_T=torch.tensor(ADV, dtype=torch.float64),
    )


def test_importance_sampling_value_gradient_and_metrics() -> None:
    lp, inputs = _inputs()
    out = losses.importance_sampling(lp, inputs)
    # -(1*2 + 1.5*1 + 0.5*(-1)) = -3.0
    assert out.loss.item() == pytest.approx(-3.0)
    out.loss.backward()
    # d/dlp of -r*A is -r*A: [-2, -1.5, 0.5, 0]; the prompt position gets no gradient
    assert lp.grad.tolist() == pytest.approx([-2.0, -1.5, 0.5, 0.0])
    assert out.metrics["tokens"] == 3
    assert out.metrics["ratio_sum"] == pytest.approx(3.0)
    assert out.metrics["ratio_max"] == pytest.approx(1.5)


def test_ppo_clips_ratio_in_the_direction_of_the_advantage() -> None:
    lp, inputs = _inputs()
    out = losses.ppo(lp, inputs, clip_low=0.2, clip_high=0.2)
    # token 0: r=1, A=2 -> 2; token 1: r=1.5, A=1 -> min(1.5, 1.2) = 1.2 (clipped);
    # token 2: r=0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clipped); loss = -(2 + 1.2 - 0.8) = -2.4
    assert out.loss.item() == pytest.approx(-2.4)
    out.loss.backward()
    # clipped tokens have no gradient; token 0 has -r*A = -2
    assert lp.grad.tolist() == pytest.approx([-2.0, 0.0, 0.0, 0.0])
    assert out.metrics["clipped_tokens"] == 2
    assert out.metrics["tokens"] == 3


def test_ppo_asymmetric_bounds() -> None:
    lp, inputs = _inputs()
    # clip_high = 0.6 leaves r = 1.5 unclipped; clip_low = 0.2 still clips r = 0.5 to 0.8
    out = losses.ppo(lp, inputs, clip_low=0.2, clip_high=0.6)
    assert out.loss.item() == pytest.approx(-(2.0 + 1.5 - 0.8))
    assert out.metrics["clipped_tokens"] == 1


def test_cispo_keeps_gradient_through_clipped_tokens() -> None:
    lp, inputs = _inputs()
    out = losses.cispo(lp, inputs, clip_low=0.2, clip_high=0.2)
    # weights sg(clip(r)) = [1, 1.2, 0.8]; loss = -(1*ln.5*2 + 1.2*ln.3*1 + 0.8*ln.2*(-1))
    expected = -(2 * math.log(0.5) + 1.2 * math.log(0.3) - 0.8 * math.log(0.2))
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    # gradient = -w*A for every token, clipped ones included
    assert lp.grad.tolist() == pytest.approx([-2.0, -1.2, 0.8, 0.0])
    assert out.metrics["clipped_tokens"] == 2


def _registered() -> dict:
    """What the plugin registers through its hook (the registry calls it the same way)."""
    found: dict = {}
    losses.register_loss_fns(lambda name, factory, **declared: found.__setitem__(name, factory))
    return found


def test_registered_losses_use_train_loss_table() -> None:
    factories = _registered()
    assert set(factories) == {"importance_sampling", "ppo", "cispo", "cross_entropy"}
    config = Config(plugins={"train.loss": {"clip_low": 0.2, "clip_high": 0.6}})
    ppo = factories["ppo"](config)
    assert ppo.name == "ppo"
    lp, inputs = _inputs()
    assert ppo(lp, inputs).loss.item() == pytest.approx(-(2.0 + 1.5 - 0.8))


def test_unknown_clip_key_is_reported_with_suggestion() -> None:
    config = Config(plugins={"train.loss": {"clip_hgh": 0.3}})
    with pytest.raises(ConfigError, match="clip_high"):
        _registered()["cispo"](config)


def test_ratio_cap_truncates_the_weight_but_keeps_the_gradient() -> None:
    """Truncated IS: the token with r = 1.5 > C = 1.25 weighs C, and its gradient is
    C * A * grad lp (a clip would give it 0)."""
    lp, inputs = _inputs()
    out = losses.importance_sampling(lp, inputs, ratio_cap=1.25)
    # -(1*2 + 1.25*1 + 0.5*(-1)) = -2.75
    assert out.loss.item() == pytest.approx(-2.75)
    out.loss.backward()
    assert lp.grad.tolist() == pytest.approx([-2.0, -1.25, 0.5, 0.0])
    assert out.metrics["truncated_tokens"] == 1
    assert out.metrics["ratio_max"] == pytest.approx(1.5)  # the metric is the raw ratio

    # ppo: a negative advantage with a large ratio is unbounded by the clip; the cap bounds it.
    big = torch.tensor([math.log(0.5) + math.log(4.0)], dtype=torch.float64, requires_grad=True)
    neg = LossInputs(
        sampler_logprobs_T=torch.tensor([math.log(0.5)], dtype=torch.float64),
        advantages_T=torch.tensor([-1.0], dtype=torch.float64),
    )
    assert losses.ppo(big, neg).loss.item() == pytest.approx(4.0)
    capped = losses.ppo(big, neg, ratio_cap=2.0)
    assert capped.loss.item() == pytest.approx(2.0)
    capped.loss.backward()
    assert big.grad.tolist() == pytest.approx([2.0])
    # A ratio that underflowed to 0 stays finite under the cap.
    tiny = torch.tensor([-800.0], dtype=torch.float64, requires_grad=True)
    zero = losses.importance_sampling(tiny, neg, ratio_cap=2.0)
    zero.loss.backward()
    assert math.isfinite(zero.loss.item()) and math.isfinite(tiny.grad.item())


def test_ratio_cap_is_read_from_train_loss_for_every_loss() -> None:
    factories = _registered()
    config = Config(plugins={"train.loss": {"ratio_cap": 1.25}})
    lp, inputs = _inputs()
    assert factories["importance_sampling"](config)(lp, inputs).loss.item() == pytest.approx(-2.75)
    assert factories["importance_sampling"](Config())(lp, inputs).loss.item() == pytest.approx(-3)
    with pytest.raises(ConfigError, match="ratio_cap"):
        factories["ppo"](Config(plugins={"train.loss": {"ratio_cap": -1.0}}))


# The reference policy's log-probs of the same four positions (the last, advantage 0, is a
# sampled token of a degenerate group's trajectory).
REFERENCE = [math.log(0.4), math.log(0.3), math.log(0.25), -1.0]


@pytest.mark.parametrize("name", ["importance_sampling", "ppo", "cispo"])
def test_kl_term_is_k3_to_the_reference_on_every_sampled_token(name: str) -> None:
    """``kl_coef * sum k3`` over every token the loss is given (the learner gives it the
    sampled ones), advantage 0 included, in value and gradient, against the same maths
    written out in float64."""
    fn = getattr(losses, name)
    lp, inputs = _inputs()
    inputs = LossInputs(
        inputs.sampler_logprobs_T,
        inputs.advantages_T,
        reference_logprobs_T=torch.tensor(REFERENCE, dtype=torch.float64),
    )
    plain = fn(lp, inputs)
    plain.loss.backward()
    plain_grad = lp.grad.clone()
    lp.grad = None
    beta = 0.3
    out = fn(lp, inputs, kl_coef=beta)
    out.loss.backward()
    # every given token, advantage 0 included (a degenerate group's tokens are anchored too)
    expected_k3 = [math.exp(r - p) - (r - p) - 1.0 for p, r in zip(NEW, REFERENCE, strict=True)]
    assert out.loss.item() - plain.loss.item() == pytest.approx(beta * sum(expected_k3), rel=1e-12)
    assert out.metrics["kl_sum"] == pytest.approx(sum(expected_k3), rel=1e-12)
    assert out.metrics["kl_tokens"] == len(NEW)
    assert out.metrics["kl_max"] == pytest.approx(max(expected_k3), rel=1e-12)
    # d k3 / d lp = 1 - exp(ref - lp): the KL term pulls lp toward the reference
    kl_grad = [beta * (1.0 - math.exp(r - p)) for p, r in zip(NEW, REFERENCE, strict=True)]
    assert (lp.grad - plain_grad).tolist() == pytest.approx(kl_grad, rel=1e-12, abs=1e-15)
    assert any(abs(g) > 1e-3 for g in kl_grad)  # kl_coef > 0 changed the gradient


def test_kl_term_is_zero_where_the_policy_is_the_reference() -> None:
    lp, inputs = _inputs()
    inputs = LossInputs(inputs.sampler_logprobs_T, inputs.advantages_T, lp.detach().clone())
    out = losses.importance_sampling(lp, inputs, kl_coef=1.0)
    out.loss.backward()
    assert out.metrics["kl_sum"] == 0.0
    # the same gradient as without the term: -r*A
    assert lp.grad.tolist() == pytest.approx([-2.0, -1.5, 0.5, 0.0])


def test_kl_coef_without_reference_logprobs_is_an_error_naming_the_setting() -> None:
    lp, inputs = _inputs()
    with pytest.raises(ValueError, match=r"\[train.loss\] kl_coef"):
        losses.importance_sampling(lp, inputs, kl_coef=0.1)


def test_kl_coef_is_read_from_train_loss_for_every_policy_loss() -> None:
    factories = _registered()
    config = Config(plugins={"train.loss": {"kl_coef": 0.05}})
    for name in ("importance_sampling", "ppo", "cispo"):
        assert factories[name](config).settings["kl_coef"] == 0.05
    with pytest.raises(ConfigError, match="kl_coef"):
        factories["ppo"](Config(plugins={"train.loss": {"kl_coef": -0.1}}))

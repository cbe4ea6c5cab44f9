"""On-policy importance ratios at the reference setup's LoRA dropout (0.05) and the sampler/learner
mismatch metrics (tiny Qwen3, CPU, fp32).

The learner scores the policy with dropout off, so a step trained on the sampler's own
samples has every ratio 1 up to float error, and the ``mismatch/*`` metrics say so."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import RTOL64
from trainer_calls import forward_backward

from searchr1.core.config_schema import Config
from searchr1.core.step_metrics import (
    merge_train_metrics,
    mismatch_from_logprobs,
    mismatch_means,
    ratio_metrics,
)
from searchr1.core.types import Datum, SamplingParams
from searchr1.kit.learner.learner import trained_token_logprobs
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, importance_sampling

IS = NamedLoss("importance_sampling", importance_sampling)
TEMPERATURE = 0.8  # the reference setup's
SEED_DROPOUT = 0.05


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_tiny_model(tmp_path_factory.mktemp("tiny"), max_position_embeddings=256)


def _provider(model_dir: Path, *, checkpointing: bool = False) -> LocalModelProvider:
    config = Config().replace(
        model={"base_model": str(model_dir), "temperature": TEMPERATURE, "dtype": "float64"},
        lora={"rank": 8, "alpha": 16.0, "dropout": SEED_DROPOUT},
    )
    config = dataclasses.replace(
        config, plugins={"model.local": {"gradient_checkpointing": checkpointing}}
    )
    p = LocalModelProvider.from_config(config)
    # A trained-looking adapter: with B = 0 the LoRA path (and its dropout) adds nothing.
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return p


def _on_policy_datums(p: LocalModelProvider) -> list[Datum]:
    """The sampler's own samples as datums, advantages +-1 on the generated tokens."""
    prompts = [[5, 17, 33, 8, 90, 41], [12, 7, 300, 52]]
    params = SamplingParams(max_tokens=20, temperature=TEMPERATURE, seed=11)
    results = p.sampler.generate([(prompt, 3, params) for prompt in prompts])
    datums = []
    for prompt, samples in zip(prompts, results, strict=True):
        for i, s in enumerate(samples):
            tokens = prompt + list(s.tokens)
            lps = [0.0] * (len(prompt) - 1) + list(s.logprobs)
            adv = [0.0] * (len(prompt) - 1) + [1.0 if i % 2 else -1.0] * len(s.tokens)
            datums.append(
                Datum(tuple(tokens[:-1]), tuple(tokens[1:]), tuple(lps), tuple(adv), f"t{i}")
            )
    return datums


@pytest.mark.parametrize("checkpointing", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_first_step_ratio_is_one_at_the_seed_dropout(model_dir: Path, checkpointing: bool) -> None:
    p = _provider(model_dir, checkpointing=checkpointing)
    calls = 0
    if checkpointing:
        # Checkpointing must still happen although the learner scores in eval mode.
        for layer in p.model.get_base_model().model.layers:
            original = layer._gradient_checkpointing_func

            def counted(*args, _f=original, **kwargs):  # type: ignore[no-untyped-def]
                nonlocal calls
                calls += 1
                return _f(*args, **kwargs)

            layer._gradient_checkpointing_func = counted
    datums = _on_policy_datums(p)
    p.model.train()  # whatever mode the model was in, the learner scores without dropout
    result = forward_backward(p, datums, IS, loss_scale=1.0 / len(datums))
    m = result.metrics
    trained = sum(1 for d in datums for a in d.advantages if a != 0)
    assert m["mismatch/tokens"] == trained > 20
    # float64 (see ``numerics``): log-probs at most ~20 in magnitude agree to 20 * RTOL64, so
    # ratios are 1 to that; k3 = r - 1 - log r (d**2 / 2, plus rounding) is far below it.
    tol = 20 * RTOL64
    assert m["mismatch/logprob_diff_max"] < tol
    assert abs(m["mismatch/ratio_min"] - 1) < tol and abs(m["mismatch/ratio_max"] - 1) < tol
    means = mismatch_means(m)  # what the step logs
    assert abs(means["mismatch/kl_sample_train"]) < tol and abs(means["mismatch/k3"]) < tol
    assert abs(ratio_metrics(m)["ratio_mean"] - 1) < tol
    assert any(q.grad is not None and q.grad.abs().sum() > 0 for q in p.learner.params)
    assert (calls > 0) == checkpointing
    assert all(module.training for module in p.model.modules())  # modes restored

    # The setting has teeth: the same samples scored with dropout on are far off-policy.
    d = datums[0]
    ids = torch.tensor([d.input_tokens])
    columns = torch.arange(len(d))
    p.model.train()
    with torch.no_grad():
        noisy = trained_token_logprobs(
            p.model, ids, torch.ones_like(ids), torch.tensor([d.target_tokens]), 0.8, columns
        )[0]
    gap = (noisy - torch.tensor(d.sampler_logprobs)).abs()[torch.tensor(d.advantages) != 0]
    assert float(gap.max()) > 1e-2
    p.close()


def test_mismatch_metrics_of_known_log_probs() -> None:
    m = mismatch_from_logprobs([-1.0, -2.0, -0.5], [-1.0, -1.5, -1.0])
    d = [0.0, -0.5, 0.5]
    assert m["mismatch/tokens"] == 3
    assert m["mismatch/logprob_diff_max"] == pytest.approx(0.5)
    assert m["mismatch/kl_sample_train_sum"] == pytest.approx(-sum(d))
    assert m["mismatch/k3_sum"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d))
    assert m["mismatch/ratio_min"] == pytest.approx(math.exp(-0.5))
    assert m["mismatch/ratio_max"] == pytest.approx(math.exp(0.5))
    # the step logs the means per trained token, not the sums
    means = mismatch_means(m)
    assert means["mismatch/kl_sample_train"] == pytest.approx(-sum(d) / 3)
    assert means["mismatch/k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3)
    assert not any(key.endswith("_sum") for key in means)
    assert mismatch_from_logprobs([], []) == {"mismatch/tokens": 0.0}
    assert mismatch_means({"mismatch/tokens": 0.0}) == {"mismatch/tokens": 0.0}
    # a sampler whose log-prob is far off (a bug, a wrong model) reports inf, not OverflowError
    broken = mismatch_means(mismatch_from_logprobs([-0.1, -0.2], [-1000.0, -0.2]))
    assert broken["mismatch/ratio_max"] == math.inf and broken["mismatch/k3"] == math.inf


def test_micro_batch_merge_is_max_min_and_token_weighted() -> None:
    a = mismatch_from_logprobs([-1.0, -2.0, -3.0], [-1.1, -2.0, -2.0])
    b = mismatch_from_logprobs([-0.2], [-0.9])
    whole = mismatch_means(
        mismatch_from_logprobs([-1.0, -2.0, -3.0, -0.2], [-1.1, -2.0, -2.0, -0.9])
    )
    merged = mismatch_means(merge_train_metrics([a, b]))
    assert merged.keys() == whole.keys()
    for key, value in whole.items():
        assert merged[key] == pytest.approx(value), key
    # A scope (one sampling server's mismatch/server<k>/*) merges and averages over its own
    # tokens; a scope that trained nothing has no means.
    scoped = mismatch_means(
        merge_train_metrics(
            [
                {**a, **{k.replace("mismatch/", "mismatch/server0/"): v for k, v in a.items()}},
                {**b, **{k.replace("mismatch/", "mismatch/server1/"): v for k, v in b.items()}},
                {"mismatch/tokens": 0.0, "mismatch/server2/tokens": 0.0},
            ]
        )
    )
    for k, part in ((0, a), (1, b)):
        own = mismatch_means(part)
        for name in ("kl_sample_train", "k3", "ratio_min", "ratio_max", "logprob_diff_max"):
            assert scoped[f"mismatch/server{k}/{name}"] == pytest.approx(own[f"mismatch/{name}"])
    assert scoped["mismatch/k3"] == pytest.approx(whole["mismatch/k3"])
    assert scoped["mismatch/server2/tokens"] == 0 and "mismatch/server2/k3" not in scoped
    # The loss's sums add, other maxima take the max, and a provider without the metrics
    # (a remote service) leaves them out instead of reporting zeros.
    step = merge_train_metrics(
        [{"tokens": 3.0, "ratio_sum": 3.3, "ratio_max": 1.2, **a}, {"tokens": 1.0, **b}]
    )
    assert step["tokens"] == 4 and step["ratio_sum"] == pytest.approx(3.3)
    assert step["ratio_max"] == 1.2 and step["mismatch/ratio_max"] == whole["mismatch/ratio_max"]
    remote = merge_train_metrics([{"tokens": 5.0, "loss": 1.0}, {"tokens": 2.0, "loss": 0.5}])
    assert remote == {"tokens": 7.0, "loss": 1.5}
    half = merge_train_metrics([{"tokens": 5.0}, {"tokens": 3.0, **a}])
    assert half["mismatch/tokens"] == 3 and half["mismatch/ratio_min"] == a["mismatch/ratio_min"]

"""Training with the local provider on the tiny model (CPU, fp32): gradients, optimizer,
checkpoints, config errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fakes import build_small_tiny_model
from numerics import RTOL64, assert_same64, assert_same_grads64, random_datums
from trainer_calls import forward_backward, load_state, optim_step

from searchr1.core.config_schema import Config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.core.types import AdamParams, Datum
from searchr1.plugins import local_model
from searchr1.plugins.local_model.provider import LocalModelProvider
from searchr1.plugins.losses import NamedLoss, cispo, importance_sampling

IS = NamedLoss("importance_sampling", importance_sampling)
ADAM = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_tiny_model(tmp_path_factory.mktemp("tiny"))


def _config(model_dir: Path, dtype: str = "float64", **lora: object) -> Config:
    """float64 unless a test needs float32: gradients of two computations of the same maths
    then agree to ``numerics.RTOL64`` on any CPU."""
    return Config().replace(
        model={"base_model": str(model_dir), "temperature": 0.9, "dtype": dtype},
        lora={"rank": 4, "alpha": 8.0, "dropout": 0.0, **lora},
    )


def _provider(model_dir: Path, dtype: str = "float64", **lora: object) -> LocalModelProvider:
    return LocalModelProvider.from_config(_config(model_dir, dtype, **lora))


_datums = random_datums


def _grads(p: LocalModelProvider) -> dict[str, torch.Tensor]:
    return {n: t.grad.clone() for n, t in p.model.named_parameters() if t.grad is not None}


def _reference_gradient(p: LocalModelProvider, datums: list[Datum], scale: float) -> dict:
    """The gradient of ``scale * sum_d -sum_t r_t A_t`` computed here, datum by datum,
    straight from the model's logits (no learner code): what the train loop's
    ``forward_backward(micro_batch, loss, 1 / N)`` calls must add up to."""
    p.model.eval()  # the learner scores without dropout; dropout is 0 here anyway
    p.model.zero_grad(set_to_none=True)
    for d in datums:
        logits = p.model(input_ids=torch.tensor([d.input_tokens])).logits[0] / 0.9
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(d.target_tokens)[:, None])
        f64 = dict(dtype=torch.float64)
        ratio = (lp[:, 0] - torch.tensor(d.sampler_logprobs, **f64)).exp()
        (-(ratio * torch.tensor(d.advantages, **f64)).sum() * scale).backward()
    out = _grads(p)
    p.model.zero_grad(set_to_none=True)
    return out


def test_micro_batches_scaled_by_one_over_n_give_the_full_batch_gradient(model_dir: Path) -> None:
    """The train loop calls ``forward_backward`` once per micro-batch with
    ``loss_scale = 1 / N`` (N = every trajectory of the step). However the step is split (by
    the train loop into micro-batches, by the learner into chunks), the accumulated gradient
    is that of the whole batch's summed loss over N, computed independently here; and
    ``loss_scale`` really scales it."""
    p = _provider(model_dir)
    # Nonzero LoRA B so that every LoRA matrix gets a gradient.
    with torch.no_grad():
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    datums = _datums(p.vocab_size, n=6)
    n = len(datums) + 2  # two trajectories of the step had advantage 0 (no datum)
    expected = _reference_gradient(p, datums, 1.0 / n)
    assert expected and all("lora_" in name for name in expected)

    def accumulated(splits: list[list[Datum]], scale: float) -> dict:
        for batch in splits:
            forward_backward(p, batch, IS, loss_scale=scale)
        out = _grads(p)
        p.learner.optimizer.zero_grad(set_to_none=True)
        return out

    whole = accumulated([datums], 1.0 / n)
    split = accumulated([datums[:1], datums[1:3], datums[3:]], 1.0 / n)
    p.learner.chunk_tokens = 20  # and chunking inside one call
    chunked = accumulated([datums], 1.0 / n)
    for got in (whole, split, chunked):
        assert got.keys() == expected.keys()
        for name, g in expected.items():
            assert_same64(got[name], g, name)
    doubled = accumulated([datums], 2.0 / n)
    for name, g in expected.items():
        assert_same64(doubled[name], 2 * g, name)
    # The reported loss is unscaled (the sum over datums), whatever the split.
    losses = [forward_backward(p, b, IS, loss_scale=1.0 / n).loss for b in (datums[:2], datums[2:])]
    assert sum(losses) == pytest.approx(forward_backward(p, datums, IS).loss, rel=RTOL64)
    p.close()


def test_only_lora_parameters_change(model_dir: Path) -> None:
    p = _provider(model_dir)
    before = {n: t.detach().clone() for n, t in p.model.named_parameters()}
    result = forward_backward(p, _datums(p.vocab_size), IS)
    assert result.metrics["tokens"] > 0 and "ratio_sum" in result.metrics
    assert "ratio_mean" not in result.metrics  # sums only: the core derives the means
    metrics = optim_step(p, ADAM)
    assert metrics["grad_norm"] > 0 and metrics["lr"] == ADAM.learning_rate
    assert metrics["step"] == 1
    changed = {n for n, t in p.model.named_parameters() if not torch.equal(t, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)
    for n, t in p.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(t, before[n]), n
            assert not t.requires_grad
    assert all(t.grad is None for t in p.model.parameters())  # zeroed after the step
    p.close()


def test_sampler_sees_the_new_weights_after_a_step(model_dir: Path) -> None:
    import asyncio

    from searchr1.core.types import SamplingParams

    p = _provider(model_dir)
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    (before,) = asyncio.run(p.sample(prompt, 1, params))
    forward_backward(p, _datums(p.vocab_size), IS)
    optim_step(p, AdamParams(learning_rate=0.5))
    (after,) = asyncio.run(p.sample(prompt, 1, params))
    assert after.logprobs[0] != before.logprobs[0]
    p.close()


def test_save_load_gives_identical_next_steps(model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    datums = _datums(700, n=4, seed=5)
    loss = NamedLoss("cispo", cispo)
    # float32, as users run it: the adapter is stored in float32 (bit-identical resume).
    a = _provider(model_dir, "float32")
    forward_backward(a, datums, loss)
    optim_step(a, ADAM)
    a.save_state(str(tmp_path / "ckpt"))
    next_a = []
    for _ in range(2):
        next_a.append(forward_backward(a, datums, loss).loss)
        optim_step(a, ADAM)

    b = LocalModelProvider.from_config(_config(model_dir, "float32").replace(run={"seed": 7}))
    load_state(b, str(tmp_path / "ckpt"))
    assert b.learner.step == 1
    next_b = []
    for _ in range(2):
        next_b.append(forward_backward(b, datums, loss).loss)
        optim_step(b, ADAM)
    assert next_b == next_a  # bit-identical

    # The adapter folder is plain peft: loadable without searchr1.
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "ckpt" / "adapter"))
    ids = torch.tensor([[5, 6, 7, 8]])
    a_only = LocalModelProvider.from_config(_config(model_dir, "float32"))
    load_state(a_only, str(tmp_path / "ckpt"))
    with torch.no_grad():
        torch.testing.assert_close(
            peft_model(input_ids=ids).logits, a_only.model(input_ids=ids).logits
        )
    for p in (a, b, a_only):
        p.close()


def test_load_state_errors_name_the_file(model_dir: Path, tmp_path: Path) -> None:
    p = _provider(model_dir)
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        load_state(p, str(tmp_path / "nothing"))
    p.save_state(str(tmp_path / "r4"))
    other = _provider(model_dir, rank=8)
    with pytest.raises(ValueError, match=r"adapter_model.safetensors.*\[lora\] rank"):
        load_state(other, str(tmp_path / "r4"))
    p.close()
    other.close()


def test_too_long_datum_names_its_trajectory(model_dir: Path) -> None:
    p = _provider(model_dir)
    n = 200  # context is 128
    d = Datum((5,) * n, (5,) * n, (0.0,) * n, (1.0,) * n, trajectory_id="q17-t3")
    with pytest.raises(ValueError, match="q17-t3"):
        forward_backward(p, [d], IS)
    p.close()


def test_factory_registered_as_local_and_config_errors(model_dir: Path) -> None:
    reg = load_registry().get("model_provider", "local")
    assert reg.plugin == "local_model" and reg.settings == {"local": local_model.LocalSettings}
    model = reg.factory(_config(model_dir))
    provider = model.sampler
    assert model.trainer is provider  # one object samples and trains the same weights
    assert provider.capabilities.losses is None  # any loss: the learner calls it
    assert provider.capabilities.snapshot_sampler is not None
    assert provider.capabilities.learner_temperature == 0.9
    assert provider.tokenizer.eos_token == "<|endoftext|>"
    assert sum(t.numel() for t in provider.model.parameters() if t.requires_grad) > 0
    provider.close()
    with pytest.raises(ValueError, match="lora.target_modules.*q_prj"):
        reg.factory(_config(model_dir, target_modules=("q_prj",)))
    bad = dataclasses.replace(_config(model_dir), plugins={"model.local": {"max_batch_row": 4}})
    with pytest.raises(ConfigError, match="max_batch_rows"):
        reg.factory(bad)
    with pytest.raises(ValueError, match="model.base_model"):
        reg.factory(_config(model_dir).replace(model={"base_model": str(model_dir / "no")}))


def test_gradient_checkpointing_gives_the_same_gradient(model_dir: Path) -> None:
    datums = _datums(700, n=3, seed=2)
    grads = []
    for on in (False, True):
        config = dataclasses.replace(
            _config(model_dir), plugins={"model.local": {"gradient_checkpointing": on}}
        )
        p = LocalModelProvider.from_config(config)
        base = p.model.get_base_model()
        assert all(layer.gradient_checkpointing == on for layer in base.model.layers)
        with torch.no_grad():
            for name, param in p.model.named_parameters():
                if "lora_B" in name:
                    param.fill_(0.01)
        forward_backward(p, datums, IS)
        grads.append(_grads(p))
        p.close()
    assert_same_grads64(grads[1], grads[0])


def test_cpu_threads_default_to_the_cores_available_and_threads_overrides() -> None:
    """A fixed default (not the load average at start-up), so numerics do not depend on what
    else runs on the machine; ``[model.local] threads`` still wins."""
    import os

    from searchr1.kit.learner.device import configure_cpu_threads

    before = torch.get_num_threads()
    try:
        assert configure_cpu_threads(0) == len(os.sched_getaffinity(0)) == torch.get_num_threads()
        assert configure_cpu_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_device_and_dtype_errors_name_the_field_and_are_user_errors() -> None:
    from searchr1.core.errors import UserError
    from searchr1.kit.learner.device import choose_device, choose_dtype

    with pytest.raises(UserError, match="model.device = 'no-such-device'"):
        choose_device("no-such-device")
    with pytest.raises(UserError, match="model.dtype = 'float8'"):
        choose_dtype("float8", torch.device("cpu"))

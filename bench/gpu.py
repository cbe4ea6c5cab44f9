"""GPU check of the ``local`` provider at the reference setup's shapes, with random weights.

    python bench/gpu.py           # on one GPU (H200: meant to finish in < 8 minutes)
    python bench/gpu.py --tiny    # the same code path on the CPU with tiny shapes (CI)

Needs only torch, transformers and peft, and no network: the models are built from the
configs kept in ``bench/configs/`` (``qwen3-4b.json``, ``qwen3.5-4b.json``: the shapes of
Qwen3-4B and Qwen3.5-4B, no weights) with random weights, bf16 on CUDA. The tokenizer is the
project's built-in one (its ids are a subset of either model's vocabulary).

Qwen3.5-4B is published as a composite ``Qwen3_5ForConditionalGeneration`` checkpoint
(``model.language_model.*`` and a vision tower ``model.visual.*``): that model is built with
random weights, saved with ``save_pretrained`` into a temporary folder and loaded back the
way the provider loads ``[model] base_model`` (``AutoModelForCausalLM``: the text stack
alone). The figures count the vision tower's bytes in the checkpoint and on the device
(``vision_checkpoint_mib``, ``vision_on_device_mib``: must be 0).

Per model: a seed-shaped rollout (8 questions x group 8, ``--turns`` sampled turns per
trajectory with a synthetic observation between them, issued concurrently as the rollout
does, cache reuse on), then one training step (``forward_backward`` over every trajectory as
one datum, importance-sampling loss, ``optim_step``; gradient checkpointing on with CUDA).
Prints ONE JSON line: per model tokens/s, peak memory of the rollout (``sampler_peak_*``)
and of the training step (``learner_peak_*``) separately, each against the memory in use
before it (``*_start_*``; GiB of CUDA allocations on a GPU, MiB of RSS on the CPU),
prefill_ratio, ``logprob_diff_max``, the min/mean/max of the sampler-to-learner ratio
exp(learner - sampler) over trained tokens, the training step's time, and the Gated
DeltaNet kernel packages missing (``missing_kernels``; on CUDA these run the reference code).

Then ``ranks``: two optimizer steps of the tiny model's LoRA learner in float64 on fixed
datums, once in one process and once as 2 torchrun ranks each training its share
(``tests/distributed/update_worker.py``, the CPU tests' worker): nccl with 2+ CUDA devices,
gloo on the CPU with ``--tiny``, skipped (saying why) on one device. The weights after the
steps must agree to float64 rounding (``max_abs_diff``; a wrong gradient scale or a rank's
lost share moves them by O(lr) = 1e-2).

With ``--vllm-python PATH`` (an interpreter that imports vLLM) or ``--vllm-wheel FILE`` (a
vLLM wheel, installed offline into a temporary venv over this one's packages, with the
wheels beside it as its dependencies), ``vllm``: one ``searchr1 train`` step of the offline
demo with ``[model] provider = "vllm"`` on a server the provider launches, reporting the
step's seconds, its sampler-to-learner mismatch and the command's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from learner_memory import Peak  # bench/ is on sys.path when this file runs

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CONFIGS = Path(__file__).resolve().parent / "configs"
MODELS = ("qwen3-4b", "qwen3.5-4b")
# --tiny: the same families, shrunk so both run on a CPU in seconds.
TINY = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
# --tiny: the vision tower of a composite checkpoint, shrunk the same way.
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2)
OBSERVATION = (
    "\n<information> Doc 1 (The old town) A writer lived in the old town for many years and "
    "wrote a book about its bridge. Doc 2 (Bridges) The bridge was built of stone. "
    "</information>\n"
)


def model_config(name: str, tiny: bool) -> Any:
    """The transformers config of ``bench/configs/NAME.json`` (a composite one, with
    ``text_config`` and ``vision_config``, for Qwen3.5), shrunk with ``tiny``."""
    from transformers import AutoConfig

    data = json.loads((CONFIGS / f"{name}.json").read_text())
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    model_type = data.pop("model_type")
    data.pop("architectures", None)
    text = data.get("text_config", data)
    if tiny:
        text.update({k: v for k, v in TINY.items() if k in text})
        if "layer_types" in text:
            text["layer_types"] = text["layer_types"][: TINY["num_hidden_layers"]]
        if "vision_config" in data:
            data["vision_config"].update(TINY_VISION, out_hidden_size=text["hidden_size"])
    return AutoConfig.for_model(model_type, **data)


def architecture(name: str) -> str:
    return json.loads((CONFIGS / f"{name}.json").read_text())["architectures"][0]


def load_base(name: str, args: Any, device: Any, dtype: Any, folder: Path) -> tuple[Any, dict]:
    """The base model on ``device`` and its layout figures. A composite config is saved as
    a composite checkpoint and loaded back through ``AutoModelForCausalLM`` (module doc)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config = model_config(name, args.tiny)
    if not hasattr(config, "vision_config"):
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(0)
            base = AutoModelForCausalLM.from_config(config, dtype=dtype)
        return base.to(device), {}
    composite_class = getattr(transformers, architecture(name))
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        composite = composite_class._from_config(config, dtype=dtype)
    composite.save_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    # The text stack loaded is the composite's, weight for weight (model.language_model.X
    # there is model.X here; the head is tied or lm_head in both).
    saved = dict(composite.named_parameters())
    equal = all(
        torch.equal(p, saved.get(n.replace("model.", "model.language_model.", 1), saved.get(n)))
        for n, p in base.named_parameters()
    )
    del composite, saved
    if device.type == "cuda":
        torch.cuda.empty_cache()
    on_device = [(n, p) for n, p in base.named_parameters() if "visual" in n]
    return base, {
        "loaded_class": type(base).__name__,
        "text_weights_equal": equal,
        "vision_checkpoint_mib": round(_checkpoint_bytes(folder, "model.visual.") / 2**20, 1),
        "vision_on_device_mib": round(
            sum(p.numel() * p.element_size() for _, p in on_device) / 2**20, 1
        ),
        "weights_on_device_mib": round(
            sum(p.numel() * p.element_size() for p in base.parameters()) / 2**20, 1
        ),
    }


def _checkpoint_bytes(folder: Path, prefix: str) -> int:
    """Bytes of the tensors named ``prefix...`` in ``folder``'s safetensors files (headers
    only, nothing loaded)."""
    from safetensors import safe_open

    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "BOOL": 1, "U8": 1}
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    piece = f.get_slice(key)
                    total += math.prod(piece.get_shape()) * sizes[piece.get_dtype()]
    return total


def build_provider(name: str, args: Any, device: Any, dtype: Any, folder: Path) -> tuple[Any, dict]:
    from searchr1.core.config_schema import Config
    from searchr1.kit.learner.budget import token_budget
    from searchr1.kit.learner.kernels import missing_kernels
    from searchr1.kit.learner.loading import (
        LocalSettings,
        attach_lora,
        checkpointing_on,
        enable_checkpointing,
    )
    from searchr1.plugins.local_model.provider import LocalModelProvider
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tokenizer = build_tokenizer(BUILTIN_TEXT, vocab_size=600)
    base, layout = load_base(name, args, device, dtype, folder)
    layout["missing_kernels"] = missing_kernels(base.config)
    run_config = Config().replace(
        model={"base_model": name, "temperature": 1.0},
        lora={"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": ("all-linear",)},
    )
    model = attach_lora(base, run_config)
    if checkpointing_on("auto", device):
        enable_checkpointing(model.get_base_model())
    budget = token_budget(0, base.config, dtype, device)
    provider = LocalModelProvider(
        model,
        tokenizer,
        device=device,
        temperature=1.0,
        settings=LocalSettings(batch_wait_ms=2.0),
        max_batch_tokens=budget,
    )
    return provider, layout


def rollout(
    provider: Any, args: Any
) -> tuple[list[tuple[list[int], list[bool], list[float]]], dict]:
    """8 x 8 multi-turn trajectories; returns (tokens, trained mask, sampler log-probs) each."""
    from searchr1.core.types import SamplingParams

    tok = provider.tokenizer
    obs = tok.encode(OBSERVATION)
    prompts = [
        tok.encode(
            f"<|im_start|>user\nQuestion {q}: who wrote the book about the old town "
            f"number {q}?<|im_end|>\n<|im_start|>assistant\n"
        )
        for q in range(args.questions)
    ]

    async def trajectory(prompt: list[int], first: Any, seed: int) -> tuple:
        tokens, mask, logprobs = list(prompt), [False] * len(prompt), [0.0] * len(prompt)
        sample = first
        for turn in range(args.turns):
            tokens += sample.tokens
            mask += [True] * len(sample.tokens)
            logprobs += sample.logprobs
            if turn == args.turns - 1:
                break
            tokens += obs
            mask += [False] * len(obs)
            logprobs += [0.0] * len(obs)
            params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0, seed=seed + turn)
            (sample,) = await provider.sample(tokens, 1, params)
        return tokens, mask, logprobs

    async def question(q: int, prompt: list[int]) -> list:
        params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0, seed=q)
        first = await provider.sample(prompt, args.group_size, params)
        return await asyncio.gather(
            *[trajectory(prompt, s, 1000 * q + 10 * k) for k, s in enumerate(first)]
        )

    async def everything() -> list:
        groups = await asyncio.gather(*[question(q, p) for q, p in enumerate(prompts)])
        return [t for g in groups for t in g]

    async def warm_up() -> None:  # first-call costs (kernels, lazy imports) stay untimed
        short = SamplingParams(max_tokens=2, temperature=1.0)
        await asyncio.gather(provider.sample(prompts[0], 2, short), provider.sample(obs, 1, short))

    asyncio.run(warm_up())
    provider.sampler.forget()
    stats = provider.sampler.stats
    before = stats.prefill_tokens
    t0 = time.perf_counter()
    trajectories = asyncio.run(everything())
    seconds = time.perf_counter() - t0
    sampled = sum(sum(m) for _, m, _ in trajectories)
    minimum = sum(len(p) for p in prompts) + len(trajectories) * (args.turns - 1) * (len(obs) + 1)
    return trajectories, {
        "rollout_s": round(seconds, 2),
        "tokens_per_s": round(sampled / seconds, 1),
        "sampled_tokens": sampled,
        "prefill_tokens": stats.prefill_tokens - before,
        "prefill_ratio": round((stats.prefill_tokens - before) / minimum, 3),
        "peak_cache_tokens": stats.peak_cache_tokens,
    }


def train_step(provider: Any, trajectories: list) -> dict:
    """One step over every trajectory; ratio stats from the loss's inputs."""
    import torch

    from searchr1.core.types import AdamParams, Datum
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    seen: dict[str, float] = {"min": float("inf"), "max": 0.0, "sum": 0.0, "n": 0}

    def watched(logprobs_T: torch.Tensor, inputs: Any) -> Any:
        with torch.no_grad():
            trained = inputs.advantages_T != 0
            ratio = (logprobs_T.detach() - inputs.sampler_logprobs_T)[trained].exp()
            if ratio.numel():
                seen["min"] = min(seen["min"], float(ratio.min()))
                seen["max"] = max(seen["max"], float(ratio.max()))
                seen["sum"] += float(ratio.sum())
                seen["n"] += ratio.numel()
        return importance_sampling(logprobs_T, inputs)

    datums = []
    for i, (tokens, mask, logprobs) in enumerate(trajectories):
        adv = 1.0 if i % 2 else -1.0
        datums.append(
            Datum(
                input_tokens=tuple(tokens[:-1]),
                target_tokens=tuple(tokens[1:]),
                sampler_logprobs=tuple(logprobs[1:]),
                advantages=tuple(adv if m else 0.0 for m in mask[1:]),
                trajectory_id=f"gpu-{i}",
            )
        )
    t0 = time.perf_counter()

    async def step() -> Any:
        queued = await provider.forward_backward(datums, NamedLoss("importance_sampling", watched))
        await provider.optim_step(AdamParams(learning_rate=1e-6))
        return await queued

    result = asyncio.run(step())
    if provider.device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "step_s": round(time.perf_counter() - t0, 2),
        "train_tokens": sum(len(d) for d in datums),
        "logprob_diff_max": result.metrics.get("mismatch/logprob_diff_max", 0.0),
        "ratio_min": seen["min"],
        "ratio_mean": seen["sum"] / max(1, seen["n"]),
        "ratio_max": seen["max"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=512)
    parser.add_argument("--vllm-python", help="an interpreter with vLLM: one vllm train step")
    parser.add_argument("--vllm-wheel", help="a vLLM wheel, installed offline: the same")
    args = parser.parse_args()
    if args.tiny:
        args.questions, args.group_size, args.turn_tokens = 2, 2, 8

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    report: dict[str, Any] = {"bench": "gpu", "tiny": args.tiny, "device": str(device)}
    if cuda:
        report["gpu"] = torch.cuda.get_device_name(0)
    t_all = time.perf_counter()
    meter = Peak(device)
    unit, scale = ("gib", 1024) if cuda else ("mib", 1)
    for name in args.models.split(","):
        if cuda:
            torch.cuda.empty_cache()
        with tempfile.TemporaryDirectory(prefix=f"gpu-bench-{name}-") as folder:
            provider, figures = build_provider(name, args, device, dtype, Path(folder))
        # The sampler's peak (rollout, caches included) and the learner's (the training
        # step) apart, each against what was in use before it (weights, optimizer state).
        figures[f"sampler_start_{unit}"] = round(meter.current_mb() / scale, 2)
        meter.reset()
        trajectories, rollout_figures = rollout(provider, args)
        figures.update(rollout_figures)
        figures[f"sampler_peak_{unit}"] = round(meter.peak_mb() / scale, 2)
        provider.sampler.forget()
        figures[f"learner_start_{unit}"] = round(meter.current_mb() / scale, 2)
        meter.reset()
        figures.update(train_step(provider, trajectories))
        figures[f"learner_peak_{unit}"] = round(meter.peak_mb() / scale, 2)
        provider.close()
        del provider
        report[name] = figures
        print(f"{name}: {figures}", file=sys.stderr)
    report["ranks"] = ranks_equal(cuda)
    print(f"ranks: {report['ranks']}", file=sys.stderr)
    if args.vllm_python or args.vllm_wheel:
        report["vllm"] = vllm_step(args)
        print(f"vllm: {report['vllm']}", file=sys.stderr)
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    print(json.dumps(report))


ROOT = Path(__file__).resolve().parents[1]
UPDATE_WORKER = ROOT / "tests" / "distributed" / "update_worker.py"


def ranks_equal(cuda: bool) -> dict[str, Any]:
    """2 ranks' update against one process's, float64 (module docstring)."""
    import torch

    devices = torch.cuda.device_count() if cuda else 2
    if devices < 2:
        return {"skipped": f"{devices} CUDA device: the 2-rank check needs 2"}
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    model = resolve("builtin:tiny", load_registry().assets)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-ranks-") as tmp:
        one, two = Path(tmp) / "one.pt", Path(tmp) / "two.pt"
        t0 = time.perf_counter()
        # the workers' logs go to stderr: stdout is this script's one JSON line
        quiet = {"env": env, "timeout": 600, "check": True, "stdout": sys.stderr.fileno()}
        subprocess.run([sys.executable, UPDATE_WORKER, model, one], **quiet)
        t1 = time.perf_counter()
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        torchrun += ["--master-port", "29541"]
        subprocess.run([*torchrun, UPDATE_WORKER, model, two], **quiet)
        t2 = time.perf_counter()
        a, b = torch.load(one), torch.load(two)
    diff = max(float((a[n] - b[n]).abs().max()) for n in a)
    scale = max(float(t.abs().max()) for t in a.values())
    tolerance = 1e-9 * max(1.0, scale)  # float64 rounding (2e-16) over reduction orders
    learned = any(float(t.abs().max()) > 0 for n, t in a.items() if "lora_B" in n)
    return {
        "backend": "nccl" if cuda else "gloo",
        "max_abs_diff": diff,
        "tolerance": tolerance,
        "equal": diff <= tolerance and learned and a.keys() == b.keys(),
        "one_process_s": round(t1 - t0, 1),
        "two_ranks_s": round(t2 - t1, 1),
    }


def vllm_step(args: Any) -> dict[str, Any]:
    """One vLLM train step of the demo (module docstring); its figures and exit code."""
    import tomllib

    from searchr1.core.config import default_config_text

    with tempfile.TemporaryDirectory(prefix="gpu-bench-vllm-") as tmp:
        python = args.vllm_python or _vllm_venv(Path(args.vllm_wheel), Path(tmp) / "venv")
        text = default_config_text().replace(
            'provider = "local"\nbase_model', 'provider = "vllm"\nbase_model', 1
        )
        text = text.replace('dir = "runs"', f'dir = "{tmp}/runs"', 1)
        text += (
            f'\n[model.vllm]\npython = "{python}"\nadapters_dir = "{tmp}/adapters"\n'
            'server_args = ["--kv-cache-memory-bytes", "67108864", "--max-num-seqs", "64"]\n'
        )
        tomllib.loads(text)  # a broken edit fails here, not in the server
        config = Path(tmp) / "vllm.toml"
        config.write_text(text, encoding="utf-8")
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "searchr1", "train", "--config", config, "--run-dir", run_dir]
            + ["--max-steps", "1"],
            capture_output=True,
            text=True,
            timeout=480,
        )
        figures: dict[str, Any] = {"exit_code": done.returncode}
        figures["seconds"] = round(time.perf_counter() - t0, 1)
        events = run_dir / "events.jsonl"
        metrics = [
            json.loads(line)
            for line in (events.read_text().splitlines() if events.exists() else [])
            if '"event": "metrics"' in line
        ]
        if metrics:
            last = metrics[-1]
            figures["step_s"] = last.get("time/step")
            figures.update({k: v for k, v in last.items() if k.startswith("mismatch/")})
        if done.returncode:
            figures["stderr_tail"] = done.stderr[-1500:]
    return figures


def _vllm_venv(wheel: Path, folder: Path) -> str:
    """A venv over this interpreter's packages with ``wheel`` installed offline (its
    dependencies from the wheels in the same folder); its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", folder], check=True, timeout=120
    )
    python = folder / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheel.parent, wheel],
        check=True,
        timeout=600,
    )
    return str(python)


if __name__ == "__main__":
    main()

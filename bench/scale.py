"""Seconds per training step and tokens per second of the offline demo with 1 and with N
data-parallel processes (``searchr1 train --nproc N``, torchrun + gloo on CPU, nccl on GPUs),
the N processes once with whole copies (the gradients all-reduced) and once with
``[model.local] fsdp = true`` (FSDP2: the weights sharded, ``nproc_N_fsdp``).

    python bench/scale.py                  # 1 vs 2 processes (whole, sharded), 6 steps each
    python bench/scale.py --nproc 4 --steps 10 --threads 4
    python bench/scale.py --check-equal    # on a lent GPU: one step's update, three ways
    python bench/scale.py --sampling       # FSDP2 sampling: gathered whole vs lockstep
    python bench/scale.py --vllm .venv-vllm/bin/python   # and 1 vs N processes on vllm

``--check-equal`` (meant for one GPU, nccl; ``--device cpu`` runs the same code with gloo):
two optimizer steps of the local learner on fixed random datums, float32, TF32 off, first
unwrapped (no process group), then as rank 0 of a one-process nccl job with the gradient
all-reduce (the data-parallel path), then with FSDP2 (``fully_shard``, the ``fsdp = true``
path); the LoRA weights after the steps must agree to float32 rounding. One JSON line.

The demo (``searchr1/defaults/offline.toml``: tiny model, 8 questions x 8 trajectories a
step, dynamic sampling) with the held-out evals off and one checkpoint at the end. By
default both runs use every core: one process with ``cores`` torch threads, N processes
with ``cores / N`` each (``--threads T``: T threads a process in both runs instead, which
measures N times the cores against one). On one CPU the processes share the cores, so what
N processes can win there is what one process leaves idle (the rollout's Python between
forwards, one thread's poor scaling); the real gain needs a device per process. s/step is the
mean ``time/step`` of the steps after the first; tokens/s is sampled tokens (every rank's)
per second over the same steps. Ends with one JSON line.

``--sampling``: an FSDP2-sharded random Qwen3 model (``--layers``, ``--hidden``; float32)
sampled by N torchrun ranks calling ``BatchedSampler.generate`` directly, once gathered
whole (``Sharding.for_sampling``, what the rollout does) and once sharded in lockstep
(``fsdp.Lockstep``), each in a job of its own. Every rank decodes ``--rows`` sequences of
``--new-tokens`` (rank ``r``: ``r x 16`` more, so the ranks finish apart) after a
``--prompt``-token prompt. Per mode: sampled tokens per second (every rank's tokens over
the slowest rank's seconds), each rank's peak bytes of model weights held while sampling
(FSDP's shards and gathered units, the whole output head; counted at every decoder layer's
forward), its peak resident memory over the same moments and before sampling, and the
lockstep's idle forwards. Then the rollout on that model: ``--rollout-steps`` steps of
the demo (4 questions x 4 trajectories a step) through ``searchr1 train --nproc N`` with
``fsdp = true``, ``fsdp_sampling`` "gather" and then "lockstep" (``rollout_*``: the step
figures above, and the peak RSS any step logged, ``memory/peak_rss_gb``: a high-water
mark, the loading's included). One JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

DEMO = Path(__file__).resolve().parents[1] / "searchr1" / "defaults" / "offline.toml"


def run(
    folder: Path,
    nproc: int,
    steps: int,
    threads: int,
    fsdp: bool = False,
    vllm: str = "",
    lockstep: bool = False,
    base_model: str = "",
    questions: int = 0,
) -> dict[str, Any]:
    """Train ``steps`` steps of the demo with ``nproc`` processes (``fsdp``: sharded;
    ``lockstep``: and sampled sharded, ``fsdp_sampling = "lockstep"``; ``vllm``: the vLLM
    interpreter of ``[model] provider = "vllm"``, one server rank 0 launches; ``base_model``
    and ``questions`` a step (with as many trajectories each) instead of the demo's); the
    step figures."""
    config = tomllib.loads(DEMO.read_text())
    config["train"].update(max_steps=steps, save_every=steps, eval_before_after=False)
    if base_model:
        config["model"]["base_model"] = base_model
    if questions:
        config["rollout"].update(questions_per_batch=questions, group_size=questions)
    if vllm:
        config["model"]["provider"] = "vllm"
        config["model"]["vllm"] = {
            "python": vllm,
            "adapters_dir": str(folder / f"adapters-{nproc}"),
            # vLLM-CPU reserves most of the RAM for its KV cache unless told a size
            "server_args": ["--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "64"],
        }
    else:
        local = config["model"].setdefault("local", {})
        local.update(threads=threads, fsdp=fsdp or lockstep)
        if lockstep:
            local["fsdp_sampling"] = "lockstep"
    name = f"{nproc}{'-fsdp' if fsdp else ''}{'-lockstep' if lockstep else ''}"
    name += "-vllm" if vllm else ""
    path = folder / f"config-{name}.toml"
    path.write_text(tomli_w.dumps(config))
    run_dir = folder / f"run-{name}"
    command = [sys.executable, "-m", "searchr1", "train", "--config", str(path)]
    command += ["--run-dir", str(run_dir)]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"{nproc} process(es) failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["event"] == "metrics"][1:]
    seconds = sum(m["time/step"] for m in metrics)
    # the first draw of every rank: questions_per_batch x group_size trajectories a step, each
    # with health/response_tokens sampled tokens on average
    trajectories = config["rollout"]["questions_per_batch"] * config["rollout"]["group_size"]
    sampled = sum(m["health/response_tokens"] * trajectories for m in metrics)
    return {
        "s_per_step": round(statistics.fmean(m["time/step"] for m in metrics), 3),
        "sampled_tokens_per_s": round(sampled / seconds, 1),
        "trained_tokens_per_s": round(sum(m["tokens/trained"] for m in metrics) / seconds, 1),
        "trajectories_per_step": trajectories,
        "threads_per_process": threads,
        "peak_rss_gb": max(m["memory/peak_rss_gb"] for m in metrics),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="per process; 0: cores / nproc")
    parser.add_argument("--check-equal", action="store_true", help="see the docstring")
    parser.add_argument("--device", default="cuda", help="--check-equal: cuda or cpu")
    parser.add_argument("--sampling", action="store_true", help="see the docstring")
    parser.add_argument("--vllm", default="", help="a vLLM python: 1 vs N processes on vllm")
    parser.add_argument("--layers", type=int, default=8, help="--sampling: decoder layers")
    parser.add_argument("--hidden", type=int, default=512, help="--sampling: hidden size")
    parser.add_argument("--rows", type=int, default=8, help="--sampling: sequences a rank")
    parser.add_argument("--prompt", type=int, default=64, help="--sampling: prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=48, help="--sampling: per row")
    parser.add_argument("--rollout-steps", type=int, default=3, help="--sampling: demo steps")
    parser.add_argument("--sampling-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check_equal:
        print(json.dumps(check_equal(args.device)))
        return
    if args.sampling_worker:
        sampling_worker(*args.sampling_worker, args)
        return
    if args.sampling:
        print(json.dumps(sampling(args)))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    result: dict[str, Any] = {"bench": "scale", "cores": cores, "load_avg": os.getloadavg()[0]}
    result["machine"] = platform.processor() or platform.machine()
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in (1, args.nproc):
            threads = args.threads or max(1, cores // nproc)
            result[f"nproc_{nproc}"] = run(Path(tmp), nproc, args.steps, threads)
        threads = args.threads or max(1, cores // args.nproc)
        sharded = run(Path(tmp), args.nproc, args.steps, threads, fsdp=True)
        result[f"nproc_{args.nproc}_fsdp"] = sharded
        if args.vllm:
            for nproc in (1, args.nproc):
                threads = args.threads or max(1, cores // nproc)
                result[f"vllm_nproc_{nproc}"] = run(
                    Path(tmp), nproc, args.steps, threads, vllm=args.vllm
                )
    one, many = result["nproc_1"], result[f"nproc_{args.nproc}"]
    result["speedup"] = round(one["s_per_step"] / many["s_per_step"], 2)
    result["speedup_fsdp"] = round(one["s_per_step"] / sharded["s_per_step"], 2)
    if args.vllm:
        one, many = result["vllm_nproc_1"], result[f"vllm_nproc_{args.nproc}"]
        result["speedup_vllm"] = round(one["s_per_step"] / many["s_per_step"], 2)
    print(json.dumps(result))


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    """``--sampling``: gathered vs lockstep FSDP2 sampling, one torchrun job each."""
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tiny_model

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads or max(1, (cores or 1) // args.nproc)
    result: dict[str, Any] = {"bench": "scale_sampling", "nproc": args.nproc, "cores": cores}
    result.update(load_avg=os.getloadavg()[0], threads_per_process=threads)
    result.update(layers=args.layers, hidden=args.hidden, rows=args.rows, prompt=args.prompt)
    result["new_tokens"] = args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "model",
            BUILTIN_TEXT,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=8,
            num_kv_heads=4,
            intermediate_size=args.hidden * 11 // 4,
        )
        # glibc hands large blocks straight back to the system when freed (a fixed mmap
        # threshold), so resident memory follows what is live, not the loading's high mark
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MALLOC_MMAP_THRESHOLD_": "65536"}
        for mode in ("gather", "lockstep"):
            out = Path(tmp) / mode
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            command += ["--nproc-per-node", str(args.nproc), __file__, "--sampling-worker"]
            command += [str(model), mode, str(out), "--threads", str(threads)]
            command += ["--rows", str(args.rows), "--prompt", str(args.prompt)]
            command += ["--new-tokens", str(args.new_tokens)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                sys.exit(f"--sampling {mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.nproc)]
            seconds = max(r["seconds"] for r in ranks)
            result[mode] = {
                "tokens_per_s": round(sum(r["tokens"] for r in ranks) / seconds, 1),
                "seconds": round(seconds, 2),
                "weights_peak_mb": [r["weights_peak_mb"] for r in ranks],
                "rss_peak_mb": [r["rss_peak_mb"] for r in ranks],
                "rss_before_mb": [r["rss_before_mb"] for r in ranks],
                "idle_forwards": [r["idle_forwards"] for r in ranks],
            }
        # the rollout on the same model: the demo's steps, sampled gathered or in lockstep
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # as above, for the runs' processes
        for mode in ("gather", "lockstep"):
            figures = run(
                Path(tmp),
                args.nproc,
                args.rollout_steps,
                threads,
                fsdp=True,
                lockstep=mode == "lockstep",
                base_model=str(model),
                questions=4,
            )
            result[f"rollout_{mode}"] = figures
    return result


def sampling_worker(model_dir: str, mode: str, out: str, args: argparse.Namespace) -> None:
    """One rank of ``--sampling``'s job: shard, warm up, sample, write ``rank{r}.json``."""
    import threading
    import time

    from searchr1.core.config_schema import Config
    from searchr1.core.distributed import World
    from searchr1.core.types import SamplingParams
    from searchr1.kit.learner.fsdp import Lockstep, shard_model
    from searchr1.kit.learner.loading import LocalSettings, load_lora_model
    from searchr1.plugins.local_model.sampler import BatchedSampler

    world = World.from_env()
    config = Config().replace(model={"base_model": model_dir, "dtype": "float32"})
    model, tokenizer, device, _ = load_lora_model(config, LocalSettings(threads=args.threads))
    sharding = shard_model(model, device)
    layers = sharding.units[:-1]
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page / 2**20

    def held() -> float:
        """Bytes of weights held now: FSDP's shards and gathered copies, the rest whole."""
        seen: dict[int, int] = {}
        for unit in sharding.units:
            for group in unit._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    for t in (fp._sharded_param_data, getattr(fp, "_unsharded_param", None)):
                        if t is not None:
                            storage = t.untyped_storage()
                            seen[storage.data_ptr()] = storage.nbytes()
        for p in model.parameters():
            storage = (p.to_local() if hasattr(p, "to_local") else p).untyped_storage()
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        seen.pop(0, None)  # freed (resharded) storages
        return sum(seen.values()) / 2**20

    peak = {"weights": 0.0, "rss": 0.0}

    def note(*_: Any) -> None:
        peak["weights"] = max(peak["weights"], held())
        peak["rss"] = max(peak["rss"], rss())

    for layer in layers:
        layer.register_forward_pre_hook(note)  # after FSDP's own hook gathered the layer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lockstep = None
    if mode == "gather":
        sharding.for_sampling()
    else:
        lockstep = Lockstep(model, device, pad)
    sampler = BatchedSampler(
        model,
        tokenizer,
        device=device,
        model_lock=threading.Lock(),
        context_length=int(model.config.max_position_embeddings),
        eos_token_ids=[],  # every row runs to its token budget
        pad_token_id=pad,
        vocab_size=int(model.config.vocab_size),
        lockstep=lockstep,
    )
    vocab = int(model.config.vocab_size)

    def requests(new: int) -> list[tuple[list[int], int, SamplingParams]]:
        return [
            (
                [(world.rank * 131 + i * 17 + k) % (vocab - 10) + 5 for k in range(args.prompt)],
                1,
                SamplingParams(max_tokens=new, temperature=1.0, seed=1000 * world.rank + i),
            )
            for i in range(args.rows)
        ]

    sampler.generate(requests(4))  # warm-up
    before = rss()
    peak.update(weights=0.0, rss=0.0)
    start = time.perf_counter()
    results = sampler.generate(requests(args.new_tokens + 16 * world.rank))
    seconds = time.perf_counter() - start
    tokens = sum(len(s.tokens) for samples in results for s in samples)
    Path(out).mkdir(parents=True, exist_ok=True)
    figures = {
        "tokens": tokens,
        "seconds": seconds,
        "weights_peak_mb": round(peak["weights"], 1),
        "rss_peak_mb": round(peak["rss"], 1),
        "rss_before_mb": round(before, 1),
        "idle_forwards": lockstep.idle_forwards if lockstep is not None else 0,
    }
    (Path(out) / f"rank{world.rank}.json").write_text(json.dumps(figures))


def check_equal(device_name: str) -> dict[str, Any]:
    """``--check-equal``: the LoRA weights after two steps unwrapped, data-parallel and
    FSDP2 on one rank (module docstring), and how far apart they are."""
    import time

    import torch
    import torch.distributed as dist

    from searchr1.core.config_schema import Config
    from searchr1.core.plugins import load_registry
    from searchr1.core.types import AdamParams
    from searchr1.kit.learner.fsdp import shard_model
    from searchr1.kit.learner.loading import LocalSettings, load_lora_model
    from searchr1.plugins.local_model.provider import LocalModelProvider
    from searchr1.plugins.losses import NamedLoss, importance_sampling

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from numerics import random_datums

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    loss = NamedLoss("importance_sampling", importance_sampling, {"kl_coef": 0.1})
    adam = AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)
    settings = LocalSettings(device=device_name, dtype="float32")
    config = Config(assets=load_registry().assets).replace(
        model={"base_model": "builtin:tiny", "temperature": 0.9, "dtype": "float32"},
        lora={"rank": 8, "alpha": 16.0, "dropout": 0.0},
    )

    def two_steps(fsdp: bool) -> tuple[dict[str, Any], float]:
        model, tokenizer, device, _ = load_lora_model(config, settings)
        sharding = shard_model(model, device) if fsdp else None
        provider = LocalModelProvider(
            model, tokenizer, device=device, temperature=0.9, settings=settings, sharding=sharding
        )
        vocab = model.config.vocab_size
        start = time.perf_counter()

        async def step(seed: int) -> None:
            for datum in random_datums(vocab, 6, seed=seed):
                await provider.forward_backward([datum], loss, 1.0 / 6)
            await provider.optim_step(adam)

        for seed in (1, 2):
            asyncio.run(step(seed))
        seconds = time.perf_counter() - start
        named = dict(provider.model.named_parameters())
        weights = {n: named[n].detach().float().cpu().clone() for n in provider.learner.param_names}
        provider.close()
        return weights, seconds

    unwrapped, t_unwrapped = two_steps(fsdp=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    backend = "nccl" if device_name.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        parallel, t_parallel = two_steps(fsdp=False)
        sharded, t_sharded = two_steps(fsdp=True)
    finally:
        dist.destroy_process_group()

    def distance(other: dict[str, Any]) -> float:
        return max(float((other[n] - w).abs().max()) for n, w in unwrapped.items())

    scale = max(float(w.abs().max()) for w in unwrapped.values())
    # float32, same kernels and one rank: only reduction order can differ (u32 = 6e-8 per
    # rounding over a few hundred terms); a wrong gradient scale or stale reference moves the
    # weights by O(lr) = 1e-2
    tolerance = 1e-5 * max(1.0, scale)
    result = {
        "bench": "scale_check_equal",
        "device": torch.cuda.get_device_name() if backend == "nccl" else "cpu",
        "backend": backend,
        "lora_max_abs": scale,
        "data_parallel_max_diff": distance(parallel),
        "fsdp_max_diff": distance(sharded),
        "tolerance": tolerance,
        "seconds": {"unwrapped": t_unwrapped, "data_parallel": t_parallel, "fsdp": t_sharded},
    }
    result["equal"] = max(result["data_parallel_max_diff"], result["fsdp_max_diff"]) <= tolerance
    return result


if __name__ == "__main__":
    main()

"""searchr1's train step vs TRL's GRPOTrainer on the same tiny model, batch and group size.

    python bench/vs_trl.py            # 6 timed steps each (after 1 warm-up step)
    python bench/vs_trl.py --quick    # 2 timed steps each
    python bench/vs_trl.py --threads 1  # both sides on 1 torch thread (a busy, shared CPU)

Both sides: the warm-started tiny model (``builtin:tiny``), LoRA (same rank, alpha, target
modules) through peft, 8 questions x 8 samples per step, the same max new tokens, temperature
1, no KL term, one optimizer step per generation batch, generation stopping at the protocol's
stop tags (``</search>``, ``</answer>``) and eos on both sides. TRL runs its *single-turn* GRPO
(it has no search tool loop), so searchr1 runs with ``max_search_calls = 0`` and one assistant
turn: both sample one completion per trajectory and train on it. Rewards: searchr1's
``format_answer`` reward on both sides.

Each side runs in its own subprocess so peak RSS (``ru_maxrss``) is its own. Prints one line
per side, then one JSON line with ``searchr1_step_s``, ``trl_step_s``, ``ratio`` (trl over
searchr1), tokens/s and peak memory of both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS, GROUP, MAX_NEW, RANK, ALPHA, LR = 8, 8, 48, 16, 32, 1e-4
BASE_MODEL = os.environ.get("BENCH_BASE_MODEL", "builtin:tiny")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_searchr1(steps: int, threads: int = 0, old_learner: bool = False) -> dict[str, float]:
    import dataclasses

    from searchr1.core.config import load_config
    from searchr1.core.plugins import load_registry
    from searchr1.core.runs import open_run
    from searchr1.core.train import train

    registry = load_registry()
    config = load_config(None, registry=registry).replace(
        model={
            "base_model": BASE_MODEL,
            "max_new_tokens": MAX_NEW,
            "temperature": 1.0,
            "top_p": 1.0,
        },
        lora={
            "rank": RANK,
            "alpha": float(ALPHA),
            "dropout": 0.0,
            "target_modules": tuple(TARGETS),
        },
        rollout={
            "questions_per_batch": QUESTIONS,
            "group_size": GROUP,
            "max_search_calls": 0,
            "max_assistant_turns": 1,
            "dynamic_sampling": False,
        },
        train={
            "max_steps": steps + 1,
            "save_every": 10_000,
            "eval_before_after": False,
            "dump_trajectories": 0,
        },
        optimizer={"lr": LR},
    )
    local: dict[str, object] = {"threads": threads} if threads else {}
    if old_learner:  # one vocabulary projection for all trained positions, no shared prompts
        local.update(learner_logit_chunk=0, learner_share_prefixes=False)
    if local:
        config = dataclasses.replace(config, plugins={**config.plugins, "model.local": local})
    run_dir = Path(tempfile.mkdtemp(prefix="bench-searchr1-"))
    run = open_run(
        config, "train", registry=registry, run_dir=str(run_dir), stream=open(os.devnull, "w")
    )
    train(run)
    from searchr1.core.logs import read_jsonl

    events = read_jsonl(run_dir / "events.jsonl")[0]
    steps_m = [e for e in events if e["event"] == "metrics"][1:]  # drop the warm-up step
    step_s = sum(e["time/step"] for e in steps_m) / len(steps_m)
    trajectories = config.rollout.questions_per_batch * config.rollout.group_size
    tokens = sum(e["health/response_tokens"] * trajectories for e in steps_m) / len(steps_m)
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "peak_mb": _peak_mb()}


def run_trl(steps: int, threads: int = 0) -> dict[str, float]:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from searchr1.core.answers import exact_match
    from searchr1.core.assets import resolve
    from searchr1.core.config import load_config
    from searchr1.core.data import load_questions
    from searchr1.core.plugins import load_registry
    from searchr1.core.protocols import make_protocol

    config = load_config(None, registry=load_registry())
    path = resolve(BASE_MODEL, config.assets)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    protocol = make_protocol(config, tokenizer, load_registry())
    questions = list(load_questions(config.data.train, config.assets).questions)[
        : QUESTIONS * (steps + 1)
    ]
    data = Dataset.from_list(
        [{"prompt": protocol.render_prompt(q), "golden": list(q.golden_answers)} for q in questions]
    )

    def reward(completions: list[str], golden: list[list[str]], **_: object) -> list[float]:
        out = []
        for text, answers in zip(completions, golden, strict=True):
            found = protocol.extract_answers(text)
            out.append(-0.1 if len(found) != 1 else float(exact_match(found[0], answers)))
        return out

    stop_ids = [
        tokenizer.eos_token_id,
        *tokenizer.convert_tokens_to_ids(["</search>", "</answer>"]),
    ]
    times: list[float] = []
    sampled: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and "completions/mean_length" in logs:
                sampled.append(logs["completions/mean_length"] * QUESTIONS * GROUP)

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=QUESTIONS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=LR,
        max_steps=steps + 1,
        logging_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        # Stop where searchr1's rollout stops (the protocol's closing tags are single tokens),
        # so both sides sample the same kind of completion rather than running on to max length.
        generation_kwargs={"eos_token_id": stop_ids},
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS),
        callbacks=[Timer()],
    )
    trainer.train()
    step_s = sum(times[1:]) / len(times[1:])
    per_step_tokens = sum(sampled[1:]) / len(sampled[1:])
    return {"step_s": step_s, "tokens_per_s": per_step_tokens / step_s, "peak_mb": _peak_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--side", choices=["searchr1", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help="torch threads, both sides")
    parser.add_argument(
        "--old-learner",
        action="store_true",
        help="searchr1's learner unchunked (learner_logit_chunk = 0, no shared prefixes)",
    )
    args = parser.parse_args()
    steps = 2 if args.quick else 6
    if args.side:
        if args.side == "searchr1":
            result = run_searchr1(steps, args.threads, args.old_learner)
        else:
            result = run_trl(steps, args.threads)
        print("RESULT " + json.dumps(result))
        return
    results = {}
    for side in ("searchr1", "trl"):
        cmd = [sys.executable, __file__, "--side", side, "--threads", str(args.threads)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--old-learner"] if args.old_learner else []
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        results[side] = json.loads(line[len("RESULT ") :])
        r = results[side]
        print(
            f"{side:>8}: {r['step_s']:.2f} s/step, {r['tokens_per_s']:.0f} sampled tokens/s, "
            f"peak RSS {r['peak_mb']:.0f} MB"
        )
    s, t = results["searchr1"], results["trl"]
    print(
        json.dumps(
            {
                "searchr1_step_s": round(s["step_s"], 3),
                "trl_step_s": round(t["step_s"], 3),
                "ratio": round(t["step_s"] / s["step_s"], 2),
                "searchr1_tokens_per_s": round(s["tokens_per_s"], 1),
                "trl_tokens_per_s": round(t["tokens_per_s"], 1),
                "searchr1_peak_mb": round(s["peak_mb"]),
                "trl_peak_mb": round(t["peak_mb"]),
                "questions": QUESTIONS,
                "group_size": GROUP,
                "max_new_tokens": MAX_NEW,
                "steps": steps,
                "threads": args.threads,
                "old_learner": args.old_learner,
            }
        )
    )


if __name__ == "__main__":
    main()

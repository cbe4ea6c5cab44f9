"""Pipelined steps through the remote provider: the real ``pytrio`` SDK over loopback HTTP to
``tests/fake_pytrio_service.py``, ``forward_backward``/``optim_step`` in the pipeline's worker
thread while the next step samples in the event loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytrio")

from fake_pytrio_service import API_KEY, FakePyTrio  # noqa: E402

from searchr1.core.hookspecs import hookimpl  # noqa: E402

CONFIG = """
[run]
seed = 3
[model]
provider = "taotoken"
api_base = "{api_base}"
api_key = "${{TAOTOKEN_API_KEY}}"
base_model = "builtin:tiny-random"
temperature = 1.0
top_p = 1.0
max_new_tokens = 12
[model.taotoken]
sdk_home = "{home}"
retry_timeout_seconds = 5.0
[lora]
rank = 4
alpha = 8
dropout = 0.0
[rollout]
protocol = "tags"
questions_per_batch = 2
group_size = 2
max_search_calls = 1
max_assistant_turns = 2
max_trajectory_tokens = 256
max_observation_tokens = 32
[reward]
name = "token_checksum"
[search]
provider = "local"
top_k = 1
[search.local]
corpus = "builtin:world/corpus.jsonl"
[train]
max_steps = 3
save_every = 3
max_staleness = 1
max_datum_tokens = 512
max_micro_batch_datums = 2
max_micro_batch_tokens = 1024
dump_trajectories = 8
[optimizer]
lr = 5e-3
[data]
train = "builtin:world/train.jsonl"
"""


class ChecksumReward:
    """A reward that differs between trajectories, so every step sends datums to the service
    (the untrained random model never answers right)."""

    @staticmethod
    def score(trajectory, golden_answers):  # noqa: ANN001, ANN205
        from searchr1.core.types import RewardResult

        return RewardResult(reward=(sum(trajectory.tokens) % 7) / 6.0)

    @hookimpl
    def register_rewards(self, register):  # noqa: ANN001, ANN201
        register("token_checksum", lambda config: self.score)


@pytest.mark.slow
def test_pipelined_steps_train_through_the_remote_service(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchr1.cli.main import main as cli
    from searchr1.core import plugins, runs

    real = plugins.load_registry
    plugin = ChecksumReward()
    monkeypatch.setattr(runs, "load_registry", lambda extra=(): real([plugin, *extra]))
    monkeypatch.setenv("TAOTOKEN_API_KEY", API_KEY)
    with FakePyTrio() as fake:
        config = tmp_path / "config.toml"
        config.write_text(CONFIG.format(api_base=fake.base_url, home=tmp_path / "home"))
        run = tmp_path / "run"
        assert cli(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = {e["step"]: e for e in events if e.get("event") == "metrics"}
    assert sorted(steps) == [1, 2, 3]
    # step s + 1 sampled on version s - 1 while step s trained on the service
    assert [steps[s]["staleness/max"] for s in (1, 2, 3)] == [0, 1, 1]
    for step, m in steps.items():
        assert m["tokens/trained"] > 0 and m["mismatch/tokens"] == m["tokens/trained"]
        rows = (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        assert {json.loads(r)["policy_version"] for r in rows} == {max(0, step - 2)}
    assert steps[1]["pipeline/overlap_s"] > 0  # step 2's rollout ran during step 1's training
    assert any((run / "checkpoints" / "step_000003").rglob("remote_checkpoint.json"))

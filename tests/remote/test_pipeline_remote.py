"""Pipelined steps through the remote provider: the real ``pytrio`` SDK over loopback HTTP to
``tests/helpers/fake_pytrio_service.py``, ``forward_backward``/``optim_step`` in the pipeline's worker
thread while the next step samples in the event loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("pytrio")

from fake_pytrio_service import API_KEY, FakePyTrio  # noqa: E402
from remote_cli import ChecksumRewardPlugin, metric_events, write_cli_config  # noqa: E402


@pytest.mark.slow
def test_pipelined_steps_train_through_the_remote_service(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchr1.cli.main import main
    from searchr1.core.plugins import load_registry

    registry = load_registry([ChecksumRewardPlugin()])  # every command runs with its reward

    def cli(argv: list[str]) -> int:
        return main(argv, registry=registry)

    monkeypatch.setenv("TAOTOKEN_API_KEY", API_KEY)
    with FakePyTrio() as fake:
        config = write_cli_config(
            tmp_path / "cfg",
            f'provider = "taotoken"\napi_base = "{fake.base_url}"\n'
            'api_key = "${TAOTOKEN_API_KEY}"',
            f'[model.taotoken]\nsdk_home = "{tmp_path / "home"}"\nretry_timeout_seconds = 5.0',
        )
        # one checkpoint, at the end: no barrier inside the three steps
        text = config.read_text(encoding="utf-8")
        text = text.replace("save_every = 2\n", "save_every = 3\nmax_staleness = 1\n")
        config.write_text(text, encoding="utf-8")
        run = tmp_path / "run"
        assert cli(["train", "--config", str(config), "--run-dir", str(run)]) == 0
    steps = metric_events(run)
    assert sorted(steps) == [1, 2, 3]
    # step s + 1 sampled on version s - 1 while step s trained on the service
    assert [steps[s]["staleness/max"] for s in (1, 2, 3)] == [0, 1, 1]
    for step, m in steps.items():
        assert m["tokens/trained"] > 0 and math.isfinite(m["mismatch/kl_sample_train"])
        rows = (run / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        assert {json.loads(r)["policy_version"] for r in rows} == {max(0, step - 2)}
    assert steps[1]["pipeline/overlap_s"] > 0  # step 2's rollout ran during step 1's training
    assert any((run / "checkpoints" / "step_000003").rglob("remote_checkpoint.json"))

"""Step monitors in a real ``searchr1 train`` run: the documented third-party monitor's
metrics reach every step's ``metrics`` event, its alert the warnings, its state the
checkpoints and its totals ``train_done``; ``[train] monitors = []`` turns them all off."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_run import read_events

from searchr1.cli.main import main as cli
from searchr1.core.errors import PluginError
from searchr1.core.plugins import load_registry

ROOT = Path(__file__).resolve().parents[2]


def _documented_monitor() -> SimpleNamespace:
    """The python example of docs/plugins.md's ``register_step_monitors`` section, as a module."""
    doc = (ROOT / "docs" / "plugins.md").read_text()
    body = re.search(r"^## register_step_monitors\n(.*?)(?=^## |\Z)", doc, re.M | re.S).group(1)
    code = re.findall(r"```python\n(.*?)```", body, flags=re.S)[-1]
    module = SimpleNamespace()
    exec(compile(code, "docs/plugins.md#register_step_monitors", "exec"), module.__dict__)
    return module


def _train(tmp_path: Path, train: str, extra: str = "") -> list[dict]:
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"q{i}?", "golden_answers": ["Paris"]}) + "\n" for i in range(8)
        )
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[run]\ndir = "{tmp_path / "runs"}"\n'
        '[model]\nprovider = "scripted"\nmax_new_tokens = 64\n'
        '[model.scripted]\nturns = [["<answer> Paris </answer>"], ["<answer> Lyon </answer>"]]\n'
        '[rollout]\nprotocol = "tags"\nquestions_per_batch = 1\ngroup_size = 2\n'
        "max_trajectory_tokens = 512\n"
        f"[train]\nmax_steps = 2\nsave_every = 2\nmax_datum_tokens = 512\n{train}\n"
        f'[data]\ntrain = "{data}"\n'
        '[search]\nprovider = "local"\n[search.local]\ncorpus = "builtin:world/corpus.jsonl"\n'
        + extra
    )
    run_dir = tmp_path / "run"
    assert cli(["train", "--config", str(config), "--run-dir", str(run_dir)]) == 0
    return read_events(run_dir)


@pytest.fixture
def documented_monitor(scripted_plugin, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registry a command loads also holds the documented monitor (a third party's)."""
    from searchr1.core import plugins

    with_scripted = plugins.load_registry
    module = _documented_monitor()
    monkeypatch.setattr(plugins, "load_registry", lambda extra=(): with_scripted([module, *extra]))


def test_a_documented_monitor_reports_metrics_alerts_state_and_totals(
    tmp_path: Path, documented_monitor
) -> None:
    events = _train(
        tmp_path,
        'monitors = ["health", "answer_length"]',
        "[train.answer_length]\nmax_chars = 3\n",
    )
    metrics = [e for e in events if e["event"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["answers/chars"] == pytest.approx(4.5)  # "Paris" and "Lyon"
        assert "health/response_tokens" in m  # the built-in listed beside it
    alerts = [e for e in events if e["event"] == "health_alert"]
    long = [a for a in alerts if a["kind"] == "long_answers"]
    assert len(long) == 1 and long[0]["level"] == "warning" and long[0]["step"] == 1
    assert long[0]["message"] == "step 1: answers average 4 characters"
    (done,) = [e for e in events if e["event"] == "train_done"]
    assert done["steps_with_long_answers"] == 2
    state = json.loads(
        (tmp_path / "run" / "checkpoints" / "step_000002" / "trainer.json").read_text()
    )
    assert state["answer_length"] == {"long_steps": 2} and "health" in state
    assert "run_notices" not in state  # not listed, not created


def test_no_monitors_means_no_health_metrics_and_no_alerts(tmp_path: Path, scripted_plugin) -> None:
    events = _train(tmp_path, "monitors = []", "[train.health]\nbaseline_steps = 2\n")
    metrics = [e for e in events if e["event"] == "metrics"]
    assert len(metrics) == 2 and "reward/mean" in metrics[0]
    assert not [k for m in metrics for k in m if k.startswith("health/")]
    assert not [e for e in events if e["event"] == "health_alert"]
    assert any(e["event"] == "importance_ratio" for e in events)  # the core's, not a monitor's


def test_a_monitor_name_the_checkpoint_keeps_for_the_core_is_refused() -> None:
    from searchr1.core.config import parse_config
    from searchr1.core.hookspecs import hookimpl
    from searchr1.core.step_monitors import open_monitors

    class Clash:
        @hookimpl
        def register_step_monitors(self, register):
            register("data", lambda config: None)
            register("half", lambda config: object())

    registry = load_registry(extra_plugins=[Clash()])
    for name, error in (("data", "keeps for the core"), ("half", "without observe, state")):
        config = parse_config(f'[train]\nmonitors = ["{name}"]\n', source="t.toml", env={})
        with pytest.raises(PluginError, match=error):
            open_monitors(config, registry)


def test_a_checkpoint_state_with_health_under_its_name_resumes_the_health_monitor() -> None:
    from searchr1.core.config import parse_config
    from searchr1.core.step_monitors import open_monitors

    saved = {
        "step": 4,
        "python_rng": [],
        "data": {},
        "health": {"length_baseline": [12.0], "ema": {"health/entropy": 1.5}},
    }
    monitors = open_monitors(parse_config("", source="t.toml", env={}), load_registry())
    monitors.load_state(saved)  # "run_notices" has no entry: it starts afresh
    state = monitors.state()
    assert state["health"]["length_baseline"] == [12.0]
    assert state["health"]["ema"] == {"health/entropy": 1.5}
    assert state["run_notices"] == {"counts": {}, "raised": []}

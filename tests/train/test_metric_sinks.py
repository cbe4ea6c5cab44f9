"""Metric sinks ([log] sinks): TensorBoard event files from a real 2-step run, failing sinks
that never stop training, no secret reaching any sink, and the errors a user can fix."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from cli_run import make_config, read_events
from train_configs import TINY_TRAIN

from searchr1.cli import main as cli
from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError, UserError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import PluginError, load_registry
from searchr1.core.sinks import open_sinks
from searchr1.core.types import MetricSink

CANARY_ENV = "sk-canary-from-env-7f3a9c"
CANARY_LITERAL = "sk-canary-literal-2b8e61"


class Recorder:
    """A third-party sink that keeps everything it is given (so the test can look for
    secrets in exactly what a sink receives)."""

    instances: list[Recorder] = []

    def __init__(self, config, run_dir: Path):
        self.run_dir = run_dir
        self.calls: list[tuple] = []
        Recorder.instances.append(self)

    def log_hparams(self, config):
        self.calls.append(("hparams", config))

    def log_scalars(self, step, scalars):
        self.calls.append(("scalars", step, dict(scalars)))

    def log_texts(self, step, name, texts):
        self.calls.append(("texts", step, name, list(texts)))

    def close(self):
        self.calls.append(("close",))


class Broken:
    """A sink whose every call fails, like a tracker whose disk filled up."""

    def __init__(self, config, run_dir):
        pass

    def log_hparams(self, config):
        raise OSError(f"No space left on device (key {CANARY_ENV})")

    log_scalars = log_texts = close = log_hparams


class TestSinks:
    @hookimpl
    def register_metric_sinks(self, register):
        register("recorder", Recorder)
        register("broken", Broken)
        register("unreachable", self._unreachable)

    @staticmethod
    def _unreachable(config, run_dir):
        raise ConnectionError("tracker.example: connection refused")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[Recorder]]:
    """One real 2-step run of the tiny model with TensorBoard, a recording sink, a sink that
    always raises and one that cannot connect; the config holds two canary secrets."""

    tmp = tmp_path_factory.mktemp("sinks")
    config = make_config(
        TINY_TRAIN,
        train={"max_steps": 2},
        search={"api_keys": CANARY_LITERAL},
        log={
            "sinks": ["tensorboard", "recorder", "broken", "unreachable"],
            "recorder": {"token": "${RECORDER_TOKEN}"},
        },
    )
    (tmp / "config.toml").write_text(config)
    mp = pytest.MonkeyPatch()
    mp.setenv("RECORDER_TOKEN", CANARY_ENV)
    Recorder.instances.clear()
    try:
        rc = cli.main(
            ["train", "--config", str(tmp / "config.toml"), "--run-dir", str(tmp / "r")],
            registry=load_registry([TestSinks()]),
        )
    finally:
        mp.undo()
    return tmp / "r", rc, list(Recorder.instances)


@pytest.mark.slow
def test_tensorboard_event_files_hold_every_step(trained) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir, rc, _ = trained
    assert rc == 0
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    metrics = {e["step"]: e for e in read_events(run_dir, "metrics")}
    got = {e.step: e.value for e in acc.Scalars("reward/mean")}
    assert sorted(got) == [1, 2]
    for step, value in got.items():
        assert value == pytest.approx(metrics[step]["reward/mean"], abs=1e-6)
    assert "search/success_rate" in acc.Tags()["scalars"]
    texts = acc.Tensors("trajectories/text_summary")
    assert [t.step for t in texts] == [1, 2]
    assert "question:" in texts[0].tensor_proto.string_val[0].decode()
    start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["train.max_steps"].number_value == 2
    assert hparams["log.sinks"].string_value.startswith('["tensorboard"')


@pytest.mark.slow
def test_failing_sinks_warn_once_and_training_finishes(trained) -> None:
    run_dir, rc, _ = trained
    assert rc == 0
    events = read_events(run_dir)
    assert [e["steps"] for e in events if e["event"] == "train_done"] == [2]
    failed = [e for e in events if e["event"] == "sink_failed"]
    assert [(e["sink"], e["method"]) for e in failed] == [
        ("unreachable", "open"),
        ("broken", "log_hparams"),
    ]
    assert all(e["level"] == "warning" for e in failed)
    assert "No space left on device" in failed[1]["error"]
    # later failures are counted once, at the end: hparams, 2 x (scalars, texts), close
    counted = [e for e in events if e["event"] == "sink_failures"]
    assert [(e["sink"], e["failures"]) for e in counted] == [("broken", 6)]


@pytest.mark.slow
def test_no_sink_receives_a_secret(trained) -> None:
    run_dir, rc, recorders = trained
    assert rc == 0
    (recorder,) = recorders
    kinds = [c[0] for c in recorder.calls]
    assert kinds[0] == "hparams" and kinds[-1] == "close" and kinds.count("hparams") == 1
    assert recorder.calls[0][1]["log"]["recorder"]["token"] == "***"
    assert recorder.calls[0][1]["search"]["api_keys"] == ["***"]
    steps = [c[1] for c in recorder.calls if c[0] == "scalars"]
    assert steps == [1, 2]
    assert any(c[0] == "texts" and c[2] == "trajectories" and c[3] for c in recorder.calls)
    received = repr(recorder.calls)
    on_disk = b"".join(p.read_bytes() for p in (run_dir / "tensorboard").rglob("*") if p.is_file())
    jsonl = (run_dir / "events.jsonl").read_text()
    for canary in (CANARY_ENV, CANARY_LITERAL):
        assert canary not in received
        assert canary.encode() not in on_disk
        assert canary not in jsonl


def test_unknown_sink_name_suggests_the_right_one(tmp_path: Path, config_file, run_cli) -> None:
    config = config_file('[log]\nsinks = ["tensorbord"]\n', "c.toml")
    result = run_cli("train", "--config", config, "--run-dir", tmp_path)
    err = result.err
    assert result.code == 2
    assert "log.sinks = 'tensorbord'" in err and "did you mean 'tensorboard'?" in err.lower()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[log]\nsinks = ["tensorboard", "tensorboard"]\n', "lists 'tensorboard' more than once"),
        ('[log]\nsinks = [""]\n', "must not contain an empty name"),
        ('[log]\nsink = ["tensorboard"]\n', "did you mean 'sinks'?"),
        ("[log]\nsinks = 3\n", "log.sinks must be a list of str"),
    ],
)
def test_log_section_is_validated(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_config(text, source="c.toml", env={}, registry=load_registry())


def test_sinks_may_come_from_one_variable() -> None:
    cfg = parse_config(
        '[log]\nsinks = "${SINKS}"\n',
        source="c.toml",
        env={"SINKS": "a, b"},
        registry=load_registry(),
    )
    assert cfg.log.sinks == ("a", "b")
    assert parse_config("", source="c.toml", env={}, registry=load_registry()).log.sinks == ()


@pytest.mark.parametrize(
    ("sink", "module", "install"),
    [
        ("wandb", "wandb", "searchr1[wandb]"),
        ("swanlab", "swanlab", "searchr1[swanlab]"),
        ("tensorboard", "torch.utils.tensorboard", "tensorboard>=2.14"),
    ],
)
def test_missing_package_names_the_install(
    sink: str, module: str, install: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what `import` sees when it is absent
    cfg = parse_config(
        f'[log]\nsinks = ["{sink}"]\n', source="c.toml", env={}, registry=load_registry()
    )
    with pytest.raises(UserError, match=re.escape(f"pip install '{install}'")):
        open_sinks(cfg, load_registry(), tmp_path)


def test_bad_sink_table_stops_at_start(tmp_path: Path) -> None:
    cfg = parse_config(
        '[log]\nsinks = ["tensorboard"]\n[log.tensorboard]\ndri = "x"\n',
        source="c.toml",
        env={},
        registry=load_registry(),
    )
    with pytest.raises(ConfigError, match="did you mean 'dir'"):
        open_sinks(cfg, load_registry(), tmp_path)


def test_unknown_sink_name_is_a_plugin_error(tmp_path: Path) -> None:
    cfg = parse_config(
        '[log]\nsinks = ["wandbb"]\n', source="c.toml", env={}, registry=load_registry()
    )
    with pytest.raises(PluginError, match="did you mean 'wandb'"):
        open_sinks(cfg, load_registry(), tmp_path)


def test_recorder_satisfies_the_protocol(tmp_path: Path) -> None:
    assert isinstance(Recorder(None, tmp_path), MetricSink)


def test_tensorboard_keeps_one_point_per_step_after_a_resume(tmp_path: Path) -> None:
    """A run killed after logging step 4 but checkpointed at step 2 resumes at step 3: the
    curve shows the resumed run's steps 3 and 4, not both runs' points."""
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = parse_config(
        '[log]\nsinks = ["tensorboard"]\n', source="c.toml", env={}, registry=load_registry()
    )
    first = open_sinks(cfg, load_registry(), tmp_path / "run")
    for step in (1, 2, 3, 4):
        first.scalars(step, {"reward/mean": 0.1 * step})
    first.close()
    time.sleep(1.1)  # event files are named by the second they were opened in
    resumed = open_sinks(cfg, load_registry(), tmp_path / "run")
    for step in (3, 4):
        resumed.scalars(step, {"reward/mean": 0.9})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = [(e.step, round(e.value, 3)) for e in acc.Scalars("reward/mean")]
    assert got == [(1, 0.1), (2, 0.2), (3, 0.9), (4, 0.9)]

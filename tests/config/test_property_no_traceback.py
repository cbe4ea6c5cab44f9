"""Whatever the config or the command line, the CLI answers with an exit code (0, 1, 2 or 3)
and a message, never a traceback.

Property tests (hypothesis) run the real CLI in-process (``searchr1.cli.main.main``), which
is what the ``searchr1`` console script calls, so an exception escaping ``main`` is exactly
a traceback a user would see. To stay fast no example loads a model: generated configs go
through ``config check`` (everything ``train`` checks before its model load), and generated
command lines for ``train``/``smoke``/``eval`` use configs whose model cannot load (an absent
``base_model`` folder, refused in milliseconds) or fail validation earlier. A few cases run
as real subprocesses to see the console exactly as a user does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.cli.main import main
from searchr1.core.config_schema import SECTIONS

ALLOWED = {0, 1, 2, 3}
FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


@contextlib.contextmanager
def _workspace() -> Iterator[Path]:
    """A project folder with data, configs and folders the generated arguments point at.
    Created per test (not a pytest fixture: hypothesis reuses one test call for all its
    examples), entered as the working directory, environment without stray configs."""
    old_cwd, old_env = os.getcwd(), dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        row = {"question": "Where was Ada born?", "answers": ["London"]}
        (root / "d.jsonl").write_text(json.dumps(row) + "\n{bad\n")
        (root / "afile").write_text("x")
        (root / "adir").mkdir()
        ckpt = root / "runs" / "train-1" / "checkpoints" / "step_000001"
        (ckpt / "model").mkdir(parents=True)
        (ckpt / "trainer.json").write_text('{"step": 1, "data": {"epoch": 0')
        (root / "nomodel.toml").write_text(
            '[model]\nbase_model = "./no-such-model"\n[search.local]\n'
            'corpus = "builtin:world/corpus.jsonl"\n[data]\ntrain = "d.jsonl"\n'
            'eval = "d.jsonl"\n[run]\ndir = "runs"\n'
        )
        # a model that is here: these cases want errors found after the config's own checks
        text = (root / "nomodel.toml").read_text().replace("./no-such-model", "builtin:tiny")
        (root / "tiny.toml").write_text(text)
        (root / "typo.toml").write_text('[search]\nprovider = "zhiu"\n')
        (root / "empty.toml").write_text("# nothing\n")
        (root / "latin1.toml").write_bytes(b'[run]\nname = "caf\xe9"\n')
        os.chdir(root)
        for var in ("SEARCHR1_CONFIG", "TAOTOKEN_API_KEY", "ZHIHU_SEARCH_KEYS"):
            os.environ.pop(var, None)
        try:
            yield root
        finally:
            os.chdir(old_cwd)
            os.environ.clear()
            os.environ.update(old_env)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)  # an exception escaping here is a user-visible traceback
    text = out.getvalue() + err.getvalue()
    assert rc in ALLOWED, (argv, rc, text[-2000:])
    assert "Traceback" not in text, (argv, text[-2000:])
    return rc, text


# ------------------------------------------------------------------ generated configs

_WORDS = [
    "local",
    "lcoal",
    "zhihu",
    "zhiu",
    "search_r1",
    "format_answer",
    "importance_sampling",
    "ppo",
    "tags",
    "tool_calls",
    "builtin:tiny",
    "builtin:world/train.jsonl",
    "nope.jsonl",
    "d.jsonl",
    "htp://h/v1",
    "h.example/v1",
    "https://h.example/v1?key=${TAOTOKEN_API_KEY}",
    "${UNSET_VARIABLE}",
    "${HOME}",
    "",
    "auto",
    "cpu",
]
_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(_WORDS),
    st.text(max_size=12),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))
_fields = {name: [f for f in cls.__dataclass_fields__] for name, cls in SECTIONS.items()}


@st.composite
def _config_tables(draw: st.DrawFn) -> dict:
    doc: dict = {}
    for section in draw(
        st.lists(st.sampled_from([*SECTIONS, "modle", "serach"]), max_size=5, unique=True)
    ):
        known = _fields.get(section, ["x"])
        keys = st.one_of(st.sampled_from(known), st.sampled_from([k + "s" for k in known]))
        table = draw(st.dictionaries(keys, _values, max_size=4))
        if draw(st.booleans()):
            name = draw(st.sampled_from(["local", "lcoal", "zhihu", "loss", "x", "openai_chat"]))
            table[name] = draw(
                st.dictionaries(st.sampled_from(["corpus", "api_base", "k"]), _values, max_size=2)
            )
        doc[section] = table if draw(st.integers(0, 9)) else draw(_scalars)
    return doc


@FAST
@given(doc=_config_tables())
def test_any_generated_config_gets_a_clear_answer_from_config_check(doc: dict) -> None:
    with _workspace() as root:
        (root / "gen.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")
        _run(["config", "check", "--config", "gen.toml"])


@FAST
@given(doc=_config_tables())
def test_any_generated_config_gets_a_clear_answer_from_train(doc: dict) -> None:
    """Past ``config check`` up to the model load: the model is forced to the local provider
    with a base model that does not exist, so a config that passes every check stops there
    (exit 2) instead of training."""
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    doc["model"] = {**model, "provider": "local", "base_model": "./no-such-model"}
    data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
    doc["data"] = {"train": "d.jsonl", **data}  # so more examples get past the data load
    with _workspace() as root:
        (root / "gen.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")
        _run(["train", "--config", "gen.toml"])  # run.dir as generated


@FAST
@given(data=st.binary(max_size=200))
def test_any_bytes_as_a_config_get_a_clear_answer(data: bytes) -> None:
    with _workspace() as root:
        (root / "gen.toml").write_bytes(data)
        rc, _ = _run(["config", "check", "--config", "gen.toml"])
        assert rc in (0, 2)


# ------------------------------------------------------------------ generated command lines

_numbers = st.one_of(
    st.integers(min_value=-3, max_value=3).map(str), st.sampled_from(["x", "1.5", "", "-0"])
)
_paths = st.sampled_from(["afile", "adir", "nowhere", "runs", "runs/train-1", "d.jsonl", ""])
_configs = st.sampled_from(
    ["nomodel.toml", "typo.toml", "empty.toml", "latin1.toml", "missing.toml", "adir"]
)


@st.composite
def _argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["train", "smoke", "eval", "config", "data", "report"]))
    if command == "config":
        return ["config", "check", "--config", draw(_configs)]
    if command == "data":
        return ["data", "check", draw(_paths)]
    if command == "report":
        return ["report", draw(_paths)]
    argv = [command, "--config", draw(_configs)]  # never the embedded demo: no real run
    options = {
        "train": ["--max-steps", "--run-dir", "--resume"],
        "smoke": ["--group-size", "--max-search-calls", "--run-dir", "--question"],
        "eval": ["--checkpoint", "--limit-per-source", "--data", "--run-dir", "--sample"],
    }[command]
    for option in draw(st.lists(st.sampled_from(options), max_size=3, unique=True)):
        if option in ("--resume", "--sample"):
            argv.append(option)
        elif option in ("--run-dir", "--data", "--checkpoint"):
            argv += [
                option,
                draw(st.one_of(_paths, st.just("runs/train-1/checkpoints/step_000001"))),
            ]
        elif option == "--question":
            argv += [option, draw(st.text(max_size=10))]
        else:
            argv += [option, draw(_numbers)]
    return argv


@FAST
@given(argv=_argv())
def test_any_command_line_gets_an_exit_code_not_a_traceback(argv: list[str]) -> None:
    with _workspace():
        _run(argv)


# ------------------------------------------------------------------ as a user sees it


@pytest.mark.slow
def test_in_a_real_process_errors_are_one_message() -> None:
    with _workspace() as root:
        cases = [
            (["train", "--max-steps", "-1"], 2, "--max-steps"),
            (["config", "check", "--config", "latin1.toml"], 2, "UTF-8"),
            (["train", "--config", "tiny.toml", "--resume"], 2, "trainer.json is damaged"),
            (["train", "--config", "tiny.toml", "--run-dir", "afile"], 2, "is a file"),
            (["eval", "--config", "tiny.toml", "--checkpoint", "adir"], 2, "not a checkpoint"),
        ]
        for argv, code, words in cases:
            proc = subprocess.run(
                [sys.executable, "-m", "searchr1.cli", *argv],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == code, (argv, proc.stderr)
            assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

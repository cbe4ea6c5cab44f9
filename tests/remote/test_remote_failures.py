"""Every failure of a remote service is named by its class, through ``searchr1 train`` and
``searchr1 smoke``: a real closed port on loopback (refused), a ``.invalid`` host (DNS, which
never resolves), and loopback fakes with injected faults (401, 404 unknown model, 429 with
Retry-After, 500, an answer that is not JSON, a hang). Each exits with its class's code, no
traceback, a message naming the URL and the class and never the key, and smoke's diagnosis
line names the class (read off the error, not its text)."""

from __future__ import annotations

import json
import socket

import pytest
from cli_run import make_config
from fake_chat_server import FakeChatServer
from smoke_configs import scripted, write_config

pytest.importorskip("pytrio")
from fake_pytrio_service import FakePyTrio  # noqa: E402

KEY = "sk-test-remote-failures-4f9a2c"
#: short SDK waits: a failure is reported within about a second
FAST = {
    "tokenizer": "builtin:tiny-random",
    "retry_timeout_seconds": 0.3,
    "retry_initial_delay_seconds": 0.05,
    "request_timeout_seconds": 1,
}


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pytrio_fake():
    with FakePyTrio(api_key=KEY) as fake:
        yield fake


@pytest.fixture(scope="module")
def chat_fake():
    with FakeChatServer(api_key=KEY) as fake:
        yield fake


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("TAOTOKEN_API_KEY", KEY)


def taotoken(api_base: str, base_model: str = "builtin:tiny-random", **table: object) -> str:
    model = {
        "provider": "taotoken",
        "api_base": api_base,
        "api_key": "${TAOTOKEN_API_KEY}",
        "base_model": base_model,
        "taotoken": {**FAST, **table},
    }
    return make_config(model=model, train={"max_steps": 1})


def chat(api_base: str, **table: object) -> str:
    model = {
        "provider": "openai_chat",
        "api_base": api_base,
        "api_key": "${TAOTOKEN_API_KEY}",
        "base_model": "builtin:tiny-random",
        "openai_chat": {
            "model": "qwen-test",
            "retry_backoff_seconds": 0.01,
            "max_retries": 1,
            "timeout_seconds": 1.0,
            **table,
        },
    }
    return make_config(model=model)


def assert_named(result, code: int, url: str, words: tuple[str, ...]) -> None:
    """Exit ``code``, no traceback, the URL and ``words`` (the class, the fix) in the
    message, never the key."""
    text = result.out + result.err
    assert result.code == code, text
    assert "Traceback" not in text
    assert KEY not in text
    assert url in result.err and all(w in result.err for w in words), result.err


def diagnosis(err: str) -> str:
    """The `diagnosis:` lines of smoke's report (stderr: a piped stdout carries JSON only)."""
    lines = [line for line in err.splitlines() if line.startswith("diagnosis: ")]
    assert lines, err
    return "\n".join(lines)


# --------------------------------------------------------------------------- the model service


@pytest.mark.parametrize(
    ("fault", "code", "words"),
    [
        ({"status": 401, "code": "unauthorized"}, 2, ("401/403", "TAOTOKEN_API_KEY is empty")),
        ({"status": 429, "code": "too_many_requests"}, 3, ("429", "--resume")),
        (
            {"status": 500, "code": "internal_error"},
            3,
            ("5xx", "HTTP 500", "The service itself is failing"),
        ),
        ({"body": b"<html>a proxy's login page</html>"}, 2, ("not the service's API",)),
        ({"delay": 3.0}, 3, ("no answer within", "request_timeout_seconds")),
    ],
    ids=["401", "429", "500", "malformed", "hang"],
)
def test_train_names_a_failing_login_by_its_class(
    pytrio_fake, config_file, run_cli, fault, code, words
):
    pytrio_fake.clear_faults()
    # every GET: the key check at login, and the address tried again to classify a failure
    pytrio_fake.inject("GET", "", times=10_000, **fault)
    try:
        result = run_cli("train", "--config", config_file(taotoken(pytrio_fake.base_url + "/api")))
    finally:
        pytrio_fake.clear_faults()
    assert_named(result, code, pytrio_fake.base_url, ("during login", *words))


def test_train_names_a_model_the_service_does_not_serve(pytrio_fake, config_file, run_cli):
    """Logged in, the first sampler asks for a model the service answers 404
    model_not_found for."""
    pytrio_fake.clear_faults()
    pytrio_fake.inject("POST", r"/sampling-runs$", 404, code="model_not_found", times=10_000)
    try:
        result = run_cli("train", "--config", config_file(taotoken(pytrio_fake.base_url + "/api")))
    finally:
        pytrio_fake.clear_faults()
    words = ("during create_sampling_client", "404", "'builtin:tiny-random'", "base_model")
    assert_named(result, 2, pytrio_fake.base_url, words)


def test_train_and_smoke_name_a_closed_port_as_refused(config_file, run_cli):
    url = f"http://127.0.0.1:{closed_port()}/api"
    config = config_file(taotoken(url))
    result = run_cli("train", "--config", config)
    assert_named(result, 3, url, ("connection refused", "Is the server running on port"))
    first = [json.loads(line) for line in result.out.splitlines() if "remote_connecting" in line]
    assert first and url in first[0]["detail"] and "timeout 1 s" in first[0]["detail"]

    smoke = run_cli("smoke", "--config", config, "--run-dir", config.parent / "smoke")
    assert smoke.code == 1 and "Traceback" not in smoke.err and KEY not in smoke.out
    assert "class refused" in diagnosis(smoke.err)


def test_an_unresolvable_host_is_dns_not_a_rate_limit(config_file, run_cli):
    """The issue's case: the reference skeleton's TaoToken host unreachable. train said a
    traceback (exit 1), smoke "429" (every message mentions that the SDK retries 429)."""
    url = "https://searchr1-test.invalid/api"
    config = config_file(taotoken(url))
    result = run_cli("train", "--config", config)
    assert_named(result, 2, url, ("does not resolve (DNS)", "'searchr1-test.invalid'"))

    smoke = run_cli("smoke", "--config", config, "--run-dir", config.parent / "smoke")
    said = diagnosis(smoke.err)
    assert smoke.code == 1 and "Traceback" not in smoke.err
    assert "class dns" in said and "429" not in said and "rate limit" not in said


# --------------------------------------------------------------------------- smoke, chat API


@pytest.mark.parametrize(
    ("fault", "failure", "words"),
    [
        ({"status": 401}, "auth", ("TAOTOKEN_API_KEY is empty or wrong",)),
        ({"status": 404}, "unknown_model", ("'qwen-test'",)),
        ({"status": 429, "retry_after": "120"}, "rate_limit", ("Wait 120 s (its Retry-After)",)),
        ({"status": 500}, "server_error", ("HTTP 500",)),
        ({"status": 200, "raw": b"not json"}, "malformed", ("the response is not JSON",)),
        ({"status": 200, "delay": 3.0}, "timeout", ("[model.openai_chat] timeout_seconds",)),
    ],
    ids=["401", "404", "429", "500", "malformed", "hang"],
)
def test_smoke_diagnoses_the_chat_api_by_class(
    chat_fake, config_file, run_cli, fault, failure, words
):
    chat_fake.fail(times=4, **fault)
    config = config_file(chat(chat_fake.base_url))
    try:
        smoke = run_cli("smoke", "--config", config, "--run-dir", config.parent / "smoke")
    finally:
        chat_fake._failures.clear()
    said = diagnosis(smoke.err)
    assert smoke.code == 1 and "Traceback" not in smoke.err and KEY not in smoke.out
    assert f"class {failure} " in said and chat_fake.base_url in said
    assert all(w in said for w in words), said


# --------------------------------------------------------------------------- search


@pytest.mark.parametrize(
    ("api_base", "failure"),
    [(f"http://127.0.0.1:{closed_port()}", "refused"), ("http://searchr1-test.invalid", "dns")],
    ids=["refused", "dns"],
)
def test_smoke_diagnoses_the_search_api_by_class(
    tmp_path, run_cli, scripted_plugin, api_base, failure
):
    search = (
        f'[search]\nprovider = "zhihu"\napi_keys = "zk-secret-search-key-1"\n'
        f'api_base = "{api_base}"\nmax_retries = 0\ntimeout_seconds = 1\n'
    )
    turns = [["<answer> France </answer>"] * 6] * 4
    config = write_config(tmp_path, scripted(turns), search)
    smoke = run_cli("smoke", "--config", config, "--run-dir", tmp_path / "smoke")
    said = diagnosis(smoke.err)
    assert smoke.code == 1 and "Traceback" not in smoke.err
    assert f"the search probe failed: class {failure} " in said and api_base in said
    assert "zk-secret-search-key-1" not in smoke.out + smoke.err

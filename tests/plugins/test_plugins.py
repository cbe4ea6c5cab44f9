"""The plugin core: entry points, selection by name, errors naming plugins, documented hooks."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from searchr1.core import hookspecs
from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigValueError
from searchr1.core.hookspecs import hookimpl
from searchr1.core.plugins import KINDS, PluginError, load_registry
from searchr1.core.rewards import create_reward
from searchr1.core.types import Trajectory, Turn

ROOT = Path(__file__).resolve().parents[2]
HOOKS = [
    name
    for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("register_")
]


def test_builtins_are_registered_through_entry_points() -> None:
    registry = load_registry()
    assert {"importance_sampling", "ppo", "cispo"} <= set(registry.names("loss_fn"))
    # built-ins come from the package's own entry points, like any third-party plugin
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="searchr1")}
    assert eps["losses"] == "searchr1.plugins.losses"
    assert registry.get("loss_fn", "ppo").plugin == "losses"


def test_unknown_name_lists_available_names() -> None:
    registry = load_registry()
    with pytest.raises(PluginError) as err:
        registry.get("loss_fn", "ppo2")
    msg = str(err.value)
    assert "train.loss_fn = 'ppo2'" in msg and "did you mean 'ppo'" in msg and "cispo" in msg


def test_duplicate_names_across_plugins_are_an_error() -> None:
    class Clash:
        @hookimpl
        def register_loss_fns(self, register):
            register("ppo", lambda config: None)

    with pytest.raises(PluginError, match="registered twice"):
        load_registry(extra_plugins=[Clash()])


def test_assets_come_from_plugins_and_clash_by_name() -> None:
    from searchr1.core.types import Asset

    registry = load_registry()
    assert registry.asset_plugins["tiny-random"] == "offline_world"
    assert registry.asset_plugins["world"] == registry.asset_plugins["tiny"] == "offline_world"

    class Clash:
        @hookimpl
        def register_assets(self, register):
            register("world", Asset("9", lambda folder: None))

    with pytest.raises(PluginError, match="'builtin:world' is registered twice"):
        load_registry(extra_plugins=[Clash()])

    class NotAnAsset:
        @hookimpl
        def register_assets(self, register):
            register("quiz", lambda folder: None)

    with pytest.raises(PluginError, match=r"register a searchr1.core.types.Asset"):
        load_registry(extra_plugins=[NotAnAsset()])


def test_a_registration_is_typed_and_an_unknown_declaration_names_the_plugin() -> None:
    from dataclasses import FrozenInstanceError

    from searchr1.core.plugins import Registration

    reg = load_registry().get("model_provider", "taotoken")
    assert isinstance(reg, Registration) and reg.plugin == "remote_model"
    assert reg.secret_variables == {"api_key": "TAOTOKEN_API_KEY"}
    assert reg.infer_provider is not None and reg.infer_provider({"api_key": "k"})
    assert reg.defaults["train.max_staleness"][0] == 1
    with pytest.raises(FrozenInstanceError):
        reg.default = "x"  # type: ignore[misc]

    class Typo:
        @hookimpl
        def register_loss_fns(self, register):
            register("mine", lambda config: None, setings=object)

    with pytest.raises(PluginError, match=r"plugin 'Typo'.*register_loss_fns.*'setings'"):
        load_registry(extra_plugins=[Typo()])

    class NotADataclass:
        @hookimpl
        def register_loss_fns(self, register):
            register("mine", lambda config: None, settings={"mine": dict})

    with pytest.raises(PluginError, match=r"'NotADataclass' declared settings of loss_fn 'mine'"):
        load_registry(extra_plugins=[NotADataclass()])


def test_the_offline_world_offers_its_ceiling_only_for_its_own_eval_set(tmp_path: Path) -> None:
    """Train's ceiling eval plays the world's ideal agent only on the world's held-out set,
    and a cold start on the world imitates it, on other data the generic teacher. (The run
    is the part of a started Run the ceiling reads: config, tokenizer, protocol.)"""
    from types import SimpleNamespace

    from searchr1.core.cold_start import teacher_for
    from searchr1.core.config import load_config
    from searchr1.core.evaluation import ceiling_agent
    from searchr1.core.protocols import make_protocol
    from searchr1.core.scripted import ScriptedTeacher
    from searchr1.kit.tokenizers import load_tokenizer

    config = load_config(None, registry=load_registry()).replace(
        train={"eval_before_after": True}
    )  # the offline demo
    assert config.data.eval.startswith("builtin:world/")
    tokenizer = load_tokenizer(config.model.base_model, config.assets, "model.base_model")
    registry = load_registry()
    protocol = make_protocol(config, tokenizer, registry)

    def env(config: object) -> object:
        sampler = SimpleNamespace(tokenizer=tokenizer)
        return SimpleNamespace(config=config, sampler=sampler, protocol=protocol)

    assert ceiling_agent(env(config), registry.assets) is not None
    own = teacher_for(config, tokenizer, protocol, config.data.train, [], registry.assets)
    assert not isinstance(own, ScriptedTeacher)
    other_file = tmp_path / "questions.jsonl"
    other_file.write_text('{"question": "q?", "answers": ["a"]}\n')
    other = config.replace(data={"eval": str(other_file)})
    assert ceiling_agent(env(other), registry.assets) is None
    generic = teacher_for(other, tokenizer, protocol, str(other_file), [], registry.assets)
    assert isinstance(generic, ScriptedTeacher)


def test_hook_implementation_with_unknown_hook_is_rejected() -> None:
    class Bad:
        @hookimpl
        def register_searchers(self, register):  # misspelled hook
            pass

    with pytest.raises(PluginError, match="unknown hook"):
        load_registry(extra_plugins=[Bad()])


def test_plugin_raising_in_hook_is_named() -> None:
    class Broken:
        @hookimpl
        def register_rewards(self, register):
            raise RuntimeError("boom")

    with pytest.raises(PluginError, match="failed in register_rewards: RuntimeError: boom"):
        load_registry(extra_plugins=[Broken()])


def test_the_hooks_are_the_plugin_kinds_plus_assets() -> None:
    assert set(HOOKS) == {hook for hook, _ in KINDS.values()} | {"register_assets"}
    assert len(HOOKS) <= 7


def _doc_section(hook: str) -> str:
    doc = (ROOT / "docs" / "plugins.md").read_text()
    section = re.search(rf"^## {hook}\n(.*?)(?=^## |\Z)", doc, flags=re.M | re.S)
    assert section, f"docs/plugins.md has no '## {hook}' section"
    return section.group(1)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_signature_and_example(hook: str) -> None:
    body = _doc_section(hook)
    annotation = getattr(hookspecs, hook).__annotations__["register"]  # "Register[...]"
    assert f"{hook}(register: {annotation}) -> None" in body, f"{hook}: signature missing"
    assert f"def {hook}(register)" in body and "@hookimpl" in body, f"{hook}: example missing"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_documented_example_runs(hook: str, tmp_path: Path, monkeypatch) -> None:
    """The hook's python example in docs/plugins.md is a working plugin."""
    code = re.findall(r"```python\n(.*?)```", _doc_section(hook), flags=re.S)[-1]
    module = SimpleNamespace()
    exec(compile(code, f"docs/plugins.md#{hook}", "exec"), module.__dict__)
    registry = load_registry(extra_plugins=[module])
    if hook == "register_assets":  # build it and read its questions, as [data] eval does
        monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "cache"))
        _read_documented_asset(registry)
        return
    kind = next(k for k, (h, _) in KINDS.items() if h == hook)
    mine = [r for r in registry.entries[kind].values() if r.plugin == "SimpleNamespace"]
    assert mine
    if kind == "metric_sink":  # cheap to run for real: feed it the way training does
        _drive_sink(
            mine[0].factory(
                parse_config("", source="t.toml", env={}, registry=load_registry()), tmp_path
            )
        )
    if kind == "agent_protocol":
        assert {r.name for r in mine} == {"final_line", "marker_tool_calls"}
        _drive_protocol(registry, "final_line")
        _drive_call_format(registry)


#: A Mistral-like chat template: tool calls as `[TOOL_CALLS][...]`, which no built-in knows.
MARKER_TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{%- for c in (m.tool_calls or []) %}[TOOL_CALLS][{{ c.function | tojson }}]"
    "{%- endfor %}{%- endif %}{{ m.content or '' }}{%- endfor %}"
)


def _drive_protocol(registry, name: str) -> None:
    """[rollout] protocol names the documented protocol: it is built and reads its answers."""
    from searchr1.core.protocols import make_protocol
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    config = parse_config(
        f'[rollout]\nprotocol = "{name}"\n', source="t.toml", env={}, registry=registry
    )
    protocol = make_protocol(config, build_tokenizer(BUILTIN_TEXT, 1024), registry)
    assert protocol.name == name
    assert protocol.extract_answers("thinking\nFINAL: Paris") == ["Paris"]


def _drive_call_format(registry) -> None:
    """The documented format is found in a template no built-in format matches, without any
    change to the core; scripted turns are written and sampled turns parsed in it."""
    from searchr1.core.agent_protocol import Action
    from searchr1.core.protocols import make_protocol
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    tokenizer = build_tokenizer(BUILTIN_TEXT, 1024)
    tokenizer.chat_template = MARKER_TEMPLATE
    config = parse_config(
        '[rollout]\nprotocol = "marker_tool_calls"\n', source="t.toml", env={}, registry=registry
    )
    protocol = make_protocol(config, tokenizer, registry)
    assert protocol.call_format.name == "marker_list"
    assert protocol.stop_strings == ("]",)
    sampled = '[TOOL_CALLS][{"name": "search", "arguments": {"query": "capital of France"}}]'
    assert protocol.parse_action(sampled) == Action("search", query="capital of France")
    assert protocol.call_format.render("search", {"query": "x"}) == (
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}}]'
    )
    built_in = config.replace(rollout={"protocol": "tool_calls"})
    with pytest.raises(ConfigValueError, match="no installed plugin knows"):
        make_protocol(built_in, tokenizer, registry)  # the built-in protocol does not know it


def _read_documented_asset(registry) -> None:
    from searchr1.core.assets import resolve
    from searchr1.core.data import load_questions

    mine = [n for n, p in registry.asset_plugins.items() if p == "SimpleNamespace"]
    assert mine == ["quiz"]
    path = resolve("builtin:quiz/quiz.jsonl", registry.assets)
    assert Path(path).is_relative_to(Path(os.environ["SEARCHR1_CACHE"]))
    questions = load_questions(path, registry.assets, field_name="data.eval").questions
    assert [q.golden_answers for q in questions] == [("Antoine de Saint-Exupery",), ("Paris",)]
    assert resolve("builtin:quiz/quiz.jsonl", registry.assets) == path  # built once, reused


def _drive_sink(sink: object) -> None:
    from searchr1.core.sinks import SinkHub, _Guarded
    from searchr1.core.types import MetricSink

    assert isinstance(sink, MetricSink)
    guarded = _Guarded("doc", sink)
    hub = SinkHub([guarded])
    hub.hparams({"train": {"max_steps": 2}})
    hub.scalars(1, {"reward/mean": 0.5})
    hub.texts(1, "trajectories", ["question: ?"])
    hub.close()
    assert guarded.failures == 0, "a method of the documented sink raised"


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-install the example third-party package into a folder put on sys.path."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT / "tests" / "example_plugin"),
        ],
        check=True,
        timeout=300,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("searchr1_example", None)
    importlib.invalidate_caches()


def test_external_plugin_selected_from_config(example_plugin: Path, monkeypatch) -> None:
    monkeypatch.setenv("SEARCHR1_LOAD_PLUGINS", "example")
    registry = load_registry()
    assert registry.get("search_provider", "echo").plugin == "example"
    cfg = parse_config(
        '[search]\nprovider = "echo"\n[search.echo]\nprefix = "got: "\n[reward]\nterms = ["no_repeat"]\n',
        source="t.toml",
        env={},
        registry=load_registry(),
    )
    search = registry.create("search_provider", cfg.search.provider, cfg)
    response = asyncio.run(search.search("little prince", 3))
    assert response.ok and response.results[0].text == "got: little prince"
    reward = create_reward(cfg, registry)  # the default reward plus the term
    turn = Turn(sampled_tokens=(), text="", action="search", query="q")
    answer = Turn(sampled_tokens=(), text="<answer>a</answer>", action="answer")
    traj = Trajectory(
        trajectory_id="t",
        question="?",
        golden_answers=("Paris",),
        tokens=(),
        generated_mask=(),
        logprobs=(),
        prompt_len=0,
        turns=(turn, turn, answer),
        end_reason="answered",
        final_answer="Paris",
        final_text="",
        search_calls=2,
        search_errors=0,
        format_ok=True,  # as the rollout records it: one <answer> element
    )
    result = reward(traj, ["Paris"])
    assert result.reward == 1.0 - 0.5  # right answer in the format, one repeated query
    assert result.components["correct"] == 1.0 and result.components["no_repeat"] == -0.5
    assert result.components["no_repeat/repeated"] == 1.0


def test_plugins_command_lists_kinds_and_external_plugin(example_plugin: Path) -> None:
    import os

    env = {**os.environ, "PYTHONPATH": str(example_plugin), "SEARCHR1_LOAD_PLUGINS": "example"}
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "plugins"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for kind, (_, field_name) in KINDS.items():
        assert f"{kind} (chosen by {field_name}):" in out.stdout
    assert re.search(r"tool_calls\s+from plugin agent_protocols", out.stdout)
    assert re.search(r"echo\s+from plugin example", out.stdout)
    assert re.search(r"importance_sampling\s+from plugin losses", out.stdout)
    assert re.search(r"world\s+from plugin offline_world", out.stdout)


@pytest.fixture
def stray_plugins(tmp_path: Path):
    """Two installed third-party plugins (dist-info folders on sys.path, as pip leaves them):
    ``stray`` registers a reward, ``broken`` names a module that does not exist."""
    (tmp_path / "searchr1_stray.py").write_text(
        "from searchr1.core.hookspecs import hookimpl\n\n\n"
        "@hookimpl\ndef register_rewards(register):\n"
        "    register('stray_reward', lambda config: None)\n"
    )
    for name, module in (("stray", "searchr1_stray"), ("broken", "searchr1_missing_module")):
        dist = tmp_path / f"{name}_plugin-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 0.1\n"
        )
        (dist / "entry_points.txt").write_text(f"[searchr1]\n{name} = {module}\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("searchr1_stray", None)
    importlib.invalidate_caches()


def test_broken_entry_point_names_the_plugin(stray_plugins: Path, monkeypatch) -> None:
    monkeypatch.setenv("SEARCHR1_LOAD_PLUGINS", "broken")
    with pytest.raises(PluginError) as err:
        load_registry()
    assert "plugin 'broken'" in str(err.value) and "broken-plugin" in str(err.value)


def test_load_plugins_unset_loads_every_installed_plugin(stray_plugins: Path, monkeypatch):
    monkeypatch.delenv("SEARCHR1_LOAD_PLUGINS")
    with pytest.raises(PluginError, match="plugin 'broken'"):
        load_registry()  # the broken one is loaded too, and says so


def test_load_plugins_empty_loads_built_ins_only(stray_plugins: Path, monkeypatch) -> None:
    monkeypatch.setenv("SEARCHR1_LOAD_PLUGINS", "")
    registry = load_registry()
    assert "stray_reward" not in registry.names("reward")
    assert "format_answer" in registry.names("reward")  # built-ins always load
    assert {"losses", "local_model", "rewards"} <= set(registry.plugins)
    assert {"broken", "stray"} <= set(registry.skipped)


def test_load_plugins_list_selects_third_party_plugins(stray_plugins: Path, monkeypatch):
    monkeypatch.setenv("SEARCHR1_LOAD_PLUGINS", " stray , ")
    registry = load_registry()
    assert registry.get("reward", "stray_reward").plugin == "stray"
    assert "broken" in registry.skipped and "stray" not in registry.skipped
    assert registry.origins["stray"] == "third-party" and registry.origins["losses"] == "built-in"
    assert "importance_sampling" in registry.names("loss_fn")


def test_load_plugins_with_an_unknown_name_is_an_error(stray_plugins: Path, monkeypatch):
    monkeypatch.setenv("SEARCHR1_LOAD_PLUGINS", "stray,strey")
    with pytest.raises(PluginError) as err:
        load_registry()
    msg = str(err.value)
    assert "$SEARCHR1_LOAD_PLUGINS names strey," in msg
    assert re.search(r"installed third-party plugins: .*broken, .*stray", msg)


def test_plugins_command_says_what_the_variable_left_out(stray_plugins: Path, run_cli) -> None:
    result = run_cli("plugins")
    out = result.out
    assert result.code == 0
    assert re.search(r"installed but not in \$SEARCHR1_LOAD_PLUGINS: broken, .*stray", out)
    assert "stray_reward" not in out


DEV_SEARCH = """
from pathlib import Path

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import SearchResponse, SearchResult

QUERIES = Path(__file__).with_name("queries.txt")


class EchoSearch:
    async def search(self, query, top_k):
        with QUERIES.open("a") as fh:
            fh.write(query + "\\n")
        return SearchResponse(results=(SearchResult(title="echo", text=query),))

    def metrics(self, reset=False):
        return {}

    def available(self):
        return True

    async def aclose(self):
        pass


@hookimpl
def register_search_providers(register):
    register("echo_dev", lambda config: EchoSearch())
"""


def test_a_module_named_in_searchr1_plugins_loads_without_packaging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    """The development loop of docs/plugins.md: a module in a plain folder, named in
    $SEARCHR1_PLUGINS, listed by ``searchr1 plugins`` and used by a real training step."""
    from cli_run import make_config, write_config

    (tmp_path / "my_dev_search.py").write_text(DEV_SEARCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SEARCHR1_PLUGINS", "my_dev_search")
    try:
        listed = run_cli("plugins")
        config = write_config(tmp_path, make_config(search={"provider": "echo_dev", "local": None}))
        trained = run_cli(
            "train", "--config", config, "--run-dir", tmp_path / "run", "--max-steps", "1"
        )
    finally:
        sys.modules.pop("my_dev_search", None)

    assert listed.code == 0, listed.err
    assert re.search(
        r"echo_dev\s+from plugin my_dev_search \(development, \$SEARCHR1_PLUGINS\)", listed.out
    ), listed.out
    assert re.search(r"importance_sampling\s+from plugin losses \(built-in\)", listed.out)
    assert "my_dev_search (development, $SEARCHR1_PLUGINS)" in listed.out
    assert trained.code == 0, trained.err
    assert (tmp_path / "queries.txt").read_text().strip()  # the rollouts searched through it


def test_a_module_in_searchr1_plugins_that_cannot_be_imported_is_named(
    monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    monkeypatch.setenv("SEARCHR1_PLUGINS", "my_search, no_such_plugin_module")
    monkeypatch.setitem(sys.modules, "my_search", SimpleNamespace(__name__="my_search"))

    result = run_cli("plugins")

    assert result.code == 2
    assert "Traceback" not in result.err
    assert (
        "searchr1: error: $SEARCHR1_PLUGINS names module 'no_such_plugin_module', which failed "
        "to import: ModuleNotFoundError: No module named 'no_such_plugin_module'; is the folder "
        "holding it on PYTHONPATH (for example PYTHONPATH=. "
        "SEARCHR1_PLUGINS=no_such_plugin_module searchr1 plugins)?"
    ) in result.err


def test_every_factory_attribute_is_documented() -> None:
    """Each optional declaration of a registration is described in docs/plugins.md and in
    the model provider hook's docstring."""
    from dataclasses import fields

    from searchr1.core.plugins import Registration

    doc = (ROOT / "docs" / "plugins.md").read_text()
    section = re.search(r"^## What a factory may declare\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert section, "docs/plugins.md has no '## What a factory may declare' section"
    hook_doc = hookspecs.register_model_providers.__doc__ or ""
    declared = [f.name for f in fields(Registration)][4:]
    assert declared == [
        "settings", "reads", "default", "defaults", "infer_provider", "secret_variables", "advise",
        "check", "capabilities",
    ]  # fmt: skip
    for attr in declared:
        assert f"* `{attr}=`" in section.group(1), f"docs/plugins.md: {attr}="
        assert f"``{attr}``" in hook_doc, f"hookspecs: {attr}"


def test_a_protocol_injected_for_a_run_is_the_one_train_uses(
    tmp_path: Path, run_cli, scripted_plugin, monkeypatch
) -> None:
    """The run's registry (not the installed plugins) gives ``train`` its protocol: a
    protocol only an injected plugin registers renders every prompt of the run."""
    from train_configs import train_config

    from searchr1.core import plugins
    from searchr1.core.types import RewardResult
    from searchr1.kit.protocols.tags import TagsProtocol

    built: list[str] = []

    class MarkedTags(TagsProtocol):
        name = "marked_tags"

        def __init__(self, tokenizer, *, enable_thinking=False):  # type: ignore[no-untyped-def]
            super().__init__(tokenizer, enable_thinking=enable_thinking)
            built.append(self.name)

    class Injected:
        @hookimpl
        def register_agent_protocols(self, register):  # type: ignore[no-untyped-def]
            register(MarkedTags.name, MarkedTags)

        @hookimpl
        def register_rewards(self, register):  # type: ignore[no-untyped-def]
            register("flat", lambda config: lambda t, golden: RewardResult(0.0, {}))

    with_scripted = plugins.load_registry
    monkeypatch.setattr(
        plugins, "load_registry", lambda extra=(): with_scripted([Injected(), *extra])
    )
    config = train_config(tmp_path, extra='[reward]\nname = "flat"\n')
    config.write_text(config.read_text().replace('protocol = "tags"', 'protocol = "marked_tags"'))
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.err
    assert built == ["marked_tags"]  # one protocol per run, from the run's registry


def test_the_package_metadata_builds_without_a_deprecation(tmp_path: Path) -> None:
    """setuptools builds the project's metadata without a deprecation warning (a license given
    as a TOML table stops building on 2027-02-18): the license is an SPDX expression."""
    source = tmp_path / "source"
    (source / "searchr1").mkdir(parents=True)
    (source / "searchr1" / "__init__.py").write_text("")
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_text((ROOT / name).read_text())
    out = tmp_path / "metadata"
    out.mkdir()
    build = "import setuptools.build_meta as b, sys; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", build, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Deprecat" not in done.stderr, done.stderr
    metadata = (out / done.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata

"""The tiny model builder: loadable like a hub model, deterministic, protocol-ready tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from searchr1.plugins.offline_world.tiny_model import (
    AGENT_TAGS,
    BUILTIN_TEXT,
    build_tiny_model,
    build_tokenizer,
)

SMALL = dict(
    vocab_size=600,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), BUILTIN_TEXT, **SMALL)


def test_loads_through_auto_classes(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen3"
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token_id == tok.eos_token_id
    ids = tok.encode("<answer> Paris </answer>")
    logits = model(input_ids=__import__("torch").tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))


def test_tags_are_single_non_special_tokens(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for tag in AGENT_TAGS:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag
    text = "<think> hm </think><search> capital city </search><|im_end|>"
    ids = tok.encode(text)
    # skip_special_tokens drops <|im_end|> but keeps every protocol tag
    assert tok.decode(ids, skip_special_tokens=True) == (
        "<think> hm </think><search> capital city </search>"
    )
    assert tok.decode(ids) == text
    assert "<search>" not in tok.all_special_tokens


def test_chat_template_renders_tools_tool_calls_and_tool_results(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "web search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who built it?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}
            ],
        },
        {"role": "tool", "content": "It was built by Ann."},
    ]
    text = tok.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(tool) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": '
        '{"query": "x"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nIt was built by Ann.\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=False)
    assert plain == "<|im_start|>user\nWho built it?<|im_end|>\n"


def test_build_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", BUILTIN_TEXT, **SMALL)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (tiny_dir, again)]
        assert digest[0] == digest[1], name
    other = build_tiny_model(tmp_path / "seed1", BUILTIN_TEXT, **{**SMALL, "seed": 1})
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_vocab_size_too_small_is_an_error() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(["abc"], 100)


def test_builtin_tiny_random_asset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from searchr1.core.assets import resolve
    from searchr1.core.plugins import load_registry

    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path))
    known = load_registry().assets
    path = Path(resolve("builtin:tiny-random", known))
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert resolve("builtin:tiny-random/config.json", known) == str(path / "config.json")

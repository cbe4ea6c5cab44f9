"""The untrained ``builtin:tiny``: random Qwen3 weights of :data:`MODEL_SIZES` and a tokenizer
trained on the world's own texts.

The tokenizer sees the corpus as the model reads it, every question inside the protocol's real
prompt and scripted turns, so names, the instruction and the tags all cost few tokens (the
tiny model copies names token by token).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.core.types import Question
from searchr1.plugins.offline_world.generate import World

if TYPE_CHECKING:
    from searchr1.core.agent_protocol import AgentProtocol

#: Model shape of ``builtin:tiny`` (about 1.3 M parameters; a CPU RL step takes seconds).
MODEL_SIZES: dict[str, int] = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 384,
}


def tokenizer_texts(world: World, protocol_cls: type[AgentProtocol]) -> list[str]:
    """Texts the tiny model's tokenizer is trained on: the corpus as the model reads it,
    every question inside the protocol's real prompt, and scripted turns, so names, the
    instruction and the tags all cost few tokens."""
    from searchr1.core.agent_protocol import format_search_results
    from searchr1.core.types import SearchResponse, SearchResult
    from searchr1.plugins.offline_world.tiny_model import BUILTIN_TEXT, build_tokenizer

    # Rendering a prompt needs a tokenizer with the chat template; any one will do.
    draft = protocol_cls(build_tokenizer(BUILTIN_TEXT, vocab_size=512))
    docs = world.documents()
    texts = [d["contents"] for d in docs]
    for d in docs:
        title, _, text = d["contents"].partition("\n")
        result = SearchResult(title=title.strip('"'), text=text)
        texts.append(format_search_results(SearchResponse(results=(result,))))
    for q in (*world.train, *world.heldout):
        texts.append(draft.render_prompt(Question(q.id, q.question, (q.answer,))))
        texts.append(draft.assistant_turn_text(query=q.hops[0]))
        texts.append(draft.assistant_turn_text(answer=q.answer))
    return texts + list(BUILTIN_TEXT)


def build_base(out_dir: Path, world: World, protocol_cls: type[AgentProtocol], seed: int) -> Path:
    """The randomly initialised tiny model with a tokenizer trained on the world's texts."""
    from searchr1.plugins.offline_world.tiny_model import build_tiny_model

    return build_tiny_model(out_dir, tokenizer_texts(world, protocol_cls), seed=seed, **MODEL_SIZES)

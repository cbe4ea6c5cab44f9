"""A tiny, reproducible Qwen3-architecture model and tokenizer, built locally (no hub needed).

Usage:
    tok = build_tokenizer(texts, vocab_size=4096)          # PreTrainedTokenizerFast, chat template
    path = build_tiny_model(Path("out"), texts, seed=0)     # save_pretrained(tokenizer + model)
    AutoTokenizer.from_pretrained(path); AutoModelForCausalLM.from_pretrained(path)
Tags (AGENT_TAGS) are single, NON-special tokens: ``decode(ids, skip_special_tokens=True)``
keeps them. Only ``SPECIAL_TOKENS`` are special; ``<|endoftext|>`` is both eos and pad.
The base of ``builtin:tiny-random`` (from ``BUILTIN_TEXT``) and ``builtin:tiny``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.kit.protocols.tags import INSTRUCTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Control tokens: skipped by ``decode(..., skip_special_tokens=True)``.
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, IM_START, IM_END)
#: Protocol tags: one id each, but *not* special, so decoded text keeps them (a tag trained as
#: a special token silently vanishes from decoded rollouts and the parser never sees it).
AGENT_TAGS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

#: Qwen3-style chat template: tools are listed as JSON in the system turn, assistant tool
#: calls are rendered as ``<tool_call>{json}</tool_call>``, consecutive ``role: tool`` messages
#: are wrapped in ``<tool_response>`` blocks inside one user turn.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in (message.tool_calls or []) %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if (message.content or '') or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}"
    "{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Built-in text for ``builtin:tiny-random``: plain English plus the agent protocol, so the
#: tokenizer has merges for both and tests need no generated world.
BUILTIN_TEXT: tuple[str, ...] = (
    INSTRUCTION + "Question: who wrote the novel?",
    "<think> I need to find the capital of the country first. </think> <search> capital of "
    "the country </search> <information> Doc 1(Title: Capital) The capital city is a large "
    "city on the river. Doc 2(Title: River) The river runs north to the sea. </information> "
    "<think> The capital is on the river. </think> <answer> the river city </answer>",
    "The quick brown fox jumps over the lazy dog. A small model learns to search for facts, "
    "read the results and answer questions in one short line. Answer: the answer is short.",
    'Which year was the bridge built? <tool_call>\n{"name": "search", "arguments": {"query": '
    '"bridge built year"}}\n</tool_call> <tool_response>\nThe bridge was built in 1932 by the '
    "city engineers.\n</tool_response> Answer: 1932",
    "Who is the author of the book about the old mountain town? When did the king of the "
    "island die? Where was the painter born? What is the name of the team that won the cup "
    "in the spring of that year? How many people live in the village near the lake?",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 1999. Names: Alice, Bob, Carol, David, Eve. "
    "Places: Paris, London, Tokyo, Berlin, Rome, Cairo, Lima, Oslo.",
)


def build_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    ``vocab_size`` is the total size including special tokens and agent tags; a small corpus
    may yield fewer merges, so ``len(tokenizer)`` can be smaller. Deterministic for the same
    texts and vocab_size.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    if vocab_size < 256 + len(SPECIAL_TOKENS) + len(AGENT_TAGS):
        raise ValueError(f"vocab_size={vocab_size} is too small for byte-level BPE (min 271)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(AGENT_TAGS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Added after training so the tags get one id each without being special.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in AGENT_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(
    out_dir: Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised Qwen3 model and its tokenizer into ``out_dir``.

    Both are written with ``save_pretrained``, so they load through ``AutoTokenizer`` /
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` exactly like a hub model. Returns
    ``out_dir``. Deterministic for the same texts, sizes and seed.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(texts, vocab_size)
    tokenizer.model_max_length = max_position_embeddings
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    # Seed a private generator state so building never perturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir

"""The warm start of ``builtin:tiny``: a short supervised fine-tune on scripted trajectories of
a realistic *untrained* search agent.

A base model asked to use a search engine does so only some of the time: it often answers
from a guess, sometimes searches with a vague query (the question's words without the name it
is about), and on two-hop questions often stops after the first hop. The scripted agent below
does exactly that, with fixed per-type rates (:class:`Behaviour`); what it reads is real
(the ``local`` BM25 provider over the world corpus), and when it answers after a search it
copies from the first result, right or wrong. RL then has Search-R1's lesson to learn: when
to search and what to ask.

Every scripted trajectory is rendered with the rollout's own protocol code
(``initial_prompt_tokens``, ``assistant_turn_tokens``, ``observation_text``,
``render_observation_tokens``), so the fine-tune sees token-for-token what the rollout will
produce. The loss covers the assistant's tokens only (as RL does): the model never trains on a
document, so it cannot memorise facts, held-out or not.

Who calls what: :func:`searchr1.plugins.offline_world.assets.build_tiny` calls :func:`build_warm_start` when
no shipped weights exist; a maintainer regenerates the shipped weights with::

    python -m searchr1.plugins.offline_world.cold_start --shipped --out searchr1/plugins/offline_world/warm_start
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.types import Question, SearchProvider
from searchr1.plugins.offline_world.generate import Entity, World, WorldQuestion, generate_world

if TYPE_CHECKING:
    from searchr1.core.agent_protocols import AgentProtocol
    from searchr1.core.config import Config

#: Model shape of ``builtin:tiny`` (about 1.3 M parameters; a CPU RL step takes seconds).
MODEL_SIZES: dict[str, int] = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 384,
}

#: What each fact relation reads from an entity: relation -> (entity kind, fact key).
_RELATIONS: dict[str, tuple[str, str]] = {
    "born_city": ("person", "born_city"),
    "born_year": ("person", "born_year"),
    "founder": ("org", "founder"),
    "country": ("city", "country"),
}
#: The relation chain of each question type (one relation per hop).
CHAINS: dict[str, tuple[str, ...]] = {
    "born_city": ("born_city",),
    "born_year": ("born_year",),
    "founder": ("founder",),
    "city_country": ("country",),
    "born_country": ("born_city", "country"),
    "founder_city": ("founder", "born_city"),
}
#: The kind of thing each question type asks for (what a guess looks like).
_ANSWER_KIND: dict[str, str] = {
    "born_city": "city",
    "born_year": "year",
    "founder": "person",
    "city_country": "country",
    "born_country": "country",
    "founder_city": "city",
}


@dataclass(frozen=True)
class Behaviour:
    """The scripted untrained agent's tendencies (probabilities per trajectory).

    ``first_search[qtype]``: searches at all (else answers a guess of the right kind); the
    rates differ by type, as a base model's confidence does. ``poor_query``: a search uses the
    question's words without the name it is about (BM25 then returns unrelated documents).
    ``second_search``: on a two-hop question, searches the name read in the first result
    (else stops: ``answer_bridge`` of the time it answers that name, otherwise it guesses).
    """

    first_search: Mapping[str, float] = field(
        default_factory=lambda: {
            "born_city": 0.6,
            "founder": 0.55,
            "born_year": 0.35,
            "city_country": 0.3,
            "born_country": 0.5,
            "founder_city": 0.4,
        }
    )
    poor_query: float = 0.3
    second_search: float = 0.45
    answer_bridge: float = 0.5


@dataclass(frozen=True)
class ScriptedTurn:
    """One scripted assistant action: a search ``query`` or a final ``answer``."""

    query: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class Episode:
    """A rendered scripted trajectory: all tokens and which of them the model "generated"
    (the only positions the fine-tune's loss covers)."""

    tokens: list[int]
    train_mask: list[bool]
    turns: list[ScriptedTurn]
    question: WorldQuestion
    #: where the search results are (trained on only for a ``reading`` episode)
    observation_mask: list[bool] = field(default_factory=list)
    #: an episode of the *reading* world: its observations are trained on too (see
    #: :func:`build_warm_start`)
    reading: bool = False


def read_fact(relation: str, entity: Entity | None, world: World) -> str:
    """What an agent copying from a result about ``entity`` answers for ``relation``.

    The right fact when ``entity`` has it; otherwise (the result is about something else)
    the first name or number its document mentions, as a copying agent would."""
    if entity is None:
        return ""
    kind, key = _RELATIONS[relation]
    facts = entity.facts
    if entity.kind == kind:
        value = facts[key]
    else:
        order = {
            "person": ("born_city", "born_year"),
            "org": ("founder", "year", "city"),
            "city": ("country",),
            "country": ("capital",),
        }[entity.kind]
        value = facts[order[0]]
    return world.entities[value].name if value in world.entities else value


def poor_query(question: WorldQuestion) -> str:
    """The question's own words without the name it is about (a vague first query)."""
    words = question.question.replace(question.hops[0], " ").rstrip("?").split()
    return " ".join(words)


class _Guesser:
    """Random answers of the right kind, drawn from the training side of the world only."""

    def __init__(self, world: World):
        self.names: dict[str, list[str]] = {}
        for e in world.entities.values():
            if e.id not in world.heldout_entities:
                self.names.setdefault(e.kind, []).append(e.name)

    def guess(self, kind: str, rng: random.Random) -> str:
        if kind == "year":
            return str(rng.randint(1650, 2000))
        return rng.choice(self.names[kind])


async def script_episode(
    question: WorldQuestion,
    world: World,
    protocol: AgentProtocol,
    search: SearchProvider,
    config: Config,
    rng: random.Random,
    behaviour: Behaviour,
    guesser: _Guesser,
) -> Episode:
    """Play the untrained agent on one question against the real search provider and render
    the trajectory with the rollout's protocol code (prompt, turns, observations)."""
    by_name = world.by_name()
    q = Question(question.id, question.question, (question.answer,), question.data_source, {})
    tokens = protocol.initial_prompt_tokens(q)
    mask = [False] * len(tokens)
    observed = [False] * len(tokens)
    turns: list[ScriptedTurn] = []

    def emit(turn: ScriptedTurn) -> list[int]:
        turn_tokens = protocol.assistant_turn_tokens(query=turn.query, answer=turn.answer)
        tokens.extend(turn_tokens)
        mask.extend([True] * len(turn_tokens))
        observed.extend([False] * len(turn_tokens))
        turns.append(turn)
        return turn_tokens

    async def search_and_read(query: str, relation: str) -> str:
        turn_tokens = emit(ScriptedTurn(query=query))
        response = await search.search(query, config.search.top_k)
        obs, _ = protocol.render_observation_tokens(
            protocol.observation_text(response), turn_tokens, config.rollout.max_observation_tokens
        )
        tokens.extend(obs)
        mask.extend([False] * len(obs))
        observed.extend([True] * len(obs))
        first = by_name.get(response.results[0].title) if response.results else None
        return read_fact(relation, first, world)

    chain = CHAINS[question.qtype]
    kind = _ANSWER_KIND[question.qtype]
    if rng.random() >= behaviour.first_search[question.qtype]:
        emit(ScriptedTurn(answer=guesser.guess(kind, rng)))
    else:
        good = rng.random() >= behaviour.poor_query
        read = await search_and_read(question.hops[0] if good else poor_query(question), chain[0])
        if len(chain) == 1:
            emit(ScriptedTurn(answer=read or guesser.guess(kind, rng)))
        elif rng.random() < behaviour.second_search and read:
            good = rng.random() >= behaviour.poor_query
            second = await search_and_read(read if good else question.hops[0], chain[1])
            emit(ScriptedTurn(answer=second or guesser.guess(kind, rng)))
        elif rng.random() < behaviour.answer_bridge and read:
            emit(ScriptedTurn(answer=read))
        else:
            emit(ScriptedTurn(answer=guesser.guess(kind, rng)))
    return Episode(tokens, mask, turns, question, observed)


async def script_episodes(
    world: World,
    questions: Sequence[WorldQuestion],
    protocol: AgentProtocol,
    search: SearchProvider,
    config: Config,
    *,
    seed: int = 0,
    behaviour: Behaviour | None = None,
) -> list[Episode]:
    """One scripted episode per question, deterministic for ``seed``."""
    rng = random.Random(seed)
    behaviour = behaviour or Behaviour()
    guesser = _Guesser(world)
    return [
        await script_episode(q, world, protocol, search, config, rng, behaviour, guesser)
        for q in questions
    ]


# --------------------------------------------------------------------------- building


def offline_config() -> Config:
    """The embedded default config (the protocol, search and limits the demo trains with)."""
    from searchr1.core.config import load_config

    return load_config(None, env={})


def tokenizer_texts(world: World, protocol_cls: type[AgentProtocol]) -> list[str]:
    """Texts the tiny model's tokenizer is trained on: the corpus as the model reads it,
    every question inside the protocol's real prompt, and scripted turns, so names, the
    instruction and the tags all cost few tokens."""
    from searchr1.core.agent_protocols import format_search_results
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


def finetune(
    model: Any,
    episodes: Sequence[Episode],
    *,
    pad_id: int,
    steps: int,
    batch_size: int = 32,
    lr: float = 2e-3,
    warmup: int = 20,
    seed: int = 0,
    log_every: int = 25,
    read_weight: float = 0.0,
) -> list[float]:
    """Full-parameter supervised fine-tune on the episodes' assistant tokens.

    AdamW with linear warm-up and cosine decay; batches are drawn by a seeded shuffle, epoch
    after epoch. Returns the loss of every step."""
    import torch

    from searchr1.core.logs import get_logger

    log = get_logger()
    gen = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches: list[list[Episode]] = []
    prefix = _shared_prefix(episodes)
    losses: list[float] = []
    model.train()
    start = time.monotonic()
    for step in range(steps):
        if not batches:
            batches = _shuffled_batches(episodes, batch_size, gen)
        loss = _assistant_loss(model, batches.pop(), pad_id, prefix, read_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = losses[-log_every:]
            log.info(
                "cold_start.step",
                step=step + 1,
                loss=round(sum(recent) / len(recent), 4),
                elapsed_s=round(time.monotonic() - start, 1),
            )
    model.eval()
    return losses


def _shuffled_batches(
    episodes: Sequence[Episode], batch_size: int, gen: random.Random
) -> list[list[Episode]]:
    """One epoch of batches in random order. Deliberately not bucketed by length: length
    tells a guess from a search, and batches of only one behaviour swing the first-token
    decision from batch to batch instead of learning its rate."""
    order = list(range(len(episodes)))
    gen.shuffle(order)
    return [
        [episodes[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)
    ][::-1]


def _shared_prefix(episodes: Sequence[Episode]) -> int:
    """Length of the token prefix every episode starts with (the instruction part of the
    prompt), minus one so each episode keeps at least its own first token."""
    first = episodes[0].tokens
    n = min(len(e.tokens) for e in episodes) - 1
    for e in episodes:
        while n > 0 and e.tokens[:n] != first[:n]:
            n -= 1
    return max(n, 0)


def _assistant_loss(
    model: Any, batch: Sequence[Episode], pad_id: int, prefix: int = 0, read_weight: float = 0.0
) -> Any:
    """Weighted mean cross-entropy of the assistant's tokens (weight 1) and, in reading
    episodes, of the observation tokens (``read_weight``).

    Two savings that do not change the loss: the ``prefix`` tokens every episode shares (the
    protocol's long instruction, most of a short episode) are run once and their keys and
    values reused by the whole batch, and the vocabulary projection is applied only at the
    positions that predict an assistant token (a few per episode)."""
    import torch
    from transformers import DynamicCache

    width = max(len(e.tokens) for e in batch) - prefix
    rows = len(batch)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, prefix + width), dtype=torch.long)
    attn[:, :prefix] = 1
    weight = torch.zeros((rows, width), dtype=torch.float32)
    for row, e in enumerate(batch):
        n = len(e.tokens) - prefix
        ids[row, :n] = torch.tensor(e.tokens[prefix:])
        attn[row, prefix : prefix + n] = 1
        weight[row, :n] = torch.tensor(e.train_mask[prefix:], dtype=torch.float32)
        if e.reading and read_weight > 0:
            weight[row, :n] += read_weight * torch.tensor(
                e.observation_mask[prefix:], dtype=torch.float32
            )
    if any(e.train_mask[prefix] or e.observation_mask[prefix] for e in batch):
        raise ValueError("an assistant token right after the shared prefix is not supported")
    cache = None
    if prefix:
        head = torch.tensor([batch[0].tokens[:prefix]])
        cache = model.model(input_ids=head, use_cache=True).past_key_values
        cache.batch_repeat_interleave(rows)
    assert cache is None or isinstance(cache, DynamicCache)
    positions = torch.arange(prefix, prefix + width).unsqueeze(0).expand(rows, -1)
    with warnings.catch_warnings():  # newer transformers renamed past_key_values -> cache
        warnings.simplefilter("ignore", FutureWarning)
        hidden = model.model(
            input_ids=ids,
            attention_mask=attn,
            past_key_values=cache,
            position_ids=positions,
            use_cache=cache is not None,
        ).last_hidden_state
    # Position t predicts token t + 1.
    w = weight[:, 1:]
    predict = w > 0
    logits = model.lm_head(hidden[:, :-1][predict])
    ce = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][predict], reduction="none")
    return (ce * w[predict]).sum() / w[predict].sum()


#: Seed of the *reading* world: a second generated world, disjoint from the demo's facts,
#: whose episodes are also trained on their search results (see :func:`build_warm_start`).
READING_WORLD_SEED = 1000
#: Loss weight of an observation token in a reading episode (assistant tokens weigh 1).
READ_WEIGHT = 0.2


def build_warm_start(
    out_dir: Path,
    *,
    seed: int = 0,
    steps: int = 1500,
    batch_size: int = 32,
    lr: float = 2e-3,
    episodes_per_question: int = 2,
    read_weight: float = READ_WEIGHT,
    init: Path | None = None,
) -> Path:
    """The whole pipeline into ``out_dir``: world, base model, scripted episodes, fine-tune,
    ``save_pretrained`` (model and tokenizer). Deterministic for the same arguments on the
    same torch build and thread count.

    Half of the episodes come from a second, *reading* world (other names, other facts) and
    are also trained on their observations (weight ``read_weight``). A base model arrives
    able to read and copy; a randomly initialised one learns copying (the induction pattern
    "Title: X) X was ...") from the few assistant tokens alone far too slowly. Training on
    the demo world's own documents would instead let the model memorise the demo's facts,
    so only the reading world's are used. ``init`` continues from a model folder this
    function wrote (its tokenizer and weights) instead of a fresh random model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1.core.agent_protocols import make_protocol, protocol_class
    from searchr1.core.builtins import resolve
    from searchr1.core.config import default_config_text, load_config
    from searchr1.core.logs import get_logger
    from searchr1.plugins.local_search import LocalBM25Search
    from searchr1.plugins.offline_world.generate import WORLD_SEED, write_world

    log = get_logger()
    out_dir = Path(out_dir)
    config = offline_config()
    world = generate_world(WORLD_SEED)
    reading = generate_world(READING_WORLD_SEED)
    resolve(config.plugin_table("search", "local")["corpus"])  # the same corpus the run reads
    with tempfile.TemporaryDirectory() as tmp:
        base = init or build_base(
            Path(tmp) / "base", world, protocol_class(config.rollout.protocol), seed
        )
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        write_world(Path(tmp) / "reading", reading)
        reading_toml = Path(tmp) / "reading.toml"
        reading_toml.write_text(
            default_config_text().replace(
                "builtin:world/corpus.jsonl", str(Path(tmp) / "reading" / "corpus.jsonl")
            )
        )
        reading_config = load_config(reading_toml, env={})
        protocol = make_protocol(config, tokenizer)

        async def collect() -> list[Episode]:
            out: list[Episode] = []
            for w, cfg, is_reading in ((world, config, False), (reading, reading_config, True)):
                search = LocalBM25Search.from_config(cfg)
                try:
                    for k in range(episodes_per_question):
                        batch = await script_episodes(
                            w,
                            w.train,
                            protocol,
                            search,
                            cfg,
                            seed=seed * 1000 + k + 100 * is_reading,
                        )
                        out += [dataclasses.replace(e, reading=is_reading) for e in batch]
                finally:
                    await search.aclose()
            return out

        episodes = asyncio.run(collect())
    lengths = sorted(len(e.tokens) for e in episodes)
    log.info(
        "cold_start.episodes",
        count=len(episodes),
        tokens_median=lengths[len(lengths) // 2],
        tokens_max=lengths[-1],
        params=sum(p.numel() for p in model.parameters()),
    )
    finetune(
        model,
        episodes,
        pad_id=int(tokenizer.pad_token_id),
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        read_weight=read_weight,
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_shipped(out_dir: Path) -> Path:
    """The recipe of the shipped ``searchr1/plugins/offline_world/warm_start`` weights: 1,200 steps from a
    random model (seed 0, lr 2e-3), then 1,500 more on freshly scripted episodes (seed 1,
    lr 1e-3). About 20 minutes on 2 idle CPU cores."""
    with tempfile.TemporaryDirectory() as tmp:
        first = build_warm_start(Path(tmp) / "phase1", seed=0, steps=1200, lr=2e-3)
        return build_warm_start(Path(out_dir), seed=1, steps=1500, lr=1e-3, init=first)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m searchr1.plugins.offline_world.cold_start --out DIR``: rebuild the warm start."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write the model to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--init", type=Path, help="continue from this warm-start folder")
    parser.add_argument(
        "--shipped", action="store_true", help="the shipped weights' two-phase recipe"
    )
    args = parser.parse_args(argv)
    from searchr1.core.logs import setup_logging

    setup_logging("cold_start")
    if args.shipped:
        build_shipped(args.out)
        print(f"warm start written to {args.out}")
        return 0
    build_warm_start(
        args.out,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        init=args.init,
    )
    print(f"warm start written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

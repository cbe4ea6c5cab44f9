"""A deterministic world of fictional entities, its corpus and its question sets.

The offline demo (``searchr1 train`` with no config) needs questions that no model can answer
from memory, so every name here is invented from syllables and every fact is drawn from a
seeded RNG. :func:`generate_world` builds the world in memory (the warm start reads its
structure); :func:`write_world` writes the files the rest of searchr1 reads.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: Syllables that build names: few and regular, so the tokenizer trained on the corpus learns
#: each as one token and a name costs 2-5 tokens (the tiny model copies names token by token).
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s")
_ORG_KINDS = ("Group", "Works", "Guild", "Company", "Press", "Society", "Institute", "Foundry")
_JOBS = ("painter", "farmer", "poet", "sailor", "engineer", "merchant", "scholar", "singer",
         "weaver", "doctor", "builder", "teacher")  # fmt: skip

ONE_HOP = "world_1hop"
TWO_HOP = "world_2hop"


@dataclass(frozen=True)
class Entity:
    """A person, organisation, city or country. ``facts`` holds its attributes by name:
    person: ``born_city``, ``born_year``, ``job``; org: ``founder``, ``city``, ``year``,
    ``kind``; city: ``country``; country: ``capital``."""

    id: str
    kind: str  # "person" | "org" | "city" | "country"
    name: str
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorldQuestion:
    """One question with its reasoning chain.

    ``hops`` are the entity names an ideal agent searches for, in order (one for one-hop, two
    for two-hop); ``subject`` is the entity id the question is about; ``mentions`` are every
    entity id named in the question or its answer (the held-out split is checked on them).
    """

    question: str
    answer: str
    data_source: str
    qtype: str
    subject: str
    hops: tuple[str, ...]
    mentions: frozenset[str]

    @property
    def id(self) -> str:
        """Stable and unique: one question of each type per subject."""
        return f"{self.qtype}-{self.subject}"

    def to_json(self) -> dict[str, object]:
        """The Search-R1 QA layout written to ``train.jsonl`` / ``heldout.jsonl``."""
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": [self.answer],
            "data_source": self.data_source,
        }


@dataclass(frozen=True)
class World:
    """Everything generated from one seed."""

    seed: int
    entities: dict[str, Entity]
    train: tuple[WorldQuestion, ...]
    heldout: tuple[WorldQuestion, ...]
    #: entity ids whose questions are reserved for the held-out set
    heldout_entities: frozenset[str]

    def documents(self) -> list[dict[str, str]]:
        """The corpus: one document per entity, in id order."""
        return [
            {"id": e.id, "contents": f'"{e.name}"\n{describe(e, self.entities)}'}
            for e in self.entities.values()
        ]

    def by_name(self) -> dict[str, Entity]:
        return {e.name: e for e in self.entities.values()}


def describe(entity: Entity, entities: dict[str, Entity]) -> str:
    """The text of an entity's document: short, fixed phrasing, one fact per clause.

    The phrasing is fixed on purpose: a one-hop answer is always a span of the subject's own
    document, and a two-hop answer is only in the document of the bridge entity (a person's
    document names the city but never the country), so two searches are needed.
    """
    f = entity.facts
    if entity.kind == "person":
        city = entities[f["born_city"]].name
        return f"{entity.name} was a {f['job']} born in {city} in {f['born_year']}."
    if entity.kind == "org":
        founder, city = entities[f["founder"]].name, entities[f["city"]].name
        return f"{entity.name} was founded by {founder} in {f['year']} and is based in {city}."
    if entity.kind == "city":
        return f"{entity.name} is a city in {entities[f['country']].name}."
    if entity.kind == "country":
        return f"{entity.name} is a country whose capital is {entities[f['capital']].name}."
    raise ValueError(f"unknown entity kind {entity.kind!r}")


class _Names:
    """Invented names whose words are all distinct: no word is shared by two entities, so a
    search for one entity's name never ties with another's document, and a name never
    appears inside another name."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.words: set[str] = set()

    def word(self, syllables: int) -> str:
        parts = [
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def unique(self, make: Iterable[int]) -> str:
        words = []
        for size in make:
            for _ in range(1000):
                w = self.word(size)
                if w not in self.words and w.lower() not in _RESERVED and w not in words:
                    words.append(w)
                    break
            else:
                raise RuntimeError("name space exhausted; use more syllables")
        self.words.update(words)
        return " ".join(words)


#: Words a generated name must not equal (they occur in documents, questions or prompts).
_RESERVED = frozenset(
    "a an the in of is was by it its born city country founded based year where who which what "
    "answer search think information doc title".split()
)

#: The seed of the shipped offline world (``builtin:world``); the warm start and the ideal
#: agent are built on the same world.
WORLD_SEED = 0


def generate_world(
    seed: int = 0,
    *,
    n_people: int = 3550,
    n_orgs: int = 900,
    n_cities: int = 500,
    n_countries: int = 50,
    heldout_fraction: float = 0.2,
    n_heldout: int = 320,
    two_hop_share: float = 0.4,
    max_train_per_type: int = 600,
) -> World:
    """Build the world for ``seed`` (same seed and sizes -> identical world).

    ``heldout_fraction`` of the people, organisations and cities are reserved: questions about
    them form the held-out pool, and no training question names them. ``n_heldout`` questions
    are drawn from that pool (``two_hop_share`` of them two-hop, balanced across types).
    Training keeps at most ``max_train_per_type`` questions of each type, so no type dominates
    the batches.
    """
    rng = random.Random(seed)
    entities, people, orgs, cities = _entities(rng, n_people, n_orgs, n_cities, n_countries)
    reserved: set[str] = set()
    for group in (people, orgs, cities):
        k = round(len(group) * heldout_fraction)
        reserved.update(rng.sample(group, k))
    pool = _all_questions(entities, people, orgs, cities)
    train = _train_questions(rng, pool, reserved, max_train_per_type)
    held_pool = [q for q in pool if q.subject in reserved]
    heldout = _balanced_sample(rng, held_pool, n_heldout, two_hop_share)
    rng.shuffle(train)
    return World(seed, entities, tuple(train), tuple(heldout), frozenset(reserved))


def _entities(
    rng: random.Random, n_people: int, n_orgs: int, n_cities: int, n_countries: int
) -> tuple[dict[str, Entity], list[str], list[str], list[str]]:
    """The world's entities by id (countries, cities, people, organisations, in that order
    of draws), and the ids of the people, organisations and cities."""
    names = _Names(rng)
    entities: dict[str, Entity] = {}
    counts: dict[str, int] = {}

    def add(kind: str, name: str, facts: dict[str, str]) -> str:
        counts[kind] = counts.get(kind, 0) + 1
        eid = f"{kind}-{counts[kind] - 1:05d}"
        entities[eid] = Entity(eid, kind, name, facts)
        return eid

    countries = [add("country", names.unique([2]), {}) for _ in range(n_countries)]
    if n_cities < n_countries:
        raise ValueError(f"n_cities={n_cities} must be >= n_countries={n_countries}")
    # The first city of each country is its capital, so every country has one.
    cities = [
        add(
            "city",
            names.unique([rng.choice((2, 2, 3))]),
            {"country": countries[i] if i < n_countries else rng.choice(countries)},
        )
        for i in range(n_cities)
    ]
    for c, capital in zip(countries, cities, strict=False):
        entities[c].facts["capital"] = capital
    people = [
        add(
            "person",
            names.unique([2, 2]),
            {
                "born_city": rng.choice(cities),
                "born_year": str(rng.randint(1650, 1990)),
                "job": rng.choice(_JOBS),
            },
        )
        for _ in range(n_people)
    ]
    orgs = []
    for _ in range(n_orgs):
        founder = rng.choice(people)
        year = int(entities[founder].facts["born_year"]) + rng.randint(20, 50)
        # Based elsewhere than its founder's birthplace: a one-hop reader of the org's
        # document must not stumble on the two-hop answer.
        home = rng.choice([c for c in cities if c != entities[founder].facts["born_city"]])
        orgs.append(
            add(
                "org",
                f"{names.unique([2])} {rng.choice(_ORG_KINDS)}",
                {"founder": founder, "city": home, "year": str(year)},
            )
        )
    return entities, people, orgs, cities


def _train_questions(
    rng: random.Random, pool: list[WorldQuestion], reserved: set[str], per_type: int
) -> list[WorldQuestion]:
    """At most ``per_type`` questions of each type that name no reserved entity."""
    by_type: dict[str, list[WorldQuestion]] = {}
    for item in pool:
        if not (item.mentions & reserved):
            by_type.setdefault(item.qtype, []).append(item)
    return [
        item
        for qtype in sorted(by_type)
        for item in rng.sample(by_type[qtype], min(per_type, len(by_type[qtype])))
    ]


def _all_questions(
    entities: dict[str, Entity], people: list[str], orgs: list[str], cities: list[str]
) -> list[WorldQuestion]:
    """Every question the world supports, in a fixed order."""
    e = entities
    out: list[WorldQuestion] = []

    def q(text: str, answer: str, qtype: str, subject: str, hops: tuple[str, ...], *more: str):
        source = ONE_HOP if len(hops) == 1 else TWO_HOP
        mentions = frozenset((subject, *more))
        out.append(WorldQuestion(text, answer, source, qtype, subject, hops, mentions))

    for p in people:
        person = e[p]
        city = e[person.facts["born_city"]]
        country = e[city.facts["country"]]
        q(f"Where was {person.name} born?", city.name, "born_city", p, (person.name,), city.id)
        q(f"In which year was {person.name} born?", person.facts["born_year"], "born_year", p,
          (person.name,))  # fmt: skip
        q(f"In which country was {person.name} born?", country.name, "born_country", p,
          (person.name, city.name), country.id)  # fmt: skip
    for o in orgs:
        org = e[o]
        founder = e[org.facts["founder"]]
        city = e[founder.facts["born_city"]]
        q(f"Who founded {org.name}?", founder.name, "founder", o, (org.name,), founder.id)
        q(f"Where was the founder of {org.name} born?", city.name, "founder_city", o,
          (org.name, founder.name), city.id)  # fmt: skip
    for c in cities:
        city = e[c]
        country = e[city.facts["country"]]
        q(f"In which country is {city.name}?", country.name, "city_country", c, (city.name,),
          country.id)  # fmt: skip
    return out


def _balanced_sample(
    rng: random.Random, pool: list[WorldQuestion], n: int, two_hop_share: float
) -> list[WorldQuestion]:
    """``n`` questions, ``two_hop_share`` two-hop, spread evenly over the question types."""
    by_type: dict[str, list[WorldQuestion]] = {}
    for item in pool:
        by_type.setdefault(item.qtype, []).append(item)
    n_two = round(n * two_hop_share)
    chosen: list[WorldQuestion] = []
    for source, want in ((ONE_HOP, n - n_two), (TWO_HOP, n_two)):
        types = sorted(t for t, qs in by_type.items() if qs[0].data_source == source)
        for i, t in enumerate(types):
            k = want // len(types) + (1 if i < want % len(types) else 0)
            if len(by_type[t]) < k:
                raise ValueError(f"held-out pool has only {len(by_type[t])} {t} questions")
            chosen.extend(rng.sample(by_type[t], k))
    rng.shuffle(chosen)
    return chosen


def write_jsonl(path: Path, rows: Iterable[dict[str, object]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_world(folder: Path, world: World) -> None:
    """Write ``corpus.jsonl``, ``train.jsonl`` and ``heldout.jsonl`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl", world.documents())
    write_jsonl(folder / "train.jsonl", (q.to_json() for q in world.train))
    write_jsonl(folder / "heldout.jsonl", (q.to_json() for q in world.heldout))

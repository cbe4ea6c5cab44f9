"""The harder offline world (``builtin:world-hard``): each question type needs its own search
behaviour, so a training recipe's effect on each shows up in its own ``data_source``.

Fictional entities from a seeded RNG, like :mod:`~searchr1.plugins.offline_world.generate`.
Documents come in several phrasings, a person may have a second (career) document, some
people share one full name, some countries have a formal name beside the short one, and every
document cites the same archive. :data:`SOURCES` lists the types; :class:`HardQuestion` records
the searches an ideal agent makes (``hops``) and the document sentences it must read
(``evidence``). Held-out questions are only about entities no training question names.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from searchr1.plugins.offline_world.generate import _JOBS, _ORG_KINDS, _Names, write_jsonl

ONE_HOP, TWO_HOP, THREE_HOP = "hard_1hop", "hard_2hop", "hard_3hop"
COMPARE, DISTRACTOR, TWO_DOC = "hard_compare", "hard_distractor", "hard_twodoc"
ALIAS, NO_SEARCH = "hard_alias", "hard_nosearch"
#: every question type, each its own ``data_source``
SOURCES = (ONE_HOP, TWO_HOP, THREE_HOP, COMPARE, DISTRACTOR, TWO_DOC, ALIAS, NO_SEARCH)
#: the types the example's cold start imitates: the protocol (search a name, search again on
#: what it read, answer), not the comparisons, distractors, aliases or when not to search
COLD_START_SOURCES = (ONE_HOP, TWO_HOP)
HARD_WORLD_SEED = 0
_FORMAL = ("Kingdom", "Republic", "Duchy", "Federation")


@dataclass(frozen=True)
class Doc:
    """One corpus document; ``text`` without the archive line (what evidence quotes)."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class HardQuestion:
    """A question with what answering it takes: ``hops`` are the queries an ideal agent
    sends, in order (each names something the question or an earlier result holds);
    ``evidence`` the document texts it must have read to answer; ``about`` the entity ids the
    question is about (held-out ones are all reserved); ``mentions`` every entity id the
    question or its answers name (no training question names a reserved one)."""

    qid: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str
    qtype: str
    hops: tuple[str, ...]
    evidence: tuple[str, ...]
    about: frozenset[str]
    mentions: frozenset[str]

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.qid,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "data_source": self.data_source,
        }


@dataclass(frozen=True)
class HardWorld:
    """Everything generated from one seed; ``reserved``: the entity ids held out."""

    seed: int
    archive: str
    docs: tuple[Doc, ...]
    train: tuple[HardQuestion, ...]
    heldout: tuple[HardQuestion, ...]
    reserved: frozenset[str]

    def documents(self) -> list[dict[str, str]]:
        """The corpus rows; every text ends with the archive every document cites."""
        return [
            {"id": d.id, "contents": f'"{d.title}"\n{d.text} Source: {self.archive}.'}
            for d in self.docs
        ]

    def cold_start(self) -> list[HardQuestion]:
        """The training questions the example's cold start imitates."""
        return [q for q in self.train if q.data_source in COLD_START_SOURCES]


def generate_hard_world(
    seed: int = HARD_WORLD_SEED,
    *,
    n_people: int = 1800,
    n_twins: int = 150,
    n_orgs: int = 500,
    n_cities: int = 400,
    n_countries: int = 30,
    career_share: float = 0.3,
    heldout_fraction: float = 0.2,
    heldout_per_source: int = 40,
    train_per_source: int = 400,
) -> HardWorld:
    """Build the world for ``seed`` (same seed and sizes -> the same world)."""
    rng = random.Random(seed)
    names = _Names(rng)
    archive = f"{names.unique([2])} Archive"
    countries, cities, people, twins, orgs = _entities(
        rng, names, n_people, n_twins, n_orgs, n_cities, n_countries, career_share
    )
    single = [p for p in people if "twin" not in p]
    docs = _documents(rng, countries, cities, people + twins, orgs)
    reserved: set[str] = set()
    for group in (single, orgs, cities, twins):
        reserved.update(e["id"] for e in rng.sample(group, round(len(group) * heldout_fraction)))
    reserved.update(p["twin"]["id"] for p in twins if p["id"] in reserved)
    pool = _questions(rng, names, archive, docs, single, twins, orgs, cities, reserved)
    train = [q for q in pool if not q.mentions & reserved]
    held = [q for q in pool if q.about <= reserved]
    train = _per_source(rng, train, train_per_source, exact=False)
    heldout = _per_source(rng, held, heldout_per_source, exact=True)
    return HardWorld(seed, archive, tuple(docs.values()), train, heldout, frozenset(reserved))


def _entities(
    rng: random.Random,
    names: _Names,
    n_people: int,
    n_twins: int,
    n_orgs: int,
    n_cities: int,
    n_countries: int,
    career_share: float,
) -> tuple[list[dict], list[dict], list[dict], list[dict], list[dict]]:
    """The countries, cities, people, their twins and the organisations (with the careers of
    ``career_share`` of the people who have no twin), drawn in that order."""
    countries = [
        {"id": f"country-{i:03d}", "name": names.unique([2]), "formal": None}
        for i in range(n_countries)
    ]
    for c in countries[1::3] + countries[2::3]:  # a formal name too (the alias answers)
        c["formal"] = f"{rng.choice(_FORMAL)} of {c['name']}"
    cities = [
        {
            "id": f"city-{i:03d}",
            "name": names.unique([rng.choice((2, 3))]),
            "country": countries[i] if i < n_countries else rng.choice(countries),
            "capital": i < n_countries,
        }
        for i in range(n_cities)
    ]

    def person(i: int, name: str | None = None, job: str | None = None) -> dict:
        year = rng.randint(1650, 1990)
        return {
            "id": f"person-{i:05d}",
            "name": name or names.unique([2, 2]),
            "city": rng.choice(cities),
            "year": year,
            "job": job or rng.choice(_JOBS),
        }

    people = [person(i) for i in range(n_people)]
    # Twins: a second person of the same full name, another job (the distractor questions).
    twins = []
    for i, first in enumerate(rng.sample(people, n_twins)):
        job = rng.choice([j for j in _JOBS if j != first["job"]])
        twins.append(person(n_people + i, first["name"], job))
        first["twin"] = twins[-1]
        twins[-1]["twin"] = first
    single = [p for p in people if "twin" not in p]
    orgs = _organisations(rng, names, n_orgs, single, cities, career_share)
    return countries, cities, people, twins, orgs


def _organisations(
    rng: random.Random,
    names: _Names,
    n_orgs: int,
    single: list[dict],
    cities: list[dict],
    career_share: float,
) -> list[dict]:
    """The organisations, each founded by a person without a twin, and the careers (two
    organisations, one in the birth city) of ``career_share`` of those people."""
    orgs = []
    for i in range(n_orgs):
        founder = rng.choice(single)
        orgs.append(
            {
                "id": f"org-{i:04d}",
                "name": f"{names.unique([2])} {rng.choice(_ORG_KINDS)}",
                "founder": founder,
                "year": founder["year"] + rng.randint(20, 50),
                "city": rng.choice([c for c in cities if c is not founder["city"]]),
            }
        )
    for p in rng.sample(single, round(len(single) * career_share)):
        work = rng.sample(orgs, 2)
        other = rng.choice([c for c in cities if c is not p["city"]])
        p["career"] = list(zip(work, (p["city"], other), strict=True))
        rng.shuffle(p["career"])  # where the birth city comes is no clue
        p["home_org"] = work[0]
    return orgs


def _documents(
    rng: random.Random,
    countries: list[dict],
    cities: list[dict],
    people: list[dict],
    orgs: list[dict],
) -> dict[str, Doc]:
    """One document per entity (``people``: the twins too) and one per career, by id, in a
    fixed order."""
    docs: dict[str, Doc] = {}

    def country_form(c: dict) -> str:
        return rng.choice((c["name"], c["formal"])) if c["formal"] else c["name"]

    for c in countries:
        cap = next(x for x in cities if x["country"] is c and x["capital"])["name"]
        text = (
            f"{c['name']}, formally the {c['formal']}, has its capital at {cap}."
            if c["formal"]
            else f"{c['name']} is a country whose capital is {cap}."
        )
        docs[c["id"]] = Doc(c["id"], c["name"], text)
    for x in cities:
        k = country_form(x["country"])
        text = rng.choice(
            (f"{x['name']} is the capital of {k}.",)
            if x["capital"]
            else (f"{x['name']} is a city in {k}.", f"{x['name']} lies in {k}.")
        )
        docs[x["id"]] = Doc(x["id"], x["name"], text)
    for p in people:
        n, job, city, year = p["name"], p["job"], p["city"]["name"], p["year"]
        text = rng.choice(
            (
                f"{n} was {_a(job)} born in {city} in {year}.",
                f"{n}, {_a(job)}, came into the world in {city} in the year {year}.",
                f"Born in {city} in {year}, {n} worked as a {job}.",
            )
        )
        docs[p["id"]] = Doc(p["id"], n, text)
        if "career" in p:
            (o1, c1), (o2, c2) = ((o["name"], c["name"]) for o, c in p["career"])
            text = rng.choice(
                (
                    f"{n} worked for {o1} in {c1} and later for {o2} in {c2}.",
                    f"{n} held posts at {o1} in {c1} and then at {o2} in {c2}.",
                )
            )
            docs[p["id"] + "-career"] = Doc(p["id"] + "-career", n, text)
    for o in orgs:
        n, f, year, city = o["name"], o["founder"]["name"], o["year"], o["city"]["name"]
        text = rng.choice(
            (
                f"{n} was founded by {f} in {year} and is based in {city}.",
                f"Founded in {year} by {f}, {n} has its seat in {city}.",
                f"{n}, based in {city}, was set up by {f} in {year}.",
            )
        )
        docs[o["id"]] = Doc(o["id"], n, text)
    return docs


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _questions(
    rng: random.Random,
    names: _Names,
    archive: str,
    docs: dict[str, Doc],
    single: list[dict],
    twins: list[dict],
    orgs: list[dict],
    cities: list[dict],
    reserved: set[str],
) -> list[HardQuestion]:
    """Every question the world supports, in a fixed order."""
    asked = _Asked(docs)
    _person_questions(asked, rng, names, archive, single, cities)
    _org_questions(asked, orgs, cities)
    q, ev, forms = asked.q, asked.ev, asked.forms
    for x in cities:
        if x["country"]["formal"] and not x["capital"]:
            q(ALIAS, "city_country", f"In which country is {x['name']}?", forms(x["country"]),
              (x["name"],), ev(x), [x], x["country"])  # fmt: skip
    for p in twins:
        for a in (p, p["twin"]):
            n, job = a["name"], a["job"]
            q(DISTRACTOR, "twin_year", f"In which year was the {job} {n} born?",
              [str(a["year"])], (f"{n} {job}",), ev(a), [a, a["twin"]])  # fmt: skip
            q(DISTRACTOR, "twin_city", f"Where was the {job} {n} born?", [a["city"]["name"]],
              (f"{n} {job}",), ev(a), [a, a["twin"]], a["city"])  # fmt: skip
    _comparisons(asked, rng, single, orgs, reserved)
    return asked.out


class _Asked:
    """The questions asked so far, and how one is written down."""

    def __init__(self, docs: dict[str, Doc]) -> None:
        self.docs = docs
        self.out: list[HardQuestion] = []

    def ev(self, *entities: dict) -> tuple[str, ...]:
        return tuple(self.docs[e["id"]].text for e in entities)

    @staticmethod
    def forms(country: dict) -> tuple[str, ...]:
        return (country["name"], country["formal"]) if country["formal"] else (country["name"],)

    def q(self, source, qtype, text, golden, hops, evidence, about, *more) -> None:
        ids = frozenset(e["id"] for e in about)
        mentions = ids | {e["id"] for e in more}
        qid = f"{qtype}-{'-'.join(e['id'] for e in about)}"
        self.out.append(
            HardQuestion(qid, text, tuple(golden), source, qtype, hops, evidence, ids, mentions)
        )


def _person_questions(
    asked: _Asked,
    rng: random.Random,
    names: _Names,
    archive: str,
    single: list[dict],
    cities: list[dict],
) -> None:
    q, ev, forms, docs = asked.q, asked.ev, asked.forms, asked.docs
    for p in single:
        n, city, country = p["name"], p["city"], p["city"]["country"]
        q(ONE_HOP, "born_year", f"In which year was {n} born?", [str(p["year"])], (n,), ev(p), [p])
        q(ONE_HOP, "born_city", f"Where was {n} born?", [city["name"]], (n,), ev(p), [p], city)
        q(TWO_HOP, "born_country", f"In which country was {n} born?", forms(country),
          (n, city["name"]), ev(p, city), [p], country)  # fmt: skip
        q(NO_SEARCH, "archive", f"Which archive is the source of the record on {n}?", [archive],
          (), (), [p])  # fmt: skip
        if "career" in p:
            home = next(o for o, c in p["career"] if c is city)
            q(TWO_DOC, "home_employer",
              f"For which organisation did {n} work in the city where {n} was born?",
              [home["name"]], (n,), (docs[p["id"]].text, docs[p["id"] + "-career"].text), [p],
              *(o for o, _ in p["career"]))  # fmt: skip
        # A stranger the corpus does not know, named with a word of this person's name: the
        # question says the answer, a search returns this person's facts instead.
        stranger = f"{n.split()[0]} {names.unique([2])}"
        place = rng.choice([c for c in cities if c is not city])
        year = rng.choice([y for y in range(1650, 1991) if y != p["year"]])
        intro = f"{stranger}, {_a(rng.choice(_JOBS))}, was born in {place['name']} in {year}."
        if rng.random() < 0.5:
            q(NO_SEARCH, "stated_city", f"{intro} Where was {stranger} born?", [place["name"]],
              (), (), [p], place)  # fmt: skip
        else:
            q(NO_SEARCH, "stated_year", f"{intro} In which year was {stranger} born?",
              [str(year)], (), (), [p], place)  # fmt: skip


def _org_questions(asked: _Asked, orgs: list[dict], cities: list[dict]) -> None:
    q, ev, forms = asked.q, asked.ev, asked.forms
    for o in orgs:
        n, f = o["name"], o["founder"]
        city, home = f["city"], o["city"]
        q(ONE_HOP, "founder", f"Who founded {n}?", [f["name"]], (n,), ev(o), [o], f)
        q(TWO_HOP, "founder_year", f"In which year was the founder of {n} born?",
          [str(f["year"])], (n, f["name"]), ev(o, f), [o], f)  # fmt: skip
        q(THREE_HOP, "founder_country", f"In which country was the founder of {n} born?",
          forms(city["country"]), (n, f["name"], city["name"]), ev(o, f, city), [o], f,
          city["country"])  # fmt: skip
        capital = next(c for c in cities if c["country"] is home["country"] and c["capital"])
        if home is not capital:
            q(THREE_HOP, "seat_capital",
              f"What is the capital of the country where {n} is based?", [capital["name"]],
              (n, home["name"], home["country"]["name"]),
              ev(o, home, home["country"]), [o], capital)  # fmt: skip


def _comparisons(
    asked: _Asked, rng: random.Random, single: list[dict], orgs: list[dict], reserved: set[str]
) -> None:
    q, ev = asked.q, asked.ev
    # Comparisons: consecutive pairs, reserved entities first (so that held-out pairs are
    # both reserved); pairs of one year are skipped.
    for group, what, verb in ((single, "year", "born"), (orgs, "year", "founded")):
        order = group[:]
        rng.shuffle(order)
        order.sort(key=lambda e: e["id"] not in reserved)
        for a, b in zip(order[::2], order[1::2], strict=False):
            if a[what] == b[what]:
                continue
            first = a if a[what] < b[what] else b
            who = "Who was" if verb == "born" else "Which was"
            q(COMPARE, f"{verb}_earlier", f"{who} {verb} earlier, {a['name']} or {b['name']}?",
              [first["name"]], (a["name"], b["name"]), ev(a, b), [a, b])  # fmt: skip


def _per_source(
    rng: random.Random, pool: list[HardQuestion], n: int, *, exact: bool
) -> tuple[HardQuestion, ...]:
    """Up to ``n`` questions of each source (exactly ``n`` when ``exact``), its question
    types in turn, shuffled together."""
    chosen: list[HardQuestion] = []
    for source in SOURCES:
        by_type: dict[str, list[HardQuestion]] = {}
        for item in pool:
            if item.data_source == source:
                by_type.setdefault(item.qtype, []).append(item)
        for qs in by_type.values():
            rng.shuffle(qs)
        mixed = [
            qs[i]
            for i in range(max(map(len, by_type.values()), default=0))
            for _, qs in sorted(by_type.items())
            if i < len(qs)
        ]
        if exact and len(mixed) < n:
            raise ValueError(f"the held-out pool has only {len(mixed)} {source} questions")
        chosen.extend(mixed[:n])
    rng.shuffle(chosen)
    return tuple(chosen)


def write_hard_world(folder: Path, world: HardWorld) -> None:
    """``corpus.jsonl``, ``train.jsonl``, ``heldout.jsonl`` and ``cold_start.jsonl`` (the
    training questions of :data:`COLD_START_SOURCES`) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl", world.documents())
    write_jsonl(folder / "train.jsonl", (q.to_json() for q in world.train))
    write_jsonl(folder / "heldout.jsonl", (q.to_json() for q in world.heldout))
    write_jsonl(folder / "cold_start.jsonl", (q.to_json() for q in world.cold_start()))

"""The ``dense`` provider, ``searchr1 index build`` and ``searchr1 serve-retriever``: the index
card, resumable builds, the encoder check, batching, and Search-R1's ``/retrieve`` protocol
served on loopback and read by the ``search_r1`` provider."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from searchr1.core.config import parse_config
from searchr1.core.errors import ConfigError
from searchr1.core.plugins import load_registry
from searchr1.plugins.dense_search import DenseSearch
from searchr1.plugins.dense_search.encoders import DEFAULT_ENCODER, load_encoder
from searchr1.plugins.dense_search.index import IndexCard, build_index
from searchr1.plugins.dense_search.server import RetrieverServer
from searchr1.plugins.search_r1_retriever import SearchR1Retriever

ROWS = [
    {"id": "p1", "contents": '"Paris"\nParis is the capital of France, on the Seine.'},
    {"id": "p2", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"title": "Mount Kilimanjaro", "text": "Kilimanjaro is the highest mountain in Africa."},
    {"id": "p4", "contents": '"Photosynthesis"\nPlants turn sunlight and water into sugar.'},
    {"id": "p5", "contents": '"Violin"\nThe violin is a string instrument played with a bow.'},
    {"id": "p6", "contents": '"Volcano"\nA volcano erupts lava, ash and gas from the crust.'},
    {"id": "p7", "contents": '"Penguin"\nPenguins are flightless birds of the Antarctic.'},
    {"id": "p8", "contents": '"Chess"\nChess is a board game of kings, queens and pawns.'},
]
QUERIES = {
    "which instrument is played with a bow": "Violin",
    "flightless birds antarctic": "Penguin",
    "highest mountain in africa": "Mount Kilimanjaro",
    "lava and ash": "Volcano",
}


def write_corpus(path: Path, rows: list[dict] = ROWS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def dense_config(index: Path, extra: str = "") -> object:
    text = f'[search]\nprovider = "dense"\n[search.dense]\nindex = "{index}"\n{extra}'
    return parse_config(text, source="test.toml", env={}, registry=load_registry())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flat index of ROWS with the default (static wordllama) encoder."""
    tmp = tmp_path_factory.mktemp("dense")
    corpus = write_corpus(tmp / "corpus.jsonl")
    build_index(corpus, tmp / "index")
    return tmp / "index"


def test_index_build_command_writes_a_card_that_the_provider_reads(tmp_path, run_cli) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    result = run_cli("index", "build", corpus, "--out", tmp_path / "idx", "--shard-size", "3")
    assert result.code == 0, result.err
    *progress, done = [json.loads(x) for x in result.out.splitlines()]  # piped: JSON lines only
    assert [p["passages"] for p in progress if p["stage"] == "encode"] == [0, 3, 6, 8]
    assert (done["event"], done["outcome"], done["passages"]) == ("index_built", "built", 8)
    card = IndexCard.read(tmp_path / "idx")
    assert (card.encoder, card.dim, card.kind, card.count) == (DEFAULT_ENCODER, 256, "flat", 8)
    assert card.bytes == (tmp_path / "idx" / "index.faiss").stat().st_size
    assert card.bytes_per_passage == pytest.approx(card.bytes / 8, abs=0.01)
    assert card.bytes_per_passage >= 4 * 256 and card.build_seconds > 0
    assert not (tmp_path / "idx" / ".build").exists()

    again = run_cli("index", "build", corpus, "--out", tmp_path / "idx")
    assert again.code == 0 and json.loads(again.out)["outcome"] == "up to date"
    other = run_cli("index", "build", corpus, "--out", tmp_path / "idx", "--kind", "hnsw")
    assert other.code == 2 and "--force" in other.err and "already holds" in other.err

    provider = DenseSearch.from_config(dense_config(tmp_path / "idx"))
    response = asyncio.run(provider.search("capital of Germany", 1))
    assert response.ok and len(response.results) == 1
    assert (response.results[0].title, response.results[0].text) == (
        "Berlin",
        "Berlin is the capital of Germany.",
    )
    assert 0 < response.results[0].score <= 1.0 + 1e-6


def test_dense_provider_ranks_the_matching_passage_first(built: Path) -> None:
    provider = DenseSearch.from_config(dense_config(built))

    async def run() -> list:
        return await asyncio.gather(*(provider.search(q, 3) for q in QUERIES))

    for response, title in zip(asyncio.run(run()), QUERIES.values(), strict=True):
        assert response.ok and len(response.results) == 3
        assert response.results[0].title == title
        scores = [r.score for r in response.results]
        assert scores == sorted(scores, reverse=True)


def test_concurrent_queries_share_one_encode_and_search(built: Path) -> None:
    provider = DenseSearch.from_config(dense_config(built, "batch_window_ms = 50"))
    calls: list[int] = []
    real = provider.index.search

    def counting(queries: list[str], top_k: int):
        calls.append(len(queries))
        return real(queries, top_k)

    provider.index.search = counting  # type: ignore[method-assign]

    async def run() -> list:
        return await asyncio.gather(
            *(provider.search(f"{q} {i}", 2) for i, q in enumerate(QUERIES))
        )

    responses = asyncio.run(run())
    assert all(r.ok and len(r.results) == 2 for r in responses)
    assert calls == [len(QUERIES)]


def test_a_crashed_build_resumes_from_its_last_shard(tmp_path: Path, run_cli) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    real = load_encoder(DEFAULT_ENCODER)
    encoded: list[int] = []

    class Crashing:
        name, dim, prefixes = real.name, real.dim, real.prefixes

        def encode(self, texts: list[str], *, query: bool):
            if len(encoded) == 2 and not query:
                raise RuntimeError("killed")
            encoded.append(len(texts))
            return real.encode(texts, query=query)

    with pytest.raises(RuntimeError, match="killed"):
        build_index(corpus, tmp_path / "idx", shard_rows=3, encoder=Crashing())  # type: ignore[arg-type]
    assert encoded == [3, 3] and not (tmp_path / "idx" / "card.json").exists()
    # a finished index is needed to search: the message says how to finish this one
    with pytest.raises(ConfigError, match="run the same `searchr1 index build` again"):
        DenseSearch.from_config(dense_config(tmp_path / "idx"))

    result = run_cli("index", "build", corpus, "--out", tmp_path / "idx", "--shard-size", "3")
    assert result.code == 0, result.err
    *progress, done = [json.loads(x) for x in result.out.splitlines()]
    assert progress[0]["passages"] == 6 and progress[0]["resumed_from"] == 6
    assert (done["outcome"], done["passages"]) == ("resumed", 8)

    fresh = run_cli("index", "build", corpus, "--out", tmp_path / "fresh")
    assert fresh.code == 0
    resumed = DenseSearch.from_config(dense_config(tmp_path / "idx")).index
    whole = DenseSearch.from_config(dense_config(tmp_path / "fresh")).index
    queries = list(QUERIES)
    assert (resumed.ids(queries, 8) == whole.ids(queries, 8)).all()
    assert [resumed.document(i) for i in range(8)] == [whole.document(i) for i in range(8)]


def test_bad_corpus_and_bad_index_are_named_errors(tmp_path: Path, run_cli) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n", "utf-8")
    result = run_cli("index", "build", bad, "--out", tmp_path / "idx")
    assert result.code == 2 and f"{bad}:2: not valid JSON" in result.err
    assert "Traceback" not in result.err
    missing = run_cli("index", "build", tmp_path / "nope.jsonl", "--out", tmp_path / "idx")
    assert missing.code == 2 and "no such corpus file" in missing.err
    unset = parse_config(
        '[search]\nprovider = "dense"\n', source="t.toml", env={}, registry=load_registry()
    )
    with pytest.raises(ConfigError, match="search.dense.index is not set"):
        DenseSearch.from_config(unset)
    with pytest.raises(ConfigError, match=r"search.dense.index = .*not a finished dense index"):
        DenseSearch.from_config(dense_config(tmp_path / "empty"))
    served = run_cli("serve-retriever", "--index", tmp_path / "empty", "--port", "0")
    assert served.code == 2 and "--index" in served.err and "index build" in served.err


def test_an_encoder_other_than_the_builders_is_refused(tmp_path: Path, built: Path) -> None:
    from dense_models import tiny_sentence_model

    texts = [r.get("contents") or r["text"] for r in ROWS] + list(QUERIES)
    model = tiny_sentence_model(tmp_path / "tiny-e5", texts, seed=1)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    card, _ = build_index(corpus, tmp_path / "idx", encoder_name=str(model), kind="hnsw")
    # the sentence-transformers path: e5's prefixes picked from the name, recorded in the card
    assert (card.dim, card.kind, card.prefixes) == (
        32,
        "hnsw",
        {"query": "query: ", "passage": "passage: "},
    )
    provider = DenseSearch.from_config(dense_config(tmp_path / "idx"))
    assert provider.index.encoder.prefixes.query == "query: "
    assert len(asyncio.run(provider.search("penguin", 3)).results) == 3

    # another name than the card's
    with pytest.raises(ConfigError, match=r"differs from .*tiny-e5.*the encoder that built"):
        DenseSearch.from_config(dense_config(tmp_path / "idx", f'encoder = "{DEFAULT_ENCODER}"'))
    # the same name, other weights behind it
    shutil.rmtree(model)
    tiny_sentence_model(model, texts, seed=2)
    with pytest.raises(ConfigError, match=r"is not the one that built .*probe vector"):
        DenseSearch.from_config(dense_config(tmp_path / "idx"))
    # and a card of another dimension than the default encoder
    with pytest.raises(ConfigError, match="differs from"):
        DenseSearch.from_config(dense_config(built, 'encoder = "tiny"'))


@pytest.fixture(scope="module")
def server(built: Path) -> Iterator[RetrieverServer]:
    from searchr1.plugins.dense_search import DenseSearchSettings, open_index

    srv = RetrieverServer(open_index(str(built), DenseSearchSettings(), "--index"), port=0)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join()
    srv.close()


def test_server_answers_search_r1s_retrieve_protocol(server: RetrieverServer) -> None:
    url = server.url + "/retrieve"
    body = {"queries": list(QUERIES), "topk": 2, "return_scores": True}
    result = httpx.post(url, json=body).json()["result"]
    assert len(result) == len(QUERIES)
    for hits, title in zip(result, QUERIES.values(), strict=True):
        assert len(hits) == 2 and set(hits[0]) == {"document", "score"}
        assert set(hits[0]["document"]) == {"id", "contents"}
        assert hits[0]["document"]["contents"].startswith(f'"{title}"\n')
        assert hits[0]["score"] >= hits[1]["score"]
    # the original's other shape: documents only; topk defaults to 3
    plain = httpx.post(url, json={"queries": ["lava and ash"]}).json()["result"]
    assert len(plain[0]) == 3 and plain[0][0]["id"] == "p6"

    bad = httpx.post(url, json={"queries": ["x"], "topk": 0})
    assert bad.status_code == 422 and '"topk"' in bad.json()["error"]
    bad = httpx.post(url, json={"queries": "x"})
    assert bad.status_code == 422 and '"queries"' in bad.json()["error"]
    assert httpx.post(url, content=b"{oops").status_code == 400
    assert httpx.post(server.url + "/search", json={}).status_code == 404
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["count"] == len(ROWS)


def test_concurrent_requests_share_one_search_on_the_server(built: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from searchr1.plugins.dense_search import DenseSearchSettings, open_index

    index = open_index(str(built), DenseSearchSettings(), "--index")
    srv = RetrieverServer(index, port=0, batch_window_ms=300)
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    try:
        alone = {q: index.search([q], k)[0] for k, q in enumerate(QUERIES, start=1)}

        def ask(item: tuple[int, str]) -> list:
            k, q = item
            body = {"queries": [q], "topk": k, "return_scores": True}
            return httpx.post(srv.url + "/retrieve", json=body, timeout=30).json()["result"][0]

        with ThreadPoolExecutor(len(QUERIES)) as pool:
            answers = list(pool.map(ask, enumerate(QUERIES, start=1)))
        assert srv.batcher.searches < len(QUERIES)  # requests were batched together
        for hits, got in zip(alone.values(), answers, strict=True):
            assert [h["document"] for h in got] == [d for d, _ in hits]  # each its own topk
            assert [h["score"] for h in got] == pytest.approx([s for _, s in hits], abs=1e-5)
    finally:
        srv.stop()
        thread.join()
        srv.close()


def test_search_r1_provider_reads_the_server_like_the_dense_provider(
    server: RetrieverServer, built: Path
) -> None:
    config = parse_config(
        f'[search]\nprovider = "search_r1"\napi_base = "{server.url}"\n',
        source="test.toml",
        env={},
        registry=load_registry(),
    )
    client = SearchR1Retriever(config)
    local = DenseSearch.from_config(dense_config(built))
    before = server.requests_served

    async def run(provider) -> list:
        out = await asyncio.gather(*(provider.search(q, 3) for q in QUERIES))
        await provider.aclose()
        return out

    remote, direct = asyncio.run(run(client)), asyncio.run(run(local))
    assert server.requests_served == before + 1  # the client batched the rollout's queries
    for a, b in zip(remote, direct, strict=True):
        assert a.ok and b.ok
        assert [(r.title, r.text) for r in a.results] == [(r.title, r.text) for r in b.results]
        assert [r.score for r in a.results] == pytest.approx([r.score for r in b.results])


def test_ivfpq_index_is_smaller_and_memory_mapped(tmp_path: Path) -> None:
    # enough passages to train product quantisation: 1500 of the offline world's
    from searchr1.core.assets import resolve

    world = (
        Path(resolve("builtin:world/corpus.jsonl", load_registry().assets))
        .read_text("utf-8")
        .splitlines()
    )
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(world[:1500]) + "\n", "utf-8")
    flat, _ = build_index(corpus, tmp_path / "flat")
    card, _ = build_index(corpus, tmp_path / "pq", kind="ivfpq")
    assert card.count == flat.count and card.params["m"] == 64
    assert card.bytes_per_passage < flat.bytes_per_passage / 4
    provider = DenseSearch.from_config(dense_config(tmp_path / "pq", "nprobe = 4"))
    import faiss

    ivf = faiss.extract_index_ivf(provider.index.index)
    assert ivf.nprobe == 4
    assert "OnDisk" in type(faiss.downcast_InvertedLists(ivf.invlists)).__name__
    maps = Path("/proc/self/maps")
    if maps.exists():  # Linux: both files are mapped, not read into the process
        mapped = maps.read_text()
        assert str(tmp_path / "pq" / "index.faiss") in mapped
        exact = DenseSearch.from_config(dense_config(tmp_path / "flat"))
        assert str(tmp_path / "flat" / "index.faiss") in maps.read_text()
        assert len(asyncio.run(exact.search("Nungen Guild", 3)).results) == 3
    response = asyncio.run(provider.search("Nungen Guild", 3))
    assert response.ok and len(response.results) == 3


def test_config_check_and_a_missing_extra_say_what_to_do(
    tmp_path: Path, built: Path, run_cli, config_file, monkeypatch
) -> None:  # noqa: ANN001
    config = config_file(
        f'[search]\nprovider = "dense"\n[search.dense]\nindex = "{tmp_path / "nothere"}"\n'
    )
    # every command stops on it, so config check refuses it as train would, with the line
    result = run_cli("config", "check", "--config", config)
    assert result.code == 2, result.out
    assert f"{config}:4: search.dense.index = " in result.err
    assert (
        "not a finished dense index, no card.json (make one with `searchr1 index build"
        in result.err
    )
    trained = run_cli("train", "--config", config)
    assert trained.code == 2 and result.err.splitlines()[-1] in trained.err

    monkeypatch.setitem(sys.modules, "faiss", None)  # the [dense] extra not installed
    with pytest.raises(ConfigError, match=r"needs faiss: pip install 'searchr1\[dense\]'"):
        DenseSearch.from_config(dense_config(built))
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    build = run_cli("index", "build", corpus, "--out", tmp_path / "idx")
    assert build.code == 2 and "needs faiss: pip install 'searchr1[dense]'" in build.err
    checked = run_cli("config", "check", "--config", config)
    assert "search provider 'dense' needs faiss: pip install 'searchr1[dense]'" in checked.err


@pytest.mark.slow  # a real `searchr1 index build` process, killed, then resumed (~15-25 s)
def test_a_build_killed_with_sigkill_resumes_where_it_stopped(tmp_path: Path, run_cli) -> None:
    """Killed mid-build (and, paused just before, a second build of its folder refused naming
    it), the build resumes where it stopped, every passage once."""
    import signal
    import subprocess
    import time

    from searchr1.core.assets import resolve

    world = (
        Path(resolve("builtin:world/corpus.jsonl", load_registry().assets))
        .read_text("utf-8")
        .splitlines()
    )
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as fh:  # 20,000 passages: seconds to encode
        for copy in range(4):
            for line in world:
                row = json.loads(line)
                fh.write(json.dumps({**row, "id": f"{row['id']}-{copy}"}) + "\n")
    argv = [sys.executable, "-m", "searchr1.cli", "index", "build", str(corpus), "--out",
            str(tmp_path / "idx"), "--shard-size", "200"]  # fmt: skip
    state = tmp_path / "idx" / ".build" / "state.json"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if json.loads(state.read_text())["rows"] >= 1000:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGSTOP)  # paused, it still holds the folder
        second = run_cli("index", "build", corpus, "--out", tmp_path / "idx")
        assert second.code == 2, second.err
        assert f"is being built by process {proc.pid} now" in second.err
        assert "build again: it resumes where that build stopped" in second.err
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done = json.loads(state.read_text())["rows"]
    assert 1000 <= done < 20_000 and not (tmp_path / "idx" / "card.json").exists()

    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    first = json.loads(resumed.stdout.splitlines()[0])
    assert first["resumed_from"] == done and first["passages"] == first["resumed_from"]
    done = json.loads(resumed.stdout.splitlines()[-1])
    assert (done["event"], done["outcome"], done["passages"]) == ("index_built", "resumed", 20_000)
    card = IndexCard.read(tmp_path / "idx")
    assert card.count == 20_000
    index = DenseSearch.from_config(dense_config(tmp_path / "idx")).index
    ids = [index.document(i)["id"] for i in range(card.count)]
    assert len(set(ids)) == 20_000  # every passage once: nothing lost or doubled at the kill
    assert ids[:3] == [f"{json.loads(world[i])['id']}-0" for i in range(3)]


@pytest.fixture(scope="module")
def smaller(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flat index of half of ROWS: the files of another build, copied over ``built``'s."""
    tmp = tmp_path_factory.mktemp("dense-half")
    build_index(write_corpus(tmp / "corpus.jsonl", ROWS[:4]), tmp / "index")
    return tmp / "index"


def _damage(how: str, index: Path, smaller: Path) -> None:
    if how == "truncated index.faiss":
        faiss_file = index / "index.faiss"
        with faiss_file.open("r+b") as fh:
            fh.truncate(faiss_file.stat().st_size // 2)
    elif how == "deleted index.faiss":
        (index / "index.faiss").unlink()
    elif how == "index.faiss of half the vectors":
        shutil.copy(smaller / "index.faiss", index / "index.faiss")
    elif how == "docs.jsonl of a smaller build":
        shutil.copy(smaller / "docs.jsonl", index / "docs.jsonl")
    else:  # "docs and offsets of a smaller build"
        for name in ("docs.jsonl", "docs.offsets.npy"):
            shutil.copy(smaller / name, index / name)


@pytest.mark.parametrize(
    "how, named",
    [
        ("truncated index.faiss", "index.faiss is"),
        ("deleted index.faiss", "index.faiss is missing"),
        ("index.faiss of half the vectors", "index.faiss is"),
        ("docs.jsonl of a smaller build", "docs.jsonl is"),
        ("docs and offsets of a smaller build", "docs.offsets.npy holds 4 passage offsets"),
    ],
)
def test_a_damaged_index_is_named_with_the_command_that_rebuilds_it(
    tmp_path: Path, built: Path, smaller: Path, run_cli, how: str, named: str
) -> None:
    index = Path(shutil.copytree(built, tmp_path / "index"))
    _damage(how, index, smaller)
    card = IndexCard.read(index)
    rebuild = (
        f"`searchr1 index build {card.corpus['path']} --out {index} --encoder {card.encoder} "
        f"--kind flat --force`"
    )
    served = run_cli("serve-retriever", "--index", index, "--port", "0")
    assert served.code == 2
    assert "Traceback" not in served.err
    assert f"--index = '{index}': {index}/{named}" in served.err and rebuild in served.err
    # building it again does not call it up to date
    again = run_cli("index", "build", card.corpus["path"], "--out", index)
    assert again.code == 2 and "up to date" not in again.out and rebuild in again.err


def test_smoke_and_train_name_a_damaged_index_not_the_model(
    tmp_path: Path, built: Path, run_cli
) -> None:
    from cli_run import make_config, write_config

    index = Path(shutil.copytree(built, tmp_path / "index"))
    _damage("truncated index.faiss", index, built)
    config = write_config(
        tmp_path,
        make_config(
            run={"dir": str(tmp_path / "runs")},
            search={"provider": "dense", "local": None, "dense": {"index": str(index)}},
        ),
    )
    for command in ("smoke", "train"):
        result = run_cli(command, "--config", config)
        assert result.code == 2, (command, result.out, result.err)
        assert "Traceback" not in result.out + result.err
        assert f"search.dense.index = '{index}': {index}/index.faiss is" in result.err
        assert "diagnosis" not in result.out and "transformers" not in result.out + result.err


#: ``searchr1 index build`` SIGKILLed while it moves its finished files into place: after the
#: second of the three moves (index.faiss and docs.jsonl moved, the offsets not)
_KILLED_IN_COMMIT = """
import os, pathlib, signal, sys
real, moved = pathlib.Path.replace, []
def replace(self, target):
    if self.parent.name == ".build" and self.name in ("index.faiss", "docs.jsonl", "docs.offsets.npy"):
        if len(moved) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        moved.append(self.name)
    return real(self, target)
pathlib.Path.replace = replace
from searchr1.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_build_killed_while_moving_its_files_finishes_when_run_again(
    tmp_path: Path, built: Path, run_cli
) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "idx"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_COMMIT, "index", "build", str(corpus), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert (out / "docs.jsonl").is_file() and not (out / "docs.offsets.npy").exists()
    assert not (out / "card.json").exists()

    result = run_cli("index", "build", corpus, "--out", out)
    assert result.code == 0, result.err
    done = json.loads(result.out)
    assert (done["outcome"], done["passages"]) == ("resumed", 8)
    assert not (out / ".build").exists()
    resumed = DenseSearch.from_config(dense_config(out)).index
    whole = DenseSearch.from_config(dense_config(built)).index
    assert [resumed.document(i) for i in range(8)] == [whole.document(i) for i in range(8)]
    assert (resumed.ids(list(QUERIES), 8) == whole.ids(list(QUERIES), 8)).all()


def test_a_hub_encoder_with_the_hub_out_of_reach(tmp_path: Path) -> None:
    """``--encoder ORG/NAME`` when the hub cannot be reached (its address a closed loopback
    port, a fresh ``HF_HOME``): a model in the cache builds the index from there; one that is
    not fails at once saying why, before huggingface_hub's own retries (about 75 s here)."""
    from dense_models import tiny_sentence_model
    from offline import hub_cache_folder, hub_out_of_reach, run_searchr1

    texts = [r.get("contents") or r["text"] for r in ROWS] + list(QUERIES)
    tiny_sentence_model(hub_cache_folder(tmp_path / "hf", "acme/tiny-e5"), texts, seed=1)
    env = hub_out_of_reach(tmp_path / "hf")
    corpus = write_corpus(tmp_path / "corpus.jsonl")

    def build(encoder: str) -> subprocess.CompletedProcess[str]:
        out = tmp_path / encoder
        return run_searchr1("index", "build", corpus, "--out", out, "--encoder", encoder, env=env)

    cached = build("acme/tiny-e5")
    assert cached.returncode == 0, cached.stderr
    assert IndexCard.read(tmp_path / "acme/tiny-e5").encoder == "acme/tiny-e5"
    missing = build("acme/not-cached")
    assert missing.returncode == 2, missing.stderr
    assert "encoder = 'acme/not-cached': cannot load it" in missing.stderr
    assert "cannot be reached: connection refused" in missing.stderr
    assert "Retrying" not in cached.stderr + missing.stderr

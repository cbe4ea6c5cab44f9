"""``searchr1 data check FILE``: what a QA file holds before a run depends on it.
``searchr1 data get nq-hotpotqa``: Search-R1's published training and test questions.

``check`` prints rows, per-source counts and every malformed row (row number and reason);
exits 1 when the file has no valid row, 2 when it cannot be read at all.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.core.errors import UserError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from searchr1.core.data import LoadedQuestions

#: name -> (hub dataset id, the files it holds, each converted to ``<split>.jsonl``)
PUBLISHED = {"nq-hotpotqa": ("PeterJinGo/nq_hotpotqa_train", ("train", "test"))}
DEFAULT_ENDPOINT = "https://huggingface.co"


def cmd_data_check(args: argparse.Namespace) -> int:
    from searchr1.cli.args import command_assets
    from searchr1.core.data import load_questions

    loaded = load_questions(args.file, command_assets(args, args.file), allow_empty=True)
    print(summary(loaded))
    if not loaded.questions:
        print(f"{args.file}: no valid question", flush=True)
        return 1
    return 0


def summary(loaded: LoadedQuestions) -> str:
    """What :func:`cmd_data_check` prints: counts, questions per ``data_source`` and every
    malformed row with its reason."""
    lines = [
        f"{loaded.path}: {loaded.total_rows} rows, {len(loaded.questions)} valid, "
        f"{len(loaded.malformed)} malformed"
    ]
    sources = loaded.per_source()
    if sources:
        lines.append("per data_source:")
        width = max(len(s or "(none)") for s in sources)
        lines += [f"  {s or '(none)':<{width}}  {n}" for s, n in sources.items()]
    if loaded.malformed:
        lines.append("malformed rows (skipped):")
        lines += [f"  {m}" for m in loaded.malformed]
    return "\n".join(lines)


def cmd_data_get(args: argparse.Namespace) -> int:
    from searchr1.core.data import load_questions

    repo, splits = PUBLISHED[args.name]
    out = Path(args.out)
    for split in splits:
        if args.source:
            parquet = Path(args.source) / f"{split}.parquet"
            if not parquet.is_file():
                raise UserError(f"--from {args.source}: no {split}.parquet there ({parquet})")
        else:
            parquet = download(repo, f"{split}.parquet", out / "parquet", args.revision)
        # a downloaded (or --from) file: never a builtin: asset
        loaded = load_questions(str(parquet), {}, field_name=f"{split}.parquet")
        target = out / f"{split}.jsonl"
        write_questions(loaded, target)
        print(summary(loaded).replace(str(loaded.path), str(target), 1), flush=True)
    train, test = (out / f"{s}.jsonl" for s in splits)
    print(f'use it: [data] train = "{train}" in the config; evaluate with')
    print(f"  searchr1 eval --data {test} --limit-per-source 100 (the first 100 of each source)")
    return 0


def write_questions(loaded: LoadedQuestions, target: Path) -> None:
    """``loaded``'s questions as a flat-layout JSONL file, written whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    with part.open("w", encoding="utf-8") as fh:
        for q in loaded.questions:
            row = {"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers)}
            fh.write(json.dumps({**row, "data_source": q.data_source}, ensure_ascii=False) + "\n")
    part.replace(target)


def download(repo: str, filename: str, folder: Path, revision: str) -> Path:
    """``filename`` of hub dataset ``repo`` at ``revision`` as ``folder/filename``, through
    ``huggingface_hub``; UserError when unreachable."""
    import huggingface_hub

    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    url = f"{endpoint}/datasets/{repo}/resolve/{revision}/{filename}"
    print(f"downloading {url}", flush=True)
    try:
        _probe(url)  # once, no retries: an offline machine hears at once, not after minutes
        path = huggingface_hub.hf_hub_download(
            repo, filename, repo_type="dataset", revision=revision, local_dir=folder,
            endpoint=endpoint,
        )  # fmt: skip
        return Path(path)
    except Exception as exc:  # noqa: BLE001 - every failure of the network says the same
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UserError(
            f"data get: could not download {url} ({type(exc).__name__}: {reason}). This "
            f"command needs the Hugging Face hub (or a mirror named by $HF_ENDPOINT). Without "
            f"it, download the dataset's files ({DEFAULT_ENDPOINT}/datasets/{repo}) on a "
            f"machine that has it and run `searchr1 data get --from DIR ...` on the folder "
            f"holding them"
        ) from None


def _probe(url: str) -> None:
    """One HEAD request; an error when the hub cannot be reached or refuses the file."""
    import httpx

    token = os.environ.get("HF_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    httpx.head(url, headers=headers, follow_redirects=True, timeout=20).raise_for_status()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="QA data utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser(
        "check", help="count rows and sources of a QA file and list its malformed rows"
    )
    c.add_argument(
        "file",
        help="QA file: .jsonl, .json or .parquet (builtin:... allowed)",
    )
    c.set_defaults(func=cmd_data_check)
    g = dsub.add_parser(
        "get",
        help="download Search-R1's published QA sets and write them as QA files",
        description="nq-hotpotqa: the train.parquet (NQ + HotpotQA) and test.parquet (seven "
        "QA sets) of the Hugging Face dataset PeterJinGo/nq_hotpotqa_train, written as "
        "OUT/train.jsonl and OUT/test.jsonl ($HF_ENDPOINT names a hub mirror).",
    )
    g.add_argument("name", choices=sorted(PUBLISHED), help="which published set")
    g.add_argument(
        "--out", default="data/nq_hotpotqa", help="folder written (default: %(default)s)"
    )
    g.add_argument("--revision", default="main", help="the dataset's git revision")
    g.add_argument(
        "--from",
        dest="source",
        help="convert train.parquet and test.parquet from this folder instead of downloading",
    )
    g.set_defaults(func=cmd_data_get)

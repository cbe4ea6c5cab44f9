"""What a run writes follows the umask, as any file the user writes does: under umask 022 a
teammate can read a shared run (its trajectories, checkpoints, report), under
077 it stays private. Files written through a temporary one renamed into place (the atomic
writes, checkpoint folders) are where 0600/0700 would creep in."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cli_run import make_config


@pytest.mark.parametrize(
    ("umask", "file_mode", "folder_mode"),
    [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)],
    ids=["umask022", "umask077"],
)
def test_a_tiny_runs_files_and_folders_follow_the_umask(
    tmp_path: Path, config_file, run_cli, umask: int, file_mode: int, folder_mode: int
) -> None:
    config = config_file(
        make_config(train={"max_steps": 1, "save_every": 1, "dump_trajectories": 2})
    )
    run = tmp_path / "run"
    previous = os.umask(umask)
    try:
        trained = run_cli("train", "--config", config, "--run-dir", run)
        assert trained.code == 0, trained.err
        reported = run_cli("report", run, "--no-png")
        assert reported.code == 0, reported.err
    finally:
        os.umask(previous)
    written = sorted(run.rglob("*"))
    kinds = {p.relative_to(run).parts[0] for p in written}
    assert {"checkpoints", "trajectories", "report", "events.jsonl"} <= kinds, kinds
    modes = {str(p.relative_to(run)): stat.S_IMODE(p.stat().st_mode) for p in written}
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (folder_mode if (run / name).is_dir() else file_mode)
    }
    assert not wrong, wrong

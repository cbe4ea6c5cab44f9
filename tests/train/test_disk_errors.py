"""A disk that refuses a write ends a command with one message and exit code 4, never a
traceback: the path, the free space there, the run's last complete checkpoint and the command
that continues it. Nothing half-written is left for a later read to take for complete.

The full and read-only disks are real: a small tmpfs mounted for the test (root or
CAP_SYS_ADMIN is needed to mount one; elsewhere these tests skip, saying so). The run fills it
itself: the scripted trainer's optimizer step of step 3 writes a filler file until the
filesystem says ENOSPC, so the failure lands after step 2's checkpoint on every machine,
whatever the sizes of the files a run writes. The missing permission is real too: the cache
folder's mode is 0555 and the command runs in a child process; as root, that process gives
up the capabilities that override file modes, so the kernel refuses the write as it does for
any user.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_run import make_config, write_config
from fakes import ScriptedModel
from train_configs import train_config

from searchr1.core.logs import read_jsonl

EXIT_DISK = 4


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs, unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """Write ``folder/filler`` until the filesystem is full, then give back ``leave`` bytes."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    if leave:
        os.truncate(filler, max(filler.stat().st_size - leave, 0))
    return filler


@pytest.fixture
def fill_at_step(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """``plan["step"] = N`` (and ``plan["leave"]``): the scripted trainer's optimizer step of
    step N fills ``plan["folder"]``; the run's writes after it meet a full disk."""
    plan: dict = {"step": None, "leave": 0, "folder": None, "calls": 0}
    real = ScriptedModel.optim_step

    async def optim_step(self, adam):  # noqa: ANN001, ANN202
        plan["calls"] += 1
        if plan["calls"] == plan["step"]:
            plan["filler"] = fill(plan["folder"], plan["leave"])
        return await real(self, adam)

    monkeypatch.setattr(ScriptedModel, "optim_step", optim_step)
    yield plan


def _temporary_files(run: Path) -> list[Path]:
    """Temporary files or folders (``.name...``) a failed write left behind."""
    return list(run.rglob(".*"))


@pytest.mark.parametrize("staleness", [0, 1], ids=["sequential", "pipelined"])
def test_disk_full_after_step_2_names_the_checkpoint_and_resume_finishes(
    tmp_path: Path, small_fs: Path, run_cli, scripted_plugin, fill_at_step: dict, staleness: int
) -> None:
    config = train_config(tmp_path, train=f"max_staleness = {staleness}\n")  # save_every = 2
    run = small_fs / "run"
    fill_at_step.update(step=3, folder=small_fs)

    result = run_cli("train", "--config", config, "--run-dir", run, "--max-steps", "4")

    assert result.code == EXIT_DISK, result.err
    assert "Traceback" not in result.err + result.out
    resume = f"searchr1 train --resume --run-dir {run} --config {config}"
    assert re.search(rf"cannot write {re.escape(str(run))}/\S+: No space left on device "
                     r"\(ENOSPC\)", result.err), result.err  # fmt: skip
    assert re.search(r"free space there: \d+(\.\d)? (B|KiB)\n", result.err), result.err
    assert f"last complete checkpoint: {run}/checkpoints/step_000002 (step 2)" in result.err
    assert f"free some space there, then continue the run with:\n  {resume}\n" in result.err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert _temporary_files(run) == []
    for dump in (run / "trajectories").glob("*.jsonl"):  # each dump is whole or absent
        assert read_jsonl(dump)[1] == 0, dump

    fill_at_step["filler"].unlink()  # free the space, then the documented command
    result = run_cli(*resume.split()[1:], "--max-steps", "4")

    assert result.code == 0, result.err
    events, cut = read_jsonl(run / "events.jsonl")
    assert cut <= 1  # at most the one line the full disk cut short, skipped by every reader
    steps = [e["step"] for e in events if e["event"] == "metrics"]
    assert steps[-2:] == [3, 4] and max(steps) == 4
    assert any(e["event"] == "resumed" and e["step"] == 2 for e in events)
    assert (run / "checkpoints" / "step_000004" / "trainer.json").is_file()


def test_a_read_only_run_folder_is_named_with_the_checkpoint_to_resume_from(
    tmp_path: Path, small_fs: Path, run_cli, scripted_plugin
) -> None:
    config = train_config(tmp_path)
    run = small_fs / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)

    result = run_cli("train", "--resume", "--config", config, "--run-dir", run, "--max-steps", "4")

    assert result.code == EXIT_DISK, result.err
    assert "Traceback" not in result.err + result.out
    assert f"cannot write {run}/events.jsonl: Read-only file system (EROFS)" in result.err
    assert "free space there: " in result.err
    assert f"last complete checkpoint: {run}/checkpoints/step_000002 (step 2)" in result.err
    assert "the filesystem is read-only: remount it read-write or use a writable folder, " in (
        result.err
    )
    assert f"searchr1 train --resume --run-dir {run} --config {config}" in result.err


def test_low_free_space_warns_before_a_checkpoint(
    tmp_path: Path, small_fs: Path, run_cli, scripted_plugin, fill_at_step: dict
) -> None:
    config = train_config(tmp_path)
    run = small_fs / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0  # checkpoint 2
    size = sum(p.stat().st_blocks * 512 for p in (run / "checkpoints").rglob("*") if p.is_file())
    # the resumed run's second optimizer step is step 4's: before its checkpoint, 1.5x is left
    fill_at_step.update(step=2, calls=0, folder=small_fs, leave=size * 3 // 2)

    result = run_cli("train", "--resume", "--config", config, "--run-dir", run, "--max-steps", "4")

    assert result.code == 0, result.err
    assert re.search(
        rf"searchr1: warning: low disk space: \S+ KiB free in {run}/checkpoints, under twice "
        r"the last checkpoint's size \(\S+ KiB, step_000002\)",
        result.err,
    ), result.err
    events, _ = read_jsonl(run / "events.jsonl")
    assert [e["event"] for e in events].count("disk_space_low") == 1
    assert (run / "checkpoints" / "step_000004").is_dir()


def _without_file_mode_override() -> None:
    """In the child, before exec: give up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH for good
    (prctl PR_CAPBSET_DROP), so even root meets file modes as any user does."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP


def test_a_cache_folder_without_write_permission_is_named(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o555)
    cache.chmod(0o555)
    env = {**os.environ, "SEARCHR1_CACHE": str(cache), "SEARCHR1_CONFIG": ""}
    # the embedded offline demo builds its world and tiny model into the cache first
    done = subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "train", "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_without_file_mode_override if os.geteuid() == 0 else None,
    )

    assert done.returncode == EXIT_DISK, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert re.search(
        rf"cannot access {re.escape(str(cache))}/world-\S+: Permission denied \(EACCES\)",
        done.stderr,
    ), done.stderr
    assert "free space there: " in done.stderr
    assert "no permission there: fix the owner or mode of the file or its folder" in done.stderr
    assert "(the cache folder is $SEARCHR1_CACHE, default ~/.cache/searchr1)" in done.stderr
    assert f"no complete checkpoint yet in {tmp_path / 'run'}" in done.stderr


def test_an_events_line_cut_short_is_skipped_and_counted_by_the_report(
    tmp_path: Path, run_cli, scripted_plugin
) -> None:
    config = train_config(tmp_path)
    run = tmp_path / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    events = run / "events.jsonl"
    whole = events.read_bytes()
    events.write_bytes(whole[:-30])  # the last line loses its end, as on a disk that filled
    resume = ("train", "--resume", "--config", config, "--run-dir", run, "--max-steps", "4")
    assert run_cli(*resume).code == 0  # appends after the torn line, not onto it

    result = run_cli("report", run, "--no-png")

    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    assert f"skipped 1 unreadable line in {run} (a line cut short by a crash or a full disk)" in (
        result.out
    )
    assert "1 unreadable log lines skipped" in (run / "report" / "index.html").read_text()
    rows, cut = read_jsonl(events)
    assert cut == 1
    assert sorted({e["step"] for e in rows if e["event"] == "metrics"}) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_run_folder_without_write_permission_names_the_resume_command(
    tmp_path: Path, run_cli
) -> None:
    """``chmod -R a-w`` on a run folder, then ``train --resume``: exit 4 naming the file and
    the command that continues the run once the folder is writable again (a child process
    without the capabilities that let root ignore file modes)."""
    config = write_config(tmp_path, make_config())  # the real tiny model, two steps
    run = tmp_path / "run"
    assert run_cli("train", "--config", config, "--run-dir", run).code == 0
    modes = {path: path.stat().st_mode for path in [run, *run.rglob("*")]}
    for path in modes:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "searchr1.cli", "train", "--resume"]
            + ["--config", str(config), "--run-dir", str(run), "--max-steps", "4"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_without_file_mode_override if os.geteuid() == 0 else None,
        )
    finally:
        for path, mode in modes.items():
            path.chmod(mode)

    assert done.returncode == EXIT_DISK, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert f"cannot access {run}/events.jsonl: Permission denied (EACCES)" in done.stderr
    assert f"last complete checkpoint: {run}/checkpoints/step_000002 (step 2)" in done.stderr
    assert f"searchr1 train --resume --run-dir {run} --config {config}" in done.stderr

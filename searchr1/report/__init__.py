"""``searchr1 report``: a self-contained HTML page (and PNGs) from a run folder.

:func:`build_report` is called by :mod:`searchr1.cli.report`. It reads the folder (:mod:`.runlog`), draws the page
(:mod:`.page`) and the PNG copies of its charts (:mod:`.charts`: one matplotlib drawing,
saved as inline SVG and as PNG), and writes them under ``RUN_DIR/report/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.disk import write_text_atomic
from searchr1.report.runlog import load_run


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`build_report` wrote."""

    html: Path
    pngs: tuple[Path, ...] = field(default_factory=tuple)
    #: lines of the run's JSONL files that were not a whole JSON object (cut short), skipped
    skipped_lines: int = 0


def build_report(
    run_dir: Path | str, out_dir: Path | str | None = None, *, pngs: bool = True
) -> ReportFiles:
    """Write ``index.html`` (and ``<chart>.png`` files) into ``out_dir``
    (default ``RUN_DIR/report``). Raises ``FileNotFoundError`` for a folder that is not a
    run."""
    from searchr1.report.charts import write_pngs
    from searchr1.report.page import render_page

    run_dir = Path(run_dir)
    log = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = write_pngs(out, log.series) if pngs else []
    html = out / "index.html"
    write_text_atomic(html, render_page(log, [p.name for p in written]))
    return ReportFiles(html=html, pngs=tuple(written), skipped_lines=log.bad_lines)

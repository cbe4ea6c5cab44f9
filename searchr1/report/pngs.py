"""PNG copies of the report's charts (for slides, issues, chat), drawn with matplotlib.

Called by :func:`searchr1.report.build_report` after the HTML page is written. matplotlib is
imported here only, with the non-interactive Agg backend, so the report works on a server
with no display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from searchr1.core.disk import atomic_write
from searchr1.report.charts import CHARTS, PALETTE

Series = Sequence[tuple[float, float]]


def write_pngs(out_dir: Path, series: Mapping[str, Series]) -> list[Path]:
    """One ``<slug>.png`` per chart of :data:`CHARTS` that has data; returns the files
    written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for spec in CHARTS:
        present = [(k, sorted(series[k])) for k in spec.keys if series.get(k)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
        try:
            for key, points in present:
                color = PALETTE[spec.keys.index(key) % len(PALETTE)]
                ax.plot(
                    [x for x, _ in points],
                    [y for _, y in points],
                    marker="o" if len(points) <= 60 else None,
                    markersize=3,
                    color=color,
                    label=key,
                )
            ax.set_title(spec.title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
            fig.tight_layout()
            path = out_dir / f"{spec.slug}.png"
            with atomic_write(path, "wb") as fh:
                fig.savefig(fh, format="png")
            written.append(path)
        finally:
            plt.close(fig)
    return written

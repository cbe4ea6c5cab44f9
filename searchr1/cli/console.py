"""What a person at a terminal sees: one short line per training step and a progress bar.

:func:`tty_screen` is the ``screen`` factory the commands pass to
:func:`searchr1.core.logs.setup_logging`: on a TTY, :class:`Console` is the last structlog
processor and the logger that prints; otherwise events stay JSON lines. ``events.jsonl`` holds
every event either way: the console picks what a person watches for.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from searchr1.core.config_schema import Config

_SKIP = frozenset({"event", "level", "timestamp", "run_id", "logger"})
#: how a field whose value is None reads (None in the event: no number of seconds applies)
_NONE_READS = {"benched_for_s": "the rest of the run"}
_RESET, _BOLD, _DIM = "\033[0m", "\033[1m", "\033[2m"
_COLORS = {"warning": "\033[1;33m", "error": "\033[1;31m", "critical": "\033[1;31m"}
#: the ``when`` of the ``eval/heldout_em`` event that scores the eval set's ideal agent
CEILING = "ceiling"


def _pct(value: Any) -> str:
    """A rate as a whole percentage, rounded down: 99.7% of trajectories is not "100%"."""
    return f"{math.floor(100 * float(value) + 1e-9)}%" if isinstance(value, int | float) else "-"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Console:
    """Renders events for a terminal and owns the run's progress bar (``total_steps`` set by
    ``searchr1 train``). Used both as structlog's final processor and as its logger."""

    def __init__(
        self,
        stream: IO[str],
        *,
        total_steps: int | None = None,
        colors: bool | None = None,
        width: int | None = None,
        intro: Callable[[str], list[str]] | None = None,
    ):
        self.stream = stream
        self.total_steps = total_steps
        if colors is None:
            colors = stream.isatty() and not os.environ.get("NO_COLOR")
        self.colors = colors
        self._width = width
        #: ``intro(run_dir)``: the lines shown for ``run_start`` (``searchr1 train``)
        self._intro = intro
        self._bar: Any = None
        self._task_bars: dict[str, Any] = {}
        self._step_times: list[float] = []
        self._heldout_em: float | None = None
        #: False when that EM was scored while search failed too often (``trustworthy``)
        self._heldout_trusted = True
        self._start_step = 0
        #: the search cost of the steps this console showed
        self._search_cost = 0.0

    # ------------------------------------------------------------------ structlog API

    def __call__(self, _logger: Any, method: str, event: dict[str, Any]) -> str:
        name = str(event.get("event", ""))
        if name == "progress":  # long work (held-out eval): a bar of its own, no line
            self._progress(event)
            raise structlog.DropEvent
        level = str(event.get("level", method))
        if level in _COLORS:
            return self._warning(level, name, event)
        if name == "metrics" and isinstance(event.get("step"), int):
            return self._step_line(event)
        if name == "eval/heldout_em":
            return self._eval_line(event)
        if name == "run_start" and self._intro is not None:  # never cut to the width
            first, *rest = self._intro(str(event.get("run_dir", "")))
            return "\n".join([self._paint(_BOLD, first), *rest])
        if name == "best_checkpoint" and event.get("message"):  # never cut to the width
            return self._paint(_BOLD, str(event["message"]))
        if name == "config_choice":  # as the run says it when piped (announce_config)
            return f"{event.get('field')} = {event.get('value')!r}: {event.get('reason')}"
        if name == "run_start":  # the config it runs was said first (``config: ...``)
            event = {k: v for k, v in event.items() if k != "config_source"}
        if name == "resumed" and isinstance(event.get("step"), int):
            self._start_step = event["step"]
        if name == "train_done":  # train_stopped is an error: _warning renders it
            self.close()
        return self._fit(self._generic(name, event))

    def msg(self, message: str) -> None:
        """Print one rendered line above the progress bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg

    def close(self) -> None:
        for bar in self._task_bars.values():
            bar.close()
        self._task_bars.clear()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ------------------------------------------------------------------ lines

    def _step_line(self, m: dict[str, Any]) -> str:
        step = m["step"]
        seconds = m.get("time/step")
        if isinstance(seconds, int | float):
            self._step_times.append(float(seconds))
        total = self.total_steps
        parts = [f"step {step:>{len(str(total or step))}}/{total}" if total else f"step {step}"]
        reward = m.get("reward/mean")
        parts.append(f"reward {reward:6.3f}" if isinstance(reward, int | float) else "reward -")
        # the protocol's rule (health checks), whatever components the reward reports
        parts.append(f"format {_pct(m.get('health/format_rate'))}")
        per = m.get("searches_per_trajectory")
        per_text = f" {per:.2f}/traj" if isinstance(per, int | float) else ""
        parts.append(f"search {_pct(m.get('search_rate'))}{per_text}")
        parts.append(f"degenerate {_pct(m.get('degenerate_group_rate'))}")
        cost = m.get("search/cost")
        if isinstance(cost, int | float):  # only with [search] cost_per_call
            self._search_cost += float(cost)
            parts.append(f"search cost {cost:.3g} (run {self._search_cost:.3g})")
        if self._heldout_em is not None:
            untrusted = "" if self._heldout_trusted else " (untrusted: search failed)"
            parts.append(f"EM {100 * self._heldout_em:.1f}%{untrusted}")
        eta = ""
        if self._step_times:
            mean = sum(self._step_times) / len(self._step_times)
            parts.append(f"{mean:.1f} s/step")
            if total:
                eta = f"ETA {_duration(mean * max(0, total - step))}"
                parts.append(eta)
        self._advance(step, eta)
        return "  ".join(parts)

    def _eval_line(self, e: dict[str, Any]) -> str:
        value, when = e.get("em"), str(e.get("when", ""))
        # The ceiling is what the best possible agent scores on the eval set (the train loop
        # evaluates one when the eval set's asset offers it), not the model: the step line
        # keeps the model's latest held-out EM (before, then any later eval).
        trusted = e.get("trustworthy") is not False
        if isinstance(value, int | float) and when != CEILING:
            self._heldout_em, self._heldout_trusted = float(value), trusted
        em = f"{100 * value:.1f}%" if isinstance(value, int | float) else "-"
        if when == CEILING:
            bits = [f"held-out EM ceiling (the eval set's ideal agent, not the model): {em}"]
        else:
            bits = [f"held-out EM {when}: {em}"]
        if isinstance(e.get("f1"), int | float):
            bits.append(f"F1 {e['f1']:.3f}")
        if isinstance(e.get("format_rate"), int | float):
            bits.append(f"format {100 * e['format_rate']:.1f}%")
        for key in ("n", "seconds"):
            if e.get(key) is not None:
                bits.append(f"{key} {e[key]}")
        line = self._paint(_BOLD, "  ".join(bits))
        if not trusted:  # the heldout_untrusted warning below says why
            success = e.get("search_success_rate")
            ok = f" {_pct(success)}" if isinstance(success, int | float) else ""
            line += "  " + self._paint(_COLORS["warning"], f"UNTRUSTED: search success{ok}")
        return line

    def _warning(self, level: str, name: str, e: dict[str, Any]) -> str:
        head = f"{'!!' if level == 'warning' else 'XX'} {level.upper()} {name}"
        fields = "  ".join(_fields(e))
        return self._paint(_COLORS[level], head) + (f"  {fields}" if fields else "")

    def _generic(self, name: str, e: dict[str, Any]) -> str:
        stamp = time.strftime("%H:%M:%S")
        fields = " ".join(_fields(e))
        return f"{self._paint(_DIM, stamp)} {name}" + (f"  {fields}" if fields else "")

    # ------------------------------------------------------------------ helpers

    def _advance(self, step: int, eta: str) -> None:
        if not self.total_steps:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total_steps,
                initial=min(self._start_step, step - 1),
                file=self.stream,
                desc="train",
                dynamic_ncols=True,
                leave=True,
                # tqdm's own clock would start at the first logged step; the ETA shown is
                # the step line's (mean s/step of this run x steps left)
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps{postfix}",
            )
        if eta:
            self._bar.set_postfix_str(eta, refresh=False)
        self._bar.update(max(0, step - self._bar.n))

    def _progress(self, e: dict[str, Any]) -> None:
        task, done, total = str(e.get("task", "")), e.get("done"), e.get("total")
        if not isinstance(done, int):
            return
        bar = self._task_bars.get(task)
        if bar is None:
            from tqdm import tqdm

            bar = self._task_bars[task] = tqdm(
                total=total, desc=task, file=self.stream, dynamic_ncols=True, leave=False
            )
        bar.update(max(0, done - bar.n))
        if isinstance(total, int) and done >= total:
            self._task_bars.pop(task).close()

    def _paint(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.colors else text

    def _fit(self, line: str) -> str:
        width = self._width or shutil.get_terminal_size((160, 24)).columns
        if len(line) <= width:  # escape codes only make it look longer: never cut short
            return line
        return line[: max(10, width - 3)] + "..."


def _fields(e: dict[str, Any]) -> list[str]:
    """``key=value`` for each field a person reads; a None that means something says it
    (``benched_for_s=the rest of the run``)."""
    return [
        f"{k}={_NONE_READS.get(k, v) if v is None else v}" for k, v in e.items() if k not in _SKIP
    ]


def intro_lines(config: Config, run_dir: str) -> list[str]:
    """The first screen of ``searchr1 train`` on a terminal, in plain words: what it trains
    on what, where the run folder is, what Ctrl-C does, how to resume and open the report."""
    from searchr1.core.cold_start import cold_start_settings
    from searchr1.core.disk import resume_command

    m, r, t = config.model, config.rollout, config.train
    cold = cold_start_settings(config).steps
    lines = [
        f"searchr1 train: teaches {m.base_model} (LoRA rank {config.lora.rank}, "
        f"{m.provider} model provider) to search and answer, by reinforcement learning",
        f"  training   {t.max_steps} steps x {r.questions_per_batch} questions x {r.group_size} "
        f"trajectories each, from {config.data.train or '(no [data] train)'}; search: "
        f"{config.search.provider}, reward: {config.reward.name}"
        + (f"; first {cold} supervised cold-start steps" if cold else ""),
    ]
    if config.data.eval and (t.eval_before_after or t.eval_every):
        when = "before and after training" if t.eval_before_after else f"every {t.eval_every} steps"
        lines.append(f"  held-out   exact match on {config.data.eval}, {when}")
    folder = Path(run_dir)
    lines += [
        f"  run folder {folder}  (events.jsonl, trajectories/, checkpoints/ every "
        f"{t.save_every} steps)",
        "  stop       Ctrl-C: stops at the next safe point, saves what can be resumed and prints "
        "the command to go on; a second Ctrl-C stops at once",
        f"  resume     {resume_command(folder, config.source)}",
        f"  report     searchr1 report {folder}  (then open {folder / 'report' / 'index.html'})",
    ]
    return lines


def tty_screen(
    stream: IO[str] | None = None, intro: Callable[[str], list[str]] | None = None
) -> Any:
    """The screen factory for :func:`searchr1.core.logs.setup_logging`: :class:`Console` when
    ``stream`` (default stdout) is a terminal, else None (JSON lines). ``intro``: see
    :class:`Console`."""
    import sys

    stream = stream or sys.stdout
    if not stream.isatty():
        return None
    return lambda out, total: Console(out, total_steps=total, intro=intro)

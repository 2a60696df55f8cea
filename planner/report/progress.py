"""Progress on stderr while work runs: a bar for work of many items (sweep points, compared
clusters, validated runs) and a spinner for a search that takes a while. Both draw only where
stderr is a terminal and the caller wants them (never with ``--json``), so pipes, files and tests
see nothing."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console


@contextlib.contextmanager
def progress_bar(unit: str, wanted: bool):
    """A progress bar on stderr for work of many items (sweep points, compared clusters, validated
    runs): ``tick(done, total)`` advances it. Silent unless ``wanted`` (not with --json or CSV on
    stdout) and stderr is a terminal, so pipes, files and tests see nothing."""
    if not (wanted and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[progress.description]{unit}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(unit, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


SEARCH_PROGRESS_AFTER_S = 2.0


@contextlib.contextmanager
def searching(what: str, wanted: bool):
    """A spinner on stderr for a search that runs longer than SEARCH_PROGRESS_AFTER_S, when stderr
    is a terminal and ``wanted`` (the output is not --json); nothing otherwise (pipes, files, tests)."""
    if not sys.stderr.isatty() or not wanted:
        yield
        return
    import threading

    status = Console(stderr=True).status(f"{what} (CP-SAT proves the optimum; --time-limit to cut it short)")
    timer = threading.Timer(SEARCH_PROGRESS_AFTER_S, status.start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        status.stop()

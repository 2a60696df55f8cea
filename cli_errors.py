"""Errors and exit codes of the command line: usage errors as ``error: <message>`` (exit 2), and
every exception of a command mapped to its message and exit code (``cli``'s docstring gives the
codes), never a traceback."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Callable

import click

from clusterplan.models.errors import ClusterplanError, InfeasibleError
from clusterplan.planner.search.space import REASONS

EXIT_BUG = 1


class _Errors:
    """Usage errors as the README's ``error: <message>`` (exit 2), not click's Usage/Error block."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            _err(f"error: {err.format_message()}{where}")
            sys.exit(2)
        except click.exceptions.ClickException as err:
            _err(f"error: {err.format_message()}")
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            _err("error: aborted")
            sys.exit(1)
        if isinstance(rv, int) and rv:  # click.exceptions.Exit with standalone_mode off
            sys.exit(rv)
        return rv


class Group(_Errors, click.Group):
    pass


class Command(_Errors, click.Command):
    pass


# ---- errors and exit codes ---------------------------------------------------------------------------
def _err(line: str) -> None:
    click.echo(line, err=True)


def guarded(fn: Callable) -> Callable:
    """Map every exception of a command to its message on stderr and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows up here, inside the handler below
            return result
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # `plan ... | head`: the reader has gone. Point stdout at /dev/null so the interpreter's
            # final flush does not fail again, and end as a normal pipeline member would.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except InfeasibleError as err:
            _err(f"error: {err}")
            if err.rejections:
                counts = ", ".join(f"{REASONS.get(k, k)}: {n:,}"
                                   for k, n in sorted(err.rejections.items(), key=lambda kv: -kv[1]))
                _err(f"rejected layouts: {counts}")
            if err.hint:
                _err(f"hint: {err.hint}")
            sys.exit(err.exit_code)
        except ClusterplanError as err:
            _err(f"error: {err}")
            sys.exit(err.exit_code)
        except Exception as err:  # noqa: BLE001 - the last line of defence: a bug, reported as one
            _err(f"internal error: {type(err).__name__}: {err}")
            _err("this is a bug in clusterplan: please report it with the command line you ran "
                 "(CLUSTERPLAN_DEBUG=1 prints the traceback)")
            if os.environ.get("CLUSTERPLAN_DEBUG") == "1":
                traceback.print_exc()
            sys.exit(EXIT_BUG)

    return wrapper

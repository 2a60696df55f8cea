"""The typed error hierarchy shared by every layer.

It lives in ``models`` because that is the bottom of the import order (see DESIGN.md); the other
packages re-export it. Every error a user can cause is a :class:`SpecError` (exit code 2); a job that
no layout can run is an :class:`InfeasibleError` (exit 3); a solver that stops without a solution is a
:class:`SolverError` (exit 4). Anything else escaping to the CLI is a bug (exit 1).
"""

from __future__ import annotations


class ClusterplanError(Exception):
    """Base class of every error clusterplan raises on purpose."""

    exit_code = 1


class SpecError(ClusterplanError, ValueError):
    """Bad input: an unknown name, a malformed file, a value out of range, an invalid layout.

    The message names the field, the value given, what is allowed and, where one exists, a fix.
    """

    exit_code = 2


class InfeasibleError(ClusterplanError):
    """No layout of the search space fits the job on the cluster.

    ``rejections`` maps each rejection reason to the number of layouts it rejected, so that the
    user sees what binds; ``hint`` says what would fix it (more devices, a bigger device, ...).
    """

    exit_code = 3

    def __init__(self, message: str, rejections: dict[str, int] | None = None, hint: str = ""):
        super().__init__(message)
        self.rejections = dict(rejections or {})
        self.hint = hint


class SolverError(ClusterplanError):
    """The solver stopped (time limit, model invalid) without any feasible solution."""

    exit_code = 4

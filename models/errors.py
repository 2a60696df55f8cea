"""The typed error hierarchy shared by every layer.

It lives in ``models`` because that is the bottom of the import order (see DESIGN.md); the other
packages re-export it. Every error a user can cause is a :class:`SpecError` (exit code 2); a job that
no layout can run is an :class:`InfeasibleError` (exit 3); a solver that stops without a solution is a
:class:`SolverError` (exit 4). Anything else escaping to the CLI is a bug (exit 1).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any


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


# ---- the one formatter of invalid fields (model files, cluster files, catalogue entries) ---------------
MAX_GIVEN_CHARS = 80
"""A given value is echoed up to this many characters, so an error never repeats a whole input."""


def shown(value: Any) -> str:
    """``repr(value)`` cut to MAX_GIVEN_CHARS characters, for a message that echoes what was given
    (an integer too long for ``repr`` is described, not printed)."""
    try:
        text = repr(value)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return "an integer of thousands of digits"
    return text if len(text) <= MAX_GIVEN_CHARS else text[:MAX_GIVEN_CHARS] + "..."


def check_number(name: str, value: Any, low: float, high: float, *, whole: bool = False,
                 above: bool = False) -> Any:
    """``value`` if it is a finite real number (not true/false, a string, NaN or infinite; a whole
    number where ``whole``) from ``low`` (excluded where ``above``) to ``high``; else a SpecError
    naming ``name``, the value and the range.

    >>> check_number("pue", 1.2, 1.0, 5.0)
    1.2
    >>> check_number("pue", "1.2", 1.0, 5.0)
    Traceback (most recent call last):
    ...
    clusterplan.models.errors.SpecError: pue: got '1.2'; allowed: a number >= 1 and <= 5
    """
    kinds = (int,) if whole else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and (isinstance(value, int) or math.isfinite(value))
    if ok:
        ok = (value > low if above else value >= low) and value <= high
    if not ok:
        kind, bound = ("a whole number", lambda x: f"{int(x):,}") if whole else ("a number", lambda x: f"{x:g}")
        raise SpecError(f"{name}: got {shown(value)}; allowed: {kind} {'>' if above else '>='} {bound(low)} and "
                        f"<= {bound(high)}")
    return value


def format_validation_error(err, where: str, label: str, root) -> str:
    """A pydantic ``ValidationError`` of ``root`` (a model class) as ``where: invalid <label>`` and
    one ``field: message (given: value)`` line per problem; an unknown field lists the allowed ones
    with the closest match."""
    lines = [f"{where}: invalid {label}"]
    lines += ["  " + _problem_line(root, problem) for problem in err.errors()]
    return "\n".join(lines)


def _problem_line(root, problem: Mapping[str, Any]) -> str:
    loc = problem["loc"]
    field = ".".join(str(part) for part in loc) or "entry"
    message = problem["msg"].removeprefix("Value error, ")
    if problem["type"] == "extra_forbidden":
        allowed = list(_model_at(root, loc[:-1]).model_fields)
        close = difflib.get_close_matches(str(loc[-1])[:MAX_GIVEN_CHARS], allowed, n=1)
        name = field if len(field) <= MAX_GIVEN_CHARS else field[:MAX_GIVEN_CHARS] + "..."
        return f"{name}: unknown field; {f'did you mean {close[0]!r}? ' if close else ''}allowed: {', '.join(allowed)}"
    given = problem.get("input")
    if problem["type"] == "missing" or isinstance(given, Mapping):
        return f"{field}: {message}"
    return f"{field}: {message} (given: {shown(given)})"


def _model_at(root, loc: tuple):
    """The nested model class a location points into (``moe`` -> MoESpec, ``scale_out`` ->
    ScaleOutEntry); ``root`` where the path leaves the nested models."""
    model = root
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return model
        nested = [a for a in (*getattr(field.annotation, "__args__", ()), field.annotation)
                  if isinstance(a, type) and hasattr(a, "model_fields")]
        if not nested:
            return model
        model = nested[0]
    return model

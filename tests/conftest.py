"""The quick suite and the full one.

``python -m pytest`` runs the quick suite (a few minutes on 2 cores): every test, but the grids
over every preset x model are sampled (each preset and each model still appears) and the
launcher-parser checks run only where their venv is already built. ``python -m pytest --full``
(or ``CLUSTERPLAN_FULL_TESTS=1``) runs every test: the whole grids and the launcher checks,
building their venv if it is missing (tests/launchers/README.md). CI (``.ci/run``) runs the full
suite. The end of every run says which of the two it was and what the quick one left out.
"""

from __future__ import annotations

import os

import pytest

FULL_ENV = "CLUSTERPLAN_FULL_TESTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="run the full suite: every preset x model grid whole and the launcher checks "
                          f"(building their venv); the same as {FULL_ENV}=1")


def full_suite(config: pytest.Config) -> bool:
    return bool(config.getoption("full")) or os.environ.get(FULL_ENV) == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: part of a grid the quick suite samples; run with --full")
    if full_suite(config):
        os.environ[FULL_ENV] = "1"  # xdist workers read the environment, not the option
        if os.environ.get("CLUSTERPLAN_SKIP_LAUNCHERS") != "1":
            os.environ["CLUSTERPLAN_LAUNCHERS"] = "1"  # tests/test_launchers.py: build the venv if missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if full_suite(config):
        if os.environ.get("CLUSTERPLAN_SKIP_LAUNCHERS") == "1":
            skip = pytest.mark.skip(reason="launcher checks: skipped by CLUSTERPLAN_SKIP_LAUNCHERS=1")
            for item in items:
                if "launchers" in item.keywords:
                    item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="sampled out of the quick suite: python -m pytest --full runs it")
    launchers = pytest.mark.skip(reason="launcher checks: python -m pytest --full runs them")
    asked = os.environ.get("CLUSTERPLAN_LAUNCHERS") == "1"  # tests/test_launchers.py alone, as its README says
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
        elif "launchers" in item.keywords and not asked:
            item.add_marker(launchers)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if full_suite(config):
        skipped = os.environ.get("CLUSTERPLAN_SKIP_LAUNCHERS") == "1"
        terminalreporter.write_line("full suite: every grid whole, launcher checks "
                                    + ("skipped (CLUSTERPLAN_SKIP_LAUNCHERS=1)" if skipped else "included"))
        return
    skipped = terminalreporter.stats.get("skipped", [])
    sampled = sum(1 for r in skipped if "sampled out of the quick suite" in str(getattr(r, "longrepr", "")))
    launchers = sum(1 for r in skipped if "launcher" in str(getattr(r, "longrepr", "")))
    terminalreporter.write_line(
        f"quick suite: {sampled} grid cases sampled out and {launchers} launcher checks skipped; "
        "python -m pytest --full runs them (CI does)")

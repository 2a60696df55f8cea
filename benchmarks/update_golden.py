"""Regenerate the golden text reports of tests/golden/ from the project's own command line.

    python benchmarks/update_golden.py          # rewrite every tests/golden/<name>.txt
    python benchmarks/update_golden.py --check  # only say which differ (exit 1 if any)

The cases are the lines of ``tests/golden/cases.txt`` (a name, then the ``clusterplan`` command
line). Each report is written as tests/test_report.py produces it: the command run in-process
through click's test runner (stdout not a terminal, so the report is 120 columns wide). Review the
diff before committing it: a golden file changes only where a report was meant to change.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def cases() -> dict[str, list[str]]:
    """name -> command-line arguments, from tests/golden/cases.txt."""
    out = {}
    for line in (GOLDEN / "cases.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, args = line.split(maxsplit=1)
            out[name] = shlex.split(args)
    return out


def report(args: list[str]) -> str:
    """The stdout of ``clusterplan ARGS``; a command that fails is an error here."""
    from click.testing import CliRunner

    from clusterplan.cli import main

    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        raise SystemExit(f"clusterplan {shlex.join(args)}: exit {result.exit_code}\n{result.stderr}")
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a golden file differs")
    check = parser.parse_args().check
    differ = []
    for name, args in cases().items():
        path = GOLDEN / f"{name}.txt"
        text = report(args)
        if path.exists() and path.read_text() == text:
            continue
        differ.append(name)
        if not check:
            path.write_text(text)
        print(f"{'differs' if check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if check and differ else 0


if __name__ == "__main__":
    sys.exit(main())

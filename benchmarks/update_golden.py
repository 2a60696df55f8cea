"""Regenerate the golden text reports of tests/golden/ from the project's own command line.

    python benchmarks/update_golden.py          # rewrite every tests/golden/<name>.txt and README's example
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


README = ROOT / "README.md"
README_HEAD_LINES = 54  # the example shows the report's first lines, "...", then its rejection table


def readme_example(golden: str, readme: str) -> str:
    """README.md with its example (the first ```text block after "## Example") rebuilt from the dense
    GPU plan's golden report: its first README_HEAD_LINES lines, "...", and the rejection table to the
    end, trailing spaces stripped; the search line keeps the wall time the README quotes (the golden
    report, run in-process, prints none)."""
    lines = readme.split("\n")
    start = lines.index("```text", lines.index("## Example")) + 1
    end = lines.index("```", start)
    report = [line.rstrip() for line in golden.rstrip("\n").split("\n")]
    table = next(i for i, line in enumerate(report) if line.startswith("rejected layouts by reason"))
    block = report[:README_HEAD_LINES] + ["", "..."] + report[table:]
    quoted = next((line for line in lines[start:end] if line.startswith("search: ")), "")
    wall = quoted.split(", ")[2] + ", " if quoted.count(", ") > 2 and quoted.split(", ")[2].endswith(" s") else ""
    block = [line.replace("OPTIMAL, ", f"OPTIMAL, {wall}", 1) if line.startswith("search: ") else line
             for line in block]
    return "\n".join(lines[:start] + block + lines[end:])


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
    readme = README.read_text()
    synced = readme_example((GOLDEN / "plan_dense_gpu.txt").read_text(), readme)
    if synced != readme:
        if not check:
            README.write_text(synced)
        print(f"{'differs' if check else 'wrote'}: README.md (its example)")
        differ.append("README.md")
    return 1 if check and differ else 0


if __name__ == "__main__":
    sys.exit(main())

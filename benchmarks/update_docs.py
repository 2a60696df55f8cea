"""Regenerate the validation tables embedded in docs/cost-model.md from the project's own commands.

    python benchmarks/update_docs.py

Each block between ``<!-- validate:NAME -->`` and ``<!-- /validate:NAME -->`` is replaced by the
output of ``clusterplan validate [FILE] --markdown --no-best`` for its file, so the document
shows what the code predicts, not what someone typed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cost-model.md"
BLOCKS = {
    "runs": [],  # the bundled runs, with the sweeps, memory and family datasets
    "holdout": ["benchmarks/holdout_runs.yaml"],
    "holdout_family": ["benchmarks/holdout_family_runs.yaml"],
}


def markdown(args: list[str]) -> str:
    cmd = [sys.executable, "-m", "cli", "validate", *args, "--markdown", "--no-best"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> None:
    text = DOC.read_text()
    for name, args in BLOCKS.items():
        body = f"`clusterplan validate {' '.join(args)} --markdown --no-best`:\n\n{markdown(args)}"
        pattern = re.compile(rf"(<!-- validate:{name} -->\n).*?(<!-- /validate:{name} -->)", re.S)
        text, count = pattern.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
        if count != 1:
            raise SystemExit(f"docs/cost-model.md: block validate:{name} not found once")
    DOC.write_text(text)
    print(f"updated {DOC}")


if __name__ == "__main__":
    main()

"""The launchers' own virtual environment: created once under a cache folder, reused between runs.

    python tests/launchers/launcher_venv.py            # create (if missing) and print its python
    python tests/launchers/launcher_venv.py --path     # print where it is (or would be), create nothing

The folder is ``$CLUSTERPLAN_LAUNCHERS_CACHE`` (default ``~/.cache/clusterplan-launchers``) /
<hash of requirements.txt, launchers.txt, constraints.txt and the interpreter version>, so a change
of any pin makes a new one. It is marked complete (a ``.complete`` file) only after every install
step succeeded; a half-built folder is removed and built again. The launchers need Python >= 3.12:
``$CLUSTERPLAN_LAUNCHERS_PYTHON``, else ``python3.12``/``python3.13`` on PATH, else a pyenv one.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIN_FILES = ("requirements.txt", "launchers.txt", "constraints.txt", "side_launchers.txt")


def find_python() -> str | None:
    """An interpreter >= 3.12 for the launcher venv, or None."""
    given = os.environ.get("CLUSTERPLAN_LAUNCHERS_PYTHON")
    candidates = [given] if given else []
    candidates += [shutil.which(n) for n in ("python3.12", "python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python3.1[23]")))
    for c in candidates:
        if not c:
            continue
        try:
            out = subprocess.run([c, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "True":
            return c
    return None


def venv_dir(python: str) -> Path:
    h = hashlib.sha256()
    for name in PIN_FILES:
        h.update((HERE / name).read_bytes())
    h.update(subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True,
                            text=True).stdout.encode())
    root = Path(os.environ.get("CLUSTERPLAN_LAUNCHERS_CACHE", "~/.cache/clusterplan-launchers")).expanduser()
    return root / h.hexdigest()[:16]


def venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def side_pins() -> list[str]:
    """The pins of side_launchers.txt (``name==version``), each installed into a folder of its own."""
    lines = (HERE / "side_launchers.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def side_dir(path: Path, pin: str) -> Path:
    """Where a side launcher (``torchtitan==0.2.2``) lies in the venv: ``side/torchtitan-0.2.2``."""
    return path / "side" / pin.replace("==", "-")


def ready(path: Path) -> bool:
    return (path / ".complete").exists() and venv_python(path).exists()


def existing() -> Path | None:
    """The complete launcher venv for the current pins, if one was built; creates nothing."""
    python = find_python()
    if python is None:
        return None
    path = venv_dir(python)
    return path if ready(path) else None


def create(log=sys.stderr) -> Path:
    """Build the venv (if missing) and return its folder. Raises RuntimeError when it cannot."""
    python = find_python()
    if python is None:
        raise RuntimeError("no Python >= 3.12 found for the launchers (megatron-core 0.19 and maxtext 0.2 need it); "
                           "set CLUSTERPLAN_LAUNCHERS_PYTHON")
    path = venv_dir(python)
    if ready(path):
        return path
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "DS_BUILD_OPS": "0"}
    pip = [str(venv_python(path)), "-m", "pip", "install", "-q"]
    steps = [
        [python, "-m", "venv", str(path)],
        [*pip, "-r", str(HERE / "requirements.txt"), "-c", str(HERE / "constraints.txt")],
        [*pip, "--no-deps", "--no-build-isolation", "-r", str(HERE / "launchers.txt")],
    ] + [[*pip, "--no-deps", "--target", str(side_dir(path, pin)), pin] for pin in side_pins()]
    for step in steps:
        print("launchers venv:", " ".join(step[-4:]), file=log, flush=True)
        done = subprocess.run(step, env=env, stdout=log, stderr=log)
        if done.returncode != 0:
            raise RuntimeError(f"installing the launchers failed at: {' '.join(step)}")
    (path / ".complete").write_text(f"{time.monotonic() - start:.0f} s to build\n")
    print(f"launchers venv: built in {time.monotonic() - start:.0f} s at {path}", file=log, flush=True)
    return path


if __name__ == "__main__":
    if "--path" in sys.argv[1:]:
        python = find_python()
        print(venv_dir(python) if python else "no Python >= 3.12")
    else:
        print(venv_python(create()))

"""How long does ``clusterplan fit`` take, and how much memory, on every bundled model x preset?

    python benchmarks/fit_bound.py                                   # every model x every preset
    python benchmarks/fit_bound.py --models deepseek-v3,palm-540b    # a few models
    python benchmarks/fit_bound.py --clusters gb200-nvl72,groq-rack --timeout 120

Each pair runs ``clusterplan fit --model M --cluster C --json`` in a fresh process (interpreter
start and imports included, as a user sees it), one after the other, and prints its wall time, its
peak resident memory (``ru_maxrss`` of that process, read with ``os.wait4``), its exit code and the
answer (the device count, or the first words of the error), then the maxima over all pairs. It
prints figures and asserts nothing: the bound ``fit`` promises (60 s, 2 GB per pair on a shared
2-core machine) is for the reader to hold the figures against. A pair that runs past ``--timeout``
is killed and shown as such; ``--memory-limit-gib`` caps each process's address space so that a
runaway pair fails instead of taking the machine. Run from anywhere with clusterplan installed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

from clusterplan.models.library import list_models
from clusterplan.topologies.library import list_clusters

KIB = 1024


def run_pair(model: str, cluster: str, timeout_s: float, memory_limit_bytes: int | None) -> dict:
    """One ``fit`` in a fresh process: wall seconds, peak RSS bytes, exit code, answer."""
    cmd = [sys.executable, "-m", "clusterplan.cli", "fit", "--model", model, "--cluster", cluster, "--json"]

    def limit() -> None:
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, preexec_fn=limit)
        status, usage, killed = _wait(proc.pid, start + timeout_s)
        wall_s = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by os.wait4: tell Popen
        out.seek(0), err.seek(0)
        return {"model": model, "cluster": cluster, "wall_s": wall_s, "rss_bytes": usage.ru_maxrss * KIB,
                "rc": proc.returncode, "killed": killed, "answer": _answer(out.read(), err.read(), killed)}


def _wait(pid: int, deadline: float) -> tuple[int, resource.struct_rusage, bool]:
    """Wait for ``pid`` (killing it at ``deadline``); its status and its own resource usage."""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, False
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, usage, True
        time.sleep(0.02)


def _answer(out: str, err: str, killed: bool) -> str:
    """The device count found, or the start of the error."""
    if killed:
        return "killed at the timeout"
    try:
        doc = json.loads(out)
        return f"{doc['num_devices']:,} x {doc['device']}"
    except (ValueError, KeyError, TypeError):
        text = " ".join(err.split())
        return text[:90] + ("..." if len(text) > 90 else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated model ids (default: every bundled model)")
    p.add_argument("--clusters", default="", help="comma-separated preset ids (default: every bundled preset)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a pair is killed")
    p.add_argument("--memory-limit-gib", type=float, default=8.0,
                   help="address-space cap per process, GiB (0: none)")
    a = p.parse_args()
    models = a.models.split(",") if a.models else [m.id for m in list_models()]
    clusters = a.clusters.split(",") if a.clusters else [c.id for c in list_clusters()]
    cap = int(a.memory_limit_gib * 2**30) or None
    print(f"clusterplan fit on {len(models)} models x {len(clusters)} presets, one fresh process each, "
          f"{os.cpu_count()} cores")
    print(f"{'model':<14} {'cluster':<22} {'wall s':>7} {'peak RSS MiB':>12} {'rc':>3}  answer")
    rows = []
    for model in models:
        for cluster in clusters:
            r = run_pair(model, cluster, a.timeout, cap)
            rows.append(r)
            print(f"{model:<14} {cluster:<22} {r['wall_s']:7.1f} {r['rss_bytes'] / 2**20:12.0f} {r['rc']:>3}  "
                  f"{r['answer']}", flush=True)
    slowest = max(rows, key=lambda r: r["wall_s"])
    largest = max(rows, key=lambda r: r["rss_bytes"])
    print(f"max wall {slowest['wall_s']:.1f} s ({slowest['model']} on {slowest['cluster']}); "
          f"max peak RSS {largest['rss_bytes'] / 2**20:.0f} MiB ({largest['model']} on {largest['cluster']}); "
          f"{len(rows)} pairs, exit codes: " + ", ".join(
              f"{rc}: {sum(r['rc'] == rc for r in rows)}" for rc in sorted({r['rc'] for r in rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

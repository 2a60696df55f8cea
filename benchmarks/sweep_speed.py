"""How long does a 1,000-point sweep take?

    python benchmarks/sweep_speed.py                  # --jobs 1 and --jobs <all cores>
    python benchmarks/sweep_speed.py --points 200     # a shorter run

Each case runs ``clusterplan sweep`` in a fresh process (interpreter start and imports included,
as a user sees it) over ``--over global-batch=...`` with ``--points`` values for Llama 3 8B on 64
H100s, and prints the wall time, the time per point and the speed-up of the parallel run. The
points of a global-batch sweep share their cluster and every cost term that does not depend on
the batch (``cost.terms.Context``) and the tables built from them (``planner.search.reuse``), and ``--jobs`` runs contiguous runs of points in forked
processes. Run from anywhere with clusterplan installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def run(points: int, jobs: int) -> tuple[float, list[dict]]:
    values = ",".join(str(64 * k) for k in range(1, points + 1))
    cmd = [sys.executable, "-m", "clusterplan.cli", "sweep", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
           "--devices", "64", "--over", f"global-batch={values}", "--jobs", str(jobs), "--json"]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - start, json.loads(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="the parallel run's processes")
    a = p.parse_args()
    print(f"sweep of {a.points} points (clusterplan sweep --model llama3-8b --cluster dgx-h100-superpod "
          f"--devices 64 --over global-batch=64,128,...), {os.cpu_count()} cores")
    results = {}
    for jobs in dict.fromkeys((1, a.jobs)):
        wall, rows = run(a.points, jobs)
        failed = sum("error" in r for r in rows)
        results[jobs] = (wall, rows)
        print(f"  --jobs {jobs}: {wall:7.1f} s wall, {wall / a.points * 1e3:6.1f} ms per point, "
              f"{len(rows)} rows ({failed} with an error)")
    if len(results) == 2:
        (w1, r1), (wn, rn) = results[1], results[a.jobs]
        same = [x.get("layout") for x in r1] == [x.get("layout") for x in rn]
        print(f"  speed-up {w1 / wn:.2f}x with {a.jobs} processes; identical rows: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

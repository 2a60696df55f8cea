"""How fast is the search on production-sized problems?

Each case runs in a fresh interpreter (``python -c``), so the wall time includes interpreter start,
imports, building the cluster graph and the search, as a user of the CLI sees it. The child also
reports the in-process search time (``SearchResult.wall_s``: space, tables, rejection counts,
solve, float evaluation of the winners). Peak RSS is the child's own ``ru_maxrss`` as returned by
``os.wait4`` (KiB on Linux), so the cases do not contaminate one another.

Usage::

    python benchmarks/search_speed.py                 # all cases, both engines, a table
    python benchmarks/search_speed.py --json          # the same as JSON
    python benchmarks/search_speed.py --case gpt3-175b --engine cpsat

Run from the repository root (or anywhere: the children run with the repository as cwd).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("cpsat", "exhaustive")


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    cluster: str
    num_devices: int
    global_batch_size: int
    seq_len: int
    precision: str
    note: str = ""


CASES = (
    Case("gpt3-175b", "gpt3-175b", "dgx-a100-superpod", 1024, 1536, 2048, "bf16"),
    Case("megatron-1t", "megatron-1t", "dgx-h100-superpod", 16384, 3072, 2048, "bf16",
         "batch from the model's job defaults; bf16 instead of its published fp16 (same peak, same search)"),
    Case("deepseek-v3", "deepseek-v3", "hgx-h800", 2048, 15360, 4096, "fp8", "batch from the model's job defaults"),
    Case("llama2-70b-tpu", "llama2-70b", "tpu-v5p-pod", 1024, 1024, 4096, "bf16",
         "one 8x8x16 slice; batch from the model's job defaults; the order also picks the torus traversal"),
    Case("deepseek-v3-nvl72", "deepseek-v3", "gb200-nvl72", 576, 15360, 4096, "fp8",
         "one SU of 8 NVL72 racks; 72-GPU NVLink domains allow tp up to 72, so many factorizations"),
)

# The child: everything a `clusterplan plan` call does, minus printing. It writes one JSON line.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from clusterplan.cost.framework import default_framework
from clusterplan.cost.layout import Job
from clusterplan.models.library import get_model
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.topologies.library import build_cluster
args = json.loads(sys.argv[1])
t1 = time.perf_counter()
cluster = build_cluster(args["cluster"], num_devices=args["num_devices"])
t2 = time.perf_counter()
job = Job(global_batch_size=args["global_batch_size"], seq_len=args["seq_len"], precision=args["precision"],
          framework=default_framework(cluster.platform))  # the CLI's default: maxtext on TPU, megatron elsewhere
res = plan(get_model(args["model"]), job, cluster,
           SearchOptions(engine=args["engine"], top_k=args["top_k"], time_limit_s=args["time_limit_s"]))
t3 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "cluster_build_s": t2 - t1, "plan_call_s": t3 - t2, "search_wall_s": res.wall_s,
    "num_considered": res.num_considered, "num_feasible": res.num_feasible, "status": res.status,
    "gap": res.gap, "layout": res.best.layout.short(), "step_time_s": res.best.step_time_s,
    "mfu": res.best.mfu, "peak_memory_gib": res.best.peak_memory_bytes / 2**30,
}))
"""


def run_case(case: Case, engine: str, top_k: int, time_limit_s: float | None, timeout_s: float) -> dict:
    """Run one case in a fresh interpreter; return its figures (or the error)."""
    args = dict(asdict(case), engine=engine, top_k=top_k, time_limit_s=time_limit_s)
    row = {"case": case.name, "engine": engine, "model": case.model, "cluster": case.cluster,
           "num_devices": case.num_devices, "global_batch_size": case.global_batch_size, "seq_len": case.seq_len,
           "precision": case.precision, "note": case.note}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], cwd=REPO, stdout=out, stderr=err,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
        # os.wait4 rather than subprocess.run: it returns this child's own rusage (peak RSS).
        status, rusage, timed_out = _wait(proc, timeout_s)
        row["wall_s"] = time.perf_counter() - start
        row["peak_rss_mib"] = rusage.ru_maxrss / 1024 if rusage else None  # ru_maxrss is in KiB on Linux
        # the child's CPU seconds (user + system): steadier than the wall time on a shared machine,
        # whose stolen time the wall clock counts
        row["cpu_s"] = rusage.ru_utime + rusage.ru_stime if rusage else None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if timed_out:
        row["error"] = f"timed out after {timeout_s:.0f} s"
    elif status != 0:
        row["error"] = (stderr.strip().splitlines() or [f"exit {status}"])[-1]
    else:
        row.update(json.loads(stdout.strip().splitlines()[-1]))
        row["layouts_per_s"] = row["num_considered"] / row["search_wall_s"]
    return row


def _wait(proc: subprocess.Popen, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, rusage, False
        if time.monotonic() > deadline:
            proc.kill()
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, rusage, True
        time.sleep(0.01)


def print_table(rows: list[dict]) -> None:
    head = ("case", "engine", "wall s", "cpu s", "search s", "import s", "graph s", "layouts", "layouts/s", "RSS MiB",
            "status", "step s", "MFU", "chosen layout")
    lines = []
    for r in rows:
        if "error" in r:
            lines.append((r["case"], r["engine"], f"{r['wall_s']:.2f}", _cpu(r), "-", "-", "-", "-", "-",
                          f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] else "-", "ERROR", "-", "-", r["error"]))
            continue
        lines.append((r["case"], r["engine"], f"{r['wall_s']:.2f}", _cpu(r), f"{r['search_wall_s']:.2f}", f"{r['import_s']:.2f}",
                      f"{r['cluster_build_s']:.2f}", f"{r['num_considered']:,}", f"{r['layouts_per_s']:,.0f}", f"{r['peak_rss_mib']:.0f}",
                      r["status"], f"{r['step_time_s']:.2f}", f"{r['mfu']:.1%}", r["layout"]))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    for i, line in enumerate([head, *lines]):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for case in CASES:
        if case.note and any(r["case"] == case.name for r in rows):
            print(f"note: {case.name}: {case.note}")
    print("wall s: whole child process (interpreter start, imports, cluster graph, search); cpu s: its CPU "
          "time (user + system; steadier on a shared machine); search s: SearchResult.wall_s; graph s: "
          "build_cluster; layouts: SearchResult.num_considered")


def _cpu(row: dict) -> str:
    return f"{row['cpu_s']:.2f}" if row.get("cpu_s") is not None else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", choices=[c.name for c in CASES],
                   help="run only this case (repeatable; default: all)")
    p.add_argument("--engine", action="append", choices=ENGINES, help="run only this engine (repeatable; default: both)")
    p.add_argument("--top", type=int, default=3, help="runners-up, as the CLI's --top (default 3)")
    p.add_argument("--time-limit", type=float, default=None, help="CP-SAT time limit in seconds (default: none)")
    p.add_argument("--timeout", type=float, default=600.0, help="kill a case after this many seconds (default 600)")
    p.add_argument("--deepseek-batch", type=int, default=None,
                   help="override DeepSeek-V3's global batch (default 15360, its published batch)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    a = p.parse_args(argv)
    cases = [c for c in CASES if not a.case or c.name in a.case]
    if a.deepseek_batch:
        cases = [Case(**dict(asdict(c), global_batch_size=a.deepseek_batch, note=f"global batch {a.deepseek_batch} "
                                                                                    "instead of the published 15360"))
                 if c.name == "deepseek-v3" else c for c in cases]
    rows = [run_case(c, e, a.top, a.time_limit, a.timeout) for c in cases for e in (a.engine or ENGINES)]
    if a.json:
        print(json.dumps({"python": sys.version.split()[0], "cpu_count": os.cpu_count(), "rows": rows}, indent=2))
    else:
        print_table(rows)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

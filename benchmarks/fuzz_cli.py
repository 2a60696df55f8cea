"""Fuzz the command line as a user's mistakes and an attacker's files would, and print the counts.

    python benchmarks/fuzz_cli.py                      # 300 runs, seed 0, one process per run
    python benchmarks/fuzz_cli.py --runs 2000 --seed 7
    python benchmarks/fuzz_cli.py --in-process --runs 100000   # the long campaign (issue 12 target)
    python benchmarks/fuzz_cli.py --in-process --seed 3 --case 4711  # replay one case, print its output

Each run is one ``clusterplan`` command with a mutated command line or input file (model files,
Hugging Face configs, cluster files, numeric options, layout strings, ``--fix`` values, hostile YAML
and JSON), killed after ``--timeout`` seconds. It counts the outcomes and checks each successful
``--json`` answer for what must never be printed: an MFU above the device's matmul ceiling, a
non-finite figure, a ZeRO stage outside 0-3, a layout whose degrees do not multiply to the device
count. The target (issue 12): no internal error (exit 1), no traceback, no hang, no wrong answer.

By default each run is a fresh ``python -m clusterplan.cli`` process (the real entry point, about a
second each). ``--in-process`` runs the same commands through click's test runner in forked workers
that import clusterplan once, about a hundred times faster, so a campaign reaches 100,000 inputs in
an hour on two cores. Case ``i`` of seed ``s`` is drawn from its own generator, so any case the
campaign reports replays alone with ``--seed s --case i``. In this mode three quarters of the cases
whose command would run a search evaluate one layout instead (``evaluate --layout tp=1``): the input
still passes every check and the cost model, and the searches that remain (one case in four) keep
the engines covered.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from clusterplan.cost.profile_file import FRAMEWORKS

HOSTILE = [None, True, False, 0, -1, 1, 3, 7, 10**11, 2**63, 10**30, -(2**70), float("nan"), float("inf"),
           -float("inf"), 1e300, -0.0, 0.5, 1e-300, "", " ", "4k", "1e3", "nan", "llama", "-5", "0x10", "∞",
           "a" * 300, [], [1, 2], {}, {"a": 1}]
LLAMA = {"name": "fuzz", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
         "ffn_hidden_size": 14336, "vocab_size": 128256, "ffn_activation": "swiglu", "seq_len": 8192}
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000,
      "max_position_embeddings": 4096, "hidden_act": "silu"}
CLUSTERS_FILES = [
    {"base": "dgx-h100-superpod", "name": "fuzz", "num_nodes": 2, "scale_up_link": "nvlink4_nvswitch",
     "scale_out": {"nic_gbit_per_s": 400, "oversubscription": 2, "switch_radix": 64}},
    {"base": "tpu-v5p-pod", "name": "fuzz torus", "num_devices": 64,
     "torus": {"max_slice_shape": [16, 16, 24], "ici_gbyte_per_s_per_link": 100, "chips_per_host": 4}},
]
OPTIONS = ["--devices", "--nodes", "--global-batch", "--seq-len", "--tokens", "--scale-out-gbit-per-s",
           "--oversubscription", "--time-limit", "--top", "--memory-headroom", "--pue", "--failure-rate",
           "--price-per-device-hour", "--restart-minutes", "--checkpoint-gbyte-per-s", "--host-power-w",
           "--precision", "--framework", "--attention", "--objective", "--device"]
TEXT = ["0", "-1", "nan", "inf", "1e400", "99999999999999999999", "1.5", "", "8", "64", "1e-9", "10%", "200%",
        "0x20", " 8 ", "8k", "fp8", "torchtitan", "maxtext", "unfused", "energy", "h200-sxm-141gb", "b200", "%s"]
KNOBS = ["tp", "pp", "dp", "cp", "ep", "etp", "vp", "mbs", "sp", "recompute", "zero", "order", "dp_overlap",
         "tp_overlap", "ep_overlap", "offload", "schedule", "cp_comm", "dp_shard", "param_gather", "cuda_graph",
         "moe_dispatcher", "bogus"]
KNOB_VALUES = ["1", "2", "8", "0", "-4", "on", "off", "full", "selective", "none", "7", "tp-cp-dp-pp", "nan",
               "1e9", "", "3", "64", "activations", "zbv", "dualpipe", "looped", "a2a", "a2a+p2p", "fp8", "layer",
               "deepep", "alltoall"]
MODELS = ["gpt", "llama3-8b", "llama3-70b", "mixtral", "deepseek-v3", "gpt3-1.3b"]
CLUSTERS = ["dgx-h100-superpod", "dgx-a100-superpod", "tpu-v5p-pod", "gaudi2-cluster", "gb200-nvl72", "mi300x-cluster",
            "cerebras-cs3-cluster", "groq-rack", "tenstorrent-galaxy", "trn2-cluster"]


def _mutate(rng: random.Random, base: dict) -> dict:
    doc = json.loads(json.dumps(base))
    for key in rng.sample(sorted(doc), min(len(doc), rng.randint(1, 3))):
        doc[key] = rng.choice(HOSTILE)
    if rng.random() < 0.3:
        doc["".join(rng.choice("abcxyz_") for _ in range(rng.randint(1, 8)))] = rng.choice(HOSTILE)
    return doc


def _write(folder: Path, name: str, doc, as_json: bool) -> str:
    path = folder / (name + (".json" if as_json else ".yaml"))
    if as_json:
        path.write_text(json.dumps(doc, allow_nan=True))
    else:
        import yaml
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


def _hostile_text(rng: random.Random) -> str:
    kind = rng.choice(["laughs", "deep", "recursive", "binary", "huge-number"])
    if kind == "laughs":
        return "a: &a [" + ",".join(['"x"'] * 9) + "]\n" + "".join(
            f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    if kind == "deep":
        return "[" * rng.randint(100, 100000)
    if kind == "recursive":
        return "a: &a [*a]\n"
    if kind == "binary":
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(200))
    return "num_layers: " + "9" * rng.randint(20, 4000) + "\n"


KINDS = ["model", "hf", "cluster", "option", "layout", "fix", "hostile", "framework-fix", "export", "fit"]
FRAMEWORK_NAMES = list(FRAMEWORKS)  # every profile, so a new one is fuzzed the day it lands
VALID_FIXES = ["tp=2", "tp=8", "pp=2", "pp=4", "dp=2", "cp=2", "ep=2", "ep=8", "vp=2", "mbs=1", "mbs=2", "sp=on",
               "zero=0", "zero=1", "zero=2", "zero=3", "recompute=none", "recompute=selective", "recompute=full",
               "dp_overlap=on", "tp_overlap=on", "ep_overlap=on", "etp=1", "head_slots=on", "order=tp-cp-pp-dp",
               "offload=activations", "offload=optimizer", "cp_comm=a2a", "cp_comm=allgather", "dp_shard=2", "param_gather=fp8",
               "moe_dispatcher=deepep", "moe_dispatcher=alltoall"]
EXPORT_FORMATS = ["megatron", "deepspeed", "torchtitan", "maxtext", "slurm"]


def make_case(rng: random.Random, folder: Path, searches: float = 1.0) -> list[str]:
    kind = rng.choice(KINDS)
    args = _case(kind, rng, folder)
    if kind in ("model", "hf", "cluster", "hostile") and rng.random() >= searches:
        top = args.index("--top") if "--top" in args else None
        rest = args[1:top] + args[top + 2:] if top else args[1:]
        args = ["evaluate", "--layout", "tp=1", *rest]
    return args


def _case(kind: str, rng: random.Random, folder: Path) -> list[str]:
    model, cluster = rng.choice(MODELS), rng.choice(CLUSTERS)
    base = ["plan", "--model", model, "--cluster", cluster, "--top", "0", "--json"]
    if kind == "model":
        return ["plan", "--model", _write(folder, "m", _mutate(rng, LLAMA), rng.random() < 0.5), "--cluster",
                "dgx-h100-superpod", "--devices", "16", "--top", "0", "--json"]
    if kind == "hf":
        (folder / "hf").mkdir(exist_ok=True)
        (folder / "hf" / "config.json").write_text(json.dumps(_mutate(rng, HF), allow_nan=True))
        return ["plan", "--model", str(folder / "hf" / "config.json"), "--cluster", "dgx-h100-superpod", "--devices",
                "16", "--top", "0", "--json"]
    if kind == "cluster":
        doc = _mutate(rng, rng.choice(CLUSTERS_FILES))
        for block in ("scale_out", "torus"):
            if rng.random() < 0.5 and isinstance(doc.get(block), dict):
                doc[block] = _mutate(rng, doc[block])
        override = rng.choice([[], [], ["--scale-out-gbit-per-s", "100"], ["--devices", "32"], ["--oversubscription", "2"]])
        return ["plan", "--model", "llama3-8b", "--cluster", _write(folder, "c", doc, rng.random() < 0.5), *override,
                "--top", "0", "--json"]
    if kind == "option":
        flag = [rng.choice(["--compile", "--no-compile"])] if rng.random() < 0.25 else []
        return base + [rng.choice(OPTIONS), rng.choice(TEXT)] + flag
    if kind == "layout":
        layout = ",".join(f"{rng.choice(KNOBS)}={rng.choice(KNOB_VALUES)}" for _ in range(rng.randint(0, 5)))
        return ["evaluate", "--model", model, "--cluster", cluster, "--layout", layout, "--json"]
    if kind == "fix":
        out = list(base)
        for _ in range(rng.randint(1, 3)):
            out += ["--fix", f"{rng.choice(KNOBS)}={rng.choice(KNOB_VALUES)}"]
        return out
    if kind == "framework-fix":  # valid knob values a framework may refuse: a rule, not "does not fit"
        out = base + ["--framework", rng.choice(FRAMEWORK_NAMES), "--devices", rng.choice(["", "16", "64"])]
        out = [a for a in out if a] if out[-1] == "" else out
        for _ in range(rng.randint(1, 3)):
            out += ["--fix", rng.choice(VALID_FIXES)]
        return [a for a in out if a != ""]
    if kind == "export":
        size = rng.choice([[], ["--devices", "64"], ["--devices", "16"]])
        return ["export", "--format", rng.choice(EXPORT_FORMATS), "--model", model, "--cluster", cluster, *size,
                "--top", "0"]
    if kind == "fit":
        return ["fit", "--model", model, "--cluster", cluster, "--json"]
    path = folder / ("h" + rng.choice([".yaml", ".json"]))
    path.write_text(_hostile_text(rng))
    if rng.random() < 0.5:
        return ["plan", "--model", str(path), "--cluster", "dgx-h100-superpod", "--json"]
    return ["plan", "--model", "llama3-8b", "--cluster", str(path), "--json"]


def wrong_answer(doc: dict) -> str | None:
    """What a successful --json answer must never say (None when it says nothing impossible)."""
    figures = [doc.get(k) for k in ("step_time_s", "mfu", "tokens_per_s", "peak_memory_bytes")]
    if any(not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in figures):
        return f"non-finite or negative figure: {figures}"
    ceiling = doc["inputs"]["caveats"]["matmul_ceiling"]
    if doc["mfu"] > ceiling + 1e-9:
        return f"MFU {doc['mfu']:.3f} above the device's matmul ceiling {ceiling:.3f}"
    lay = doc["layout"]
    if lay["zero_stage"] not in (0, 1, 2, 3):
        return f"zero_stage {lay['zero_stage']}"
    framework, job = doc["inputs"].get("framework") or {}, doc["inputs"]["job"]
    if lay.get("tp_overlap") and lay["tp"] > 1 and framework.get("id") == "torchtitan" and not job.get("compiled"):
        return "torchtitan async TP in a plan not compiled (torchtitan refuses it without compile)"
    if lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] != doc["num_devices"]:
        return f"degrees {lay['tp']}x{lay['pp']}x{lay['dp']}x{lay['cp']} != {doc['num_devices']} devices"
    return None


class _Hang(BaseException):
    """Raised by the alarm in an in-process worker; a BaseException so no handler swallows it."""


def _case_args(seed: int, index: int, folder: Path, searches: float) -> list[str]:
    """Case ``index`` of ``seed``, from its own generator (so it replays alone)."""
    return make_case(random.Random(f"{seed}:{index}"), folder, searches)


def _run_subprocess(task: tuple) -> tuple:
    seed, index, timeout, searches = task
    with tempfile.TemporaryDirectory() as tmp:
        args = _case_args(seed, index, Path(tmp), searches)
        try:
            r = subprocess.run([sys.executable, "-m", "clusterplan.cli", *args], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return index, args, None, "", ""
    return index, args, r.returncode, r.stdout, r.stderr


def _run_in_process(task: tuple) -> tuple:
    import signal
    import traceback

    from click.testing import CliRunner

    from clusterplan.cli import main as cli

    seed, index, timeout, searches = task

    def alarm(signum, frame):
        raise _Hang()

    with tempfile.TemporaryDirectory() as tmp:
        args = _case_args(seed, index, Path(tmp), searches)
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        start = time.perf_counter()
        try:
            r = CliRunner().invoke(cli, args)
        except _Hang:
            return index, args, None, "", ""
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if time.perf_counter() - start > timeout:
            return index, args, None, "", ""
    code, err = r.exit_code, r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        code = 1
        err += "".join(traceback.format_exception(r.exception))
    return index, args, code, r.stdout, err


def _warm_up() -> None:
    """Import everything a command may touch before forking, so workers share it."""
    from click.testing import CliRunner

    from clusterplan.cli import main as cli

    CliRunner().invoke(cli, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--top", "0", "--json"])
    CliRunner().invoke(cli, ["evaluate", "--model", "mixtral", "--cluster", "tpu-v5p-pod", "--layout", "tp=1"])


def _judge(args: list[str], code: int | None, out: str, err: str) -> tuple[str, str | None]:
    """(outcome, problem or None) of one run."""
    if code is None:
        return "killed", f"hang: {args}"
    if code == 1 or "Traceback" in out + err:
        return f"exit {code}", f"exit {code}: {args}: {err.strip()[-300:]}"
    if code == 3 and (why := _wrong_refusal(err)):
        return "exit 3", f"wrong: {args}: {why}"
    if code == 0 and "--json" in args:
        doc = json.loads(out)
        why = wrong_answer(doc["plan"] if args[0] == "fit" else doc)
        if why:
            return "exit 0", f"wrong: {args}: {why}"
    if code == 0 and args[0] == "export" and not out.strip():
        return "exit 0", f"wrong: {args}: an export that wrote nothing"
    return f"exit {code}", None


def _wrong_refusal(err: str) -> str | None:
    """A "does not fit" whose own figure is under the device's memory (the least memory a layout
    needs "0.07x over" what it has: the layout was refused for another reason, issue 41)."""
    import re

    found = re.search(r"\(([\d.,]+)x over\)", err)
    if found and float(found.group(1).replace(",", "")) < 1.0:
        return f"does not fit at {found.group(1)}x the device's memory"
    return None


def _pool(runner, tasks: list[tuple], jobs: int, in_process: bool):
    """(the pool, an iterator over the results of ``runner`` on ``tasks``): forked workers that
    imported clusterplan once (in-process), or threads that each wait on a process."""
    if in_process:
        import multiprocessing

        _warm_up()
        pool = multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=500)
        return pool, pool.imap_unordered(runner, tasks, chunksize=4)
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(jobs)
    return pool, pool.map(runner, tasks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--in-process", action="store_true", help="run commands in forked workers (fast)")
    p.add_argument("--searches", type=float, default=None,
                   help="share of mutated-file cases that search (default 1 per process, 0.25 in-process)")
    p.add_argument("--case", type=int, default=None, help="replay one case and print its output")
    p.add_argument("--kind", choices=KINDS, action="append", help="only cases of this kind (repeatable)")
    a = p.parse_args()
    if a.kind:
        KINDS[:] = a.kind
    searches = a.searches if a.searches is not None else (0.25 if a.in_process else 1.0)
    runner = _run_in_process if a.in_process else _run_subprocess
    if a.case is not None:
        index, args, code, out, err = runner((a.seed, a.case, a.timeout, searches))
        print("clusterplan " + " ".join(args) + f"\nexit {code}\n{out}{err}")
        return 0
    counts: Counter = Counter()
    problems: list[str] = []
    start = time.perf_counter()
    tasks = [(a.seed, i, a.timeout, searches) for i in range(a.runs)]
    pool, results = _pool(runner, tasks, a.jobs, a.in_process)
    with pool:
        for index, args, code, out, err in results:
            outcome, problem = _judge(args, code, out, err)
            counts[outcome] += 1
            if problem:
                kind = "hang" if code is None else "internal error" if problem.startswith("exit") else "wrong answer"
                counts[kind] += 1
                problems.append(f"case {index}: {problem}")
                print(f"  case {index}: {problem[:400]}", file=sys.stderr, flush=True)
            done = sum(v for k, v in counts.items() if k.startswith("exit") or k == "killed")
            if done % 5000 == 0:
                print(f"  {done:,} of {a.runs:,} runs in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    mode = "in-process" if a.in_process else "one process each"
    print(f"{a.runs} runs (seed {a.seed}, {mode}) in {wall:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"internal errors {counts['internal error']}, hangs {counts['hang']}, wrong answers {counts['wrong answer']} "
          f"(target: 0, 0, 0)")
    for line in problems[:20]:
        print("  " + line[:400])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

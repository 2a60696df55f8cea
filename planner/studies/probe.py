"""``clusterplan probe``: measure the user's own device and fabric, and turn the figures into a
calibration (``planner.studies.calibration``) of the same form ``clusterplan calibrate`` writes.

What it measures (:func:`measure`, needs PyTorch and a GPU: ``pip install 'clusterplan[probe]'``):

- the maximum achievable matmul rate, bf16 (and fp8 where PyTorch's ``_scaled_mm`` runs), the best
  of a sweep of large GEMM shapes, each timed after warm-up (the method of ml-engineering's
  ``mamf-finder.py``): against ``peak x gemm.large``, the ``compute`` factor;
- a device-to-device copy of 1 GiB, bytes read and written per second: against ``memory_bytes_per_s x
  memory_efficiency``, the ``memory`` factor;
- the host time of a tiny eager op (recorded, not used: it hides behind long kernels, so only runs
  tell how much of it a step pays; ``host`` stays for ``calibrate``);
- under ``torchrun`` with several ranks, NCCL all-reduce, all-gather, reduce-scatter and all-to-all of
  256 MiB inside one node and, with several nodes, across them (one rank per node and every rank):
  their bus bandwidth (nccl-tests' definition) against the bandwidth the cluster's graph gives the
  same group, the ``scale_up`` and ``scale_out`` factors.

On a machine without a GPU, ``--figures FILE`` reads figures recorded before (this module's
``clusterplan-probe/1`` JSON, or ``benchmarks/gpu_probe.py``'s), which is how CI runs it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from clusterplan.models.errors import SpecError, check_number, shown
from clusterplan.models.files import load_file
from clusterplan.planner.studies.calibration import FABRIC, NAMES, PARAMETERS, Entry
from clusterplan.topologies.cluster import Cluster

FORMAT = "clusterplan-probe/1"
COLLECTIVE_BYTES = 256 * 2**20
GEMM_SHAPES = tuple((m, n, k) for m in (4096, 8192, 16384) for n in (4096, 8192, 14336) for k in (4096, 8192))


# ---- turning figures into factors --------------------------------------------------------------------

FIGURES = ("gemm_bf16_flops_per_s", "copy_bytes_per_s", "kernel_launch_s")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MAX_FIGURE = 1e20  # beyond any device's FLOP/s or bytes/s


def read_figures(path: str | Path) -> dict:
    """Figures recorded by :func:`measure` (``clusterplan-probe/1``) or by ``benchmarks/gpu_probe.py``
    (its ``mamf``, ``memory_bandwidth`` and ``launch`` sections), in this module's form, each figure
    checked: SpecError (exit 2) names the one that is not what :func:`measure` writes."""
    where = f"--figures {path}"
    if not Path(path).is_file():
        raise SpecError(f"{where}: no such file; allowed: a JSON file of probe figures")
    doc = load_file(path, where)
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: got {type(doc).__name__}; allowed: a JSON object of probe figures")
    if doc.get("format") != FORMAT and "mamf" in doc:  # benchmarks/gpu_probe.py's own output
        doc = _from_gpu_probe(doc, where)
    if doc.get("format") != FORMAT:
        raise SpecError(f"{where}: format: got {doc.get('format')!r}; allowed: {FORMAT} (clusterplan probe "
                        f"--save-figures) or benchmarks/gpu_probe.py's JSON")
    for key in FIGURES:
        if doc.get(key) is not None:
            check_number(f"{where}: {key}", doc[key], 0.0, MAX_FIGURE, above=True)
    if not isinstance(doc.get("device") or {}, dict):
        raise SpecError(f"{where}: device: got {shown(doc['device'])}; allowed: a mapping (name, memory_bytes, ...)")
    rows = doc.get("collectives") or []
    if not isinstance(rows, list):
        raise SpecError(f"{where}: collectives: got {shown(rows)}; allowed: a list of measured collectives")
    for i, row in enumerate(rows):
        _check_collective(row, f"{where}: collectives[{i}]")
    return doc


def _from_gpu_probe(doc: dict, where: str) -> dict:
    """``benchmarks/gpu_probe.py``'s sections as this module's figures (a section that failed there
    records an error instead of figures: the figure is then absent)."""
    def figure(section: str, *keys: str):
        value = doc.get(section)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    tflops = figure("mamf", "bf16", "best_tflops")
    if tflops is not None:
        check_number(f"{where}: mamf.bf16.best_tflops", tflops, 0.0, MAX_FIGURE / 1e12, above=True)
    return {"format": FORMAT, "device": doc.get("device") or {}, "collectives": [],
            "gemm_bf16_flops_per_s": None if tflops is None else tflops * 1e12,
            "copy_bytes_per_s": figure("memory_bandwidth", "copy_bytes_per_s"),
            "kernel_launch_s": figure("launch", "add_s")}


def _check_collective(row, where: str) -> None:
    """One measured collective as :func:`measure` writes it."""
    if not isinstance(row, dict):
        raise SpecError(f"{where}: got {shown(row)}; allowed: a mapping with op, ranks, nodes, busbw_bytes_per_s")
    if row.get("op") not in OPS:
        raise SpecError(f"{where}.op: got {shown(row.get('op'))}; allowed: {', '.join(OPS)}")
    for key in ("ranks", "nodes"):
        check_number(f"{where}.{key}", row.get(key), 1, 2**31 - 1, whole=True)
    check_number(f"{where}.busbw_bytes_per_s", row.get("busbw_bytes_per_s"), 0.0, MAX_FIGURE, above=True)


def probe_entry(figures: dict, cluster_arg: str, device: str | None, framework: str | None) -> Entry:
    """:func:`entry_from_figures` for ``--cluster`` (a preset or file, ``--device`` of its family) and
    ``--framework`` (default: the platform's, as for ``plan``)."""
    from clusterplan.planner.inputs import job_framework, load_cluster

    cluster = load_cluster(cluster_arg, device=device)
    return entry_from_figures(figures, cluster, job_framework(framework, cluster))


def entry_from_figures(figures: dict, cluster: Cluster, framework: str) -> Entry:
    """The calibration entry the figures give for ``cluster``'s device under ``framework``: each
    factor the figures measure, the others kept with why."""
    dev = cluster.device
    values = {name: 1.0 for name in NAMES}
    fitted: dict[str, dict] = {}
    kept = {"host": "a probe measures the host's dispatch time per op, which hides behind long kernels; only "
                    "measured steps tell how much of it a step pays (clusterplan calibrate)"}
    measured = {"compute": (figures.get("gemm_bf16_flops_per_s"), dev.peak("bf16") * dev.gemm.large),
                "memory": (figures.get("copy_bytes_per_s"), dev.memory_bytes_per_s * dev.memory_efficiency)}
    measured.update(_fabric(figures.get("collectives") or [], cluster))
    for spec in PARAMETERS:
        name = spec.name
        if name in kept:
            continue
        got, bundled = measured.get(name, (None, None))
        if got and bundled:
            values[name] = min(spec.high, max(spec.low, got / bundled))
            fitted[name] = {"stderr_log": None, "measured": got, "bundled": bundled}
        else:
            kept[name] = f"not measured by this probe; needs {spec.needs}" if name not in FABRIC else (
                "not measured: run clusterplan probe under torchrun with several ranks (and nodes, for scale_out)")
    return Entry(dev.id, framework, cluster.id, values, fitted, kept, (), None,
                 {"probe": {"device": (figures.get("device") or {}).get("name"),
                            "kernel_launch_s": figures.get("kernel_launch_s")}})


def _fabric(rows: list[dict], cluster: Cluster) -> dict[str, tuple[float | None, float | None]]:
    """Median bus bandwidth of the measured collectives inside one node and across nodes, against
    what the cluster's graph gives the same groups per device and direction."""
    out: dict[str, tuple[float | None, float | None]] = {}
    inside = [r["busbw_bytes_per_s"] for r in rows if r["nodes"] == 1 and r["ranks"] > 1 and r["op"] != "all_reduce"]
    if inside:
        ranks = max(r["ranks"] for r in rows if r["nodes"] == 1)
        out["scale_up"] = (statistics.median(inside), cluster.strided_profile(ranks, 1).intra_bytes_per_s)
    across = [r for r in rows if r["nodes"] > 1 and r["ranks"] == r["nodes"] and r["op"] != "all_reduce"]
    if across and cluster.num_devices >= across[0]["nodes"] * cluster.devices_per_node:
        nodes = across[0]["nodes"]
        out["scale_out"] = (statistics.median(r["busbw_bytes_per_s"] for r in across),
                            cluster.strided_profile(nodes, cluster.devices_per_node).inter_bytes_per_s)
    return out


# ---- measuring (PyTorch, one GPU per rank) ----------------------------------------------------------------

def measure(quick: bool = False) -> dict:
    """The figures of this machine's GPU (and, under ``torchrun``, of its NCCL collectives)."""
    try:
        import torch
    except ImportError:
        raise SpecError("probe needs PyTorch with a GPU: pip install 'clusterplan[probe]' (or pass --figures FILE "
                        "with figures recorded on the machine)") from None
    if not torch.cuda.is_available():
        raise SpecError("probe: no GPU visible to PyTorch (torch.cuda.is_available() is False); pass --figures FILE")
    import os

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    figures = {"format": FORMAT, "device": {"name": props.name, "memory_bytes": props.total_memory,
                                            "torch": torch.__version__},
               "gemm_bf16_flops_per_s": _mamf(torch, GEMM_SHAPES[:4] if quick else GEMM_SHAPES),
               "copy_bytes_per_s": _copy(torch), "kernel_launch_s": _launch(torch), "collectives": []}
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        figures["collectives"] = _collectives(torch, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return figures


def _timed(torch, fn, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after three warm-ups, by CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _mamf(torch, shapes) -> float:
    best = 0.0
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        best = max(best, 2.0 * m * n * k / _timed(torch, lambda: torch.mm(a, b), 20))
    return best


def _copy(torch) -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2.0 * src.numel() / _timed(torch, lambda: dst.copy_(src), 20)  # read and write


def _launch(torch) -> float:
    x = torch.ones(1, device="cuda")
    return _timed(torch, lambda: [x.add_(1) for _ in range(1000)], 5) / 1000


def _collectives(torch, per_node: int) -> list[dict]:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = max(1, world // max(1, per_node))
    groups = [(per_node, 1, [list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)])]
    if nodes > 1:
        groups.append((nodes, nodes, [list(range(i, world, per_node)) for i in range(per_node)]))
    rows = []
    for ranks, span, members in groups:
        handles = [dist.new_group(g) for g in members]  # every rank creates every group, in one order
        mine = next(h for g, h in zip(members, handles) if rank in g)
        rows += [{"op": op, "ranks": ranks, "nodes": span, "bytes": COLLECTIVE_BYTES,
                  "busbw_bytes_per_s": _busbw(torch, dist, op, mine, ranks)} for op in
                 ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]
    return rows


def _busbw(torch, dist, op: str, group, ranks: int) -> float:
    """nccl-tests' bus bandwidth: all-reduce 2 (n - 1) / n x bytes / t, the others (n - 1) / n."""
    size = COLLECTIVE_BYTES // 2
    full = torch.empty(size, dtype=torch.bfloat16, device="cuda")
    part = torch.empty(size // ranks, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(full)
    run = {"all_reduce": lambda: dist.all_reduce(full, group=group),
           "all_gather": lambda: dist.all_gather_into_tensor(full, part, group=group),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full, group=group),
           "all_to_all": lambda: dist.all_to_all_single(out, full, group=group)}[op]
    seconds = _timed(torch, run, 10)
    factor = 2 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
    return factor * COLLECTIVE_BYTES / seconds

"""Compare what the cost model predicts with what ``benchmarks/gpu_probe.py`` measured on a real GPU.

    python benchmarks/compare_probe.py            # the probe files in benchmarks/results/

Per decoder layer of the probe (eager PyTorch, bf16, one device, no tensor parallelism) it builds
the same layer as a ``ModelSpec`` and prices one layer's forward+backward with ``cost.compute``
(the ops of ``models.ops.layer_ops``) on the catalogue device the probe ran on, with each attention
kernel the cost model knows, and its stored activations with ``cost.terms.activation_bytes`` /
``op_sac_activation_bytes`` under the activation semantics each case has (Korthikanti's fused count;
torchtitan's eager modules, with or without ``repeat_kv``). It prints measured and predicted side by
side; ``tests/test_probe.py`` holds the model to them. No figure here feeds the cost model: the
device constants taken from a probe are copied into the data files by hand, citing the probe file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterplan.cost.compute import fp8_cast_s, op_time_s, ops_time_s  # noqa: E402
from clusterplan.cost.framework import load_profile  # noqa: E402
from clusterplan.cost.terms import (activation_bytes, comm_kernel_slowdown, moe_mlp_activation_bytes,  # noqa: E402
                                    op_sac_activation_bytes)
from clusterplan.models.ops import ACT_BYTES, Op, _gemm, layer_ops, moe_ops  # noqa: E402
from clusterplan.models.spec import ModelSpec, MoESpec  # noqa: E402
from clusterplan.topologies.library import load_device  # noqa: E402

DEVICE_OF = {"NVIDIA H200": "h200-sxm-141gb", "NVIDIA H100 80GB HBM3": "h100-sxm5-80gb"}
RESULTS = REPO / "benchmarks" / "results"
PROBES = (RESULTS / "gpu_probe_h200_2026-11-26.json", RESULTS / "gpu_probe2_h200_2026-11-26.json",
          RESULTS / "gpu_probe3_h200_2026-11-26.json", RESULTS / "gpu_probe_h100_2026-11-26.json",
          RESULTS / "gpu_probe_h100_small_run_2026-11-26.json", RESULTS / "gpu_probe_h100_tp_shard_2026-11-26.json",
          RESULTS / "gpu_probe_overlap_h100_2026-11-26.json", RESULTS / "gpu_probe_overlap2_h100_2026-11-26.json",
          RESULTS / "gpu_probe_overlap3_h100_2026-11-26.json", RESULTS / "gpu_probe_overlap4_h100_2026-11-26.json",
          RESULTS / "gpu_probe_overlap5_h100_2026-11-26.json", RESULTS / "gpu_probe_moe_h100_2026-11-26.json",
          RESULTS / "gpu_probe_fp8_h100_2026-11-27.json", RESULTS / "gpu_probe_fp8_h200_2026-11-27.json",
          RESULTS / "gpu_probe_expert_gemms_h100_2026-11-27.json",
          RESULTS / "gpu_probe_tp_shard_unfused_h100_2026-11-28.json")
LLAMA3_8B = dict(hidden=4096, heads=32, kv_heads=8, ffn=14336, style="llama")


def _model(row: dict) -> ModelSpec:
    return ModelSpec(name="probe-layer", num_layers=1, hidden_size=row["hidden"],
                     num_attention_heads=row["heads"], num_kv_heads=row["kv_heads"],
                     ffn_hidden_size=row["ffn"], vocab_size=32000,
                     ffn_activation="swiglu" if row["style"] == "llama" else "gelu", dropout=False,
                     seq_len=row["seq"])


def layer_rows(probe: dict) -> list[dict]:
    """The probe's ``layers`` cases (the probe's own layer: repeat_kv, unfused SwiGLU, no rotary)."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in probe.get("layers") or []:
        model, n = _model(row), row["seq"] * row["micro_batch"]
        pred = {v: ops_time_s(ops, dev, "bf16") + ops_time_s(ops, dev, "bf16", backward=True)
                for v in ("flash", "flash2")
                for ops in [layer_ops(model, n, row["seq"], 1, False, False, attention=v)]}
        eager = row["style"] == "llama"  # the probe's llama layer is written like torchtitan's
        out.append({"case": row["case"], "measured_s": row["fwd_bwd_s_per_layer"], "predicted_s": pred["flash"],
                    "predicted_fa2_s": pred["flash2"], "measured_bytes": row["activation_bytes_per_layer"],
                    "predicted_bytes": activation_bytes(model, n, 1, False, "none", False, eager=eager,
                                                        kv_repeat=eager and row["kv_heads"] != row["heads"])})
    return out


def titan_rows(probe: dict) -> list[dict]:
    """torchtitan's own block: kept activations per layer under each recompute mode."""
    out = []
    for row in probe.get("titan_layers") or []:
        spec = dict(LLAMA3_8B, seq=row["seq"])
        model, n = _model(spec), row["seq"] * row["micro_batch"]
        # the first layer's input is allocated before the probe's baseline: add it back
        measured = row["activation_bytes_per_layer"] + ACT_BYTES * n * spec["hidden"] / row["layers"]
        eager = not row["compiled"]  # torch.compile's partitioner keeps what fused kernels keep
        if row["ac"] == "op_sac":
            pred = op_sac_activation_bytes(model, n, 1, False, row["compiled"])
        else:
            pred = activation_bytes(model, n, 1, False, {"none": "none", "full": "full"}[row["ac"]], False,
                                    eager=eager, kv_repeat=not row["gqa_native"])
        name = f"titan {'compile' if row['compiled'] else 'eager'} ac={row['ac']} " \
               f"{'enable_gqa' if row['gqa_native'] else 'repeat_kv'}"
        out.append({"case": name, "measured_bytes": measured, "predicted_bytes": pred,
                    "measured_s": row["fwd_bwd_s_per_layer"], "predicted_s": _titan_layer_s(probe, row)})
    return out


def _titan_layer_s(probe: dict, row: dict) -> float:
    """Forward, backward and recompute of one Llama-3-8B layer as the cost model prices it under
    torchtitan's profile (cuDNN attention, per-op SAC for ``op_sac``; repeat_kv before 2026-02)."""
    from clusterplan.cost.layout import Job
    from clusterplan.cost.terms import Context, compute_terms
    from clusterplan.models.library import get_model
    from clusterplan.planner.inputs import load_cluster
    cluster = load_cluster(str(RESULTS / "one_h100.yaml"), device=DEVICE_OF[probe["device"]["name"]])
    job = Job(global_batch_size=row["micro_batch"], seq_len=row["seq"], framework="torchtitan",
              framework_date="2026-02" if row["gqa_native"] else "2025-10", compiled=row["compiled"])
    model = get_model("llama3-8b")
    ct = compute_terms(Context(model, job, cluster), 1, 1, row["micro_batch"], False,
                       {"none": "none", "op_sac": "selective", "full": "full"}[row["ac"]])
    return (ct.forward_s + ct.backward_s + ct.recompute_s) / model.num_layers


def _shard_time_s(row: dict, dev, attention: str, precision: str, dropout: bool) -> float:
    """Forward and backward of one tensor-parallel rank's GPT layer of the probe's row, as priced."""
    model = ModelSpec(name="probe-tp-shard", num_layers=1, hidden_size=row["hidden"], num_attention_heads=row["heads"],
                      num_kv_heads=row["heads"], ffn_hidden_size=4 * row["hidden"], vocab_size=32000,
                      ffn_activation="gelu", dropout=dropout, seq_len=row["seq"])
    ops = layer_ops(model, row["seq"] * row["micro_batch"], row["seq"], row["tp"], False, False, attention=attention)
    return ops_time_s(ops, dev, precision) + ops_time_s(ops, dev, precision, backward=True)


def tp_shard_rows(probe: dict) -> list[dict]:
    """One tensor-parallel rank's GPT layer (no communication) at micro-batch sizes 1 to 8: time per
    token, measured and by the roofline (FlashAttention-2, as PyTorch SDPA picks for head dim 216)."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in probe.get("tp_shard") or []:
        if not isinstance(row, dict):
            continue
        n = row["seq"] * row["micro_batch"]
        pred = _shard_time_s(row, dev, "flash2", "bf16", False)
        out.append({"case": f"h{row['hidden']} tp{row['tp']} mbs{row['micro_batch']}", "micro_batch": row["micro_batch"],
                    "hidden": row["hidden"], "measured_s": row["fwd_bwd_s_per_layer"], "predicted_s": pred,
                    "measured_s_per_token": row["fwd_bwd_s_per_layer"] / n, "predicted_s_per_token": pred / n})
    return out


def tp_shard_unfused_rows(probe: dict) -> list[dict]:
    """One tensor-parallel rank of a 2022 Megatron-DeepSpeed GPT layer (unfused attention, fp16,
    dropout 0.1): fwd+bwd time, measured and priced (``attention="unfused"``), by head size and
    micro-batch."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    return [{"case": f"h{row['hidden']} d{row['head_dim']} tp{row['tp']} mbs{row['micro_batch']}",
             "head_dim": row["head_dim"], "hidden": row["hidden"], "tp": row["tp"], "micro_batch": row["micro_batch"],
             "measured_s": row["fwd_bwd_s_per_layer"], "predicted_s": _shard_time_s(row, dev, "unfused", "fp16", True)}
            for row in (probe.get("tp_shard_unfused") or {}).get("layers") or []]


def small_run_rows(probe: dict) -> list[dict]:
    """The probe's FSDP2 training run on one rank, priced as ``clusterplan validate`` prices a
    measured run: the same run-file fields (torchtitan at 2025-10, before its enable_gqa, so with
    repeat_kv as the probe's block; compile on for the compiled case, whose loss is then compiled as
    torchtitan's since 2025-04), evaluated on the catalogue device the probe ran on."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies.validate import evaluate_run
    out = []
    # the first run (gpu_probe_h100_2026-11-26.json) recorded no phases and leaked between cases:
    # superseded by gpu_probe_h100_small_run_2026-11-26.json
    rows = [r for r in probe.get("small_run") or [] if isinstance(r, dict) and "phases" in r]
    # Some cases began with a 5.6 GiB leftover of the case before (one fp32 copy of the weights,
    # not freed even after gc.collect()): each peak is taken over the cleanest start of any case.
    starts = [r["phases"]["start"]["allocated"] for r in rows]
    for row in rows:
        leftover = row["phases"]["start"]["allocated"] - min(starts)
        accum = row.get("micro_batches", 1)
        run = {"id": f"small-run-{row['ac']}", "compile": row["compiled"],
               "framework": {"name": "torchtitan", "date": "2025-10"},
               "model": {"name": "probe llama", "num_layers": row["layers"], "hidden_size": row["hidden"],
                         "num_attention_heads": row["heads"], "num_kv_heads": row["kv_heads"],
                         "ffn_hidden_size": row["ffn"], "vocab_size": row["vocab"], "ffn_activation": "swiglu",
                         "tied_embeddings": False},
               "seq_len": row["seq"], "global_batch_size": row["micro_batch"] * accum,
               "micro_batch_size": row["micro_batch"],
               "precision": "bf16",
               "hardware": {"cluster": str(RESULTS / "one_h100.yaml"), "device": DEVICE_OF[probe["device"]["name"]],
                            "count": 1},
               "layout": {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "zero_stage": 3,
                          "recompute": {"none": "none", "op_sac": "selective", "full": "full"}[row["ac"]]},
               "measured": {"peak_memory_gib": (row["peak_allocated_bytes"] - leftover) / 2**30,
                            "peak_memory_kind": "allocated", "step_time_s": row["step_s"]}}
        res = evaluate_run(run, SearchOptions(), best=False)
        run["measured"] = {"peak_memory_gib": (row["peak_reserved_bytes"] - leftover) / 2**30,
                           "peak_memory_kind": "reserved", "step_time_s": row["step_s"]}
        reserved = evaluate_run(run, SearchOptions(), best=False)
        name = (f"{'compiled' if row['compiled'] else 'eager'} ac={row['ac']}, {accum} micro-batch"
                f"{'es' if accum > 1 else ''} ({row['params'] / 1e9:.2f} B params)")
        out.append({"case": name, "measured_bytes": row["peak_allocated_bytes"] - leftover, "reason": res.reason,
                    "measured_reserved_bytes": row["peak_reserved_bytes"] - leftover,
                    "predicted_bytes": res.predicted_peak_memory_bytes,
                    "predicted_reserved_bytes": reserved.predicted_peak_memory_bytes,
                    "measured_step_s": row["step_s"], "predicted_step_s": res.predicted_step_time_s})
    return out


def moe_rows(probe: dict) -> list[dict]:
    """The probe's ``moe`` cases: one rank's MoE MLP (router, permute, grouped SwiGLU experts,
    weighted un-permute) against ``models.ops.moe_ops`` timed by the roofline, and its activations
    against ``cost.terms.moe_mlp_activation_bytes`` (eager SwiGLU keeps 4 tensors of the expert width)."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in probe.get("moe") or []:
        if not isinstance(row, dict) or "case" not in row:
            continue
        moe = MoESpec(num_experts=row["experts"], top_k=row["top_k"], expert_ffn_hidden_size=row["expert_ffn"])
        model = ModelSpec(name="probe-moe", num_layers=1, hidden_size=row["hidden"], num_attention_heads=16,
                          num_kv_heads=16, ffn_hidden_size=row["expert_ffn"], vocab_size=32000,
                          ffn_activation="swiglu", dropout=False, seq_len=row["tokens"], moe=moe)
        ops = moe_ops(model, row["tokens"], 1, False, local_experts=row["experts"])
        out.append({"case": row["case"], "measured_s": row["fwd_bwd_s"],
                    "predicted_s": ops_time_s(ops, dev, "bf16") + ops_time_s(ops, dev, "bf16", backward=True),
                    "measured_bytes": row["activation_bytes"],
                    "predicted_bytes": moe_mlp_activation_bytes(model, row["tokens"], 4)})
    return out


def fp8_rows(probe: dict) -> list[dict]:
    """The probe's ``fp8_linear`` cases: one linear layer's FP8 forward and backward (cast-transpose of
    the input and of the output gradient, three tensorwise-scaled GEMMs) against ``cost.compute``'s
    price of the same GEMM with unfused casts (``fp8_cast_s``), and the sustained FP8 and bf16
    GEMM rates against ``DeviceSpec.gemm_flops_per_s`` (burst MAMF x sustained fraction)."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in (probe.get("fp8_linear") or {}).get("rows") or []:
        op = _gemm(row["name"], row["tokens"], row["k"], row["n"])
        casts = fp8_cast_s(op, dev, False) + fp8_cast_s(op, dev, True)
        out.append({"case": f"{row['name']} K{row['k']} N{row['n']} x {row['tokens']} tokens",
                    "measured_s": sum(row["gemm_s"].values()) + sum(row["cast_transpose_s"].values()),
                    "predicted_s": op_time_s(op, dev, "fp8") + op_time_s(op, dev, "fp8", backward=True),
                    "measured_cast_s": sum(row["cast_transpose_s"].values()), "predicted_cast_s": casts})
    for key, dtype in (("sustained", "bf16"), ("sustained_fp8", "fp8")):
        if isinstance(probe.get(key), dict) and "steady_tflops" in probe[key]:
            out.append({"case": f"{dtype} 8192^3 GEMM for 30 s: ms per TFLOP",
                        "measured_s": 1 / probe[key]["steady_tflops"],
                        "predicted_s": 1e12 / dev.gemm_flops_per_s(dtype), "measured_cast_s": 0.0, "predicted_cast_s": 0.0})
    return out


def expert_gemm_rows(probe: dict) -> list[dict]:
    """The probe's ``expert_gemms`` cases: one rank's expert GEMMs of one projection (forward), the
    rate ``cost.compute`` gives them as one grouped op (``models.ops.moe_ops``, casts left out as the
    probe has none) beside each measured way of launching them."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in probe.get("expert_gemms") or []:
        if not isinstance(row, dict) or "case" not in row:
            continue
        e, m, k, n = row["experts"], row["rows"], row["k"], row["n"]
        flops = 2.0 * m * k * n * e
        op = Op("experts", "gemm", flops, ACT_BYTES * e * (m * k + k * n + m * n), input_elements=e * m * k,
                rows=m, cols=n, groups=e)
        t = op_time_s(op, dev, row["dtype"]) - (fp8_cast_s(op, dev, False) if row["dtype"] == "fp8" else 0.0)
        measured = {key: row.get(f"{key}_tflops") for key in ("sequential", "four_streams", "grouped", "one_gemm")}
        out.append({"case": f"{row['case']} {row['proj']} {row['dtype']}", "gemm_flops": flops / e,
                    "predicted_tflops": flops / t / 1e12, **measured})
    return out


COPY_MIN_BYTES_PER_S = 20e9


def overlap_rows(probe: dict) -> list[dict]:
    """The probe's ``overlap``, ``overlap_more`` and ``overlap_waves`` cases: a GEMM (or attention)
    loop's slowdown beside a kernel of N blocks, against the device's ``comm_kernel_slowdown`` curve
    (what ``cost.terms.overlap_share`` charges for NCCL overlap) and against the bare SM share (what
    it charges with an SM margin or beside attention); ``valid`` is False where the copy's own timing
    included a compile."""
    dev = load_device(DEVICE_OF[probe["device"]["name"]])
    out = []
    for row in [r for key in ("overlap", "overlap_more", "overlap_waves") for r in probe.get(key) or []]:
        if not isinstance(row, dict) or "side" not in row:
            continue
        share = row["ctas"] / dev.gemm.sm_count
        rate = row.get("side_alone_bytes_per_s")
        # a copy kernel that streamed under 20 GB/s per block alone (valid runs: 26-36) had a Triton
        # compile inside its timing, so the side kernel ran too few passes to cover the GEMMs
        valid = not (row["side"] == "copy" and not row.get("delay") and rate and rate / row["ctas"] < COPY_MIN_BYTES_PER_S)
        curve = comm_kernel_slowdown(dev.comm_kernel_slowdown, share) if dev.comm_kernel_slowdown else None
        what = row.get("compute") or "x".join(map(str, row["gemm"]))
        out.append({"case": f"{what} + {row['side']} {row['ctas']}"
                            + (f" delay {row['delay']}" if row.get("delay") else ""),
                    "measured": row["gemm_slowdown"], "curve": curve, "sm_share_slowdown": share / (1 - share),
                    "shape": tuple(row.get("gemm") or ()), "compute": row.get("compute"), "side": row["side"],
                    "blocks": row["ctas"], "delay": row.get("delay") or 0, "valid": valid})
    return out


def _section(header: str, rows: list[dict], line) -> None:
    """Print ``header`` and one ``line(row)`` per row, if there are rows."""
    if rows:
        print(header)
    for r in rows:
        print(line(r))


def _err(predicted: float, measured: float) -> str:
    return f"{predicted / measured - 1:+6.1%}"


def _layer_line(r: dict) -> str:
    return (f"  {r['case']:34} {r['measured_s'] * 1e3:8.2f} {r['predicted_s'] * 1e3:8.2f}"
            f" {_err(r['predicted_s'], r['measured_s'])} {r['predicted_fa2_s'] * 1e3:8.2f}"
            f" {r['measured_bytes'] / 2**20:9.0f} {r['predicted_bytes'] / 2**20:9.0f}"
            f" {_err(r['predicted_bytes'], r['measured_bytes'])}")


def _small_run_line(r: dict) -> str:
    if r["predicted_bytes"] is None:
        return f"  {r['case']:48} not evaluated: {r['reason']}"
    return (f"  {r['case']:48} {r['measured_bytes'] / 2**30:9.2f} {r['predicted_bytes'] / 2**30:6.2f}"
            f" {_err(r['predicted_bytes'], r['measured_bytes'])}"
            f" {r['measured_reserved_bytes'] / 2**30:9.2f} {r['predicted_reserved_bytes'] / 2**30:6.2f}"
            f" {_err(r['predicted_reserved_bytes'], r['measured_reserved_bytes'])}"
            f" {r['measured_step_s']:7.3f} {r['predicted_step_s']:6.3f} {_err(r['predicted_step_s'], r['measured_step_s'])}")


def _print_losses(probe: dict) -> None:
    losses = probe.get("loss") or {}
    prof = load_profile("torchtitan")
    for mode, loss in (losses.items() if "eager" in losses else [("eager", losses)] if losses else []):
        held = prof.compiled_logit_bytes if mode == "compiled" else prof.logit_bytes
        print(f"  loss cross_entropy(logits.float()), {mode}: backward peak "
              f"{loss['backward_peak_bytes_per_logit']:.2f} B per logit; torchtitan profile: {held:g}")


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]] or [p for p in PROBES if p.exists()]
    for path in paths:
        probe = json.loads(path.read_text())
        print(f"{path.name}: {probe['device']['name']}, torch {probe['device']['torch']}")
        _section(f"  {'layer (eager PyTorch, bf16)':34} {'meas ms':>8} {'pred ms':>8} {'err':>6} {'fa2 ms':>8}"
                 f" {'meas MiB':>9} {'pred MiB':>9} {'err':>6}", layer_rows(probe), _layer_line)
        _section(f"  {'torchtitan Llama-3-8B block, 8192 tokens':52} {'meas MiB':>9} {'pred MiB':>9} {'err':>6}"
                 f" {'meas ms':>8} {'pred ms':>8} {'err':>6}", titan_rows(probe),
                 lambda r: (f"  {r['case']:52} {r['measured_bytes'] / 2**20:9.0f} {r['predicted_bytes'] / 2**20:9.0f}"
                            f" {_err(r['predicted_bytes'], r['measured_bytes'])} {r['measured_s'] * 1e3:8.2f}"
                            f" {r['predicted_s'] * 1e3:8.2f} {_err(r['predicted_s'], r['measured_s'])}"))
        _print_losses(probe)
        _section(f"  {'one TP rank of a GPT layer, 2048 tokens x mbs':34} {'meas ns/tok':>11} {'pred ns/tok':>11} {'err':>6}",
                 tp_shard_rows(probe),
                 lambda r: (f"  {r['case']:34} {r['measured_s_per_token'] * 1e9:11.1f}"
                            f" {r['predicted_s_per_token'] * 1e9:11.1f} {_err(r['predicted_s'], r['measured_s'])}"))
        _section(f"  {'2022 Megatron-DeepSpeed TP rank, unfused attn, fp16':52} {'meas ms':>8} {'pred ms':>8} {'err':>6}",
                 tp_shard_unfused_rows(probe),
                 lambda r: (f"  {r['case']:52} {r['measured_s'] * 1e3:8.2f} {r['predicted_s'] * 1e3:8.2f}"
                            f" {_err(r['predicted_s'], r['measured_s'])}"))
        _section(f"  {'MoE MLP on one rank (eager, bf16)':34} {'meas ms':>8} {'pred ms':>8} {'err':>6}"
                 f" {'meas MiB':>9} {'pred MiB':>9} {'err':>6}", moe_rows(probe),
                 lambda r: (f"  {r['case']:34} {r['measured_s'] * 1e3:8.2f} {r['predicted_s'] * 1e3:8.2f}"
                            f" {_err(r['predicted_s'], r['measured_s'])} {r['measured_bytes'] / 2**20:9.0f}"
                            f" {r['predicted_bytes'] / 2**20:9.0f} {_err(r['predicted_bytes'], r['measured_bytes'])}"))
        _section(f"  {'GEMM or attention beside N blocks (slowdown)':44} {'measured':>8} {'curve':>6} {'SM share':>8}",
                 overlap_rows(probe),
                 lambda r: (f"  {r['case']:44} {r['measured']:8.1%} "
                            + (f"{r['curve']:6.1%}" if r["curve"] is not None else f"{'-':>6}")
                            + f" {r['sm_share_slowdown']:8.1%}" + ("" if r["valid"] else "  invalid: compile timed")))
        _section(f"  {'FP8 linear layer fwd+bwd (GEMMs and casts)':44} {'meas ms':>8} {'pred ms':>8} {'err':>6}"
                 f" {'casts meas':>10} {'pred':>6}", fp8_rows(probe),
                 lambda r: (f"  {r['case']:44} {r['measured_s'] * 1e3:8.3f} {r['predicted_s'] * 1e3:8.3f}"
                            f" {_err(r['predicted_s'], r['measured_s'])} {r['measured_cast_s'] * 1e3:10.3f}"
                            f" {r['predicted_cast_s'] * 1e3:6.3f}"))
        _section(f"  {'expert GEMMs of one rank (TFLOP/s)':40} {'model':>7} {'1 by 1':>7} {'4 strm':>7} {'grouped':>7}"
                 f" {'1 GEMM':>7}", expert_gemm_rows(probe),
                 lambda r: f"  {r['case']:40} {r['predicted_tflops']:7.1f} " + " ".join(
                     f"{r[k]:7.1f}" if r[k] else f"{'-':>7}" for k in ("sequential", "four_streams", "grouped", "one_gemm")))
        _section(f"  {'FSDP2 training run on one rank, peak GiB':48} {'allocated':>9} {'pred':>6} {'err':>6}"
                 f" {'reserved':>9} {'pred':>6} {'err':>6} {'step s':>7} {'pred':>6} {'err':>6}",
                 small_run_rows(probe), _small_run_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

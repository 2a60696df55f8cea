"""Optimizer-state offload to host memory (``offload=optimizer``): DeepSpeed's ZeRO-Offload and
Megatron-Core's --optimizer-cpu-offload keep Adam's fp32 states and gradients on the host and step them
on the CPU. Priced by ``evaluate`` (device memory without the states; the gradient and weight copies
over the host link and the CPU step, all exposed), refused where the framework, its release, the
device's catalogue entry or the host memory cannot, held by the search's ``--fix``, and exported
with each framework's own switches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.step import evaluate, num_microbatches
from clusterplan.cost.terms import Context, host_optimizer_bytes, host_optimizer_terms, host_tier
from clusterplan.cost.terms.dp import optimizer_params
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.planner.search.space import Bounds, build_space
from clusterplan.topologies.library import build_cluster

sys.path.insert(0, str(Path(__file__).parent / "launchers"))
import launcher_cases  # noqa: E402  (tests/launchers/launcher_cases.py)

RUN = CliRunner()
MODEL = get_model("llama3-8b")
BASE = "tp=1,pp=1,dp=8,mbs=1,recompute=full,zero={zero},offload={offload}"


def _job(framework: str, date: str = "") -> Job:
    return Job(global_batch_size=64, seq_len=8192, framework=framework, framework_date=date)


def _h100():
    return build_cluster("dgx-h100-superpod", num_devices=8)


def test_layout_text_takes_the_optimizer_modes_and_keeps_old_layouts_as_they_were():
    assert parse_layout(BASE.format(zero=1, offload="optimizer")).offload == "optimizer"
    assert "offload=activations+optimizer" in parse_layout(BASE.format(zero=1, offload="activations+optimizer")).short()
    assert "offload" not in parse_layout(BASE.format(zero=1, offload="none")).short()
    with pytest.raises(SpecError, match="optimizer"):  # the allowed list names the new modes
        parse_layout(BASE.format(zero=1, offload="gradients"))


def test_megatron_offload_moves_the_states_to_the_host_and_pays_its_copies_and_cpu_step():
    job, cluster = _job("megatron"), _h100()
    on_layout = parse_layout(BASE.format(zero=1, offload="optimizer"))
    assert layout_problems(MODEL, job, cluster, on_layout) == []
    off, on = evaluate(MODEL, job, cluster, parse_layout(BASE.format(zero=1, offload="none"))), evaluate(
        MODEL, job, cluster, on_layout)
    assert off.memory.optimizer_bytes > 0 and on.memory.optimizer_bytes == 0.0
    assert on.memory.weights_bytes == off.memory.weights_bytes and on.memory.gradients_bytes == off.memory.gradients_bytes
    ctx, tier = Context(MODEL, job, cluster), host_tier(cluster.device)
    count = optimizer_params(ctx, on_layout)
    assert count == pytest.approx(MODEL.num_params / 8, rel=0.01)  # the rank's ZeRO-1 shard
    want = (count * job.grad_bytes / tier.bytes_per_s, count * 30.0 / 76.8e9, count * 2.0 / tier.bytes_per_s)
    assert host_optimizer_terms(ctx, on_layout) == pytest.approx(want)
    assert on.time.optimizer_s == pytest.approx(sum(want)) and on.time.optimizer_s > 10 * off.time.optimizer_s
    assert on.step_time_s == pytest.approx(off.step_time_s - off.time.optimizer_s + sum(want))
    assert host_optimizer_bytes(ctx, on_layout) == pytest.approx(count * 16.0)


def test_deepspeed_zero2_accumulates_on_the_host_a_round_trip_per_micro_batch():
    job, cluster = _job("deepspeed"), _h100()
    ctx = Context(MODEL, job, cluster)
    z1, z2 = (parse_layout(BASE.format(zero=z, offload="optimizer")) for z in (1, 2))
    m = num_microbatches(job, z2)
    assert m == 8
    d2h1, cpu1, _ = host_optimizer_terms(ctx, z1)
    d2h2, cpu2, _ = host_optimizer_terms(ctx, z2)
    assert d2h2 == pytest.approx(d2h1 * (2 * m - 1)) and cpu2 == pytest.approx(cpu1)


@pytest.mark.parametrize("framework,date,layout,says", [
    ("torchtitan", "", BASE.format(zero=1, offload="optimizer"), "torchtitan"),
    ("megatron", "2024-12", BASE.format(zero=1, offload="optimizer"), "from 2025-02 on"),
    ("deepspeed", "2021-01", BASE.format(zero=1, offload="optimizer"), "from 2021-04 on"),
    ("megatron", "", BASE.format(zero=0, offload="optimizer"), "needs a sharded optimizer"),
    ("megatron", "", BASE.format(zero=1, offload="optimizer").replace("dp=8", "dp=8,param_gather=fp8"), "param_gather"),
])
def test_optimizer_offload_is_refused_where_it_cannot_run(framework, date, layout, says):
    job = _job(framework, date)
    if "param_gather=fp8" in layout:
        job = Job(global_batch_size=64, seq_len=8192, framework=framework, precision="fp8")
    problems = " ".join(m for _, m in layout_problems(MODEL, job, _h100(), parse_layout(layout)))
    assert "offload=optimizer" in problems and says in problems, problems


def test_a_device_without_a_host_memory_bandwidth_or_room_is_refused():
    b200 = build_cluster("dgx-b200-superpod", num_devices=8)
    problems = [m for k, m in layout_problems(MODEL, _job("megatron"), b200,
                                              parse_layout(BASE.format(zero=1, offload="optimizer"))) if k == "offload"]
    assert problems and "dram_gbyte_per_s" in problems[0]
    big = get_model("llama3-405b")  # 405 B / 8 ranks x 16 B: about 810 GB against 256 GB per GPU
    problems = [m for k, m in layout_problems(big, Job(global_batch_size=8, seq_len=8192, framework="megatron"), _h100(),
                                              parse_layout("tp=8,pp=1,dp=1,mbs=1,recompute=full,zero=1,offload=optimizer"))
                if k == "offload"]
    assert problems and "optimizer states and fp32 gradients" in problems[0] and "256.0 GB per device" in problems[0]


def test_plan_offers_it_only_where_fix_holds_it_or_fit_counts_it():
    """No published run measures optimizer offload's speed, so plan does not offer it by itself; --fix
    holds it (tests/test_optimizer_offload_search.py prices it) and fit's with-offload answer counts it."""
    job, cluster = _job("megatron"), _h100()
    assert build_space(MODEL, job, cluster).offload == ("none",)
    assert "optimizer" in build_space(MODEL, job, cluster, Bounds(offer_offload=True)).offload
    assert build_space(MODEL, job, cluster, Bounds(fixed={"offload": "optimizer"})).offload == ("optimizer",)
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "8", "--framework"]
    out = RUN.invoke(main, [*args, "megatron", "--fix", "offload=optimizer", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["layout"]["offload"] == "optimizer"
    for framework, says in (("torchtitan", "no optimizer-state offload"), ("megatron", "dram_gbyte_per_s")):
        where = ["--cluster", "dgx-b200-superpod"] if framework == "megatron" else []  # B200: no host DRAM rate
        out = RUN.invoke(main, [*args, framework, "--fix", "offload=optimizer", *where])
        assert out.exit_code == 2 and says in out.output and "Traceback" not in out.output, out.output


def test_evaluate_prints_the_host_copies_and_the_cpu_step():
    out = RUN.invoke(main, ["evaluate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "8",
                            "--global-batch", "64", "--framework", "deepspeed",
                            "--layout", BASE.format(zero=2, offload="optimizer")])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("optimizer offload:"))
    assert "gradient copies to the host" in line and "CPU Adam at 256.0 GB/s" in line and "unvalidated" in line


def test_exports_write_each_frameworks_switch_and_the_others_refuse():
    from clusterplan.planner.report.export import export

    doc = launcher_cases.plan_doc(launcher_cases.CASES["llama3-8b-h100-optimizer-offload"][0], "megatron")
    mega = export(doc, "megatron")
    assert "--optimizer-cpu-offload" in mega and "--optimizer-offload-fraction 1.0" in mega
    assert "--use-precision-aware-optimizer" in mega and "--use-distributed-optimizer" in mega
    config = json.loads(export(launcher_cases.plan_doc(launcher_cases.CASES["llama3-8b-h100-zero-offload"][0],
                                                       "deepspeed"), "deepspeed"))
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "--cpu-optimizer" in " ".join(config["_comment"])  # Megatron-DeepSpeed's DeepSpeedCPUAdam
    doc["inputs"]["framework"] = None  # a plan without its framework: the format's own check refuses
    for fmt in ("torchtitan", "maxtext"):
        with pytest.raises(SpecError, match="offload=optimizer"):
            export(doc, fmt)

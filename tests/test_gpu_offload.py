"""Activation offload on GPUs (``offload=activations``): Megatron-Core's --cpu-offloading-num-layers
(no recomputation, pp 1, copies on Transformer Engine's own streams) and DeepSpeed's cpu_checkpointing
(full recomputation, copies blocking the compute stream), over the host link of the device
(PCIe Gen5 x16 on x86 nodes, NVLink-C2C on Grace): refused where the framework cannot, priced by
``evaluate``, searched only where the copies hide, exported with the framework's own flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.layout import Job, parse_layout
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.step import evaluate, offload_copies
from clusterplan.cost.terms import Context, host_tier
from clusterplan.models.library import get_model
from clusterplan.planner.search.space import Bounds, build_space, split_spaces
from clusterplan.topologies.library import build_cluster

sys.path.insert(0, str(Path(__file__).parent / "launchers"))
import launcher_cases  # noqa: E402  (tests/launchers/launcher_cases.py)

RUN = CliRunner()
MODEL = get_model("llama3-8b")
MEGATRON = "tp=1,pp=1,dp=64,mbs=1,recompute=none,zero=1,offload=activations"
DEEPSPEED = "tp=1,pp=1,dp=64,mbs=1,recompute=full,zero=1,offload=activations"


def _job(framework: str) -> Job:
    return Job(global_batch_size=128, seq_len=8192, framework=framework)


def _gb200(n: int = 64):
    return build_cluster("gb200-nvl72", num_devices=n)


def test_grace_and_x86_gpus_carry_their_host_link():
    """GB200 reaches Grace's LPDDR5X over NVLink-C2C, far faster than an H100's PCIe Gen5 x16."""
    c2c, pcie = host_tier(_gb200().device), host_tier(build_cluster("dgx-h100-superpod", num_devices=8).device)
    assert pcie.bytes_per_s == pytest.approx(64e9) and c2c.bytes_per_s > 3 * pcie.bytes_per_s
    assert host_tier(build_cluster("dgx-a100-superpod", num_devices=8).device) is None


@pytest.mark.parametrize("layout,framework,needs", [
    ("tp=1,pp=1,dp=64,mbs=1,recompute=full,zero=1,offload=activations", "megatron", "recompute=none"),
    ("tp=1,pp=2,dp=32,mbs=1,recompute=none,zero=1,offload=activations", "megatron", "pp <= 1"),
    ("tp=1,pp=1,dp=64,mbs=1,recompute=none,zero=1,offload=activations", "deepspeed", "recompute=full")])
def test_offload_is_refused_where_the_framework_cannot_run_it(layout, framework, needs):
    problems = " ".join(str(p) for p in layout_problems(MODEL, _job(framework), _gb200(), parse_layout(layout)))
    assert needs in problems and f"{framework} (" in problems and "offload=activations (since 20" in problems


def test_megatron_offload_frees_all_but_the_last_layer_and_hides_copies_behind_compute():
    job, cluster = _job("megatron"), _gb200()
    on = evaluate(MODEL, job, cluster, parse_layout(MEGATRON))
    off = evaluate(MODEL, job, cluster, parse_layout(MEGATRON.replace("activations", "none")))
    layer = off.memory.activations_bytes / MODEL.num_layers
    assert on.memory.activations_bytes == pytest.approx(layer, rel=0.05)  # the last layer stays
    copies_s, window_s, link = offload_copies(Context(MODEL, job, cluster), on.layout)
    assert window_s > 0 and link == host_tier(cluster.device).bytes_per_s
    m = job.global_batch_size // 64
    assert on.time.offload_s == pytest.approx(m * max(0.0, copies_s - window_s))


def test_deepspeed_cpu_checkpointing_exposes_every_copy():
    """DeepSpeed 0.19.5 copies with tensor.to(cpu) on the compute stream: nothing hides."""
    job, cluster = _job("deepspeed"), _gb200()
    ev = evaluate(MODEL, job, cluster, parse_layout(DEEPSPEED))
    copies_s, window_s, _ = offload_copies(Context(MODEL, job, cluster), ev.layout)
    assert window_s == 0.0 and copies_s > 0
    assert ev.time.offload_s == pytest.approx(job.global_batch_size // 64 * copies_s)
    assert ev.memory.activations_bytes == 0.0


def test_plan_does_not_search_offload_no_published_run_measures():
    """Megatron's and DeepSpeed's activation offload are priced but unmeasured: plan's search leaves
    them out (semantics.offload_searched), unless --fix holds them or fit asks (Bounds.offer_offload)."""
    cluster = _gb200()
    for framework in ("megatron", "deepspeed"):
        assert build_space(MODEL, _job(framework), cluster).offload == ("none",)
        held = build_space(MODEL, _job(framework), cluster, Bounds(fixed={"offload": "activations"}))
        assert "activations" in held.offload


def test_maxtext_searches_offload_on_tpus_only():
    """MaxText's offload is measured by its TPU recipes, not on GPUs (XLA on GPU): searched there only."""
    job = _job("maxtext")
    assert build_space(MODEL, job, _gb200()).offload == ("none",)
    tpu = build_cluster("tpu-v6e-pod", num_devices=64)
    assert build_space(MODEL, job, tpu).offload == ("none", "activations")


def test_search_offers_megatron_offload_without_recompute_at_pp1_and_not_deepspeeds():
    cluster = _gb200()
    for framework, offered in (("megatron", True), ("deepspeed", False)):
        job = _job(framework)
        space = build_space(MODEL, job, cluster, Bounds(offer_offload=True))
        # with the optimizer modes: GB200's Grace memory has a bandwidth the CPU Adam step is priced at
        assert space.offload == ("none", "activations", "optimizer", "activations+optimizer")
        off = [s for s in split_spaces(space, MODEL, job, cluster) if s.offload == ("activations",)]
        assert bool(off) == offered
        assert all(sub.recompute == ("none",) and all(f[1] == 1 for f in sub.factorizations) for sub in off)


def test_evaluate_says_how_long_the_copies_take_and_whether_they_hide():
    for framework, layout, says in (("megatron", MEGATRON, " beside "), ("deepspeed", DEEPSPEED, "all of it exposed")):
        out = RUN.invoke(main, ["evaluate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "64",
                                "--global-batch", "128", "--framework", framework, "--layout", layout])
        assert out.exit_code == 0, out.output
        line = next(x for x in out.output.splitlines() if x.startswith("host offload:"))
        assert "GB/s host link" in line and says in line


def test_exports_write_each_frameworks_offload_switch():
    """The launcher matrix's offload cases (tests/launchers/launcher_cases.py; CI runs the pinned parsers
    on them): Megatron's flag for every layer but the last, DeepSpeed's config key and Megatron-DeepSpeed's
    --checkpoint-in-cpu (without it, checkpointing.configure turns the config's cpu_checkpointing off)."""
    from clusterplan.planner.report.export import export

    mega = export(launcher_cases.plan_doc(launcher_cases.CASES["llama3-8b-gb200-offload"][0], "megatron"), "megatron")
    assert f"--cpu-offloading-num-layers {MODEL.num_layers - 1}" in mega
    case = launcher_cases.CASES["llama3-8b-gb200-cpu-checkpointing"][0]
    config = json.loads(export(launcher_cases.plan_doc(case, "deepspeed"), "deepspeed"))
    assert config["activation_checkpointing"]["cpu_checkpointing"] is True
    assert "--deepspeed-activation-checkpointing --checkpoint-in-cpu" in " ".join(config["_comment"])


def test_fit_on_a_gpu_cluster_counts_megatron_offload():
    out = RUN.invoke(main, ["fit", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--json"])
    doc = json.loads(out.output)
    assert doc["num_devices_with_offload"] is not None and doc["num_devices_with_offload"] <= doc["num_devices"]


def test_engines_agree_with_megatron_offload_on_gb200():
    """CP-SAT equals the exhaustive search where Megatron's offloaded space (the last layer kept on the
    device, in the tables' transient) competes with the rest."""
    from clusterplan.planner.search.space import Bounds
    from test_search import _check_engines_agree  # tests/ is on the path, as in test_offload_search.py

    model = MODEL.model_copy(update={"num_layers": 8})
    job = Job(global_batch_size=64, seq_len=8192, framework="megatron")
    _check_engines_agree(model, job, build_cluster("gb200-nvl72", num_devices=8),
                         Bounds(fixed={"pp": 1, "order": "tp-cp-dp-pp"}))
    _check_engines_agree(MODEL, job, build_cluster("gb200-nvl72", num_devices=8), Bounds(fixed={"pp": 1}))


def test_offload_beyond_the_hosts_memory_is_refused_and_not_searched():
    """Eight sequences of 8,192 tokens in flight without recomputation need more than a GB200's 240 GB
    share of Grace memory: evaluate names both figures, and the search leaves that factorization out."""
    job, cluster = Job(global_batch_size=64, seq_len=8192, framework="megatron"), _gb200(8)
    problems = [m for k, m in layout_problems(MODEL, job, cluster, parse_layout(
        "tp=1,pp=1,dp=8,mbs=8,recompute=none,zero=1,offload=activations")) if k == "offload"]
    assert problems and "GB of host memory" in problems[0] and "240.0 GB per device" in problems[0]
    space = build_space(MODEL, job, cluster)
    off = [s for s in split_spaces(space, MODEL, job, cluster) if s.offload == ("activations",)]
    assert all((1, 1, 8, 1) not in sub.factorizations for sub in off)

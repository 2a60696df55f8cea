"""Wrong answers on paths users walk (issue 41): each test fails on the code before its fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.terms import Context
from clusterplan.models.library import get_model
from clusterplan.planner.inputs import Request
from clusterplan.planner.search.exhaustive import smallest_memory
from clusterplan.planner.search.space import build_space, parse_bounds
from clusterplan.planner.search.tables import build_tables, layout_from_indices

RUN = CliRunner()


@pytest.mark.parametrize("framework,fixes,rule", [
    ("deepspeed", ["pp=2", "zero=3"], "incompatible with pipeline parallelism"),
    ("deepspeed", ["pp=2", "zero=2"], "incompatible with pipeline parallelism"),
    ("megatron", ["pp=2", "zero=3"], "pipeline"),
])
def test_a_fix_the_framework_refuses_names_its_rule(framework, fixes, rule):
    """Not "does not fit ... use more devices" (exit 3): the framework's rule, exit 2."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-superpod", "--devices", "64", "--framework", framework]
    for f in fixes:
        args += ["--fix", f]
    out = RUN.invoke(main, args)
    assert out.exit_code == 2, out.output
    assert rule in out.stderr and "does not fit" not in out.stderr
    assert all(f in out.stderr for f in fixes)
    # the rule on DP overlap does not bind (the layout is refused with the overlap off too): not named
    assert "ReduceGrads" not in out.stderr


@pytest.mark.parametrize("model,devices,fix,words", [
    ("mixtral", 64, "ep=3", "8 experts"),
    ("llama3-8b", 48, "tp=3", "32 attention heads"),
    ("llama3-8b", 64, "mbs=3", "global batch not divisible"),
])
def test_a_fix_that_breaks_a_structural_rule_is_bad_input(model, devices, fix, words):
    out = RUN.invoke(main, ["plan", "--model", model, "--cluster", "dgx-superpod", "--devices", str(devices),
                            "--fix", fix])
    assert out.exit_code == 2, out.output
    assert words in out.stderr and fix in out.stderr
    assert "change the batch size" not in out.stderr


def test_least_memory_is_that_of_a_layout_the_framework_runs():
    """The exit-3 figure names a layout the framework can run (DeepSpeed: no ZeRO-2/3 with pp)."""
    request = Request(model="llama3-405b", cluster="dgx-superpod", num_devices=16, framework="deepspeed")
    model = get_model("llama3-405b")
    cluster = request.load_cluster()
    job = request.build_job(model, cluster)[0]
    space = build_space(model, job, cluster, parse_bounds(("pp=2",)))
    found = smallest_memory(build_tables(Context(model, job, cluster), space, ignore_memory=True, memory_only=True))
    assert found is not None
    assert layout_from_indices(space, found[1]).zero_stage in (0, 1)


def test_weight_streaming_frees_no_gradients():
    """Cerebras streams weights and gradients off-chip: a one-micro-batch step under a framework that
    frees sharded gradients between steps (torchtitan's FSDP2) held -7.5 GiB of gradients. The
    command line now refuses torchtitan on Cerebras (it runs on GPUs only); the pricing is checked
    through the API, which prices any framework on any device."""
    from clusterplan.cost.layout import Job, Layout
    from clusterplan.cost.step import evaluate
    from clusterplan.topologies.library import build_cluster
    ev = evaluate(get_model("llama3-8b"), Job(global_batch_size=4, seq_len=8192, framework="torchtitan"),
                  build_cluster("cerebras-cs3-cluster"), Layout(dp=4, zero_stage=3))
    assert ev.memory.gradients_bytes == 0 and ev.memory.total_bytes > 0


def test_no_data_parallelism_means_no_zero_stage_rule():
    """torchtitan's plain-DDP rules concern data-parallel ranks: pp=8 on 8 devices (dp=1) runs. (Found on
    a 4-device Cerebras cluster, where torchtitan no longer plans: it runs on GPUs only.)"""
    out = RUN.invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "dgx-superpod", "--devices", "8",
                            "--framework", "torchtitan", "--fix", "tp=1,pp=8,dp=1", "--top", "0"])
    assert out.exit_code == 0, out.output
    assert "pp=8" in out.stdout


def test_evaluate_refuses_a_rank_order_the_framework_does_not_lay_out():
    """plan --fix refused order=tp-cp-pp-dp under torchtitan while evaluate priced it."""
    args = ["--model", "llama3-8b", "--cluster", "dgx-superpod", "--devices", "64", "--framework", "torchtitan"]
    out = RUN.invoke(main, ["evaluate", *args, "--layout", "tp=2,pp=2,dp=16,order=tp-cp-pp-dp"])
    assert out.exit_code == 2 and "order=tp-cp-pp-dp" in out.stderr and "does not offer" in out.stderr, out.output
    fixed = RUN.invoke(main, ["plan", *args, "--fix", "order=tp-cp-pp-dp"])
    assert fixed.exit_code == 2
    ok = RUN.invoke(main, ["evaluate", *args, "--layout", "tp=2,pp=2,dp=16,order=tp-cp-dp-pp"])
    assert ok.exit_code == 0, ok.output


def test_a_whatif_where_nothing_runs_says_so_on_stderr():
    for args in (["compare", "--model", "llama3-405b", "--cluster", "dgx-superpod:8", "--cluster", "tpu-v5p-pod:8"],
                 ["sweep", "--model", "llama3-405b", "--cluster", "dgx-superpod", "--over", "devices=8,16", "--json"]):
        out = RUN.invoke(main, args)
        assert out.exit_code == 3, out.output
        assert out.stderr.startswith("error: no ") and "does not fit" in out.stderr, out.stderr


@pytest.mark.parametrize("args", [
    ["compare", "--model", "llama3-8b", "--cluster", "dgx-superpod:8", "--cluster", "mi300x-cluster:8"],
    ["sweep", "--model", "llama3-8b", "--cluster", "dgx-superpod", "--over", "devices=8,16", "--jobs", "1"],
])
def test_whatif_no_timings_gives_the_same_bytes(args):
    runs = [RUN.invoke(main, [*args, "--json", "--no-timings"]) for _ in range(2)]
    assert all(r.exit_code == 0 for r in runs), runs[0].output
    assert runs[0].stdout == runs[1].stdout and "wall_s" not in runs[0].stdout


def test_csv_and_chart_on_one_path_is_refused(tmp_path):
    path = str(tmp_path / "x.png")
    out = RUN.invoke(main, ["compare", "--model", "llama3-8b", "--cluster", "dgx-superpod:8", "--csv", path,
                            "--chart", path])
    assert out.exit_code == 2 and "--csv and --chart both name" in out.stderr


@pytest.mark.parametrize("objective,key", [("time", "time_to_train_s"), ("cost", "cost_usd"),
                                           ("energy", "energy_j")])
def test_the_chart_plots_what_the_objective_ranks_by(objective, key):
    from clusterplan.planner.report.chart import _left_metric
    row = {"search": {"objective": objective}, "time_to_train_s": 8.64e5, "step_time_s": 1.0, "cost_usd": 5.0,
           "cost_per_step_usd": 0.1, "energy_j": 3.6e9, "energy_per_step_j": 3.6e6}
    assert _left_metric([row])[0] == key
    per_step = {**row, "time_to_train_s": None, "cost_usd": None, "energy_j": None}  # no --tokens
    assert _left_metric([per_step])[0] == {"time": "step_time_s", "cost": "cost_per_step_usd",
                                          "energy": "energy_per_step_j"}[objective]


def test_the_csv_memory_columns_match_the_table(tmp_path):
    import csv
    path = tmp_path / "rows.csv"
    out = RUN.invoke(main, ["compare", "--model", "llama3-8b", "--cluster", "dgx-superpod:8", "--csv", str(path)])
    assert out.exit_code == 0, out.output
    row = next(csv.DictReader(path.open()))
    used = float(row["used_gib"])
    assert f"{used:.1f}" in out.stdout and float(row["reserved_gib"]) >= used


@pytest.mark.parametrize("command", ["clusters", "devices", "models"])
def test_catalogue_ids_are_never_broken_on_a_narrow_terminal(command, monkeypatch):
    import json
    import clusterplan.cli as cli_module
    from rich.console import Console
    ids = [r["id"] for r in json.loads(RUN.invoke(main, [command, "--json"]).stdout)]
    monkeypatch.setattr(cli_module, "_console", lambda: Console(width=70, highlight=False, markup=False,
                                                                  emoji=False, soft_wrap=True))
    out = RUN.invoke(main, [command])
    assert out.exit_code == 0
    firsts = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert all(i in firsts for i in ids), [i for i in ids if i not in firsts]


def test_an_moe_plan_on_72_gpu_racks_prices_expert_groups_across_racks():
    """DeepSeek-V3 on the default GB200 NVL72 pod: expert groups that straddle the 72-GPU racks are
    priced at their slowest group, not refused (issue 36), so the plan keeps expert parallelism;
    with 64 devices of each rack (--domain-devices 64, Slurm's --segment 16) groups of 64 stay inside
    a rack and the same search finds them."""
    import json
    out = RUN.invoke(main, ["plan", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--top", "0", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["layout"]["ep"] > 1 and "alignment" not in doc["rejections"]
    segmented = RUN.invoke(main, ["plan", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--domain-devices", "64",
                                  "--top", "0", "--json"])
    assert segmented.exit_code == 0 and json.loads(segmented.stdout)["layout"]["ep"] == 64


def test_llama3_405b_on_256_gb200_evaluates_and_plans():
    """Measured outside the repository: Llama 3.1 405B ran on 256 GB200 at TP4 PP8 CP2. 256 GB200 are
    3 full racks and 40 of a fourth, so every layout's groups straddle the racks; evaluate refused
    it ("straddle domains unevenly", exit 2) and plan found no layout. Both now price it (exit 0)."""
    import json
    layout = ["--layout", "tp=4,pp=8,cp=2"]
    base = ["--model", "llama3-405b", "--cluster", "gb200-nvl72", "--devices", "256"]
    out = RUN.invoke(main, ["evaluate", *base, *layout])
    assert out.exit_code == 0, out.output
    assert "step time" in out.stdout and "straddle" not in out.output
    racks = json.loads(RUN.invoke(main, ["evaluate", *base, *layout, "--json"]).stdout)
    segments = json.loads(RUN.invoke(main, ["evaluate", *base, *layout, "--domain-devices", "64", "--json"]).stdout)
    # 4 racks of 64 hold every dp group of 32 in one rack; 3 x 72 + 40 split some 8 + 24 and 16 + 16
    assert racks["breakdown"]["dp_comm"] > segments["breakdown"]["dp_comm"] > 0
    plan = RUN.invoke(main, ["plan", *base, "--top", "0", "--json"])
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["step_time_s"] > 0


def test_megatron_dense_context_parallel_keeps_pp_last():
    """Megatron-Core builds its expert rank generator for dense models too (since 2024-11): with
    cp > 1 and pp > 1 it refuses --use-tp-pp-dp-mapping (order tp-cp-pp-dp). The plan chose that
    order and the export wrote the flag; evaluate priced it. Before the folding release it ran."""
    from clusterplan.cost.checks import placement_problem
    from clusterplan.cost.profile_file import load_profile

    out = RUN.invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                            "--seq-len", "32768", "--fix", "cp=2,pp=2,tp=2"])
    assert out.exit_code == 0, out.output
    best = next(line for line in out.output.splitlines() if line.startswith("best layout"))
    assert "cp=2" in best and "pp=2" in best and "order=tp-cp-pp-dp" not in best
    bad = RUN.invoke(main, ["evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                            "--layout", "tp=8,pp=2,cp=2,dp=2,order=tp-cp-pp-dp"])
    assert bad.exit_code == 2 and "order=tp-cp-dp-pp" in bad.stderr and "dense models too" in bad.stderr
    megatron = load_profile("megatron")
    assert megatron.at("2024-10").checks_dense_placement() is False
    assert megatron.at("2024-11").checks_dense_placement() is True
    assert placement_problem(8, 2, 2, 1, True, "tp-cp-pp-dp", dense=True)
    assert placement_problem(8, 2, 1, 1, True, "tp-cp-pp-dp", dense=True) is None  # cp = 1: the sizes agree
    assert placement_problem(8, 2, 2, 1, True, "tp-cp-pp-dp") is None  # other frameworks: no expert generator

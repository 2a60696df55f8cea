"""The MoE dispatcher knob (``Layout.moe_dispatcher``): layout text, framework refusals, and the
all-to-all bytes each dispatcher sends (``cost.terms.comm._dispatch_s``)."""

from __future__ import annotations

import dataclasses
from math import comb

import pytest

from clusterplan.cost import collectives as coll
from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms.comm import _dispatch_s, ranks_per_token, remote_nodes_per_token
from clusterplan.models.errors import SpecError
from clusterplan.models.spec import ModelSpec, MoESpec
from clusterplan.topologies.cluster import GroupProfile
from clusterplan.topologies.library import build_cluster

MOE = ModelSpec(name="tiny-moe", num_layers=8, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
                ffn_hidden_size=2816, vocab_size=32000, ffn_activation="swiglu",
                moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=1024))
DENSE = MOE.model_copy(update={"moe": None, "name": "tiny-dense"})
JOB = Job(global_batch_size=64, seq_len=2048, framework="megatron")


def _profile(k: int, domains: int = 1, intra: float = 300e9, inter: float = 50e9) -> GroupProfile:
    per = k // domains
    return GroupProfile(num_ranks=k, num_domains=domains, ranks_per_domain=per,
                        intra_bytes_per_s=intra if per > 1 else 0.0, inter_bytes_per_s=inter if domains > 1 else 0.0,
                        intra_latency_s=2e-6 if per > 1 else 0.0, inter_latency_s=5e-6 if domains > 1 else 0.0,
                        intra_in_network_reduction=False, inter_in_network_reduction=False,
                        intra_nir_bytes_per_s=0.0, torus_axes=0, torus_wraparound=False)


def test_layout_text_takes_the_dispatcher_and_writes_it_only_when_set():
    lay = parse_layout("tp=1,pp=1,dp=8,ep=8,moe_dispatcher=deepep")
    assert lay.moe_dispatcher == "deepep"
    assert "moe_dispatcher=deepep" in lay.short()
    assert parse_layout(lay.short().replace(" ", ",")) == lay
    assert "moe_dispatcher" not in Layout(dp=8, ep=8).short()  # the default, as every layout text before it
    assert "moe_dispatcher" not in Layout(dp=8, moe_dispatcher="deepep").short()  # no expert parallelism
    with pytest.raises(SpecError, match=r"layout\.moe_dispatcher: got 'nccl'; allowed: auto, alltoall, deepep, hybridep"):
        parse_layout("dp=8,ep=8,moe_dispatcher=nccl")


def test_ranks_per_token_by_hand():
    """Experts spread evenly over k ranks, top-k chosen uniformly: E[ranks hit] = k (1 - C(E - E/k, top_k) / C(E, top_k))."""
    E, top, k = 256, 8, 8
    assert ranks_per_token(E, top, k) == pytest.approx(k * (1 - comb(E - E // k, top) / comb(E, top)), rel=1e-12)
    assert ranks_per_token(E, top, 1) == 1.0
    assert 1.0 < ranks_per_token(E, top, k) < top
    assert ranks_per_token(64, 8, 64) == pytest.approx(8.0)  # one expert per rank: nothing to deduplicate


def test_dispatchers_inside_one_domain_by_hand():
    """One scale-up domain: NCCL all-to-all (and the implicit dispatcher) sends every routed copy,
    DeepEP and Hybrid-EP one per destination rank."""
    e, token_bytes, p = MOE.moe, 1e6, _profile(8)
    every = coll.all_to_all_s(token_bytes * e.top_k * e.load_factor, p)
    assert _dispatch_s(e, token_bytes, p, "auto") == every
    assert _dispatch_s(e, token_bytes, p, "alltoall") == every
    dedup = coll.all_to_all_s(token_bytes * ranks_per_token(e.num_experts, e.top_k, 8) * e.load_factor, p)
    assert _dispatch_s(e, token_bytes, p, "deepep") == pytest.approx(dedup, rel=1e-12)
    assert _dispatch_s(e, token_bytes, p, "hybridep") == pytest.approx(dedup, rel=1e-12)
    assert dedup < every


def test_dispatchers_across_domains_by_hand():
    """Across domains NCCL all-to-all sends every copy over the fabric, and so does ``auto`` (what the
    frameworks run unless told: the Megatron export writes the alltoall dispatcher for it); DeepEP
    crosses it once per remote node (its intranode leg deduplicated per rank as well)."""
    e, token_bytes, p = MOE.moe, 1e6, _profile(32, 4, inter=10e9)
    flat = coll.all_to_all_s(token_bytes * e.top_k * e.load_factor, p)
    assert _dispatch_s(e, token_bytes, p, "alltoall") == flat
    assert _dispatch_s(e, token_bytes, p, "auto") == flat
    remote = token_bytes * e.load_factor * remote_nodes_per_token(e.num_experts, e.top_k, 4)
    deep = coll.hierarchical_all_to_all_s(token_bytes * ranks_per_token(e.num_experts, e.top_k, 32) * e.load_factor,
                                          remote, p)
    assert _dispatch_s(e, token_bytes, p, "deepep") == pytest.approx(deep, rel=1e-12)
    assert deep < flat


def test_evaluate_orders_the_dispatchers_and_keeps_the_default():
    """Two H100 nodes, ep=16 over both: NCCL all-to-all and ``auto`` (the alltoall dispatcher the
    export writes for it) are the slowest, DeepEP faster; ``auto`` is the layout without the knob."""
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    base = Layout(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none")
    steps = {d: evaluate(MOE, JOB, cluster, base.with_(moe_dispatcher=d)).time.ep_comm_s for d in
             ("auto", "alltoall", "deepep", "hybridep")}
    assert steps["auto"] == evaluate(MOE, JOB, cluster, base).time.ep_comm_s
    assert steps["alltoall"] == steps["auto"] > steps["deepep"] == steps["hybridep"] > 0
    one_node = base.with_(dp=8, ep=8)
    eight = build_cluster("dgx-h100-superpod", num_devices=8)
    assert (evaluate(MOE, JOB, eight, one_node.with_(moe_dispatcher="deepep")).time.ep_comm_s
            < evaluate(MOE, JOB, eight, one_node).time.ep_comm_s)


def test_fabric_without_gpu_initiated_rdma_prices_deepep_as_nccl_all_to_all():
    """EFA has no GPU-initiated RDMA (IBGDA): the EFA link classes say so, the groups that cross
    them carry it, and DeepEP / Hybrid-EP across domains are priced as NCCL's all-to-all there (every
    routed copy), while on InfiniBand they keep their deduplication; ``auto`` is NCCL's on both."""
    e, token_bytes = MOE.moe, 1e6
    ib, efa = _profile(32, 4, inter=10e9), dataclasses.replace(_profile(32, 4, inter=10e9), inter_gpu_initiated_rdma=False)
    nccl = _dispatch_s(e, token_bytes, efa, "alltoall")
    assert nccl == _dispatch_s(e, token_bytes, ib, "alltoall")
    for d in ("deepep", "hybridep"):
        assert _dispatch_s(e, token_bytes, efa, d) == nccl > _dispatch_s(e, token_bytes, ib, d)
    assert _dispatch_s(e, token_bytes, efa, "auto") == nccl == _dispatch_s(e, token_bytes, ib, "auto")
    one_domain = dataclasses.replace(_profile(8), inter_gpu_initiated_rdma=False)  # NVLink only: no NIC in the way
    assert _dispatch_s(e, token_bytes, one_domain, "deepep") < _dispatch_s(e, token_bytes, one_domain, "alltoall")
    base = Layout(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none")
    for preset, proxied in (("aws-p5", True), ("aws-p6-b300", True), ("dgx-h100-superpod", False)):
        cluster = build_cluster(preset, num_devices=16)
        assert cluster.axis_profile(tuple(range(16))).inter_gpu_initiated_rdma is not proxied
        steps = {d: evaluate(MOE, JOB, cluster, base.with_(moe_dispatcher=d)).time.ep_comm_s for d in ("alltoall", "deepep")}
        assert (steps["deepep"] == steps["alltoall"]) is proxied and steps["deepep"] <= steps["alltoall"]


def test_frameworks_refuse_a_dispatcher_they_lack_naming_its_date():
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    lay = Layout(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none", moe_dispatcher="deepep")
    assert not layout_problems(MOE, JOB, cluster, lay)
    old = dict(layout_problems(MOE, dataclasses.replace(JOB, framework_date="2025-01"), cluster, lay))
    assert "moe_dispatcher=deepep" in old["framework"] and "since 2025-02" in old["framework"]
    hybrid = dict(layout_problems(MOE, dataclasses.replace(JOB, framework_date="2025-10"), cluster,
                                  lay.with_(moe_dispatcher="hybridep")))
    assert "since 2025-11" in hybrid["framework"]
    ds = dict(layout_problems(MOE, dataclasses.replace(JOB, framework="deepspeed"), cluster, lay.with_(zero_stage=1)))
    assert "moe_dispatcher=deepep" in ds["framework"] and "allowed: auto, alltoall" in ds["framework"]
    dense = dict(layout_problems(DENSE, JOB, cluster, Layout(dp=16, moe_dispatcher="alltoall")))
    assert "moe_dispatcher=alltoall concerns expert layers" in dense["experts"]


def test_validate_prices_the_published_dispatchers_of_the_bundled_group():
    """torchtitan PR #2107's DeepSeek-V3 pair (bundled sweeps, one job under the standard all-to-all
    and under DeepEP): each run is priced with its own dispatcher, so the two differ and rank as
    measured; a dispatcher the format does not know is the run's bad input."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.studies.runs import bundled_data_path, load_runs_and_groups, price_run

    runs, _ = load_runs_and_groups(bundled_data_path("sweeps.yaml"))
    pair = {r["layout"]["moe_dispatcher"]: r for r in runs if r.get("group") == "torchtitan2512-deepep-deepseek-v3-671b-512h100"}
    assert set(pair) == {"alltoall", "deepep"}
    priced = {d: price_run(r, SearchOptions())[1] for d, r in pair.items()}
    assert priced["alltoall"].layout.moe_dispatcher == "alltoall"
    assert priced["deepep"].step_s() < priced["alltoall"].step_s()
    bad = dict(pair["deepep"], layout=dict(pair["deepep"]["layout"], moe_dispatcher="nccl"))
    result, _ = price_run(bad, SearchOptions())
    assert "layout.moe_dispatcher: got 'nccl'" in result.reason


def test_explain_shows_the_other_dispatchers_where_a_layout_names_one():
    from clusterplan.planner.explain import sensitivities

    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    lay = Layout(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none", moe_dispatcher="deepep")
    best = evaluate(MOE, JOB, cluster, lay)
    rows = {r["move"]: r for r in sensitivities(MOE, JOB, cluster, best)}
    assert rows["moe_dispatcher alltoall"]["delta"] > 0  # NCCL all-to-all sends every copy over the fabric
    assert rows["moe_dispatcher auto"]["delta"] >= 0
    old = dataclasses.replace(JOB, framework_date="2025-10")
    rows = {r["move"]: r for r in sensitivities(MOE, old, cluster, evaluate(MOE, old, cluster, lay))}
    assert not rows["moe_dispatcher hybridep"]["allowed"] and "since 2025-11" in rows["moe_dispatcher hybridep"]["reason"]
    plain = {r["move"] for r in sensitivities(MOE, JOB, cluster, evaluate(MOE, JOB, cluster, lay.with_(moe_dispatcher="auto")))}
    assert not any(m.startswith("moe_dispatcher") for m in plain)  # a plan's own layout (auto): as before


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_search_holds_a_fixed_dispatcher_and_its_engines_agree(dispatcher):
    """--fix moe_dispatcher=X: the search prices every layout's all-to-alls under X (not searched: one
    value), CP-SAT and the exhaustive enumerator agree, and the winner is what evaluate prices."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds, parse_bounds
    from tests.test_search import _check_engines_agree

    cluster = build_cluster("dgx-h100-superpod", num_devices=32)
    job = Job(global_batch_size=64, seq_len=2048, framework="megatron")
    bounds = Bounds({"moe_dispatcher": dispatcher, "ep": 16, "tp": 1}, {}, {"pp": 2}, 0.1)
    _check_engines_agree(MOE, job, cluster, bounds)
    res = plan(MOE, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=bounds))
    assert res.best.layout.moe_dispatcher == dispatcher
    assert res.best.step_time_s == evaluate(MOE, job, cluster, res.best.layout).step_time_s
    auto = plan(MOE, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=Bounds({"ep": 16, "tp": 1}, {}, {"pp": 2}, 0.1)))
    assert (res.best.step_time_s > auto.best.step_time_s) == (dispatcher == "alltoall")
    assert parse_bounds(("moe_dispatcher=deepep",)).fixed == {"moe_dispatcher": "deepep"}
    with pytest.raises(SpecError, match="moe_dispatcher=deepep: deepspeed"):
        plan(MOE, dataclasses.replace(job, framework="deepspeed"), cluster,
             SearchOptions(top_k=0, bounds=Bounds({"moe_dispatcher": "deepep"})))


def test_search_on_efa_prices_deepep_as_nccl_and_its_engines_agree():
    """The search's tables read the fabric's capability too: on EFA (aws-p5), with the expert group
    across nodes, --fix moe_dispatcher=deepep finds the layout and step time --fix alltoall finds,
    and CP-SAT agrees with the exhaustive enumerator."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds
    from tests.test_search import _check_engines_agree

    cluster = build_cluster("aws-p5", num_devices=32)
    job = Job(global_batch_size=64, seq_len=2048, framework="megatron")
    best = {}
    for dispatcher in ("alltoall", "deepep"):
        bounds = Bounds({"moe_dispatcher": dispatcher, "ep": 16, "tp": 1}, {}, {"pp": 2}, 0.1)
        _check_engines_agree(MOE, job, cluster, bounds)
        best[dispatcher] = plan(MOE, job, cluster, SearchOptions(engine="exhaustive", top_k=0, bounds=bounds)).best
    assert best["deepep"].step_time_s == pytest.approx(best["alltoall"].step_time_s, rel=1e-12)
    assert best["deepep"].layout.with_(moe_dispatcher="alltoall") == best["alltoall"].layout


def test_torchtitan_offers_hybridep_from_its_date_and_refuses_deepep_with_fp8_experts():
    """torchtitan has Hybrid-EP since 2026-03 (#2207), after 0.2.2 (2026-02); 0.3's float8/MXFP8
    grouped experts (since 2026-04, #3127) need a dispatcher that pads, so DeepEP is refused with them:
    the search offers Hybrid-EP instead, a --fix of DeepEP is bad input (exit 2) and evaluate names the
    rule; at 0.2.2's date the fp8 job keeps DeepEP and has no Hybrid-EP."""
    from clusterplan.planner.search.space import Bounds, build_space

    cluster = build_cluster("dgx-h100-superpod", num_devices=32)
    tt = dataclasses.replace(JOB, framework="torchtitan")
    fp8 = dataclasses.replace(tt, precision="fp8")
    assert build_space(MOE, fp8, cluster, Bounds()).moe_dispatcher == ("auto", "hybridep")
    assert build_space(MOE, dataclasses.replace(fp8, framework_date="2026-02"), cluster,
                       Bounds()).moe_dispatcher == ("auto", "deepep")
    with pytest.raises(SpecError, match=r"--fix moe_dispatcher=deepep with precision=fp8: .*allowed: "
                                        r"moe_dispatcher=auto, alltoall or hybridep"):
        build_space(MOE, fp8, cluster, Bounds({"moe_dispatcher": "deepep"}))
    lay = Layout(tp=1, pp=1, dp=32, ep=16, micro_batch_size=1, recompute="none", zero_stage=3, moe_dispatcher="deepep")
    assert "grouped GEMMs to fp8" in dict(layout_problems(MOE, fp8, cluster, lay))["experts"]
    assert not layout_problems(MOE, tt, cluster, lay)
    assert not layout_problems(MOE, fp8, cluster, lay.with_(moe_dispatcher="hybridep"))
    old = dict(layout_problems(MOE, dataclasses.replace(tt, framework_date="2026-02"), cluster,
                               lay.with_(moe_dispatcher="hybridep")))
    assert "since 2026-03" in old["framework"]


def test_exports_write_the_dispatcher_or_refuse_it():
    """Megatron: the flex dispatcher with the backend (float32 router probabilities, as its kernels
    take them); the alltoall dispatcher for alltoall and auto. torchtitan 0.2.2: expert_parallel_comm_backend
    deepep; Hybrid-EP (after 0.2.2) refused there. torchtitan 0.3: model_registry's moe_comm_backend deepep or
    hybridep (standard, its default, for alltoall and auto), DeepEP refused with float8 grouped experts and with a
    sequence tp * cp does not split."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "launchers"))
    import launcher_cases
    from clusterplan.planner.report.export import export

    doc = launcher_cases.plan_doc(launcher_cases.CASES["deepseek-v3-h800x2048-deepep"][0], "megatron")
    text = export(doc, "megatron")
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    assert "--moe-router-dtype fp32" in text and "--moe-token-dispatcher-type alltoall" not in text
    for other in ("auto", "alltoall"):
        plain = export({**doc, "layout": {**doc["layout"], "moe_dispatcher": other}}, "megatron")
        assert "--moe-token-dispatcher-type alltoall" in plain and "flex" not in plain
    tt = launcher_cases.plan_doc(launcher_cases.CASES["deepseek-v3-h800x2048-deepep"][0], "torchtitan-0.2")
    assert 'expert_parallel_comm_backend = "deepep"' in export(tt, "torchtitan-0.2")
    with pytest.raises(SpecError, match="torchtitan 0.2.2 has no Hybrid-EP"):
        export({**tt, "layout": {**tt["layout"], "moe_dispatcher": "hybridep"}}, "torchtitan-0.2")
    titan = launcher_cases.plan_doc(launcher_cases.CASES["deepseek-v3-h800x2048-deepep-bf16"][0], "torchtitan")
    text = export(titan, "torchtitan")
    assert titan["layout"]["ep"] > 1 and 'model_registry("671B", attn_backend="flex_flash", moe_comm_backend="deepep")' in text
    hybrid = export({**titan, "layout": {**titan["layout"], "moe_dispatcher": "hybridep"}}, "torchtitan")
    assert 'moe_comm_backend="hybridep"' in hybrid and "deepep" not in hybrid.replace("deep_ep", "")
    for other in ("auto", "alltoall"):
        assert "moe_comm_backend" not in export({**titan, "layout": {**titan["layout"], "moe_dispatcher": other}},
                                                "torchtitan")
    fp8 = {**titan, "inputs": {**titan["inputs"], "job": {**titan["inputs"]["job"], "precision": "fp8"}}}
    assert "Float8GroupedExpertsConverter" in export({**fp8, "layout": {**fp8["layout"], "moe_dispatcher": "hybridep"}},
                                                     "torchtitan")
    with pytest.raises(SpecError, match="moe_dispatcher=deepep with precision=fp8: .*allowed with it"):
        export(fp8, "torchtitan")
    with pytest.raises(SpecError, match="moe_dispatcher=deepep with seq_len=4095: .*multiple of 2"):
        odd = {**titan, "inputs": {**titan["inputs"], "job": {**titan["inputs"]["job"], "seq_len": 4095}}}
        export({**odd, "layout": {**odd["layout"], "cp": 2}}, "torchtitan")


def test_auto_across_nodes_is_priced_as_the_dispatcher_its_export_launches():
    """A plan that names no dispatcher, its expert group over two H100 nodes (tp=2, ep=8 on 16 GPUs):
    the Megatron export launches the alltoall dispatcher, so the plan is priced as that dispatcher
    (every routed copy over the fabric), not as a per-node deduplication the job does not run."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "launchers"))
    import launcher_cases
    from clusterplan.planner.report.export import export

    options = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-superpod", "--devices", "16",
               "--global-batch", "64", "--layout"]
    docs = {d: launcher_cases.plan_doc(options + [f"tp=2,pp=1,dp=8,ep=8,mbs=1,sp=on,moe_dispatcher={d}"], "megatron")
            for d in ("auto", "alltoall", "deepep")}
    text = export(docs["auto"], "megatron")
    assert "--moe-token-dispatcher-type alltoall" in text and "flex" not in text
    assert docs["auto"]["step_time_s"] == docs["alltoall"]["step_time_s"]
    assert docs["deepep"]["step_time_s"] < docs["auto"]["step_time_s"]  # the group spans nodes: dedup pays


def test_capacity_factor_is_exported_and_refused_with_megatron_deepep():
    """A capacity factor the plan priced is Megatron's --moe-expert-capacity-factor with padding to it;
    Megatron-Core's DeepEP backend refuses the padding, so evaluate and the export refuse the pair."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "launchers"))
    import launcher_cases
    from clusterplan.planner.report.export import export

    doc = launcher_cases.plan_doc(launcher_cases.CASES["mixtral-8x7b-h100-capacity"][0], "megatron")
    text = export(doc, "megatron")
    assert "--moe-expert-capacity-factor 1.25" in text and "--moe-pad-expert-input-to-capacity" in text
    assert "--moe-expert-capacity-factor" not in export(launcher_cases.plan_doc(
        launcher_cases.CASES["deepseek-v3-h800x2048-deepep"][0], "megatron"), "megatron")
    with pytest.raises(SpecError, match="DeepEP backend does not pad"):
        export({**doc, "layout": {**doc["layout"], "moe_dispatcher": "deepep", "ep": max(2, doc["layout"]["ep"])}},
               "megatron")
    padded = MOE.model_copy(update={"moe": MOE.moe.model_copy(update={"capacity_factor": 1.25})})
    cluster = build_cluster("dgx-h100-superpod", num_devices=16)
    lay = Layout(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, recompute="none", moe_dispatcher="deepep")
    assert "DeepEP backend does not pad" in dict(layout_problems(padded, JOB, cluster, lay))["experts"]
    assert not layout_problems(padded, JOB, cluster, lay.with_(moe_dispatcher="hybridep"))
    from clusterplan.planner.search.space import Bounds, build_space  # --fix of the pair: bad input, not a plan
    with pytest.raises(SpecError, match="--fix moe_dispatcher=deepep with capacity factor 1.25: .*allowed: "):
        build_space(padded, JOB, cluster, Bounds({"moe_dispatcher": "deepep"}))


def test_search_chooses_the_fastest_dispatcher_per_expert_group_and_its_engines_agree():
    """Without --fix the tables take, per expert group, the fastest dispatcher the job can run (DeepEP
    on H100 under Megatron, inside a node: one copy per rank holding the token's experts, where NCCL's
    all-to-all and the implicit dispatcher send all eight), CP-SAT agrees with the
    exhaustive enumerator, the winner names its dispatcher and is what evaluate prices; and it is no
    slower than the same layout with the implicit dispatcher."""
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds, build_space
    from tests.test_search import _check_engines_agree

    cluster = build_cluster("dgx-h100-superpod", num_devices=32)
    bounds = Bounds({"ep": 8, "tp": 1, "ep_overlap": False}, {}, {"pp": 2}, 0.1)  # inside a node
    assert build_space(MOE, JOB, cluster, bounds).moe_dispatcher == ("auto", "deepep")
    _check_engines_agree(MOE, JOB, cluster, bounds)
    best = plan(MOE, JOB, cluster, SearchOptions(engine="cpsat", top_k=0, bounds=bounds)).best
    assert best.layout.moe_dispatcher == "deepep"
    assert best.step_time_s == evaluate(MOE, JOB, cluster, best.layout).step_time_s
    assert best.step_time_s < evaluate(MOE, JOB, cluster, best.layout.with_(moe_dispatcher="auto")).step_time_s


@pytest.mark.parametrize("where,framework,capacity,offered", [
    (("dgx-h100-superpod", 32), "megatron", None, ("auto", "deepep")),  # Hybrid-EP: priced alike, wins no tie
    (("dgx-h100-superpod", 32), "megatron", 1.25, ("auto", "hybridep")),  # DeepEP's backend does not pad
    (("dgx-h100-superpod", 32), "torchtitan", None, ("auto", "deepep")),  # its 0.3 export writes moe_comm_backend
    (("dgx-a100-superpod", 32), "megatron", None, ("auto",)),  # no measured rate before Hopper
    (("mi300x-cluster", 32), "megatron", None, ("auto",)),
])
def test_the_search_offers_the_dispatchers_the_job_can_run(where, framework, capacity, offered):
    from clusterplan.planner.search.space import Bounds, build_space
    model = MOE.model_copy(update={"moe": MOE.moe.model_copy(update={"capacity_factor": capacity})})
    job = dataclasses.replace(JOB, framework=framework)
    assert build_space(model, job, build_cluster(*where), Bounds()).moe_dispatcher == offered
    assert build_space(model, job, build_cluster(*where), Bounds({"moe_dispatcher": "alltoall"})).moe_dispatcher == (
        "alltoall",)
    assert build_space(DENSE, job, build_cluster(*where), Bounds()).moe_dispatcher == ("auto",)


def test_torchtitan_deepep_never_runs_experts_split_over_tp_and_the_engines_agree():
    """torchtitan's DeepEP refuses expert tensor parallelism (0.2.2 parallelize.py): at 0.2.2's date,
    with tp=2, evaluate refuses etp=tp under DeepEP, a --fix of DeepEP searches only folded experts
    (etp=1) and the unfixed search never gives DeepEP to an expert group split over tp; CP-SAT agrees
    with the exhaustive enumerator on both; the 0.2 export refuses the pair."""
    from clusterplan.planner.report.export.torchtitan02 import _torchtitan_comm_backend
    from clusterplan.planner.search import SearchOptions
    from clusterplan.planner.search.engine import plan
    from clusterplan.planner.search.space import Bounds
    from tests.test_search import _check_engines_agree

    cluster = build_cluster("dgx-h100-superpod", num_devices=32)
    job = dataclasses.replace(JOB, framework="torchtitan", framework_date="2026-02")
    lay = Layout(tp=2, pp=1, dp=16, ep=8, micro_batch_size=1, recompute="none", zero_stage=3, sequence_parallel=True,
                 moe_dispatcher="deepep")
    assert "does not run expert tensor parallelism" in dict(layout_problems(MOE, job, cluster, lay))["experts"]
    assert not layout_problems(MOE, job, cluster, lay.with_(expert_tp=False))
    assert not layout_problems(MOE, job, cluster, lay.with_(moe_dispatcher="alltoall"))
    for fixed, etp in (({"moe_dispatcher": "deepep"}, False), ({"expert_tp": True}, True)):
        bounds = Bounds({"tp": 2, "ep": 8, "ep_overlap": False, **fixed}, {}, {"pp": 2}, 0.1)
        _check_engines_agree(MOE, job, cluster, bounds)
        best = plan(MOE, job, cluster, SearchOptions(engine="cpsat", top_k=0, bounds=bounds)).best
        assert best.layout.expert_tp is etp and (best.layout.moe_dispatcher == "deepep") is (not etp)
        assert not layout_problems(MOE, job, cluster, best.layout)
    with pytest.raises(SpecError, match="moe_dispatcher=deepep with expert_tensor_parallel_degree=2: .*allowed: etp=1"):
        _torchtitan_comm_backend({"ep": 8, "tp": 2, "expert_tp": True, "moe_dispatcher": "deepep"})


def test_export_torchtitan_refuses_a_fixed_deepep_behind_fp8_experts_with_exit_2():
    """The CLI: DeepSeek-V3's published FP8 job under --format torchtitan with --fix moe_dispatcher=deepep
    is bad input naming the knob, the precision and what is allowed, before any search; no traceback."""
    from click.testing import CliRunner
    from clusterplan import cli

    result = CliRunner().invoke(cli.main, ["export", "--format", "torchtitan", "--model", "deepseek-v3", "--cluster",
                                           "hgx-h800", "--devices", "2048", "--fix", "moe_dispatcher=deepep"])
    assert result.exit_code == 2, result.output
    assert "moe_dispatcher=deepep with precision=fp8" in result.stderr and "allowed: moe_dispatcher=auto" in result.stderr
    assert "Traceback" not in result.output + result.stderr

"""Context-parallel communication kinds (``Layout.cp_comm``, Megatron-Core's ``--cp-comm-type``): the
ring, the all-gather of keys and values, the heads' all-to-alls (Ulysses) and the hierarchical
all-to-all + ring, priced by evaluate, refused where the framework lacks them, exported."""

import pytest

from clusterplan.cost.layout import Job, Layout, parse_layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import cp_a2a_size
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model
from clusterplan.topologies.library import build_cluster

MODEL = get_model("llama3-70b")  # 64 query heads, 8 key/value heads
CLUSTER = build_cluster("dgx-h100-superpod", num_devices=128)
JOB = Job(global_batch_size=64, seq_len=32768)


def _eval(comm: str, tp: int = 2, cp: int = 4, job: Job = JOB):
    layout = Layout(tp=tp, cp=cp, pp=2, dp=128 // (tp * cp * 2), cp_comm=comm)
    assert not layout_problems(MODEL, job, CLUSTER, layout)
    return evaluate(MODEL, job, CLUSTER, layout)


def test_parse_and_print():
    layout = parse_layout("tp=2,cp=4,cp_comm=a2a+p2p")
    assert layout.cp_comm == "a2a+p2p" and "cp=4 cp_comm=a2a+p2p" in layout.short()
    assert "cp_comm" not in parse_layout("tp=2,cp=4,cp_comm=p2p").short()  # the default: texts stay as they were
    assert "cp_comm" not in parse_layout("tp=2,cp_comm=a2a").short()  # means nothing without cp
    with pytest.raises(SpecError, match="layout.cp_comm: got 'ring'; allowed: p2p, allgather, a2a, a2a\\+p2p"):
        parse_layout("cp=4,cp_comm=ring")


def test_the_ring_is_the_default_and_unchanged():
    assert _eval("p2p").step_time_s == evaluate(MODEL, JOB, CLUSTER, Layout(tp=2, cp=4, pp=2, dp=8)).step_time_s


def test_the_exposed_all_gather_costs_more_than_the_hidden_ring():
    ring, gather = _eval("p2p"), _eval("allgather")
    assert gather.time.cp_comm_s > ring.time.cp_comm_s
    # the same attention work: only the communication differs
    assert gather.time.compute_s == pytest.approx(ring.time.compute_s)


def test_ulysses_all_to_alls_grow_with_the_heads_bytes_not_with_cp_steps():
    a2a = _eval("a2a")
    assert a2a.time.cp_comm_s > 0
    # a2a+p2p inside one 8-GPU node at tp=2: all four cp ranks are in the domain, so it is the a2a
    assert cp_a2a_size("a2a+p2p", 4, 2, CLUSTER.domain_size) == 4
    assert _eval("a2a+p2p").time.cp_comm_s == pytest.approx(a2a.time.cp_comm_s)


def test_hierarchical_split_the_domain_then_the_ring():
    assert cp_a2a_size("a2a+p2p", 8, 2, 8) == 4  # 4 cp ranks per node, a ring of 2 nodes
    assert cp_a2a_size("a2a+p2p", 4, 8, 8) == 1  # one cp rank per node: the ring alone
    assert cp_a2a_size("p2p", 8, 1, 8) == 1 and cp_a2a_size("allgather", 8, 1, 8) == 1
    # cp=16 at tp=1: all-to-alls over the 8 GPUs of a node, then a ring of 2 nodes, unlike the ring of 16
    ring, hier = _eval("p2p", 1, 16), _eval("a2a+p2p", 1, 16)
    assert 0 < hier.time.cp_comm_s != ring.time.cp_comm_s
    assert not layout_problems(MODEL, JOB, CLUSTER, Layout(cp=16, pp=2, dp=4, cp_comm="a2a+p2p"))
    assert layout_problems(MODEL, JOB, CLUSTER, Layout(cp=16, pp=2, dp=4, cp_comm="a2a"))  # 8 kv heads over 16


def test_all_to_all_needs_the_heads_divisible():
    layout = Layout(tp=4, cp=4, pp=2, dp=4, cp_comm="a2a")  # 2 key/value heads per tp rank, 4 cp ranks
    messages = [m for _, m in layout_problems(MODEL, JOB, CLUSTER, layout)]
    assert any("cp_comm=a2a" in m and "2 key/value heads" in m and "divisible by 4" in m for m in messages)
    assert not layout_problems(MODEL, JOB, CLUSTER, layout.with_(cp_comm="allgather"))


@pytest.mark.parametrize("framework, date, comm", [
    ("torchtitan", "", "allgather"), ("torchtitan", "", "a2a"), ("nanotron", "", "a2a+p2p"),
    ("megatron", "2024-10", "allgather"),  # --cp-comm-type arrived 2024-11
])
def test_refused_where_the_framework_lacks_the_kind(framework, date, comm):
    job = Job(global_batch_size=64, seq_len=32768, framework=framework, framework_date=date)
    layout = Layout(tp=2, cp=4, pp=2, dp=8, sequence_parallel=True, cp_comm=comm)
    messages = [m for key, m in layout_problems(MODEL, job, CLUSTER, layout) if key == "framework"]
    assert any(m.startswith(f"cp_comm={comm}:") and "does not offer it" in m for m in messages), messages


def test_megatron_offers_every_kind_since_2024_11():
    job = Job(global_batch_size=64, seq_len=32768, framework_date="2024-11")
    for comm in ("allgather", "a2a", "a2a+p2p"):
        assert not layout_problems(MODEL, job, CLUSTER, Layout(tp=2, cp=4, pp=2, dp=8, cp_comm=comm))


@pytest.mark.parametrize("framework, moves", [("megatron", {"cp_comm allgather", "cp_comm a2a", "cp_comm a2a+p2p"}),
                                              ("torchtitan", set())])
def test_explain_moves_to_the_kinds_the_framework_offers(framework, moves):
    from clusterplan.planner.explain import sensitivities
    job = Job(global_batch_size=64, seq_len=32768, framework=framework)
    best = evaluate(MODEL, job, CLUSTER, Layout(tp=2, cp=4, pp=4, dp=4, sequence_parallel=True, recompute="full"))
    assert best.fits
    rows = {r["move"]: r for r in sensitivities(MODEL, job, CLUSTER, best) if r["move"].startswith("cp_comm")}
    assert set(rows) == moves
    for name, row in rows.items():  # priced: the ring hides behind attention, the others are exposed
        assert row["allowed"] and row["step_time_s"] > best.step_time_s, name


@pytest.mark.parametrize("comm, cp, tp, flags", [
    ("p2p", 4, 2, []),  # Megatron's default: nothing written, as before
    ("allgather", 4, 2, ["--cp-comm-type all_gather"]),  # Transformer Engine's name for the kind
    ("a2a", 4, 2, ["--cp-comm-type a2a"]),
    ("a2a+p2p", 16, 1, ["--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes 8 2"]),  # 8 per node
])
def test_megatron_export_writes_the_kind(comm, cp, tp, flags):
    from clusterplan import export
    from clusterplan.planner.report.plan import evaluation_document
    layout = Layout(tp=tp, cp=cp, pp=2, dp=128 // (tp * cp * 2), cp_comm=comm, recompute="full")
    doc = evaluation_document(MODEL, JOB, CLUSTER, evaluate(MODEL, JOB, CLUSTER, layout))
    text = export(doc, "megatron", model=MODEL)
    written = [line.strip() for line in text.splitlines() if "cp-comm-type" in line or "hierarchical-context" in line]
    assert written == flags


def _search_case():
    model = get_model("llama3-8b").model_copy(update={"num_layers": 4})
    return model, Job(global_batch_size=32, seq_len=8192), build_cluster("dgx-h100-superpod", num_devices=32)


def test_search_picks_the_fastest_kind_per_factorization():
    """cp=16 over two 8-GPU nodes: all-to-alls inside each node and a ring of two beat a ring of 16."""
    from clusterplan.planner.search import SearchOptions, plan
    from clusterplan.planner.search.space import parse_bounds
    model, job, cluster = _search_case()
    best = plan(model, job, cluster, SearchOptions(engine="cpsat", bounds=parse_bounds(("cp=16,tp=1",)))).best
    assert best.layout.cp_comm == "a2a+p2p"
    ring = evaluate(model, job, cluster, best.layout.with_(cp_comm="p2p"))
    assert best.time.cp_comm_s < ring.time.cp_comm_s
    assert best.step_time_s == evaluate(model, job, cluster, best.layout).step_time_s  # priced as evaluate does
    held = plan(model, job, cluster, SearchOptions(engine="cpsat", bounds=parse_bounds(("cp=16,tp=1,cp_comm=p2p",))))
    assert held.best.layout.cp_comm == "p2p"


def test_engines_agree_with_the_kinds():
    from clusterplan.planner.search.space import parse_bounds
    from test_search import _check_engines_agree  # tests/ is on the path (test_offload_search.py)
    model, job, cluster = _search_case()
    for fix in ("cp=16,pp=1", "cp=8,pp=1,cp_comm=a2a", "cp=16,pp=1,cp_comm=a2a"):  # the last: no head split
        _check_engines_agree(model, job, cluster, parse_bounds((fix,)))


def test_validate_holds_the_ring_where_a_run_does_not_say():
    from clusterplan.cost.framework import load_profile
    from clusterplan.planner.studies.runs import _bounds
    prof = load_profile("megatron").at(None)
    assert _bounds({"layout": {"tp": 1, "cp": 16}}, prof).fixed["cp_comm"] == "p2p"
    assert _bounds({"layout": {"tp": 1, "cp": 16, "cp_comm": "a2a"}}, prof).fixed["cp_comm"] == "a2a"

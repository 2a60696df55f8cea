"""Laws the cost model must obey for every layout, checked as properties (hypothesis).

- More work never makes a layout faster: widening the FFN, or adding layers' worth of hidden
  size, never lowers the predicted step time, under every overlap setting (TP overlap, DP overlap,
  context parallelism's ring, EP overlap) and every framework. Overlap budget counted twice broke this once
  (issue 8: 6 of 11,304 fuzzed comparisons).
- No overlap is free: with overlap on, the exposed communication is at least the share of compute
  its kernels take.
- More scale-out bandwidth never makes a layout slower.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.cost.terms import overlapped_exposed_s
from clusterplan.models.spec import ModelSpec
from clusterplan.topologies.library import build_cluster

CLUSTERS = {"h100": build_cluster("dgx-h100-superpod", num_devices=32),
            "a100": build_cluster("dgx-a100-superpod", num_devices=32),
            # slow NICs and PCIe-class scale-up put TP and DP traffic beyond their compute windows,
            # where counting one stretch of compute for two streams would show
            "a100-slow": build_cluster("dgx-a100-superpod", num_devices=32, scale_out_gbit_per_s=10)}
FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


def _model(ffn: int, hidden: int = 2048, layers: int = 8) -> ModelSpec:
    return ModelSpec(name="law", num_layers=layers, hidden_size=hidden, num_attention_heads=16, num_kv_heads=16,
                     ffn_hidden_size=ffn, vocab_size=32000, ffn_activation="swiglu", seq_len=4096)


layouts = st.builds(
    lambda tp, pp, cp, mbs, sp, rc, zero, do, to, order: (tp, pp, cp, mbs, sp, rc, zero, do, to, order),
    st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
    st.sampled_from([1, 2]), st.booleans(), st.sampled_from(["none", "selective", "full"]),
    st.sampled_from([0, 1, 2, 3]), st.booleans(), st.booleans(),
    st.sampled_from(["tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp"]))


def _layout(knobs) -> Layout:
    tp, pp, cp, mbs, sp, rc, zero, do, to, order = knobs
    dp = 32 // (tp * pp * cp)
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch_size=mbs, sequence_parallel=sp and tp > 1, recompute=rc,
                  zero_stage=zero, order=order, dp_overlap=do, tp_overlap=to)


def _structural(model, job, cluster, layout) -> list:
    return [p for p in layout_problems(model, job, cluster, layout) if p[0] != "framework"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=layouts, base_ffn=st.sampled_from([1024, 2048, 5504, 8192]), extra=st.sampled_from([64, 512, 4096]),
       hidden=st.sampled_from([512, 1024, 2048]), batch=st.sampled_from([0, 64, 512]),
       cluster=st.sampled_from(sorted(CLUSTERS)), framework=st.sampled_from(FRAMEWORKS))
def test_more_flops_never_faster(knobs, base_ffn, extra, hidden, batch, cluster, framework):
    c = CLUSTERS[cluster]
    layout = _layout(knobs)
    if layout.num_devices != 32:
        return
    batch = batch or layout.dp * layout.micro_batch_size  # 0: one micro-batch per step, the rarest regime
    job = Job(global_batch_size=batch, seq_len=4096, framework=framework)
    small, big = _model(base_ffn, hidden), _model(base_ffn + extra, hidden)
    _never_faster(small, big, job, c, layout)


def _moe(expert_ffn: int, hidden: int = 1024) -> ModelSpec:
    from clusterplan.models.spec import MoESpec
    return ModelSpec(name="law-moe", num_layers=8, hidden_size=hidden, num_attention_heads=16, num_kv_heads=8,
                     ffn_hidden_size=4 * hidden, vocab_size=32000, ffn_activation="swiglu", seq_len=4096,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=expert_ffn, num_dense_layers=1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=layouts, ep=st.sampled_from([1, 2, 4, 8]), eo=st.booleans(), vp=st.sampled_from([1, 2]),
       base_ffn=st.sampled_from([512, 1408, 4096]), extra=st.sampled_from([64, 1024]),
       batch=st.sampled_from([0, 64, 512]), cluster=st.sampled_from(sorted(CLUSTERS)))
def test_more_expert_flops_never_faster_with_ep_overlap(knobs, ep, eo, vp, base_ffn, extra, batch, cluster):
    """The same law for MoE layouts, with Megatron's EP overlap (combined 1F1B) on or off: the
    all-to-alls' window is the compute TP overlap and the context-parallel ring leave, and it takes
    the FSDP window, so no stretch of compute hides two streams."""
    c = CLUSTERS[cluster]
    layout = _layout(knobs)
    if layout.num_devices != 32 or layout.dp % ep:
        return
    layout = layout.with_(ep=ep, ep_overlap=eo, vp=vp if layout.pp > 1 else 1,
                          sequence_parallel=layout.tp > 1)
    batch = batch or layout.dp * layout.micro_batch_size
    job = Job(global_batch_size=batch, seq_len=4096, framework="megatron")
    small, big = _moe(base_ffn), _moe(base_ffn + extra)
    _never_faster(small, big, job, c, layout)



def _never_faster(small: ModelSpec, big: ModelSpec, job: Job, c, layout: Layout) -> None:
    """The larger model's step is not shorter (where the layout is structurally valid for it)."""
    if _structural(small, job, c, layout):
        return
    t_small = evaluate(small, job, c, layout).step_time_s
    t_big = evaluate(big, job, c, layout).step_time_s
    assert t_big >= t_small * (1 - 1e-12), (layout.short(), t_small, t_big)


def test_ep_overlap_costs_something():
    """EP overlap on a layout with expert traffic and micro-batches to pair: cheaper than exposed,
    dearer than nothing; refused combinations (full recomputation) are priced as off."""
    model, c = _moe(4096), build_cluster("dgx-h100-superpod", num_devices=32, scale_out_gbit_per_s=100)
    job = Job(global_batch_size=256, seq_len=4096, framework="megatron")
    base = Layout(tp=1, pp=2, vp=2, dp=16, ep=8, micro_batch_size=1, recompute="none", zero_stage=1)
    off = evaluate(model, job, c, base).time.ep_comm_s
    on = evaluate(model, job, c, base.with_(ep_overlap=True)).time.ep_comm_s
    assert 0 < on < off
    full = base.with_(recompute="full")
    assert evaluate(model, job, c, full.with_(ep_overlap=True)).time.ep_comm_s == evaluate(model, job, c, full).time.ep_comm_s


@settings(max_examples=100, deadline=None)
@given(comm=st.floats(1e-6, 10.0), window=st.floats(0.0, 10.0), extra=st.floats(0.0, 5.0),
       share=st.floats(0.01, 0.5))
def test_overlap_is_never_free_and_never_rewards_less_compute(comm, window, extra, share):
    exposed = overlapped_exposed_s(comm, window, share)
    assert exposed >= share * comm > 0
    assert exposed <= comm
    # a wider window lowers the exposed time by at most what it adds
    assert overlapped_exposed_s(comm, window + extra, share) >= exposed - extra - 1e-12


@settings(max_examples=60, deadline=None)
@given(knobs=layouts, gbit=st.sampled_from([100, 200, 400]))
def test_more_scale_out_bandwidth_never_slower(knobs, gbit):
    layout = _layout(knobs)
    model, job = _model(8192), Job(global_batch_size=64, seq_len=4096)
    slow = build_cluster("dgx-h100-superpod", num_devices=32, scale_out_gbit_per_s=gbit)
    fast = build_cluster("dgx-h100-superpod", num_devices=32, scale_out_gbit_per_s=2 * gbit)
    if layout.num_devices != 32 or _structural(model, job, slow, layout):
        return
    assert evaluate(model, job, fast, layout).step_time_s <= evaluate(model, job, slow, layout).step_time_s * (1 + 1e-12)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_overlap_settings_all_cost_something(framework):
    """TP overlap on a layout with TP traffic: cheaper than exposed, dearer than nothing."""
    model, c = _model(8192), CLUSTERS["h100"]
    job = Job(global_batch_size=64, seq_len=4096, framework=framework)
    base = Layout(tp=8, pp=1, dp=4, micro_batch_size=1, sequence_parallel=True, recompute="none", zero_stage=1)
    off = evaluate(model, job, c, base.with_(tp_overlap=False)).time.tp_comm_s
    on = evaluate(model, job, c, base.with_(tp_overlap=True)).time.tp_comm_s
    assert 0 < on < off


@settings(max_examples=200, deadline=None)
@given(knobs=layouts, ffn=st.sampled_from([1024, 5504, 14336]), hidden=st.sampled_from([512, 2048, 4096]),
       cluster=st.sampled_from(sorted(CLUSTERS)))
def test_one_stretch_of_compute_hides_one_stream(knobs, ffn, hidden, cluster):
    """The overlap windows are disjoint: the GEMMs TP overlap hides behind, the attention core the
    context-parallel ring hides behind and the DP window together never exceed the compute they are
    cut from. This is what makes more compute never faster whatever overlaps are on."""
    from clusterplan.cost.terms import Context, compute_terms
    layout = _layout(knobs)
    if layout.num_devices != 32:
        return
    model, job = _model(ffn, hidden), Job(global_batch_size=64, seq_len=4096)
    c = compute_terms(Context(model, job, CLUSTERS[cluster]), layout.tp, layout.cp, layout.micro_batch_size,
                      layout.sequence_parallel, layout.recompute)
    to, cp = layout.tp_overlap and layout.tp > 1, layout.cp
    tp_window = c.gemm_bwd_s if to else 0.0
    cp_window = c.attn_bwd_s if cp > 1 else 0.0
    assert tp_window + cp_window + c.dp_window_s(to, cp) <= c.backward_s * (1 + 1e-12)
    whole = c.forward_s + c.backward_s + c.recompute_s
    assert (c.gemm_s if to else 0.0) + (c.attn_s if cp > 1 else 0.0) + c.fsdp_window_s(to, cp) <= whole * (1 + 1e-12)
    # EP overlap's all-to-alls take the FSDP window: the two never hide behind the same compute
    assert c.fsdp_window_s(to, cp, True) == 0.0
    assert (c.gemm_s if to else 0.0) + (c.attn_s if cp > 1 else 0.0) + c.ep_window_s(to, cp) <= whole * (1 + 1e-12)


def test_overlap_share_follows_the_measured_tail_effect():
    """Plain NCCL overlap on an H100 costs the measured GEMM slowdown (s / (1 + s)), more than the SMs
    the kernels hold; TE userbuffers, whose GEMMs leave those SMs (SM margin), the context-parallel
    ring beside attention, and a device with no curve cost the SM share."""
    from clusterplan.cost.terms import Context, comm_kernel_slowdown, overlap_share
    model = _model(8192)
    h100 = CLUSTERS["h100"]
    dev = h100.device
    assert dev.comm_kernel_slowdown and dev.comm_kernel_slowdown_measured
    ctx = Context(model, Job(global_batch_size=64, seq_len=4096, framework="megatron"), h100)
    sms = ctx.job.profile.profile.dp_comm_sms / dev.gemm.sm_count
    s = comm_kernel_slowdown(dev.comm_kernel_slowdown, sms)
    assert overlap_share(ctx, "dp") == pytest.approx(s / (1 + s))
    assert overlap_share(ctx, "dp") > 2 * sms
    assert overlap_share(ctx, "tp") == pytest.approx(ctx.job.profile.profile.tp_comm_sms / dev.gemm.sm_count)
    assert overlap_share(ctx, "dp", beside="attention") == pytest.approx(sms)  # the CP ring: no tail effect measured
    bare = dataclasses.replace(h100, device=dev.model_copy(update={"comm_kernel_slowdown": ()}))
    assert overlap_share(Context(model, ctx.job, bare), "dp") == pytest.approx(sms)


@settings(max_examples=100, deadline=None)
@given(a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_comm_kernel_slowdown_grows_with_the_sms_held(a, b):
    from clusterplan.cost.terms import comm_kernel_slowdown
    curve = CLUSTERS["h100"].device.comm_kernel_slowdown
    lo, hi = sorted((a, b))
    assert 0.0 <= comm_kernel_slowdown(curve, lo) <= comm_kernel_slowdown(curve, hi)


def test_tp_overlap_window_is_the_compute_of_the_layouts_expert_parallelism():
    """Regression (found by the property above in CI): TP overlap's window was the GEMMs of the
    layer priced at ep 1 while the EP-overlap window was the rest of the compute at the layout's
    ep, so a wider expert FFN could hide more than it added. The case that failed: 64 tokens x 4096
    at tp 8, ep 4, both overlaps on, on an H100 pod."""
    c = CLUSTERS["h100"]
    layout = Layout(tp=8, pp=1, dp=4, ep=4, micro_batch_size=1, sequence_parallel=True, recompute="none",
                    zero_stage=0, dp_overlap=False, tp_overlap=True, ep_overlap=True)
    job = Job(global_batch_size=64, seq_len=4096, framework="megatron")
    t_small = evaluate(_moe(512), job, c, layout).step_time_s
    t_big = evaluate(_moe(576), job, c, layout).step_time_s
    assert t_big >= t_small


MORE_CLUSTERS = {**CLUSTERS, "mi300x": build_cluster("mi300x-cluster", num_devices=32),
                 "gaudi3": build_cluster("gaudi3-cluster", num_devices=32)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=layouts, ep=st.sampled_from([1, 2, 4, 8]), top_k=st.sampled_from([1, 2, 3]),
       more=st.sampled_from([1, 2, 4]), experts=st.sampled_from([8, 64]), batch=st.sampled_from([0, 64]),
       cluster=st.sampled_from(sorted(MORE_CLUSTERS)), framework=st.sampled_from(FRAMEWORKS + ("maxtext",)))
def test_a_larger_top_k_is_never_faster(knobs, ep, top_k, more, experts, batch, cluster, framework):
    """Each token through more experts is more work. MaxText's ZeRO-3 (FSDP inside a node, data
    parallel across nodes) hid its per-step all-reduce in the same backward that hid the
    micro-batch's FSDP traffic, so more expert compute hid more than it cost (issue 41)."""
    from clusterplan.models.spec import MoESpec
    c = MORE_CLUSTERS[cluster]
    layout = _layout(knobs)
    if layout.num_devices != 32 or layout.dp % ep:
        return
    layout = layout.with_(ep=ep)
    job = Job(global_batch_size=batch or layout.dp * layout.micro_batch_size, seq_len=4096, framework=framework)

    def model(k: int) -> ModelSpec:
        return _moe(512).model_copy(update={"moe": MoESpec(num_experts=experts, top_k=k, expert_ffn_hidden_size=512)})
    small, big = model(top_k), model(top_k + more)
    _never_faster(small, big, job, c, layout)


def _leading_dense(layers: int, dense: int, ffn: int, expert_ffn: int, hidden: int, top_k: int) -> ModelSpec:
    from clusterplan.models.spec import MoESpec
    return ModelSpec(name="law-leading-dense", num_layers=layers, hidden_size=hidden, num_attention_heads=16,
                     num_kv_heads=8, ffn_hidden_size=ffn, vocab_size=32000, ffn_activation="swiglu", seq_len=4096,
                     moe=MoESpec(num_experts=16, top_k=top_k, expert_ffn_hidden_size=expert_ffn, num_dense_layers=dense))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=layouts, ep=st.sampled_from([1, 2, 4]), vp=st.sampled_from([1, 2]), layers=st.sampled_from([8, 12, 17, 23]),
       dense=st.sampled_from([1, 2, 3]), ffn=st.sampled_from([2048, 8192, 16384]), expert_ffn=st.sampled_from([256, 1024]),
       top_k=st.sampled_from([1, 2]), batch=st.sampled_from([64, 256]), cluster=st.sampled_from(sorted(CLUSTERS)))
def test_one_more_layer_is_never_faster(knobs, ep, vp, layers, dense, ffn, expert_ffn, top_k, batch, cluster):
    """DeepSeek-V3's shape: a few dense layers first, MoE layers after. Every stage's time used to be
    the average layer's, though the dense layers all sit on the first stage, so one more MoE layer
    could lower the slowest stage's time when dense layers are the slower (issue 41: 764 of 2,024
    fuzzed pairs). The slowest stage is now the slower of the one with the most dense layers and the
    one with the fewest (cost.terms.stage_kind_shares)."""
    c = CLUSTERS[cluster]
    layout = _layout(knobs)
    if layout.num_devices != 32 or layout.pp == 1 or layout.dp % ep:
        return
    layout = layout.with_(ep=ep, vp=vp)
    job = Job(global_batch_size=batch, seq_len=4096)
    small = _leading_dense(layers, dense, ffn, expert_ffn, 1024, top_k)
    big = _leading_dense(layers + 1, dense, ffn, expert_ffn, 1024, top_k)
    if layout_problems(small, job, c, layout) or layout_problems(big, job, c, layout):
        return
    t_small = evaluate(small, job, c, layout).step_time_s
    t_big = evaluate(big, job, c, layout).step_time_s
    assert t_big >= t_small * (1 - 1e-12), (layout.short(), t_small, t_big)

"""Check the cost model's laws on random valid variations, and print the counts.

    python benchmarks/fuzz_laws.py                         # 2,000 instances, seed 0
    python benchmarks/fuzz_laws.py --instances 100000 --seed 7
    python benchmarks/fuzz_laws.py --seed 7 --case 4711    # replay one instance, print both sides

A law instance draws a model (dense, MoE, or MoE with leading dense layers as DeepSeek-V3 has), a
cluster, a framework, a job and a layout that passes the structural rules, changes one thing that
must not help, evaluates both sides with ``cost.step.evaluate`` and checks the direction:

- more work is never faster: one more layer, a wider FFN or expert FFN, a larger top_k, a larger
  global batch (issue 8 found one window counted twice; issue 41 found the layer and top_k cases);
- more bandwidth is never slower: a faster scale-out NIC;
- more layers never need less memory on the most loaded rank;
- the search is never beaten: a layout the search could have returned is never faster than its
  answer (a sample, as each costs a search).

An instance whose layout becomes invalid on either side (the change broke a divisibility rule, or
the framework refuses it) is skipped and not counted. Case ``i`` of seed ``s`` draws from its own
generator, so a reported instance replays alone. Exit code 1 when a law failed, else 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from collections import Counter

from clusterplan.cost.framework import framework_domains
from clusterplan.cost.layout import Job, Layout
from clusterplan.cost.profile_file import FRAMEWORKS
from clusterplan.cost.step import evaluate
from clusterplan.cost.checks import layout_problems
from clusterplan.models.errors import ClusterplanError
from clusterplan.models.spec import ModelSpec, MoESpec
from clusterplan.planner.search import SearchOptions, plan
from clusterplan.planner.search.space import Bounds
from clusterplan.topologies.library import build_cluster

REL = 1e-9  # float noise allowed between the two sides
CLUSTERS = [("dgx-h100-superpod", 32), ("dgx-a100-superpod", 32), ("gb200-nvl72", 36), ("mi300x-cluster", 32),
            ("gaudi3-cluster", 32), ("tpu-v5p-pod", 32), ("dgx-b200-superpod", 16), ("trn2-cluster", 32)]
LAWS = ("layers", "ffn", "expert_ffn", "top_k", "batch", "bandwidth", "memory_layers", "search")  # weights: instance()


def _model(r: random.Random, kind: str) -> ModelSpec:
    hidden = r.choice([512, 1024, 2048])
    layers = r.choice([4, 8, 12, 17, 23, 32])
    base = dict(name="law", num_layers=layers, hidden_size=hidden, num_attention_heads=16, num_kv_heads=r.choice([4, 8, 16]),
                ffn_hidden_size=r.choice([1024, 2816, 4096, 8192, 16384]), vocab_size=r.choice([32000, 128256]),
                ffn_activation=r.choice(["swiglu", "gelu"]), seq_len=4096)
    if kind == "dense":
        return ModelSpec(**base)
    experts = r.choice([8, 16, 64])
    dense = 0 if kind == "moe" else r.randint(1, min(3, layers - 1))
    return ModelSpec(**base, moe=MoESpec(num_experts=experts, top_k=r.choice([1, 2, 4]),
                                         expert_ffn_hidden_size=r.choice([256, 512, 1408]),
                                         num_shared_experts=r.choice([0, 1]), num_dense_layers=dense))


def _layout(r: random.Random, n: int, model: ModelSpec, job: Job, family: str) -> Layout:
    """A layout drawn among the degrees that divide the devices and the values the job's framework
    offers (``cost.framework.framework_domains``), so that most draws pass the rules."""
    degrees = [d for d in (1, 2, 4, 8) if n % d == 0]
    tp, pp = r.choice([d for d in degrees if d <= model.num_kv_heads_resolved] or [1]), r.choice(degrees)
    cp = r.choice([c for c in (1, 1, 2) if n % (tp * pp * c) == 0] or [1])
    dp = n // (tp * pp * cp)
    offered = framework_domains(job.profile, family)

    def pick(knob: str, values: tuple):
        return r.choice([v for v in values if v in offered.get(knob, values)] or [values[0]])
    ep = pick("ep", tuple(e for e in (1, 2, 4, 8) if model.moe and model.moe.num_experts % e == 0 and dp % e == 0) or (1,))
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vp=pick("vp", (1, 2)) if pp > 1 else 1,
                  micro_batch_size=r.choice([1, 2]), sequence_parallel=tp > 1 and pick("sequence_parallel", (True, False)),
                  recompute=pick("recompute", ("none", "selective", "full")), zero_stage=pick("zero_stage", (0, 1, 2, 3)),
                  dp_overlap=pick("dp_overlap", (True, False)), tp_overlap=pick("tp_overlap", (True, False)),
                  ep_overlap=pick("ep_overlap", (False, True)), order=pick("order", ("tp-cp-dp-pp", "tp-cp-pp-dp")))


def _valid(model, job, cluster, layout) -> bool:
    return not layout_problems(model, job, cluster, layout)


def _changed(law: str, r: random.Random, model: ModelSpec, job: Job, cluster):
    """(model, job, cluster) after the law's change; the second side of the comparison."""
    if law in ("layers", "memory_layers"):
        return model.model_copy(update={"num_layers": model.num_layers + r.choice([1, 2])}), job, cluster
    if law == "ffn":
        return model.model_copy(update={"ffn_hidden_size": model.ffn_hidden_size + r.choice([64, 1024])}), job, cluster
    if law == "expert_ffn" and model.moe:
        moe = model.moe.model_copy(update={"expert_ffn_hidden_size": model.moe.expert_ffn_hidden_size + 256})
        return model.model_copy(update={"moe": moe}), job, cluster
    if law == "top_k" and model.moe and model.moe.top_k < model.moe.num_experts:
        moe = model.moe.model_copy(update={"top_k": min(model.moe.num_experts, model.moe.top_k + r.choice([1, 2]))})
        return model.model_copy(update={"moe": moe}), job, cluster
    if law == "batch":
        return model, dataclasses.replace(job, global_batch_size=2 * job.global_batch_size), cluster
    return None


def instance(seed: int, index: int) -> tuple[str, str | None, str]:
    """One law instance: (law, failure or None, what was compared); law ``skip`` when invalid."""
    r = random.Random(f"{seed}:{index}")
    law = r.choices(LAWS, weights=[1, 1, 1, 1, 1, 1, 1, 0.05])[0]  # a search costs a hundred evaluations
    preset, n = r.choice(CLUSTERS)
    try:
        cluster = build_cluster(preset, num_devices=n)
        model = _model(r, "dense" if law == "ffn" and r.random() < 0.3 else
                       r.choice(["moe", "leading-dense"]) if law in ("expert_ffn", "top_k") else
                       r.choice(["dense", "moe", "leading-dense"]))
        job = Job(global_batch_size=1, seq_len=4096, framework=r.choice(FRAMEWORKS))
        layout = _layout(r, n, model, job, cluster.device.family)
        job = dataclasses.replace(job, global_batch_size=layout.dp * layout.micro_batch_size * r.choice([1, 4, 16]))
        if not _valid(model, job, cluster, layout):
            return "skip", None, ""
        return _check(law, r, model, job, cluster, layout, preset, n)
    except ClusterplanError:
        return "skip", None, ""


def _check(law: str, r: random.Random, model, job, cluster, layout, preset: str, n: int) -> tuple[str, str | None, str]:
    what = f"{law}: {preset}:{n} {job.framework} {layout.short()} model={model.model_dump_json()[:200]}"
    if law == "search":
        return law, _search_law(model, job, cluster, layout), what
    if law == "bandwidth":
        slow = build_cluster(preset, num_devices=n, scale_out_gbit_per_s=r.choice([25, 100]))
        fast = build_cluster(preset, num_devices=n, scale_out_gbit_per_s=800)
        if not (_valid(model, job, slow, layout) and _valid(model, job, fast, layout)):
            return "skip", None, ""
        a, b = evaluate(model, job, slow, layout).step_time_s, evaluate(model, job, fast, layout).step_time_s
        return law, (None if b <= a * (1 + REL) else f"800 Gb/s {b} s slower than the slow NIC's {a} s"), what
    changed = _changed(law, r, model, job, cluster)
    if changed is None or not _valid(*changed, layout):
        return "skip", None, ""
    before, after = evaluate(model, job, cluster, layout), evaluate(*changed, layout)
    if law == "memory_layers":
        if layout.zero_stage >= 3:  # ZeRO-3's gathered layers are priced at the stage's average unit (with the
            return "skip", None, ""  # vocabulary matrix spread over its layers): one more layer may shrink it
        if layout.pp > 1 and model.moe and 0 < model.moe.num_dense_layers:
            # Leading dense layers with pipeline stages: one more (MoE) layer shifts a dense layer from
            # the last rank to the first (cost.stages), and the last rank, which binds with the
            # logits, can get lighter: 3 dense + 1 MoE layers on pp=2 put D+M on the last rank, 3 + 2
            # put M+M there (seed 401, instance 29511: 22 MB less). The law holds per layer kind.
            return "skip", None, ""
        a, b = before.memory.fit_bytes, after.memory.fit_bytes
        return law, (None if b >= a * (1 - REL) else f"more layers need less memory: {b} < {a} bytes"), what
    a, b = before.step_time_s, after.step_time_s
    return law, (None if b >= a * (1 - REL) else f"more work is faster: {b} s < {a} s"), what


def _search_law(model, job, cluster, layout) -> str | None:
    """The search's answer is at least as fast as ``layout`` when ``layout`` fits and lies in the
    space the search offers (the same framework, the memory headroom the search keeps)."""
    ev = evaluate(model, job, cluster, layout)
    headroom = Bounds().headroom(job, cluster)
    if ev.memory.fit_bytes > cluster.device.memory_bytes * (1 - headroom):
        return None
    try:
        best = plan(model, job, cluster, SearchOptions(top_k=0)).best
    except ClusterplanError:
        return None  # e.g. a knob value the space does not offer (vp=2 the micro-batch count refuses)
    if best.step_time_s <= ev.step_time_s * (1 + 1e-3):  # the integer tables round each term
        return None
    offered = plan(model, job, cluster, SearchOptions(top_k=0, bounds=Bounds(fixed=_fixed(layout))))
    return (f"search answered {best.step_time_s} s but {layout.short()} runs in {ev.step_time_s} s "
            f"(the search with it fixed: {offered.best.step_time_s} s)")


def _fixed(layout: Layout) -> dict:
    return {k: getattr(layout, k) for k in ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch_size",
                                            "sequence_parallel", "recompute", "zero_stage")}


def _run(task: tuple) -> tuple:
    seed, index = task
    law, failure, what = instance(seed, index)
    return index, law, failure, what


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--case", type=int, default=None, help="replay one instance")
    a = p.parse_args()
    if a.case is not None:
        print(instance(a.seed, a.case))
        return 0
    import multiprocessing

    counts: Counter = Counter()
    failures: list[str] = []
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(a.jobs, maxtasksperchild=2000) as pool:
        for index, law, failure, what in pool.imap_unordered(_run, [(a.seed, i) for i in range(a.instances)], 16):
            counts[law] += 1
            if failure:
                counts["failed"] += 1
                failures.append(f"instance {index}: {failure} ({what})")
                print(f"  instance {index}: {failure} ({what[:300]})", file=sys.stderr, flush=True)
    checked = sum(v for k, v in counts.items() if k in LAWS)
    print(f"{a.instances} instances (seed {a.seed}) in {time.perf_counter() - start:.0f} s: {checked} law instances "
          f"checked ({', '.join(f'{k} {counts[k]}' for k in LAWS)}), {counts['skip']} skipped (invalid on a side)")
    print(f"laws broken: {counts['failed']} (target 0)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

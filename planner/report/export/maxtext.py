"""``--format maxtext``: MaxText 0.2.5 ``key=value`` overrides: the model, the mesh (``ici_*`` inside a
slice, ``dcn_*`` across), the batch and the pipeline."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

from clusterplan.cost.framework import load_profile
from clusterplan.cost.layout import offloads_activations, order_axes
from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import (GPU_FAMILIES, PINNED, _job, _rope, hsdp_degrees, model_spec,
                                                      rope_theta, shape_key)


MAXTEXT_MODELS = {
    # shape_key: MaxText 0.2.5 configs/models/<name>.yml
    (32, 4096, 32, 8, 14336, 0, 128256): "llama3-8b",
    (80, 8192, 64, 8, 28672, 0, 128256): "llama3-70b",
    (126, 16384, 128, 8, 53248, 0, 128256): "llama3.1-405b",
    (32, 4096, 32, 32, 11008, 0, 32000): "llama2-7b",
    (40, 5120, 40, 40, 13824, 0, 32000): "llama2-13b",
    (80, 8192, 64, 8, 28672, 0, 32000): "llama2-70b",
    (32, 4096, 32, 8, 14336, 8, 32000): "mixtral-8x7b",
    (61, 7168, 128, 128, 18432, 256, 129280): "deepseek3-671b",
    (96, 12288, 96, 96, 49152, 0, 50257): "gpt3-175b",
}


def maxtext_model(model) -> list[tuple[str, object]]:
    """``model_name`` when MaxText ships the model, else the explicit shape (dense SwiGLU only)."""
    name = MAXTEXT_MODELS.get(shape_key(model))
    if name:
        return [("model_name", name)]
    if model.moe is not None or model.mla is not None or not _rope(model):
        raise SpecError(f"--format maxtext: MaxText 0.2.5 ships no config of {model.name}'s shape and clusterplan "
                        "writes explicit shapes for dense SwiGLU models only; add a configs/models/<name>.yml and "
                        "pass model_name=<name>")
    return [("decoder_block", "llama2"), ("base_emb_dim", model.hidden_size),
            ("base_num_query_heads", model.num_attention_heads), ("base_num_kv_heads", model.num_kv_heads_resolved),
            ("base_mlp_dim", model.ffn_hidden_size), ("base_num_decoder_layers", model.num_layers),
            ("head_dim", model.head_dim_resolved), ("vocab_size", model.vocab_size),
            ("mlp_activations", '["silu","linear"]'), ("enable_dropout", str(model.dropout).lower()),
            ("rope_max_timescale", rope_theta(model)),
            ("logits_via_embedding", str(model.tied_embeddings).lower())]


MAXTEXT_AXES = ("data", "fsdp", "tensor", "context", "pipeline", "expert")
MAXTEXT_MESH_ORDER = ("data", "pipeline", "fsdp", "context", "tensor", "expert")
"""The axes in MaxText's ``mesh_axes`` order (base.yml, 0.2.5: data, stage, fsdp, ..., context, ...,
tensor, ..., expert), least network-intensive first: the order jax places them on the torus in reverse."""


def torus_axes_fit(sizes: list[int], physical: tuple[int, ...]) -> bool:
    """Whether each logical mesh axis (``sizes``, least network-intensive first) gets whole physical
    torus axes, as ``jax.experimental.mesh_utils.create_device_mesh`` assigns them without
    ``allow_split_physical_axes``: from the last logical axis back, the first subset of the free
    physical axes (most axes first, in combination order) whose lengths multiply to the size."""
    free = list(physical)
    for size in reversed(sizes):
        if size == 1:
            continue
        found = next((combo for k in range(len(free), 0, -1) for combo in itertools.combinations(range(len(free)), k)
                      if math.prod(free[i] for i in combo) == size), None)
        if found is None:
            return False
        for i in found:
            free[i] = 0  # assigned: a zero length matches no size
    return True


def maxtext_mesh(doc: dict) -> tuple[dict[str, int], dict[str, int], int]:
    """(ici degrees, dcn degrees, devices per slice). A slice is a TPU pod slice (the whole job) or,
    on GPUs, a node: ICI takes the innermost axes of the plan's rank order up to the slice size,
    DCN the rest."""
    L, cluster = doc["layout"], doc["inputs"]["cluster"]
    if L["ep"] > 1 and not L.get("expert_tp", True):
        raise SpecError("--format maxtext: MaxText has no expert-tensor-parallel folding (etp=1); plan under "
                        "--framework maxtext")
    zero3 = L["zero_stage"] == 3
    dp_rest = L["dp"] // L["ep"]
    fsdp = hsdp_degrees(L, "maxtext", (3,))[0] if L.get("dp_shard") else dp_rest if zero3 else 1
    degrees = {"tensor": L["tp"], "context": L["cp"], "pipeline": L["pp"], "expert": L["ep"],
               "data": dp_rest // fsdp, "fsdp": fsdp}
    if cluster["family"] in GPU_FAMILIES:
        per_slice = cluster["devices_per_node"]
    else:  # a TPU pod slice: the cluster's scale-up domain (the whole job on one slice)
        per_slice = min(cluster.get("domain_size") or doc["num_devices"], doc["num_devices"])
    if doc["num_devices"] % per_slice:
        raise SpecError(f"--format maxtext: {doc['num_devices']} devices are not whole {per_slice}-device slices")
    # hybrid sharding (dp_shard): the fsdp axis is the innermost data-parallel ranks, as the plan priced
    by_axis = {"tp": ["tensor"], "cp": ["context"], "dp": ["expert", "fsdp", "data"], "pp": ["pipeline"]}
    order = [a for k in order_axes(L["order"]) for a in by_axis[k]]
    ici, dcn, room = {}, {}, per_slice
    for axis in order:
        g = math.gcd(degrees[axis], room)
        ici[axis], dcn[axis] = g, degrees[axis] // g
        room //= g
    if room != 1:
        raise SpecError(f"--format maxtext: the layout's degrees do not fill a {per_slice}-device slice with whole "
                        "axes (ici product must equal the devices per slice)")
    if (doc.get("zero_shard_copies") or 1) > 1 and not L.get("dp_shard"):
        # what the plan priced (maxtext semantics.zero3_across_domains: replicate, cost.terms.zero_replicas):
        # fsdp inside a slice, plain data parallelism across slices, as base.yml's -1 defaults do
        dcn["data"], dcn["fsdp"] = dcn["fsdp"], 1
    return ici, dcn, per_slice


def maxtext_batch(gbs: int, devices: int, accumulation: int) -> str:
    """``per_device_batch_size`` such that MaxText's ``int(devices * per_device) * accumulation`` is
    ``gbs`` exactly: the exact decimal where there is one, else the nearest float above the
    fraction (e.g. 2048 over 6144 devices: 1/3 is written 0.3333333333333333, whose product with
    6144 is 2048.0, where 0.333333 gives 2047)."""
    if gbs % accumulation:
        raise SpecError(f"--format maxtext: global batch {gbs} is not {accumulation} accumulation steps")
    target = gbs // accumulation
    exact = Fraction(target, devices)
    candidate = float(exact)
    for _ in range(4):
        if int(devices * candidate) == target and abs(Fraction(candidate) - exact) < Fraction(1, 10 ** 12):
            return repr(candidate) if exact.denominator != 1 else str(exact.numerator)
        candidate = math.nextafter(candidate, math.inf)
    raise SpecError(f"--format maxtext: per_device_batch_size {exact} cannot be written so that MaxText trains "
                    f"{gbs} sequences; choose a global batch that is a multiple of {exact.denominator}")


JAX_DEVICES_PER_CHIP = {"google-tpu7x": 2}
"""Device families whose chips JAX shows as several devices: TPU7x's two TensorCore chiplets are two
TPU devices (Google Cloud TPU7x docs, ``gcp_tpu7x`` in devices.yaml), which MaxText's mesh and
``per_device_batch_size`` count, while the catalogue's device is the chip."""


def _maxtext_refusals(doc: dict, model, family: str) -> None:
    """What MaxText cannot run, by its profile's rules (the search keeps to them): another platform,
    a pipeline split or micro-batch count its config validation asserts against, partial remat;
    and a mesh clusterplan does not write (chiplets that JAX counts as devices)."""
    L = doc["layout"]
    if family not in GPU_FAMILIES and family != "tpu-torus":
        raise SpecError(f"--format maxtext: MaxText runs on TPUs and GPUs, not {family}")
    chiplets = JAX_DEVICES_PER_CHIP.get(doc["inputs"]["cluster"].get("device_family", ""), 1)
    if chiplets > 1:
        raise SpecError(f"--format maxtext: JAX sees {chiplets} devices per {doc['inputs']['cluster']['device']} chip "
                        "(one per TensorCore chiplet), which MaxText's ici_*/dcn_* degrees and per_device_batch_size "
                        "count, while clusterplan plans per chip; it does not write a chiplet mesh: take the plan's "
                        f"per-chip degrees and give the {chiplets} chiplets of each chip an axis of your own")
    prof = load_profile("maxtext").at(None)
    dense = model.moe.num_dense_layers if model.moe else 0
    for problem in (prof.pipeline_split_problem(model.num_layers, dense, L["pp"], L["vp"]),
                    prof.pipeline_microbatch_problem(L["pp"], L["num_microbatches"])):
        if problem:
            raise SpecError(f"--format maxtext: {problem} (plan under --framework maxtext, whose search keeps to it)")
    if L.get("recompute_layers"):
        raise SpecError("--format maxtext: MaxText's remat_policy applies to every layer alike; it has no "
                        f"recompute_layers={L['recompute_layers']} (evaluate the layout without it)")


def maxtext_overrides(doc: dict, model=None) -> str:
    """MaxText 0.2.5 ``key=value`` overrides for ``train.py base.yml ...``: the model, the mesh
    (ici_* inside a slice, dcn_* across slices, every axis written so no -1 default fills in), the
    batch and the pipeline."""
    L, job = doc["layout"], _job(doc)
    model = model_spec(doc, model)
    family = doc["inputs"]["cluster"]["family"]
    _maxtext_refusals(doc, model, family)
    ici, dcn, per_slice = maxtext_mesh(doc)
    stages = L["pp"] * L["vp"]
    accumulation = L["num_microbatches"] if L["pp"] == 1 else 1
    # MaxText names what it saves: 'minimal' recomputes least (selective here: the maxtext profile offers
    # no recompute=none, semantics.recompute_none), 'full' recomputes everything.
    remat = "full" if L["recompute"] == "full" else "minimal"
    # offload=activations (with full recomputation): base.yml's remat_policy 'custom' with
    # decoder_layer_input 'offload' (its other named tensors default to 'remat'), MaxText 0.2.5
    offload = [("decoder_layer_input", "offload")] if offloads_activations(L.get("offload", "none")) else []
    remat = "custom" if offload else remat
    pairs: list[tuple[str, object]] = [*maxtext_model(model),
                                       ("hardware", "tpu" if family == "tpu-torus" else "gpu")]
    names = {"pipeline": "pipeline"}
    for axis in MAXTEXT_AXES:
        pairs.append((f"ici_{names.get(axis, axis)}_parallelism", ici[axis]))
    for axis in MAXTEXT_AXES:
        pairs.append((f"dcn_{names.get(axis, axis)}_parallelism", dcn[axis]))
    pairs += [("per_device_batch_size", maxtext_batch(job["global_batch_size"], doc["num_devices"], accumulation)),
              ("gradient_accumulation_steps", accumulation), ("max_target_length", job["seq_len"]),
              ("remat_policy", remat), *offload]
    if L["pp"] > 1:
        pairs += [("num_layers_per_pipeline_stage", model.num_layers // stages),
                  ("num_pipeline_repeats", L["vp"]), ("num_pipeline_microbatches", L["num_microbatches"])]
    if job["precision"] in ("fp8", "int8"):  # int8: AQT's dynamic-range int8 (use_qwix_quantization stays false)
        pairs.append(("quantization", job["precision"]))
    torus = doc["inputs"]["cluster"].get("torus_shape")
    split = bool(torus) and not torus_axes_fit([ici[a] for a in MAXTEXT_MESH_ORDER], tuple(torus))
    if split:  # else create_device_mesh raises 'Failed to find assignment for logical_axis_index ...'
        pairs.append(("allow_split_physical_axes", "true"))
    slices = doc["num_devices"] // per_slice
    head = [f"# {doc['inputs']['model']['name']} on {doc['num_devices']} x {doc['inputs']['cluster']['device']}: "
            f"predicted {doc['step_time_s']:.3f} s/step",
            f"# for {PINNED['maxtext']}: python -m maxtext.trainers.pre_train.train <base.yml> run_name=... <these>",
            f"# {slices} slice(s) of {per_slice} devices: ici_* inside a slice, dcn_* across"]
    if split:
        head.append(f"# the ici degrees do not each take whole axes of the {'x'.join(map(str, torus))} torus: "
                    "allow_split_physical_axes lets jax split a physical axis between two mesh axes")
    return "\n".join(head + [f"{k}={v}" for k, v in pairs])

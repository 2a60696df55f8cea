"""The launcher matrix: plans (clusterplan CLI options) and the formats each is exported to.

Shared by tests/test_launchers.py and by hand: ``python tests/launchers/launcher_cases.py OUTDIR`` writes
every export and its meta JSON (what check.py compares the launcher's view against).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

# id: (CLI options, formats). The plan for each format is searched under that format's framework
# (planner.report.export.FRAMEWORK_OF_FORMAT), as `clusterplan export` does.
CASES = {
    "llama3-8b-h100x64": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64"],
                          ["megatron", "slurm", "deepspeed", "torchtitan", "torchtitan-0.2", "maxtext"]),
    "llama3-70b-h100x1024": (["--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "1024"],
                             ["megatron", "slurm", "deepspeed", "torchtitan", "maxtext"]),
    "llama3-70b-pp3-uneven": (["--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "768",
                               "--fix", "pp=3"], ["megatron", "slurm", "torchtitan"]),
    "mixtral-8x7b-h100x256": (["--model", "mixtral-8x7b", "--cluster", "dgx-h100-superpod", "--devices", "256",
                               "--global-batch", "512", "--seq-len", "4096"],
                              ["megatron", "slurm", "deepspeed", "maxtext"]),
    "deepseek-v3-h800x2048": (["--model", "deepseek-v3", "--cluster", "hgx-h800", "--devices", "2048"],
                              ["megatron", "slurm", "torchtitan", "torchtitan-0.2"]),
    "deepseek-v3-pp4-uneven": (["--model", "deepseek-v3", "--cluster", "hgx-h800", "--devices", "2048",
                                "--fix", "pp=4"], ["megatron", "slurm"]),
    "llama3-8b-fsdp-h100x128": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "128",
                                 "--fix", "zero=3", "--fix", "tp=1", "--fix", "pp=1"], ["torchtitan", "megatron"]),
    "llama3-8b-long-cp": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "256",
                           "--seq-len", "131072", "--global-batch", "64", "--min", "cp=2"],
                          ["megatron", "slurm", "torchtitan", "torchtitan-0.2", "maxtext"]),
    # context parallelism's other kinds (Megatron-Core --cp-comm-type): the KV all-gather, and all-to-alls
    # inside each 8-GPU node with the ring across (--hierarchical-context-parallel-sizes 8 2)
    "llama3-8b-cp-allgather": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                                "--seq-len", "32768", "--global-batch", "32", "--fix", "cp=4,cp_comm=allgather"],
                               ["megatron"]),
    "llama3-8b-cp-a2a-p2p": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                              "--seq-len", "32768", "--global-batch", "32", "--fix", "cp=16,tp=1,cp_comm=a2a+p2p"],
                             ["megatron", "slurm"]),
    # torch.compile priced (--compile): torchtitan's async TP becomes a knob, and [compile] is written
    "llama3-70b-h100x256-compile": (["--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "256",
                                     "--compile", "--min", "tp=2"], ["torchtitan"]),
    # 3072 sequences on 6144 chips of one v5p pod slice (pp must divide 126 layers and the micro-batches)
    "llama3-405b-tpu-v5p": (["--model", "llama3-405b", "--cluster", "tpu-v5p-pod", "--devices", "6144",
                             "--global-batch", "3072"], ["maxtext"]),
    # Llama 3 70B on a 16x16x16 v5p slice: fsdp 2048 and tp 2 split physical axes (allow_split_physical_axes);
    # DeepSeek-V3 on the default v5p pod (61 layers: MaxText pipelines only its MoE layers, so no pp);
    # Llama 2 7B on two v5e slices (dcn_data across them); check.py places each mesh on the torus
    "llama3-70b-tpu-v5p-4096": (["--model", "llama3-70b", "--cluster", "tpu-v5p-pod", "--devices", "4096"], ["maxtext"]),
    "deepseek-v3-tpu-v5p": (["--model", "deepseek-v3", "--cluster", "tpu-v5p-pod"], ["maxtext"]),
    "llama2-7b-tpu-v5e-2-slices": (["--model", "llama2-7b", "--cluster", "tpu-v5e-pod", "--devices", "512"], ["maxtext"]),
    # fsdp over 8 v6e chips at 4 sequences each fits only with the layer inputs offloaded to host memory:
    # remat_policy custom, decoder_layer_input offload
    "llama3-8b-tpu-v6e-8-offload": (["--model", "llama3-8b", "--cluster", "tpu-v6e-pod", "--devices", "8",
                                     "--global-batch", "32", "--seq-len", "8192", "--fix", "dp=8,mbs=4"], ["maxtext"]),
    "llama3-405b-gb200-nvl72": (["--model", "llama3-405b", "--cluster", "gb200-nvl72", "--devices", "576"],
                                ["megatron", "slurm", "torchtitan"]),
    # 12 micro-batches over pp 8 with interleaving: Megatron-Core groups them (since 2024-11)
    "gpt3-175b-vp-groups": (["--model", "gpt3-175b", "--cluster", "dgx-h100-superpod", "--devices", "1024",
                             "--fix", "tp=4,pp=8,dp=32,mbs=4,vp=4"], ["megatron", "slurm"]),
    # the embedding and the head each take a layer's slot (126 + 2 = 128 over 16 x 2 stages): Megatron's
    # --account-for-embedding/loss-in-pipeline-split; torchtitan writes its own split's modules
    "llama3-405b-head-slots": (["--model", "llama3-405b", "--cluster", "dgx-h100-superpod", "--devices", "2048",
                                "--fix", "pp=16,vp=2,head_slots=on"], ["megatron", "slurm", "torchtitan", "torchtitan-0.2"]),
    # full recomputation of only some layers of each stage (no search offers it: evaluate prices the
    # given layout); Megatron's block method counts per model chunk, torchtitan 0.2.2 checkpoints every k-th block
    # (0.3 dropped layer SAC)
    "llama3-8b-partial-recompute": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                     "--devices", "64", "--global-batch", "128", "--layout",
                                     "tp=2,pp=2,dp=16,vp=2,mbs=1,sp=on,recompute=full,recompute_layers=8"],
                                    ["megatron", "torchtitan-0.2"]),
    # the MoE dispatcher held: Megatron's flex dispatcher with the DeepEP / Hybrid-EP backend
    # (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend), torchtitan 0.2.2's
    # expert_parallel_comm_backend = "deepep"
    "deepseek-v3-h800x2048-deepep": (["--model", "deepseek-v3", "--cluster", "hgx-h800", "--devices", "2048",
                                      "--fix", "moe_dispatcher=deepep"], ["megatron", "slurm", "torchtitan-0.2"]),
    # torchtitan 0.3: model_registry(moe_comm_backend="deepep") (bf16: its float8 grouped experts refuse
    # DeepEP), and "hybridep" with the float8 converters, which pad the experts' tokens through it
    "deepseek-v3-h800x2048-deepep-bf16": (["--model", "deepseek-v3", "--cluster", "hgx-h800", "--devices", "2048",
                                           "--precision", "bf16", "--fix", "moe_dispatcher=deepep"], ["torchtitan"]),
    "deepseek-v3-h800x2048-hybridep": (["--model", "deepseek-v3", "--cluster", "hgx-h800", "--devices", "2048",
                                        "--fix", "moe_dispatcher=hybridep"], ["torchtitan"]),
    # a capacity factor: experts padded to 1.25x the mean load (--moe-expert-capacity-factor with
    # --moe-pad-expert-input-to-capacity), under the alltoall dispatcher
    "mixtral-8x7b-h100-capacity": (["--model", "mixtral-8x7b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                                    "--moe-capacity-factor", "1.25"], ["megatron"]),
    "mixtral-8x7b-gb200-hybridep": (["--model", "mixtral-8x7b", "--cluster", "gb200-nvl72", "--devices", "72",
                                     "--fix", "moe_dispatcher=hybridep"], ["megatron", "slurm"]),
    # CUDA graphs (no search offers them: evaluate prices the given layout): Megatron-Core's
    # --cuda-graph-impl full_iteration (with the NaN check off, as validate_args asks) and per-layer
    # transformer_engine; torchtitan 0.3's trainer graphs each micro-batch (disable_cuda_graphs False)
    "llama3-8b-cuda-graph-full": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                   "--devices", "8", "--global-batch", "64", "--layout",
                                   "tp=1,pp=1,dp=8,mbs=1,cuda_graph=full"], ["megatron", "slurm", "torchtitan"]),
    "llama3-8b-cuda-graph-layer": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                    "--devices", "8", "--global-batch", "64", "--layout",
                                    "tp=2,pp=1,dp=4,mbs=1,sp=on,recompute=selective,cuda_graph=layer"], ["megatron"]),
    # a dropless MoE model's per-layer graphs: Megatron captures the attention (and a dense layer's MLP)
    # alone, --cuda-graph-modules attn mlp (TransformerConfig refuses mlp where no layer is dense)
    "deepseek-v3-cuda-graph-layer": (["--model", "deepseek-v3", "--cluster", "dgx-h100-superpod", "--devices", "256",
                                      "--fix", "cuda_graph=layer"], ["megatron"]),
    "qwen3-30b-a3b-cuda-graph-layer": (["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                                        "--fix", "cuda_graph=layer"], ["megatron"]),
    # the block-scaled precisions: Megatron's --fp8-recipe mxfp8 and --fp4-format/--fp4-recipe nvfp4,
    # torchtitan's MX converter
    "llama3-70b-gb300-mxfp8": (["--model", "llama3-70b", "--cluster", "gb300-nvl72", "--devices", "64",
                                "--precision", "mxfp8"], ["megatron", "slurm", "torchtitan"]),
    "llama3-70b-gb200-nvfp4": (["--model", "llama3-70b", "--cluster", "gb200-nvl72", "--devices", "64",
                                "--precision", "nvfp4"], ["megatron", "slurm", "torchtitan"]),
    # MaxText's AQT int8 training on TPU (quantization=int8)
    "llama3-8b-tpu-v5p-int8": (["--model", "llama3-8b", "--cluster", "tpu-v5p-pod", "--devices", "64",
                                "--precision", "int8"], ["maxtext"]),
    # hybrid sharded data parallelism (dp_shard=8 of 64: sharded inside each node, 8 replicas): torchtitan's
    # data_parallel_shard/replicate_degree, MaxText's fsdp beside data (DeepSpeed 0.19.8 removed MiCS: refused);
    # Megatron's partial distributed optimizer (ZeRO-1) --num-distributed-optimizer-instances
    "llama3-8b-hsdp": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                        "--global-batch", "128", "--layout", "dp=64,mbs=2,zero=3,dp_shard=8"],
                       ["torchtitan", "torchtitan-0.2", "maxtext"]),
    "llama3-8b-partial-distopt": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                   "--devices", "64", "--global-batch", "128", "--layout",
                                   "tp=2,dp=32,mbs=2,sp=on,zero=1,dp_shard=8"], ["megatron", "slurm"]),
    # hybrid sharding as the search picks it (planner.search.hsdp): 4:1 oversubscribed leaves, where a node's
    # shard group beats sharding over every rank (torchtitan: HSDP over a node's 8 GPUs; Megatron: tp 4 and
    # the partial distributed optimizer over a node's 2 data-parallel ranks)
    "llama3-8b-h100x256-oversubscribed": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "256",
                                           "--oversubscription", "4"],
                                          ["torchtitan", "torchtitan-0.2", "megatron", "slurm"]),
    # activation offload to host memory (offload=activations): Megatron's --cpu-offloading-num-layers
    # (no recomputation, pp 1), DeepSpeed's cpu_checkpointing (with full recomputation, --checkpoint-in-cpu)
    "llama3-8b-gb200-offload": (["evaluate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "64",
                                 "--layout", "tp=1,pp=1,dp=64,mbs=1,recompute=none,zero=1,offload=activations"],
                                ["megatron", "slurm"]),
    "llama3-8b-gb200-cpu-checkpointing": (["evaluate", "--model", "llama3-8b", "--cluster", "gb200-nvl72",
                                           "--devices", "64", "--layout",
                                           "tp=1,pp=1,dp=64,mbs=1,recompute=full,zero=1,offload=activations"],
                                          ["deepspeed"]),
    # optimizer-state offload to host memory (offload=optimizer): Megatron's --optimizer-cpu-offload with
    # --optimizer-offload-fraction 1.0 on the distributed optimizer, DeepSpeed's ZeRO-Offload
    # (zero_optimization.offload_optimizer.device cpu)
    "llama3-8b-h100-optimizer-offload": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                          "--devices", "8", "--layout",
                                          "tp=1,pp=1,dp=8,mbs=1,recompute=full,zero=1,offload=optimizer"],
                                         ["megatron", "slurm"]),
    "llama3-8b-h100-zero-offload": (["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod",
                                     "--devices", "8", "--layout",
                                     "tp=1,pp=1,dp=8,mbs=1,recompute=full,zero=2,offload=optimizer"], ["deepspeed"]),
    # FP8 with per-tensor current scaling: --fp8-recipe tensorwise
    "llama3-8b-h100-fp8-current": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "8",
                                    "--precision", "fp8", "--fp8-scaling", "current"], ["megatron"]),
    # FP8 parameter all-gathers (param_gather=fp8): Megatron's --fp8-param-gather with the distributed
    # optimizer, torchtitan 0.2.2's [quantize.linear.float8] enable_fsdp_float8_all_gather under FSDP2
    "llama3-8b-h100-fp8-param-gather": (["--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
                                         "--precision", "fp8", "--fix", "param_gather=fp8,tp=1,pp=1"],
                                        ["megatron", "slurm", "torchtitan-0.2"]),
}

MAXTEXT_TOPOLOGY = {"h100-sxm5-80gb": "a3", "tpu-v5p": "v5p-{cores}"}
"""MaxText's AOT target per device (utils/accelerator_to_spec_map.py); others use internal_compile."""


def layers_per_stage_max(num_layers: int, pp: int, vp: int, head_slots: bool) -> int:
    """The most layers on one (virtual) stage of the split the plan priced: ``ceil(L / stages)``,
    or with ``head_slots`` ``L + 2`` slots, the larger parts first, the first and last giving one
    slot each to the embedding and the head (torchtitan's own rule since 2025-04)."""
    stages = pp * vp
    if not head_slots or pp == 1:
        return math.ceil(num_layers / stages)
    q, r = divmod(num_layers + 2, stages)
    counts = [q + 1] * r + [q] * (stages - r)
    counts[0] -= 1
    counts[-1] -= 1
    return max(counts)


def meta_for(doc: dict, model) -> dict:
    """What check.py compares the launcher's view against."""
    from clusterplan.planner.report.export import cuda_arch, maxtext_mesh

    L, cluster = doc["layout"], doc["inputs"]["cluster"]
    meta = {"world_size": doc["num_devices"], "devices_per_node": cluster["devices_per_node"],
            "global_batch_size": doc["inputs"]["job"]["global_batch_size"], "layout": L,
            "cuda_arch": cuda_arch(cluster["device"]),
            "layers_per_stage_max": layers_per_stage_max(model.num_layers, L["pp"], L["vp"], bool(L.get("head_slots"))),
            "head_slots": bool(L.get("head_slots")),
            "model": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                      "num_attention_heads": model.num_attention_heads, "num_kv_heads": model.num_kv_heads_resolved,
                      "ffn_hidden_size": model.ffn_hidden_size, "vocab_size": model.vocab_size,
                      "num_experts": model.moe.num_experts if model.moe else None, "mla": model.mla is not None}}
    if L["vp"] > 1:  # the interleaved schedule's micro-batch group and the first rank's warm-up the model prices
        from clusterplan.cost.layout import interleaved_warmup, microbatch_group_size
        m, pp, vp = L["num_microbatches"], L["pp"], L["vp"]
        group = microbatch_group_size(m, pp, vp, groups=True)
        meta["interleave"] = {"group": group, "first_rank_warmup": min(m * vp, interleaved_warmup(pp, vp, group))}
    if doc["inputs"]["framework"]["id"] == "maxtext":
        _, _, per_slice = maxtext_mesh(doc)
        meta["maxtext_devices_per_slice"] = per_slice
        topo = MAXTEXT_TOPOLOGY.get(cluster["device"])
        if topo:
            meta["maxtext_compile_topology"] = topo.format(cores=2 * per_slice)
        if cluster.get("torus_shape"):  # check.py places MaxText's mesh on it
            meta["torus_shape"], meta["device"] = cluster["torus_shape"], cluster["device"]
    return meta


def plan_doc(options: list[str], fmt: str) -> dict:
    """The Plan document of ``clusterplan plan OPTIONS --framework F`` (in process) under the format's
    framework at the format's framework date (``export --format torchtitan-0.2`` plans as of 2026-02), or
    of ``clusterplan evaluate ...`` for a case whose options start with ``evaluate``: what ``export``
    formats."""
    from clusterplan import cli
    from clusterplan.planner.report.export import FRAMEWORK_OF_FORMAT, TORCHTITAN_FORMAT_DATES
    from clusterplan.planner.report.plan import plan_document

    date = TORCHTITAN_FORMAT_DATES.get(fmt)
    args = [*options[1:]] if options[0] == "evaluate" else [*options, "--top", "0"]
    command = cli.evaluate_command if options[0] == "evaluate" else cli.plan_command
    with command.make_context(command.name, [*args, "--framework", FRAMEWORK_OF_FORMAT[fmt]]) as ctx:
        params = {k: v for k, v in ctx.params.items() if k != "as_json"}
        if options[0] == "evaluate":
            layout = params.pop("layout_text")
            doc, _, _ = cli.evaluate_request(cli._request(**params, framework_date=date), layout)
            return json.loads(json.dumps(doc))
        return json.loads(json.dumps(plan_document(cli._load_and_search(**params, framework_date=date).result)))


def write_case(case: str, fmt: str, out: Path) -> tuple[Path, Path]:
    from clusterplan.planner.report.export import export, model_spec

    options, _ = CASES[case]
    doc = plan_doc(options, fmt)
    model = model_spec(doc)
    text = export(doc, fmt)
    suffix = {"deepspeed": ".json", "torchtitan": ".py", "torchtitan-0.2": ".toml", "slurm": ".sbatch",
              "megatron": ".sh"}.get(fmt, ".txt")
    export_file, meta_file = out / f"{case}.{fmt}{suffix}", out / f"{case}.{fmt}.meta.json"
    export_file.write_text(text)
    meta_file.write_text(json.dumps(meta_for(doc, model), indent=1))
    return export_file, meta_file


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for case, (_, formats) in CASES.items():
        for fmt in formats:
            try:
                print(*write_case(case, fmt, out))
            except Exception as e:  # noqa: BLE001 -- a report for a person
                print(f"{case} {fmt}: {type(e).__name__}: {e}")

"""``--format slurm``: an sbatch script that starts Megatron-LM with torchrun, one node per
``devices_per_node`` devices (GPU and Gaudi clusters)."""

from __future__ import annotations

import re

from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export.common import _layout_line, model_spec
from clusterplan.planner.report.export.megatron import ENV_REASONS, FAMILY_NOTES, _megatron_args_and_notes, _megatron_header


TORCHRUN_FAMILIES = ("nvswitch", "nvlink-domain", "xgmi", "gaudi")
"""Cluster families whose devices PyTorch drives, one process per device: torchrun can start them.
TPU slices run under XLA/JAX launchers, Cerebras and Groq under their own compilers and runtimes."""
RDZV_PORT = 29500  # torchrun's default master port


def _segment_line(cluster: dict, num_devices: int) -> list[str]:
    """On NVLink Switch domains spanning several nodes, the nodes of each domain the plan assumes,
    kept together by Slurm's topology/block plugin (``--segment``: Megatron-Bridge's GB200 executor
    sets it the same way). Slurm takes a segment only where the node count divides by it (Topology
    Guide, "User Options"): a job on whole nodes that uses part of its last domain (256 GB200 = 3
    racks of 72 and 40) asks for none, and the plan prices its groups that straddle the racks."""
    if cluster["family"] != "nvlink-domain" or not cluster.get("domain_size"):
        return []
    if num_devices > cluster["domain_size"] and num_devices % cluster["domain_size"]:
        return []
    nodes = min(cluster["domain_size"], num_devices) // cluster["devices_per_node"]
    return [f"#SBATCH --segment={nodes}"]


def slurm_script(doc: dict, model=None) -> str:
    """An sbatch script: one torchrun per node (``srun``), which starts one Megatron-LM process per device.

    Raises
    ------
    SpecError
        A cluster torchrun does not drive (TPU, Cerebras, Groq), or one that is not whole nodes.
    """
    cluster = doc["inputs"]["cluster"]
    per_node, num_devices = cluster["devices_per_node"], doc["num_devices"]
    _check_torchrun(cluster, num_devices)
    args, notes, env = _megatron_args_and_notes(doc, model_spec(doc, model))
    notes = [*notes, *([FAMILY_NOTES[cluster["family"]]] if cluster["family"] in FAMILY_NOTES else [])]
    header = ["#!/bin/bash", *_megatron_header(doc, notes),
              f"# layout: {_layout_line(doc['layout'])}",
              f"#SBATCH --job-name={_job_name(doc['inputs']['model']['name'])}",
              f"#SBATCH --nodes={num_devices // per_node}",
              "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it forks the per-device ranks
              f"#SBATCH --gpus-per-node={per_node}",
              "#SBATCH --exclusive",
              *_segment_line(cluster, num_devices),
              ""]
    body = ["set -euo pipefail"]
    for key, value in env.items():
        body += [f"# {ENV_REASONS[key]}", f"export {key}={value}"]
    body += ["# the first host of the allocation hosts the rendezvous (no pipe: a long host list must not",
             "# end the script through SIGPIPE under pipefail)",
             'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
             'if [ "${#hosts[@]}" -eq 0 ]; then echo "error: no hosts in SLURM_JOB_NODELIST" >&2; exit 1; fi',
             'MASTER_ADDR="${hosts[0]}"',
             "export MASTER_ADDR",
             ""]
    launch = ["srun torchrun", '--nnodes "$SLURM_NNODES"', f"--nproc-per-node {per_node}",
              '--rdzv-id "$SLURM_JOB_ID"', "--rdzv-backend c10d", f'--rdzv-endpoint "$MASTER_ADDR:{RDZV_PORT}"',
              "pretrain_gpt.py", *args]
    return "\n".join(header + body + [" \\\n  ".join(launch)])


def _check_torchrun(cluster: dict, num_devices: int) -> None:
    if cluster["family"] not in TORCHRUN_FAMILIES:
        raise SpecError(f"--format slurm: {cluster['id']} is a {cluster['family']} cluster ({cluster['device']}), "
                        f"which torchrun does not launch; the slurm format is for {', '.join(TORCHRUN_FAMILIES)} "
                        "clusters (for a TPU slice use --format maxtext)")
    if num_devices % cluster["devices_per_node"]:
        raise SpecError(f"--format slurm: {num_devices} devices are not whole {cluster['devices_per_node']}-device "
                        "nodes; use a multiple of the node size")


def _job_name(model_name: str) -> str:
    """A Slurm-safe job name: ``Llama 3 70B`` -> ``llama-3-70b``."""
    return re.sub(r"[^a-z0-9._-]+", "-", model_name.lower()).strip("-") or "clusterplan"

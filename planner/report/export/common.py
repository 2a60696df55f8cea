"""What every launcher format shares: the formats and the launcher release each is written for,
the model shape of a plan (from the document, or the bundled catalogue), the CUDA architecture of
a device id, the layout in the report's words and the profile line each config carries."""

from __future__ import annotations

import re
from types import SimpleNamespace

from clusterplan.cost.layout import recompute_words
from clusterplan.models.errors import SpecError


FORMATS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2", "maxtext", "slurm")
PINNED = {
    "megatron": "Megatron-Core 0.19.2 (PyPI megatron-core==0.19.2, megatron/training/arguments.py)",
    "deepspeed": "DeepSpeed 0.19.8 (PyPI deepspeed==0.19.8)",
    "torchtitan": "torchtitan 0.3.0 (PyPI torchtitan==0.3.0, a config_registry module for --module/--config)",
    "torchtitan-0.2": "torchtitan 0.2.2 (PyPI torchtitan==0.2.2, TOML job config via --job.config_file)",
    "maxtext": "MaxText 0.2.5 (PyPI maxtext==0.2.5, src/maxtext/configs/base.yml)",
    "slurm": "Megatron-Core 0.19.2 pretrain_gpt.py under torchrun (PyTorch 2.13)",
}
"""The launcher release each format is written for and tested against (tests/launchers/README.md)."""
GPU_FAMILIES = ("nvswitch", "nvlink-domain", "xgmi")


def _job(doc: dict) -> dict:
    return doc["inputs"]["job"]


# ---- the model shape ------------------------------------------------------------------------------
def model_spec(doc: dict, model=None):
    """The :class:`models.spec.ModelSpec` the plan was made for.

    The Plan document records the model's name and size only; the shape comes from ``model`` when
    the caller has it (``export(doc, fmt, model=result.model)``), else from the bundled catalogue,
    matched on name, layers, width and parameter count.

    Raises
    ------
    SpecError
        A model that is not bundled, when no ``model`` is given.
    """
    from clusterplan.models.library import get_model, list_models
    from clusterplan.models.spec import ModelSpec

    info = doc["inputs"]["model"]
    if model is not None:
        return model
    if isinstance(info.get("spec"), dict):
        return ModelSpec(**info["spec"])
    for entry in list_models():
        if entry.name == info["name"]:
            spec = get_model(entry.id)
            if (spec.num_layers, spec.hidden_size, spec.num_params) == (
                    info["num_layers"], info["hidden_size"], info["num_params"]):
                return spec
    raise SpecError(f"export: the plan is for {info['name']!r}, which is not a bundled model, and the plan "
                    "document does not carry its shape (heads, FFN, vocabulary); export it from the process "
                    "that planned it: planner.report.export.export(doc, fmt, model=result.model)")


def _rope(model) -> bool:
    """SwiGLU models in the catalogue (Llama, Mixtral, DeepSeek, PaLM) use rotary positions and
    RMSNorm without biases; GELU models (GPT-3, Megatron/MT-NLG) learned positions and LayerNorm.
    The model spec records the MLP only, so the other two follow from it (stated in the header)."""
    return model.ffn_activation == "swiglu"


ROPE_THETA_DEFAULT = 10000  # RoPE's original base (Su et al. 2021): a model spec without rope_theta


def rope_theta(model) -> int:
    """The model's RoPE base as the integer launchers take (Megatron's --rotary-base and Megatron-DeepSpeed's
    --rotary-position-embeddings-theta are ``type=int``)."""
    theta = model.rope_theta or ROPE_THETA_DEFAULT
    if theta != int(theta):
        raise SpecError(f"export: rope_theta {theta} is not a whole number; the launchers take an integer base")
    return int(theta)


def cuda_arch(device: str) -> int | None:
    """The CUDA compute-capability major of a device id (8 Ampere, 9 Hopper, 10 Blackwell); None for
    a device CUDA does not drive."""
    d = device.lower()
    if re.match(r"g?b[0-9]{3}", d):
        return 10
    if re.match(r"g?h[0-9]{3}", d):
        return 9
    if re.match(r"a[0-9]{2,3}\b|a[0-9]{3}-", d):
        return 8
    return None


def shape_key(model) -> tuple[int, ...]:
    """(layers, hidden, heads, kv heads, FFN, routed experts, vocabulary): what tells bundled
    models apart (Llama 2 7B and Llama 3 8B share a trunk)."""
    return (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads_resolved,
            model.ffn_hidden_size, model.moe.num_experts if model.moe else 0, model.vocab_size)


def _layout_line(layout: dict) -> str:
    """The layout in the words of ``plan``'s report: ``tp=8 pp=4 dp=32 mbs=1 recompute=none zero=1``."""
    always = ("tp", "pp", "dp")
    degrees = [f"{k}={layout[k]}" for k in (*always, "cp", "ep", "vp") if k in always or layout[k] > 1]
    sp = "on" if layout["sequence_parallel"] else "off"
    recompute = recompute_words(layout["recompute"], layout.get("recompute_layers", 0), layout.get("recompute_modules") or ())
    hybrid = [f"dp_shard={layout['dp_shard']}"] if layout.get("dp_shard") else []
    schedule = [f"schedule={layout['schedule']}"] if layout.get("schedule") else []
    return " ".join(degrees + [f"mbs={layout['micro_batch_size']}", f"sp={sp}", *recompute,
                               f"zero={layout['zero_stage']}", *schedule, *hybrid])


def hsdp_degrees(L: dict, fmt: str, stages: tuple[int, ...]) -> tuple[int, int]:
    """The (shard, replicate) data-parallel degrees a launcher's hybrid sharding takes for a plan's
    layout (``Layout.dp_shard``; 0 shards over every data-parallel rank), where its ZeRO stage is one of
    the launcher's sharded ``stages``; else (1, dp), plain replication. A ``dp_shard`` under any other
    stage is refused: the launcher has no hybrid sharding for it."""
    n, zero = L.get("dp_shard") or 0, L["zero_stage"]
    if zero not in stages:
        if n:
            raise SpecError(f"--format {fmt}: dp_shard={n} with zero={zero}: its hybrid sharding runs with zero "
                            f"{', '.join(map(str, stages))} only")
        return 1, L["dp"]
    shard = n or L["dp"]
    return shard, L["dp"] // shard


def _plan_device(doc: dict) -> SimpleNamespace:
    """The plan's device as an id and a family: the Plan document's ``device_family``, else (a document
    written before it carried one) the bundled device's."""
    cluster = doc["inputs"]["cluster"]
    family = cluster.get("device_family")
    if family is None:
        from clusterplan.topologies.library import load_device
        family = load_device(cluster["device"]).family
    return SimpleNamespace(id=cluster["device"], family=family)


def profile_line(doc: dict) -> str:
    """What the plan was searched under, beside the launcher release the config is written for: the
    profile describes a framework release's features (possibly as of an earlier date), the pinned
    launcher is the package the flags are checked against (tests/launchers)."""
    fw = doc["inputs"].get("framework") or {}
    when = f", features as of {fw['date']}" if fw.get("as_of") else ""
    return (f"planned with the {fw.get('id', '?')} profile ({fw.get('version', '?')}{when}); written for the "
            "launcher release this header names")

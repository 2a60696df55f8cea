"""``--model-code huggingface``: a Hugging Face transformers model class trained under DeepSpeed ZeRO
or FSDP. Its eager modules keep more for backward (cost.terms.HF_MODEL_CODE); it has no tensor,
pipeline, context or expert parallel modules, so the search holds those at 1, and only DeepSpeed's
config can be exported for it."""

import json

import pytest
from click.testing import CliRunner

from clusterplan import cli

BASE = ["--model", "llama2-7b", "--cluster", "dgx-a100-superpod", "--devices", "16", "--global-batch", "64",
        "--seq-len", "4096"]


def _run(*args: str):
    return CliRunner().invoke(cli.main, list(args))


def test_plan_holds_data_parallelism_and_prices_the_eager_modules():
    docs = {}
    for code in ("native", "huggingface"):
        result = _run("plan", *BASE, "--framework", "deepspeed", "--model-code", code, "--fix", "recompute=none",
                      "--fix", "mbs=1", "--fix", "zero=3", "--json")
        assert result.exit_code == 0, result.output
        docs[code] = json.loads(result.stdout)
    hf = docs["huggingface"]
    assert hf["inputs"]["job"]["model_code"] == "huggingface"
    assert all(hf["layout"][k] == 1 for k in ("tp", "pp", "cp", "ep", "vp"))
    assert hf["memory"]["activations"] > docs["native"]["memory"]["activations"]


@pytest.mark.parametrize("args, needle", [
    (("plan", *BASE, "--model-code", "huggingface"), "--framework deepspeed or torchtitan"),
    (("plan", *BASE, "--framework", "deepspeed", "--model-code", "huggingface", "--fix", "tp=2"), "data-parallel only"),
    (("evaluate", *BASE, "--framework", "deepspeed", "--model-code", "huggingface", "--layout", "tp=2,dp=8"),
     "data-parallel only"),
    (("export", "--format", "torchtitan", *BASE, "--model-code", "huggingface"), "does not run"),
    (("plan", *BASE, "--model-code", "hf"), "hf"),
])
def test_refusals_name_the_option(args, needle):
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert needle in result.output


def test_deepspeed_export_says_how_a_transformers_class_takes_it():
    result = _run("export", "--format", "deepspeed", *BASE, "--model-code", "huggingface")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert any("transformers Trainer" in line for line in config["_comment"])
    assert not any("Megatron-DeepSpeed arguments" in line for line in config["_comment"])


def test_compare_carries_the_model_code_to_every_candidate():
    result = _run("compare", "--model", "llama2-7b", "--cluster", "dgx-a100-superpod:16", "--cluster",
                  "dgx-h100-superpod:16", "--framework", "deepspeed", "--model-code", "huggingface",
                  "--global-batch", "64", "--seq-len", "4096", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert len(rows) == 2 and all(r["layout"]["tp"] == 1 and r["layout"]["pp"] == 1 for r in rows)


def _titan_step(*extra: str) -> dict:
    result = _run("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "8",
                  "--global-batch", "16", "--seq-len", "8192", "--framework", "torchtitan",
                  "--layout", "dp=8,zero=3,mbs=2,recompute=none", *extra, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eager_kernels_cost_time_that_compile_and_fused_code_do_not():
    """torchtitan's own modules run eager element-wise kernels (models.ops.Kernels) unless compiled;
    a model of Transformer Engine layers under the same profile (``--model-code fused``) does not."""
    eager = _titan_step()["step_time_s"]
    compiled = _titan_step("--compile")["step_time_s"]
    fused = _titan_step("--model-code", "fused")["step_time_s"]
    assert eager > fused and eager > compiled
    assert fused <= compiled  # compiled still copies K and V per query head (repeat_kv) at this release


def test_rotary_is_priced_only_where_the_model_has_it():
    from clusterplan.models.library import get_model
    from clusterplan.models.ops import Kernels, layer_ops
    llama = get_model("llama3-8b")
    names = {op.name for op in layer_ops(llama, 4096, 4096, 1, False, False)}
    assert "rotary" in names
    learned = llama.model_copy(update={"position_embedding": "learned"})
    assert "rotary" not in {op.name for op in layer_ops(learned, 4096, 4096, 1, False, False)}
    eager = {op.name: op.bytes for op in layer_ops(llama, 4096, 4096, 1, False, False, kernels=Kernels(eager=True))}
    fused = {op.name: op.bytes for op in layer_ops(llama, 4096, 4096, 1, False, False)}
    assert eager["rotary"] == 5 * fused["rotary"] and eager["mlp_act"] > fused["mlp_act"]
    composite = {op.name: op.bytes for op in layer_ops(llama, 4096, 4096, 1, False, False,
                                                        kernels=Kernels(eager=True, composite_norm=True))}
    assert composite["norms"] == 9 * fused["norms"]

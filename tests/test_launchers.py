"""Exports that run: each (plan, format) of the matrix in tests/launchers/launcher_cases.py goes through the
pinned launcher's own parser/validator (tests/launchers/check.py), in the launchers' own virtual
environment (tests/launchers/launcher_venv.py, cached under ~/.cache/clusterplan-launchers/<hash>).

The launcher tests (marker ``launchers``) run when CLUSTERPLAN_LAUNCHERS=1 (which builds the venv
if it is missing: torch, megatron-core, deepspeed, torchtitan, maxtext, jax; several GB) or when
the venv for the current pins already exists; otherwise they are skipped with the reason. The
export-level tests below them need no launcher and always run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterplan.models.errors import SpecError
from clusterplan.planner.report.export import (FRAMEWORK_OF_FORMAT, PINNED, TORCHTITAN_FORMAT_DATES, export, maxtext_batch,
                                               model_spec, pipeline_layout, torchtitan_registry)

HERE = Path(__file__).resolve().parent / "launchers"
sys.path.insert(0, str(HERE))
import launcher_cases  # noqa: E402  (tests/launchers/launcher_cases.py)
import launcher_venv  # noqa: E402  (tests/launchers/launcher_venv.py)

sys.path.remove(str(HERE))

# Register the marker (pyproject.toml's [tool.pytest.ini_options] markers is the lasting place for it).
_config = getattr(pytest.mark, "_config", None)
if _config is not None and not any(m.startswith("launchers:") for m in _config.getini("markers")):
    _config.addinivalue_line("markers", "launchers: runs a pinned launcher's own validator on an export "
                                        "(tests/launchers/README.md)")

MATRIX = [(case, fmt) for case, (_, formats) in launcher_cases.CASES.items() for fmt in formats]
CHECK_TIMEOUT_S = 600


@functools.lru_cache(maxsize=None)
def _doc(case: str, framework: str, date: str | None) -> str:
    fmt = next(f for f, fw in FRAMEWORK_OF_FORMAT.items() if fw == framework and TORCHTITAN_FORMAT_DATES.get(f) == date)
    return json.dumps(launcher_cases.plan_doc(launcher_cases.CASES[case][0], fmt))


def doc_for(case: str, fmt: str) -> dict:
    return json.loads(_doc(case, FRAMEWORK_OF_FORMAT[fmt], TORCHTITAN_FORMAT_DATES.get(fmt)))


@pytest.fixture(scope="session")
def launcher_python() -> Path:
    if os.environ.get("CLUSTERPLAN_LAUNCHERS") == "1":
        try:
            return launcher_venv.venv_python(launcher_venv.create())
        except RuntimeError as e:
            pytest.fail(f"CLUSTERPLAN_LAUNCHERS=1 but the launcher venv could not be built: {e}")
    path = launcher_venv.existing()
    if path is None:
        pytest.skip("launcher venv not built: run with CLUSTERPLAN_LAUNCHERS=1 to install the pinned launchers "
                    "(tests/launchers/README.md)")
    return launcher_venv.venv_python(path)


@pytest.mark.launchers
@pytest.mark.parametrize("case,fmt", MATRIX, ids=[f"{c}-{f}" for c, f in MATRIX])
def test_launcher_accepts_export(case, fmt, launcher_python, tmp_path):
    doc = doc_for(case, fmt)
    model = model_spec(doc)
    text = export(doc, fmt)
    export_file, meta_file = tmp_path / f"export.{fmt}", tmp_path / "meta.json"
    export_file.write_text(text)
    meta_file.write_text(json.dumps(launcher_cases.meta_for(doc, model)))
    # DeepSpeed's CPU accelerator JIT-builds its shm comm op once (about a minute): keep the build
    # beside the cached venv so later runs reuse it
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "TORCH_EXTENSIONS_DIR": str(launcher_python.parent.parent / "torch_extensions")}
    done = subprocess.run([str(launcher_python), str(HERE / "check.py"), fmt, str(export_file), str(meta_file)],
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 0, f"{PINNED[fmt]} refused the export:\n{text}\n--- launcher says:\n" \
                                 f"{done.stderr[-4000:]}"
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["ok"] is True


# ---- export-level facts (no launcher needed) ---------------------------------------------------------
def test_matrix_covers_the_issue():
    """At least 8 plans: dense, MoE (Mixtral, DeepSeek-V3), FSDP under torchtitan, long context,
    TPU under MaxText, GB200 NVL72; every format appears."""
    assert len(launcher_cases.CASES) >= 8
    assert {fmt for _, fmt in MATRIX} == set(FRAMEWORK_OF_FORMAT)


@pytest.mark.parametrize("case", ["llama3-70b-pp3-uneven", "deepseek-v3-pp4-uneven"])
def test_uneven_pipeline_split_is_written_as_a_layout(case):
    doc = doc_for(case, "megatron")
    text = export(doc, "megatron")
    L, model = doc["layout"], model_spec(doc)
    assert model.num_layers % (L["pp"] * L["vp"])  # the case is uneven
    assert f"--pipeline-model-parallel-layout '{pipeline_layout(model.num_layers, L['pp'], L['vp'])}'" in text


def test_pipeline_layout_80_layers_on_3_stages():
    assert pipeline_layout(80, 3, 1) == "Et*26|t*27|t*27L"
    assert pipeline_layout(64, 4, 2) is None


def test_megatron_export_carries_the_model_shape():
    text = export(doc_for("deepseek-v3-h800x2048", "megatron"), "megatron")
    for flag in ("--num-attention-heads 128", "--ffn-hidden-size 18432", "--vocab-size 129280", "--swiglu",
                 "--normalization RMSNorm", "--position-embedding-type rope", "--num-experts 256",
                 "--moe-router-topk 8", "--multi-latent-attention", "--untie-embeddings-and-output-weights",
                 "--max-position-embeddings"):
        assert flag in text
    gqa = export(doc_for("llama3-8b-h100x64", "megatron"), "megatron")
    assert "--group-query-attention" in gqa and "--num-query-groups 8" in gqa


def test_ep_overlap_is_exported_where_the_plan_has_it():
    """Megatron's --overlap-moe-expert-parallel-comm exactly when the plan overlaps its expert
    all-to-alls (the DeepSeek-V3 plan does; a dense plan cannot)."""
    doc = doc_for("deepseek-v3-h800x2048", "megatron")
    text = export(doc, "megatron")
    assert doc["layout"]["ep_overlap"] and doc["layout"]["ep"] > 1
    assert "--overlap-moe-expert-parallel-comm" in text and "--recompute-granularity full" not in text
    assert "--overlap-moe-expert-parallel-comm" not in export(doc_for("llama3-8b-h100x64", "megatron"), "megatron")


def test_fp8_param_gather_is_exported_where_the_plan_has_it():
    """param_gather=fp8: Megatron's --fp8-param-gather, torchtitan 0.2.2's float8 all-gather keys; 0.3
    (which dropped them) refuses rather than write a config that gathers in bf16."""
    doc = doc_for("llama3-8b-h100-fp8-param-gather", "megatron")
    assert doc["layout"]["param_gather"] == "fp8"
    assert "--fp8-param-gather" in export(doc, "megatron")
    assert "--fp8-param-gather" not in export(doc_for("llama3-8b-h100-fp8-current", "megatron"), "megatron")
    titan = doc_for("llama3-8b-h100-fp8-param-gather", "torchtitan-0.2")
    text = export(titan, "torchtitan-0.2")
    assert "enable_fsdp_float8_all_gather = true" in text and "precompute_float8_dynamic_scale_for_fsdp = true" in text
    with pytest.raises(SpecError, match="torchtitan 0.3 has no float8 all-gather"):
        torchtitan_registry(titan)


def test_fsdp_gets_no_single_connection_and_no_fusion():
    doc = doc_for("llama3-8b-fsdp-h100x128", "megatron")
    assert doc["layout"]["zero_stage"] == 3
    text = export(doc, "megatron")
    assert "--no-gradient-accumulation-fusion" in text and "export CUDA_DEVICE_MAX_CONNECTIONS" not in text


def test_slurm_has_no_pipe_into_head_and_sets_connections_only_when_needed():
    hopper = export(doc_for("llama3-70b-h100x1024", "slurm"), "slurm")
    assert "| head" not in hopper and 'mapfile -t hosts < <(scontrol show hostnames' in hopper
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in hopper
    blackwell = export(doc_for("llama3-405b-gb200-nvl72", "slurm"), "slurm")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in blackwell


def test_deepspeed_config_is_strict_json():
    config = json.loads(export(doc_for("llama3-8b-h100x64", "deepspeed"), "deepspeed"))
    assert "Megatron-DeepSpeed arguments" in " ".join(config["_comment"])


def test_deepspeed_refuses_zero2_with_pipeline():
    doc = doc_for("llama3-8b-h100x64", "deepspeed")
    doc["layout"] = {**doc["layout"], "pp": 2, "zero_stage": 2}
    with pytest.raises(SpecError, match="incompatible with pipeline"):
        export(doc, "deepspeed")


def test_torchtitan_refuses_a_model_it_does_not_define():
    doc = doc_for("mixtral-8x7b-h100x256", "deepspeed")
    doc["inputs"]["framework"]["id"] = "torchtitan"
    with pytest.raises(SpecError, match="no model definition"):
        export(doc, "torchtitan")


def test_torchtitan_targets_the_pinned_releases():
    """--format torchtitan: 0.3.0's config registry module (--module/--config); --format torchtitan-0.2:
    0.2.2's TOML, planned as of 2026-02."""
    text = export(doc_for("deepseek-v3-h800x2048", "torchtitan"), "torchtitan")
    assert "torchtitan 0.3.0" in text and "from torchtitan.models.deepseek_v3 import model_registry" in text
    assert 'model_registry("671B"' in text and "def clusterplan():" in text and "enable_async_tensor_parallel=" in text
    compile(text, "clusterplan_torchtitan.py", "exec")  # a Python module
    old = export(doc_for("deepseek-v3-h800x2048", "torchtitan-0.2"), "torchtitan-0.2")
    assert "torchtitan 0.2.2" in old and 'name = "deepseek_v3"' in old and 'flavor = "671B"' in old
    assert "enable_async_tensor_parallel" in old  # [parallelism] in 0.2.2 (not [compile])
    assert "features as of 2026-02" in old
    with pytest.raises(SpecError, match="as of 2026-02 or earlier"):
        export(doc_for("deepseek-v3-h800x2048", "torchtitan"), "torchtitan-0.2")


def test_torchtitan_async_tp_only_compiled():
    """torchtitan refuses async TP without torch.compile (CompileConfig: 'Async TP requires ...
    --compile.enable'): an eager plan never has it and writes no [compile]; a compiled one may, and
    writes [compile] because its memory was priced compiled."""
    from clusterplan.cli import main as clusterplan
    from click.testing import CliRunner

    eager = doc_for("llama3-8b-fsdp-h100x128", "torchtitan")
    assert eager["inputs"]["job"]["compiled"] is False and not eager["layout"]["tp_overlap"]
    assert "CompileConfig(enable=False" in export(eager, "torchtitan")
    compiled = doc_for("llama3-70b-h100x256-compile", "torchtitan")
    assert compiled["inputs"]["job"]["compiled"] is True and compiled["layout"]["tp"] > 1
    text = export(compiled, "torchtitan")
    assert f"CompileConfig(enable=True, components=['model', 'loss'], enable_async_tensor_parallel=" \
           f"{bool(compiled['layout']['tp_overlap'])})" in text
    args = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "256",
            "--framework", "torchtitan", "--fix", "tp=8,tp_overlap=on"]
    refused = CliRunner().invoke(clusterplan, args)
    assert refused.exit_code == 2 and "only under torch.compile" in refused.output
    assert CliRunner().invoke(clusterplan, [*args, "--compile", "--json"]).exit_code == 0
    megatron = CliRunner().invoke(clusterplan, ["plan", "--model", "gpt", "--cluster", "dgx-superpod", "--compile"])
    assert megatron.exit_code == 2 and "--compile: megatron has no torch.compile switch" in megatron.output


def test_maxtext_per_device_batch_is_exact():
    assert maxtext_batch(2048, 6144, 1) != "0.333333"  # what %g printed: 2,047 sequences
    assert int(6144 * float(maxtext_batch(2048, 6144, 1))) == 2048
    assert maxtext_batch(2048, 1024, 1) == "2"
    assert maxtext_batch(64, 256, 1) == "0.25"


def test_maxtext_gpu_mesh_splits_ici_and_dcn():
    text = export(doc_for("llama3-70b-h100x1024", "maxtext"), "maxtext")
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    ici = [int(v) for k, v in pairs.items() if k.startswith("ici_")]
    dcn = [int(v) for k, v in pairs.items() if k.startswith("dcn_")]
    assert eval("*".join(map(str, ici))) == 8 and eval("*".join(map(str, ici + dcn))) == 1024


def test_maxtext_mesh_puts_data_on_dcn_across_slices():
    """On two v5e slices the plan shards ZeRO-3 inside a slice and replicates across (maxtext.yaml
    zero3_across_domains); the export says the same: ici_fsdp fills each slice, dcn_data joins them."""
    from click.testing import CliRunner
    from clusterplan import cli
    result = CliRunner().invoke(cli.main, ["export", "--format", "maxtext", "--model", "llama2-7b", "--cluster",
                                           "tpu-v5e-pod", "--devices", "512", "--fix", "zero=3,tp=1,cp=1,pp=1"])
    assert result.exit_code == 0, result.output
    pairs = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line and not line.startswith("#"))
    assert (pairs["ici_fsdp_parallelism"], pairs["dcn_data_parallelism"], pairs["dcn_fsdp_parallelism"]) == ("256", "2", "1")
    assert "2 slice(s) of 256 devices" in result.stdout
    shown = CliRunner().invoke(cli.main, ["plan", "--model", "llama2-7b", "--cluster", "tpu-v5e-pod", "--devices", "512",
                                          "--fix", "zero=3,tp=1,cp=1,pp=1"])
    assert "ZeRO-3 shards over the 256 data-parallel ranks of each slice and the 2 slices keep copies" in shown.stdout


def test_maxtext_refuses_uneven_pipeline():
    doc = doc_for("llama3-70b-h100x1024", "maxtext")
    doc["layout"] = {**doc["layout"], "pp": 3, "vp": 1, "dp": doc["layout"]["dp"]}
    with pytest.raises(SpecError, match="divide evenly"):
        export(doc, "maxtext")


def test_maxtext_refuses_micro_batches_the_stages_do_not_divide():
    """2048 sequences on 6144 v5p chips need pp=3 (heads and sequence rule out tp or cp of 3), and
    MaxText cannot cut 2048 into a multiple of 3 pipeline micro-batches: refused, not written."""
    doc = doc_for("llama3-405b-tpu-v5p", "maxtext")
    doc["layout"] = {**doc["layout"], "pp": 3, "vp": 1, "dp": 128, "tp": 16, "num_microbatches": 128}
    doc["inputs"]["job"]["global_batch_size"] = 2048
    with pytest.raises(SpecError, match="multiple of the stages"):
        export(doc, "maxtext")


def test_llama2_is_not_exported_as_llama3():
    """Llama 2 7B shares Llama 3 8B's trunk (32 x 4096, 32 heads) but not its kv heads, FFN or
    vocabulary: torchtitan 0.2.2 has no Llama 2 (refused), MaxText's model is llama2-7b."""
    from clusterplan.models.library import get_model
    from clusterplan.planner.report.export import maxtext_model, torchtitan_flavor

    with pytest.raises(SpecError, match="no model definition"):
        torchtitan_flavor(get_model("llama2-7b"))
    assert maxtext_model(get_model("llama2-7b")) == [("model_name", "llama2-7b")]
    assert torchtitan_flavor(get_model("llama3-8b")) == ("llama3", "8B")

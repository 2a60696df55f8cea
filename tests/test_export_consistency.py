"""For presets x bundled models, the layout ``export --format F`` writes is the one the search under F's
framework returns (at F's framework date), and a format whose framework does not run on the preset's
platform exits 2 (issue 41: the search offers only what the export of its framework writes).

The quick suite runs a fixed sample; the exhaustive variant (every preset x model x format) is marked
``slow`` and runs only with CLUSTERPLAN_SLOW=1."""

from __future__ import annotations

import itertools
import json
import os
import random
import shlex
import tomllib

import pytest
from click.testing import CliRunner

from clusterplan import cli
from clusterplan.cost.framework import device_platform, load_profile
from clusterplan.models.errors import ClusterplanError
from clusterplan.models.library import list_models
from clusterplan.planner.report.export import FORMATS, FRAMEWORK_OF_FORMAT, TORCHTITAN_FORMAT_DATES
from clusterplan.planner.report.plan import plan_document
from clusterplan.topologies.library import list_clusters, load_device

PRESETS = [c.id for c in list_clusters()]
MODELS = [m.id for m in list_models()]


def _plan(preset: str, model: str, fmt: str) -> tuple[int, dict | None]:
    """``plan --framework F --top 0`` in process, at F's framework date: (exit code, Plan document)."""
    args = ["--model", model, "--cluster", preset, "--top", "0", "--framework", FRAMEWORK_OF_FORMAT[fmt]]
    with cli.plan_command.make_context("plan", args) as ctx:
        params = {k: v for k, v in ctx.params.items() if k != "as_json"}
        try:
            planned = cli._load_and_search(**params, framework_date=TORCHTITAN_FORMAT_DATES.get(fmt))
        except ClusterplanError as e:  # the exit code the CLI maps it to (cli.guarded)
            return e.exit_code, None
    return 0, json.loads(json.dumps(plan_document(planned.result)))


def written(fmt: str, text: str) -> dict[str, int]:
    """The tp, pp and micro-batch size a config writes, read the way each launcher reads them."""
    if fmt in ("megatron", "slurm"):
        words = shlex.split(text.split("MEGATRON_ARGS=(", 1)[1].rsplit(")", 1)[0] if fmt == "megatron" else
                            text.split("pretrain_gpt.py", 1)[1].replace("\\\n", " "))
        value = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
        return {"tp": int(value["--tensor-model-parallel-size"]), "pp": int(value["--pipeline-model-parallel-size"]),
                "mbs": int(value["--micro-batch-size"])}
    if fmt == "deepspeed":
        config = json.loads(text)
        words = shlex.split(" ".join(c for c in config["_comment"] if c.startswith("Megatron-DeepSpeed arguments:"))
                            .removeprefix("Megatron-DeepSpeed arguments:"))
        value = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
        return {"tp": int(value.get("--tensor-model-parallel-size", 1)), "pp": int(value.get("--pipeline-model-parallel-size", 1)),
                "mbs": config["train_micro_batch_size_per_gpu"]}
    if fmt == "torchtitan-0.2":
        p, t = (cfg := tomllib.loads(text))["parallelism"], cfg["training"]
        return {"tp": p["tensor_parallel_degree"], "pp": p["pipeline_parallel_degree"],
                "mbs": p.get("pipeline_parallel_microbatch_size", t["local_batch_size"])}
    if fmt == "torchtitan":
        sets = dict(line.strip().removeprefix("config.").split(" = ", 1) for line in text.splitlines()
                    if line.strip().startswith(("config.parallelism.", "config.training.")) and " = " in line)
        value = {k: v.split("  #")[0] for k, v in sets.items()}
        pp = int(value["parallelism.pipeline_parallel_degree"])
        return {"tp": int(value["parallelism.tensor_parallel_degree"]), "pp": pp,
                "mbs": int(value["parallelism.pipeline_parallel_microbatch_size"] if pp > 1 else
                           value["training.local_batch_size"])}
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {"tp": int(pairs["ici_tensor_parallelism"]) * int(pairs["dcn_tensor_parallelism"]),
            "pp": int(pairs["ici_pipeline_parallelism"]) * int(pairs["dcn_pipeline_parallelism"])}


MODEL_REFUSALS = ("has no model definition of", "have no model definition of", "ships no config of",
                  "trains a Hugging Face transformers model class")
"""An export's refusal of the model itself (torchtitan defines Llama 3 and DeepSeek-V3 flavors only; MaxText's
shapes: export.maxtext_model), which no layout changes."""


def check(preset: str, model: str, fmt: str) -> None:
    runs = load_device(next(c for c in list_clusters() if c.id == preset).device)
    exported = CliRunner().invoke(cli.main, ["export", "--format", fmt, "--model", model, "--cluster", preset])
    framework = FRAMEWORK_OF_FORMAT[fmt]
    if device_platform(runs) not in load_profile(framework).platforms:
        assert exported.exit_code == 2 and "does not run on" in exported.stderr, (preset, model, fmt, exported.output)
        return
    if exported.exit_code == 2 and any(s in exported.stderr for s in MODEL_REFUSALS):
        return  # the launcher release defines no such model (and clusterplan writes no shape for it): said so
    if exported.exit_code == 2 and fmt == "maxtext" and "does not write a chiplet mesh" in exported.stderr:
        return  # TPU7x: JAX counts two chiplets per chip, the plan counts chips (export.maxtext JAX_DEVICES_PER_CHIP)
    code, doc = _plan(preset, model, fmt)
    if exported.exit_code != 0:  # the search found nothing (3, 4) or the input is refused (2): so did plan
        assert exported.exit_code == code and code in (2, 3, 4), (preset, model, fmt, code, exported.output)
        return
    assert code == 0, (preset, model, fmt, exported.output)
    L = doc["layout"]
    want = {"tp": L["tp"], "pp": L["pp"], "mbs": L["micro_batch_size"]}
    got = written(fmt, exported.stdout)
    assert got == {k: want[k] for k in got}, (preset, model, fmt, got, want)


SAMPLE = random.Random(41).sample(list(itertools.product(PRESETS, MODELS, FORMATS)), 4) + [
    ("tpu-v5p-pod", "deepseek-v3", "maxtext"), ("gaudi3-cluster", "llama3-8b", "deepspeed"),
    ("trn2-cluster", "llama3-8b", "torchtitan"), ("hgx-h800", "deepseek-v3", "torchtitan-0.2")]


@pytest.mark.parametrize("preset,model,fmt", SAMPLE, ids=["-".join(s) for s in SAMPLE])
def test_export_writes_the_layout_the_search_returns(preset, model, fmt):
    check(preset, model, fmt)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CLUSTERPLAN_SLOW") != "1", reason="exhaustive: set CLUSTERPLAN_SLOW=1 (hours)")
@pytest.mark.parametrize("preset,model", list(itertools.product(PRESETS, MODELS)))
def test_export_writes_the_layout_the_search_returns_everywhere(preset, model):
    for fmt in FORMATS:
        check(preset, model, fmt)

"""The search offers only what the export of its framework writes, on the platforms the framework
runs on (issue 41: framework profiles and exports). Launcher-level checks are in tests/test_launchers.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clusterplan.cli import main as clusterplan
from clusterplan.cost.framework import FRAMEWORKS, device_platform, frameworks_on, load_profile
from clusterplan.models.errors import SpecError
from clusterplan.topologies.library import load_device


def run(*args: str):
    return CliRunner().invoke(clusterplan, list(args))


# ---- platforms --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster", ["gaudi3-cluster", "gaudi2-cluster"])
def test_deepspeed_on_gaudi_runs_the_devices_fused_attention(cluster):
    """DeepSpeed is Gaudi's main stack: without --attention its plan runs Gaudi's fused SDPA (flash),
    not FlashAttention-2's CUDA kernels, and no flag the user never gave is blamed."""
    done = run("plan", "--model", "llama3-8b", "--cluster", cluster, "--devices", "64", "--framework", "deepspeed",
               "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["inputs"]["job"]["attention"] == "flash"
    assert doc["inputs"]["framework"]["id"] == "deepspeed"


def test_an_explicit_flash2_on_gaudi_is_still_refused():
    done = run("plan", "--model", "llama3-8b", "--cluster", "gaudi3-cluster", "--devices", "64", "--framework",
               "deepspeed", "--attention", "flash2")
    assert done.exit_code == 2 and "--attention: flash2" in done.output


def test_deepspeed_keeps_flash2_on_cuda():
    done = run("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--framework",
               "deepspeed", "--json")
    assert done.exit_code == 0 and json.loads(done.output)["inputs"]["job"]["attention"] == "flash2"


@pytest.mark.parametrize("framework,cluster", [("deepspeed", "trn2-cluster"), ("torchtitan", "trn2-cluster"),
                                               ("megatron", "cerebras-cs3-cluster"), ("torchtitan", "gaudi3-cluster"),
                                               ("maxtext", "groq-rack")])
def test_a_framework_is_refused_where_it_does_not_run(framework, cluster):
    """The search under a framework refuses a platform outside its profile's ``platforms`` with exit 2,
    naming the framework, the device and the frameworks that run there."""
    done = run("plan", "--model", "llama3-8b", "--cluster", cluster, "--framework", framework)
    assert done.exit_code == 2, done.output
    assert f"{framework} does not run on" in done.output and "Traceback" not in done.output
    device = load_device(done.output.split("does not run on ")[1].split(" ")[0])
    others = frameworks_on(device_platform(device))
    assert all(f in done.output for f in others)
    assert ("no framework profile runs there" in done.output) == (not others)


@pytest.mark.parametrize("fmt,cluster", [("megatron", "cerebras-cs3-cluster"), ("slurm", "cerebras-cs3-cluster"),
                                         ("torchtitan", "trn2-cluster"), ("deepspeed", "trn2-cluster"),
                                         ("torchtitan", "gaudi3-cluster"), ("maxtext", "gaudi3-cluster")])
def test_every_export_refuses_a_platform_its_framework_does_not_run_on(fmt, cluster):
    done = run("export", "--format", fmt, "--model", "llama3-8b", "--cluster", cluster)
    assert done.exit_code == 2, done.output
    assert f"export --format {fmt}:" in done.output and "does not run on" in done.output


def test_export_refuses_a_plan_document_from_another_platform():
    """A Plan document searched elsewhere (here: edited to a Trainium device) is refused by export itself."""
    from clusterplan.planner.report.export import export

    done = run("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--framework",
               "torchtitan", "--json", "--top", "0")
    doc = json.loads(done.output)
    doc["inputs"]["cluster"]["device"], doc["inputs"]["cluster"]["device_family"] = "trainium2", "aws-trainium2"
    with pytest.raises(SpecError, match="torchtitan does not run on trainium2"):
        export(doc, "torchtitan")


def test_without_framework_a_platform_no_profile_runs_on_still_plans_with_a_stand_in():
    done = run("plan", "--model", "llama3-8b", "--cluster", "trn2-cluster", "--devices", "64", "--json")
    assert done.exit_code == 0, done.output
    assert any("stand-in" in line for line in json.loads(done.output)["inputs"]["caveats"]["unvalidated"])


def test_every_profile_names_known_platforms():
    for fw in FRAMEWORKS:
        assert load_profile(fw).platforms
    assert frameworks_on("nvidia") == FRAMEWORKS and frameworks_on("tpu") == ("maxtext",)
    assert frameworks_on("trainium") == () and "deepspeed" in frameworks_on("gaudi")

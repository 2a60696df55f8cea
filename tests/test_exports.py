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


# ---- what the exports write --------------------------------------------------------------------------
def export_text(fmt: str, *args: str) -> str:
    done = run("export", "--format", fmt, *args)
    assert done.exit_code == 0, done.output
    return done.stdout


LLAMA3_H100 = ("--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64")
MIXTRAL_H100 = ("--model", "mixtral-8x7b", "--cluster", "dgx-h100-superpod", "--devices", "256", "--global-batch", "512",
                "--seq-len", "4096")


@pytest.mark.parametrize("args,theta", [(LLAMA3_H100, 500000), (MIXTRAL_H100, 1000000)])
def test_exports_carry_the_models_rope_base(args, theta):
    """Llama 3 rotates with a base of 500,000 and Mixtral 1e6: a launcher left at its default (10,000)
    builds another model."""
    assert f"--rotary-base {theta}\n" in export_text("megatron", *args)
    ds = json.loads(export_text("deepspeed", *args))
    assert f"--rotary-position-embeddings-theta {theta} " in " ".join(ds["_comment"])


def test_bundled_rope_models_state_their_base():
    from clusterplan.models.library import get_model
    assert get_model("llama3-405b").rope_theta == 500000 and get_model("mixtral").rope_theta == 1e6
    assert get_model("llama2-7b").rope_theta == 10000 and get_model("gpt3-175b").rope_theta is None


@pytest.mark.parametrize("extra", [(), ("--fix", "recompute=full,tp=2")])
def test_deepspeed_partitions_no_activations_the_plan_keeps_whole(extra):
    """DeepSpeed partitions checkpointed activations only under its own activation checkpointing, which
    the plan does not price; contiguous buffers would need them partitioned (deepspeed.checkpointing
    asserts it). So neither is ever on, and without full recomputation the section is left out."""
    config = json.loads(export_text("deepspeed", *LLAMA3_H100, *extra))
    section = config.get("activation_checkpointing")
    if extra:
        assert section == {"partition_activations": False, "contiguous_memory_optimization": False}
    else:
        assert section is None


def test_deepspeed_names_only_flags_megatron_deepspeed_has():
    """microsoft/Megatron-DeepSpeed has no --pp-partition-method (BigScience's fork had it): the search under
    deepspeed no longer offers the embedding-and-head split, and a pipelined export never names the flag."""
    config = json.loads(export_text("deepspeed", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod",
                                    "--devices", "256", "--fix", "pp=4,zero=1"))
    assert "--pp-partition-method" not in json.dumps(config)
    refused = run("plan", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "256",
                  "--framework", "deepspeed", "--fix", "pp=4,head_slots=on")
    assert refused.exit_code == 2 and "head_slots=on" in refused.output
    assert "--use-flash-attn-v2" in " ".join(config["_comment"])  # the kernel the plan prices


def test_megatron_export_sets_its_environment_as_a_line_to_run(tmp_path):
    """CUDA_DEVICE_MAX_CONNECTIONS=1 is an ``export`` line where the device needs it (Hopper with TP), none
    on Blackwell; sourcing the file gives the environment and the arguments."""
    import subprocess

    hopper = export_text("megatron", *LLAMA3_H100)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in hopper.splitlines()
    (tmp_path / "args.sh").write_text(hopper)
    shown = subprocess.run(["bash", "-c", 'source "$1"; echo "$CUDA_DEVICE_MAX_CONNECTIONS ${#MEGATRON_ARGS[@]}"', "_",
                            str(tmp_path / "args.sh")], capture_output=True, text=True, check=True).stdout.split()
    assert shown[0] == "1" and int(shown[1]) > 20
    blackwell = export_text("megatron", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "64")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in blackwell


# ---- MaxText: its pipeline rules in the profile, its mesh on the torus ---------------------------------
def maxtext_pairs(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("layers,dense,pp,vp,refused", [(126, 0, 8, 1, True), (126, 0, 6, 1, False), (126, 0, 3, 2, False),
                                                        (80, 0, 16, 2, True), (61, 3, 2, 1, True), (61, 3, 1, 1, False)])
def test_maxtext_profile_carries_its_pipeline_rule(layers, dense, pp, vp, refused):
    """MaxText: stages x repeats x layers per stage = the pipelined layers (types.py), and the deepseek
    decoder pipelines its MoE layers only, outside what the cost model prices."""
    prof = load_profile("maxtext").at(None)
    problem = prof.pipeline_split_problem(layers, dense, pp, vp)
    assert (problem is not None) == refused
    assert problem is None or "..." not in problem
    assert load_profile("megatron").at(None).pipeline_split_problem(layers, dense, pp, vp) is None
    assert prof.pipeline_microbatch_problem(4, 6) and not prof.pipeline_microbatch_problem(4, 8)


@pytest.mark.parametrize("layout,needle", [("tp=1,pp=8,dp=128", "divide evenly over pp x vp"),
                                           ("tp=1,pp=4,dp=256,mbs=1", "a multiple of the stages")])
def test_maxtext_evaluate_refuses_the_pipelines_its_search_leaves_out(layout, needle):
    """evaluate holds a given layout to the rules the search applies: 126 layers over 8 stages, or
    6 micro-batches over 4 stages (global batch 1,536 / (256 x 1)), are layouts MaxText refuses."""
    done = run("evaluate", "--model", "llama3-405b", "--cluster", "dgx-h100-superpod", "--devices", "1024",
               "--framework", "maxtext", "--global-batch", "1536" if "mbs=1" in layout else "1024", "--layout", layout)
    assert done.exit_code == 2, done.output
    assert needle in done.output


@pytest.mark.parametrize("model", ["llama3-405b", "deepseek-v3"])
def test_maxtext_search_offers_no_pipeline_its_export_refuses(model):
    """pp=8 for 126 or 61 layers was the search's pick under MaxText, which its export then refused."""
    from clusterplan.planner.report.export import export

    for fixed in ("pp=8", "pp=2"):
        done = run("plan", "--model", model, "--cluster", "dgx-h100-superpod", "--devices", "1024", "--framework",
                   "maxtext", "--fix", fixed, "--json", "--top", "0")
        # 2: the --fix leaves no layout that passes MaxText's pipeline rules (a bound the rules refuse is bad
        # input, named: tests/test_user_paths.py); 3: none fits
        assert done.exit_code in (0, 2, 3), done.output
        if done.exit_code == 2:
            assert fixed in done.stderr and "pp * vp exceeds the number of layers" in done.stderr
        if done.exit_code == 0:
            doc = json.loads(done.output)
            export(doc, "maxtext")  # must not raise
            assert model == "llama3-405b" and fixed == "pp=2"


def test_maxtext_writes_split_physical_axes_where_the_mesh_needs_it():
    from clusterplan.planner.report.export import torus_axes_fit

    assert not torus_axes_fit([1, 1, 2048, 1, 2, 1], (16, 16, 16))  # fsdp 2048 = 16 x 16 x 8: z is split
    assert torus_axes_fit([1, 1, 256, 1, 16, 1], (16, 16, 16)) and torus_axes_fit([1, 1, 256, 1, 1, 1], (16, 16))
    big = maxtext_pairs(export_text("maxtext", "--model", "llama3-70b", "--cluster", "tpu-v5p-pod", "--devices", "4096"))
    ici = [int(big[f"ici_{a}_parallelism"]) for a in ("data", "pipeline", "fsdp", "context", "tensor", "expert")]
    assert big.get("allow_split_physical_axes") == ("true" if not torus_axes_fit(ici, (16, 16, 16)) else None)
    small = maxtext_pairs(export_text("maxtext", "--model", "llama2-7b", "--cluster", "tpu-v5e-pod", "--devices", "256",
                                      "--fix", "tp=1,pp=1,cp=1"))
    assert "allow_split_physical_axes" not in small


def test_maxtext_fp8_steps_do_not_accumulate():
    """MaxText: 'FP8 quantization is not compatible with gradient accumulation' (DeepSeek-V3 is published in fp8)."""
    pairs = maxtext_pairs(export_text("maxtext", "--model", "deepseek-v3", "--cluster", "tpu-v5p-pod"))
    assert pairs["quantization"] == "fp8" and pairs["gradient_accumulation_steps"] == "1"

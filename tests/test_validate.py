"""Validation against published runs: the command works on any clusterplan-runs/1 file, and the
fidelity of the cost model on the bundled runs does not regress.

The issue's fidelity targets (median |error| <= 10%, 90th percentile <= 25%, no run off by more
than 2x) are not met yet; ``test_fidelity_targets`` states them and is expected to fail until they
are (see docs/cost-model.md for the runs that miss and why). The regression bounds below are the
figures the model reaches today, so a change that makes predictions worse fails the suite.
"""

from __future__ import annotations

import copy

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import clusterplan.cli as cli
from clusterplan.cost.framework import load_profile
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.validate import bundled_runs_path, evaluate_run, load_runs, validate

REPO = Path(__file__).resolve().parents[1]
HOLDOUT = REPO / "benchmarks" / "holdout_runs.yaml"
FAST = SearchOptions(engine="exhaustive", top_k=0)


@pytest.fixture(scope="module")
def bundled():
    return validate(None, FAST, best=False)


def test_bundled_runs_are_the_shared_ones():
    runs = load_runs(bundled_runs_path())
    assert len(runs) >= 50
    assert all("id" in r and "measured" in r for r in runs)


def test_every_run_is_reported(bundled):
    ids = [r["id"] for r in bundled["runs"]]
    assert len(ids) == len(load_runs(bundled_runs_path()))
    for r in bundled["runs"]:
        if r["reason"] is None:
            assert r["predicted_step_time_s"] > 0
            assert isinstance(r["fits"], bool)
            assert r["predicted_peak_memory_bytes"] > 0
    # OPT-175B publishes no batch size: it is reported with its reason, not dropped
    opt = next(r for r in bundled["runs"] if r["id"] == "opt175b-992gpu")
    assert "global_batch_size" in opt["reason"]


def test_published_layouts_are_held(bundled):
    runs = {r["id"]: r for r in load_runs(bundled_runs_path())}
    for r in bundled["runs"]:
        if r["reason"]:
            continue
        published = runs[r["id"]]["layout"]
        for knob in ("tp", "pp", "dp", "cp", "ep", "vp", "zero_stage", "recompute"):
            if published.get(knob) is not None:
                assert r["layout"][knob] == published[knob], (r["id"], knob)


def test_regression_bounds(bundled):
    """Today's figures (docs/cost-model.md): a change that makes them worse fails here."""
    s = bundled["summary"]["overall"]
    # 30.8% today (docs/cost-model.md, "Runs still off")
    assert s["p90_abs_error"] <= 0.32
    # Two published layouts overflow today: DeepSeek-V3's DualPipe layout, and Megatron-Bridge's
    # DeepSeek-V3 on 1,024 H100, which overlapped its all-to-alls and so (Megatron's rule) did not
    # recompute everything: without full recomputation the model puts it 6 GiB over (MoE memory
    # over-predicted, docs/cost-model.md)
    assert s["fits"] >= s["evaluated"] - 2
    summary = bundled["summary"]
    # 77.3% since 2026-11-29 (82.9% before): the two AWS EFA MoE dispatcher groups (89 pairs, 56 ordered
    # as measured; every run predicted 50-92% too fast, worst at micro-batch 1): new measured data the
    # model misses, not a change that made it worse (docs/cost-model.md, "Runs still off")
    assert summary["ranking"]["pairs"] >= 150 and summary["ranking"]["agreement"] >= 0.75
    memory = bundled["memory"]["summary"]
    assert memory["memory"]["runs"] >= 25 and memory["memory"]["median_abs_error"] <= 0.08  # 5.5% today
    # 17.5% since 2026-11-29 (13.7% before; issue 9's target is 15%): the optimizer step's peak of
    # DeepSpeed ZeRO-1/2 (cost.terms.step_gradients, read in DeepSpeed's step(); it brought the two
    # BigScience dp-1 peaks within 2%) moved one row, the DeepSpeed gist's ZeRO-2 LLaMA-7B with
    # checkpointing at micro-batch 1, from +13.7% to +20.2%: its max_memory_allocated (23.5) is the
    # weights, gradient partition and optimizer states alone, below any backward's peak, so it was
    # not read over a whole step (low confidence; docs/cost-model.md). With 43 peaks the p90 sits
    # between the 38th and 39th: that one row moved it
    assert memory["memory"]["p90_abs_error"] <= 0.18
    # 15 of 19 today: the 530B ZeRO-3 OOM on 560 GPUs (predicted at 95% of the device since ZeRO-3's
    # live set is priced as DeepSpeed of 2021 held it, which made the 640-GPU run that trained fit) and
    # three of the BigScience prequel's six OOM rows are wrong (docs/cost-model.md, "Published fit/OOM
    # facts the model gets wrong")
    assert memory["fit_facts"]["facts"] >= 19 and memory["fit_facts"]["agreed"] >= memory["fit_facts"]["facts"] - 4


@pytest.mark.xfail(reason="issue 8's targets not met yet: see docs/cost-model.md, 'Runs still off'", strict=False)
def test_issue_8_targets(bundled):
    s = bundled["summary"]
    assert s["ranking"]["agreement"] >= 0.90
    assert s["best_vs_published"]["median_speedup"] <= 1.10
    assert abs(s["zero3"]["median_signed_error"]) <= 0.10
    assert s["overall"]["median_abs_error"] <= 0.06 and s["overall"]["p90_abs_error"] <= 0.20


def test_fidelity_target_median(bundled):
    """Issue 3's median target: |step-time error| <= 10% on the bundled runs (6.0% today)."""
    assert bundled["summary"]["overall"]["median_abs_error"] <= 0.10


def test_fidelity_targets_tail(bundled):
    """Issue 3's tail targets, met since 2026-11-27 (the FP8 casts and DeepSpeed 2021's ZeRO-3 host
    copies priced): p90 24.3%, max 41.7%, every run within 2x."""
    s = bundled["summary"]["overall"]
    assert s["p90_abs_error"] <= 0.25
    assert s["max_abs_error"] < 1.0  # predicted within 2x: error in (-50%, +100%)
    assert all(r["error"] is None or -0.5 <= r["error"] <= 1.0 for r in bundled["runs"])


def test_attention_rule_applies_to_every_llmfoundry_run():
    """RUNS_FORMAT.md's attention rule: every llm-foundry run, bundled or held out, ran the Triton
    FlashAttention of its benchmark script (attn_impl triton): flash1, never flash2."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / "runs.yaml"]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_llmfoundry.yaml")]
    runs = [r for f in files for r in load_runs(f) if str(r["id"]).startswith("llmfoundry")]
    assert len(runs) == 201
    assert all(r.get("attention") == "flash1" for r in runs)
    # the model-code rule: MPT's fused cross-entropy, tied embeddings, ALiBi
    assert all(r.get("model_code") == "llmfoundry" for r in runs)
    assert all(r["model"]["tied_embeddings"] is True and r["model"]["position_embedding"] == "alibi" for r in runs)


def test_megatron_bridge_rule_applies_to_every_mbridge_run():
    """RUNS_FORMAT.md's Megatron-Bridge config rule is one rule for every run it covers: each mbridge
    run, bundled or held out, carries the performance configs' bf16 gradient reduce, SP where tp > 1,
    the model providers' zero dropout, and a note naming where the settings were read."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml")]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_family_runs.yaml")]
    runs = [r for f in files for r in load_runs(f) if str(r["id"]).startswith("mbridge")]
    assert len(runs) == 60
    for r in runs:
        assert r.get("grad_reduce_dtype") == "bf16", r["id"]
        assert r["model"].get("dropout") is False, r["id"]  # the providers' hidden/attention dropout 0.0
        assert any("Megatron-Bridge config rule" in str(n) for n in r.get("notes", [])), r["id"]
        if r["layout"]["tp"] > 1:
            assert r["layout"]["sequence_parallel"] is True, r["id"]


def test_megatron_bridge_rule_names_the_dispatcher_of_every_bundled_moe_run():
    """RUNS_FORMAT.md's Megatron-Bridge config rule, the dispatcher: every bundled Megatron-Bridge run
    with expert parallelism states the dispatcher its release's config ran (auto would price it as the
    NCCL all-to-all whatever the recipe named), and a row that does not name it in its id cites the
    file and line it was read from. The held-out files are frozen and not held to it."""
    root = Path(__file__).resolve().parent.parent
    covered = 0
    for name in ("runs.yaml", "family_runs.yaml", "memory_runs.yaml", "sweeps.yaml"):
        path = root / "planner" / "data" / name
        text = path.read_text()
        for r in load_runs(path):
            bridge = str(r["id"]).startswith("mbridge") or "Megatron-Bridge" in str((r.get("framework") or {}).get("version"))
            if not bridge or (r["layout"].get("ep") or 1) == 1:
                continue
            covered += 1
            dispatcher = r["layout"].get("moe_dispatcher")
            assert dispatcher in ("alltoall", "deepep", "hybridep"), r["id"]
            if dispatcher not in r["id"]:
                block = text.split(f"- id: {r['id']}\n", 1)[1].split("\n- id: ", 1)[0]
                line = next(ln for ln in block.splitlines() if ln.strip().startswith("moe_dispatcher:"))
                assert re.search(r"#.*\.(py|yaml|md):\d+", line), (r["id"], line)
    assert covered == 61


def test_habana_megatron_rule_applies_to_every_habana_megatron_run():
    """RUNS_FORMAT.md's Habana Megatron-LM rule: every run of HabanaAI/Megatron-LM, bundled or held
    out, trains without dropout (pretrain_llama.sh's HL_DROPOUT default 0.0), and the model then keeps
    no dropout masks: the published Llama 3.1 70B layout on 64 Gaudi 2 (tp 8 without sequence
    parallelism, 80 layers) holds 2 n h bytes a layer less than under Megatron-Core's 0.1 default."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml", "memory_runs.yaml")]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_family_runs.yaml")]
    runs = [r for f in files for r in load_runs(f)
            if "HabanaAI/Megatron-LM" in str((r.get("framework") or {}).get("version", ""))]
    assert len(runs) >= 2
    assert all(r["model"].get("dropout") is False for r in runs), [r["id"] for r in runs]
    run = next(r for r in runs if r["id"] == "intel-gaudi2-1.19-llama31-70b-64")
    without = evaluate_run(copy.deepcopy(run), FAST, best=False)
    run["model"].pop("dropout")
    default = evaluate_run(run, FAST, best=False)
    masks = 80 * 2 * 8192 * 8192  # 1-byte masks of the attention and MLP outputs, replicated over tp
    assert default.predicted_peak_memory_bytes - without.predicted_peak_memory_bytes == pytest.approx(masks, rel=1e-3)


def test_precision_rule_names_the_format_the_source_names():
    """RUNS_FORMAT.md's precision rule: a run whose source names MXFP8 or NVFP4 (Megatron-Bridge's
    FP8-MX, MXFP8, NVFP4 columns; torchao's mxfp8 recipes) carries that precision, and no other
    run does."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml", "memory_runs.yaml")]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_family_runs.yaml")]
    runs = [r for f in files for r in load_runs(f)]
    for fmt, said in (("mxfp8", "MXFP8"), ("nvfp4", "NVFP4")):
        named = {r["id"] for r in runs  # torchao's rows share one note: their ids name the recipe
                 if any(f"precision {said}" in str(n) for n in r.get("notes", [])) or f"-{fmt}-" in r["id"]}
        carried = {r["id"] for r in runs if r.get("precision") == fmt}
        assert named == carried and carried, fmt
    assert sum(r.get("precision") == "mxfp8" for r in runs) == 16
    assert sum(r.get("precision") == "nvfp4" for r in runs) == 4


def test_fp8_scaling_rule_applies_to_every_mbridge_fp8_run():
    """RUNS_FORMAT.md's FP8 scaling rule: every Megatron-Bridge FP8 run says current scaling, except
    DeepSeek-V3 on H100 (block scales, left at the default); no other run says anything."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml", "memory_runs.yaml", "sweeps.yaml")]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_family_runs.yaml", "holdout_llmfoundry.yaml")]
    runs = [r for f in files for r in load_runs(f)]
    said = {r["id"] for r in runs if "fp8_scaling" in r}
    rule = {r["id"] for r in runs if str(r["id"]).startswith("mbridge") and r.get("precision") == "fp8"
            and "deepseekv3-1024h100" not in r["id"]}
    assert said == rule and len(rule) == 22
    assert all(r["fp8_scaling"] == "current" for r in runs if r["id"] in said)


def test_one_micro_batch_rule_applies_to_every_maxtext_run():
    """RUNS_FORMAT.md's one-micro-batch rule: every MaxText row writes the per-replica batch (none
    sets gradient accumulation), and validate reads a pipeline-free run of a release without
    gradient accumulation as one micro-batch a step whatever its file says (the shared file's
    MaxText rows hold the per-chip batch), with a note."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml")]
    files += [root / "benchmarks" / "holdout_family_runs.yaml"]
    runs = [r for f in files for r in load_runs(f) if (r.get("framework") or {}).get("name") == "maxtext"]
    assert len(runs) == 43  # 12 Trillium recipes (tpu-recipes) since 2026-11-29
    for r in runs:
        assert r["micro_batch_size"] * r["layout"]["dp"] == r["global_batch_size"], r["id"]
    run = copy.deepcopy(next(r for r in load_runs(files[0]) if r["id"] == "maxtext-32b-v5p-128"))
    run["micro_batch_size"] = 8  # the per-chip figure, as the shared file gives it
    res = evaluate_run(run, SearchOptions(), best=False)
    assert res.layout["micro_batch_size"] == 32 and any("read as 32" in n for n in res.notes), res.notes
    # a release with gradient accumulation keeps the file's micro-batch
    run["framework"] = {"name": "maxtext", "date": "2024-09"}
    res = evaluate_run(run, SearchOptions(), best=False)
    assert res.layout["micro_batch_size"] == 8 and not any("read as" in n for n in res.notes)


def test_slurm_segment_rule_applies_to_every_multi_rack_mbridge_run():
    """RUNS_FORMAT.md's Slurm segment rule: every mbridge run on NVL72 racks spanning more than one
    rack uses 4 x (the largest divisor of its node count up to 18) devices per NVLink domain, as
    Megatron-Bridge's executor asks Slurm for; no other run carries the field."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / f for f in ("runs.yaml", "family_runs.yaml", "sweeps.yaml", "memory_runs.yaml")]
    files += [root / "benchmarks" / f for f in ("holdout_runs.yaml", "holdout_family_runs.yaml")]
    covered = 0
    for r in (r for f in files for r in load_runs(f)):
        hw = r["hardware"]
        expected = None
        if str(r["id"]).startswith("mbridge") and hw["cluster"] in ("gb200-nvl72", "gb300-nvl72") and hw["count"] > 72:
            nodes = hw["count"] // 4
            expected = 4 * next(c for c in range(18, 0, -1) if nodes % c == 0)
            covered += 1
        assert hw.get("devices_per_domain") == expected, r["id"]
    assert covered == 14


def test_nemo_2407_rule_applies_to_every_nemo2407_run():
    """RUNS_FORMAT.md's NeMo 24.07 config rule covers every nemo2407 run, bundled or held out: each
    names where its settings were read, and sequence parallelism is never left to the search."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "planner" / "data" / "runs.yaml", root / "benchmarks" / "holdout_runs.yaml"]
    runs = [r for f in files for r in load_runs(f) if str(r["id"]).startswith("nemo2407")]
    assert len(runs) == 8
    for r in runs:
        assert any("NeMo 24.07 config rule" in str(n) for n in r.get("notes", [])), r["id"]
        assert r["layout"]["sequence_parallel"] is not None, r["id"]
        matched = r["layout"]["recompute"] is not None
        assert matched == (r.get("grad_reduce_dtype") == "bf16"), r["id"]  # a matching config sets both


def test_unseen_file_with_a_bad_run(tmp_path):
    doc = yaml.safe_load(HOLDOUT.read_text())
    bad = dict(doc["runs"][0], id="broken-run")
    bad["hardware"] = dict(bad["hardware"], cluster="no-such-cluster")
    doc["runs"] = doc["runs"][:3] + [bad]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli.main, ["validate", str(path), "--json", "--search", "exhaustive", "--no-best"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["runs"]) == 4
    broken = out["runs"][-1]
    assert broken["id"] == "broken-run" and "no-such-cluster" in broken["reason"]
    assert all(r["predicted_step_time_s"] for r in out["runs"][:3])
    assert out["summary"]["overall"]["runs"] == 3


def test_model_code_under_a_framework_that_does_not_run_it_is_refused(tmp_path):
    """A runs file's ``model_code`` is checked against its framework as ``--model-code`` is on the
    command line: llm-foundry's modules under megatron are named, field by field, not priced."""
    run = next(r for r in load_runs(bundled_runs_path()) if r.get("model_code") == "llmfoundry")
    bad = dict(run, id="mpt-under-megatron", framework={"name": "megatron", "date": "2023-10"})
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [run, bad]}))
    result = CliRunner().invoke(cli.main, ["validate", str(path), "--json", "--no-best"])
    assert result.exit_code == 0, result.output
    out = {r["id"]: r for r in json.loads(result.stdout)["runs"]}
    assert out[run["id"]]["predicted_step_time_s"] and out["mpt-under-megatron"]["predicted_step_time_s"] is None
    reason = out["mpt-under-megatron"]["reason"]
    assert "model_code" in reason and "framework.name megatron" in reason and "torchtitan" in reason


def test_layer_scope_compares_the_layers_alone(tmp_path):
    """``measured.step_scope: layers`` (a per-layer timing, Korthikanti et al. 2022 Table 4) is
    compared with the layers' predicted time alone, which is below the whole step's."""
    from clusterplan.planner.studies.validate import bundled_data_path
    run = next(r for r in load_runs(bundled_data_path("sweeps.yaml"))
               if r["id"] == "korthikanti2022-t4-22b-1layer-8gpu-baseline")
    step = dict(run, id="whole-step", measured={k: v for k, v in run["measured"].items() if k != "step_scope"})
    bad = dict(run, id="bad-scope", measured=dict(run["measured"], step_scope="layer"))
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [run, step, bad]}))
    result = CliRunner().invoke(cli.main, ["validate", str(path), "--json", "--no-best"])
    out = {r["id"]: r for r in json.loads(result.stdout)["runs"]}
    layers, whole = out[run["id"]]["predicted_step_time_s"], out["whole-step"]["predicted_step_time_s"]
    assert 0 < layers < whole and abs(out[run["id"]]["error"]) < 0.25
    assert "step_scope" in out["bad-scope"]["reason"] and "layers" in out["bad-scope"]["reason"]


def test_best_layout_is_never_slower(tmp_path):
    doc = yaml.safe_load(HOLDOUT.read_text())
    doc["runs"] = doc["runs"][:4]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = validate(path, FAST, best=True)
    checked = 0
    for r in out["runs"]:
        assert r["best_step_time_s"] is not None
        checked += 1
        assert r["best_step_time_s"] <= r["predicted_step_time_s"] * (1 + 1e-9)
        if r["best_step_time_s"] < r["predicted_step_time_s"]:
            assert "faster by changing" in r["best_note"]
    assert checked == 4


@pytest.mark.parametrize("content, needle", [
    ("format: something-else\nruns: []\n", "clusterplan-runs/1"),
    ("format: clusterplan-runs/1\nruns: [1\n", "invalid YAML"),
    ("format: clusterplan-runs/1\nruns: 7\n", "must be a list"),
])
def test_bad_files_exit_2(tmp_path, content, needle):
    path = tmp_path / "runs.yaml"
    path.write_text(content)
    result = CliRunner().invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 2
    assert needle in result.stderr
    assert "Traceback" not in result.output


def test_missing_file_exit_2(tmp_path):
    result = CliRunner().invoke(cli.main, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_validated_error_file_is_what_validate_measures():
    """planner/data/validated_error.yaml (what every plan reports as its family's validated error,
    and the interval table its 80% intervals come from) is what `clusterplan validate` measures
    today over every measured step time in the repository: regenerate it with
    `python benchmarks/update_docs.py` when the model or the data change."""
    from importlib import resources

    from clusterplan.planner.studies.validate import LABEL_HOLDOUT_FILES, STEP_TIME_FILES, error_by_family
    stored = yaml.safe_load((resources.files("clusterplan.planner") / "data" / "validated_error.yaml").read_text())
    holdouts = sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks").glob("holdout_*.yaml"))
    assert sorted(LABEL_HOLDOUT_FILES) == holdouts and "memory_runs.yaml" in STEP_TIME_FILES  # every measured run
    families, intervals = error_by_family(extra_files=tuple(REPO / f for f in LABEL_HOLDOUT_FILES))
    assert stored["families"] == families and stored["intervals"] == intervals


def test_async_tp_saves_what_torchtitan_measured():
    """torchtitan's async TP is priced at its published cost (overlap.tp_comm_share 0.50 from its
    June 2025 benchmark): the saving over vanilla TP on the 70B and 8B rows comes within 25% of the
    measured one (bf16 and fp8 tensorwise; the rowwise rows' baseline was slow for another reason)."""
    from clusterplan.planner.studies.validate import bundled_data_path, evaluate_run
    rows = {r["id"]: r for r in load_runs(bundled_data_path("sweeps.yaml"))}
    pairs = [("torchtitan2506-llama3-70b-256gpu-fsdp32-tp8-bf16-vanilla-tp",
              "torchtitan2506-llama3-70b-256gpu-fsdp32-tp8-bf16-asynctp"),
             ("torchtitan2506-llama3-8b-64gpu-fsdp8-tp8-bf16-vanilla-tp",
              "torchtitan2506-llama3-8b-64gpu-fsdp8-tp8-bf16-asynctp")]
    for vanilla, asynctp in pairs:
        v, a = (evaluate_run(rows[i], SearchOptions(), best=False) for i in (vanilla, asynctp))
        measured = v.measured_step_time_s - a.measured_step_time_s
        predicted = v.predicted_step_time_s - a.predicted_step_time_s
        assert predicted == pytest.approx(measured, rel=0.25), (vanilla, predicted, measured)


@pytest.mark.parametrize("source,date", [
    ("Narayanan et al. 2021 (SC21, arXiv:2104.04473); Table 2", "2021-04"),  # the preprint's month
    ("https://arxiv.org/abs/2410.06511, torchtitan 2025 camera-ready", "2024-10"),
    ("a 2022 blog post, updated 2023", "2023-12"),  # no preprint: December of the latest year
    ("arXiv:3012.00001", "2026-08"),  # never past the profile's release
    ("no year at all", "2026-08"),
    ("NVIDIA NeMo Framework Performance Summary (container NeMo 24.07), 2026 docs", "2024-07"),  # the tag
    ('Megatron-Bridge Performance Summary, "25.11 NeMo Container", arXiv:2104.04473', "2025-11"),
    ("26.04.01 NeMo container", "2026-04"),
])
def test_a_runs_framework_date_follows_one_written_rule(source, date):
    """RUNS_FORMAT.md's framework rule, for a run without framework.date."""
    from clusterplan.planner.studies.validate import run_framework
    fw, got, origin = run_framework({"id": "x-deepspeed-run", "source": source}, "gpu")
    assert (fw, origin) == ("deepspeed", "inferred from the run's id or source")
    assert got == min(date, load_profile("deepspeed").date)


def _bundled_run(run_id: str) -> dict:
    return copy.deepcopy(next(r for r in load_runs(bundled_runs_path()) if r["id"] == run_id))


def test_a_published_layout_that_does_not_fit_is_priced_with_its_unoffered_knobs():
    """A published layout that overflows memory and holds a knob its framework profile lacks (here
    ZeRO-2 under megatron) is still priced, as not fitting; the fallback used to drop the run's
    allowance for unoffered knobs and report a --fix error instead."""
    run = _bundled_run("nemo2407-llama3-70b-64h100-fp8")
    run["id"] = "overflowing-zero2"
    run["hardware"]["count"] = 8
    run["layout"].update(tp=8, pp=1, dp=1, cp=1, vp=1, zero_stage=2)
    result = evaluate_run(run, SearchOptions(time_limit_s=10), best=False)
    assert result.reason is None, result.reason
    assert result.fits is False and result.predicted_step_time_s > 0
    assert result.layout["zero_stage"] == 2


def test_a_published_named_schedule_keeps_its_ep_overlap():
    """DeepSeek-V3 ran DualPipe (vp 1, two mirrored stages a rank) with its all-to-alls overlapped
    (report section 3.2.1). Megatron's rule refuses EP overlap at vp 1 with a pipeline, so the search
    held it and chose vp 2 instead, pricing interleaved 1F1B; the overlap now comes with the named
    schedule, applied after the search, and the layout is priced as published."""
    result = evaluate_run(_bundled_run("deepseek-v3-2048h800"), SearchOptions(time_limit_s=10), best=False)
    assert result.reason is None, result.reason
    lay = result.layout
    assert (lay["schedule"], lay["vp"], lay["ep_overlap"]) == ("dualpipe", 1, True)
    assert set(lay["recompute_modules"]) == {"layernorm", "mla_up_proj", "moe_act"}
    assert result.breakdown["ep_comm_s"] < 0.5 * _open_ep_s(_bundled_run("deepseek-v3-2048h800"))


def _open_ep_s(run: dict) -> float:
    run["layout"]["ep_overlap"] = False
    return evaluate_run(run, SearchOptions(time_limit_s=10), best=False).breakdown["ep_comm_s"]


def test_a_framework_date_before_the_frameworks_code_is_named():
    """A run dated before its framework offers any data-parallel mode gets a message naming the
    framework and the date, not the generic '--fix/--min/--max leave no value'."""
    run = _bundled_run("llama1-65b-2048gpu")
    run["framework"]["date"] = "2023-02"
    result = evaluate_run(run, SearchOptions(time_limit_s=10), best=False)
    assert result.reason is not None and "torchtitan" in result.reason and "2023-02" in result.reason
    assert "leave no value" not in result.reason


def test_regret_is_what_the_run_ranked_first_measured_against_the_best():
    from clusterplan.planner.studies.runs import RunResult
    from clusterplan.planner.studies.validate import regret

    def run(i, predicted, measured):
        return RunResult(id=f"r{i}", count=8, predicted_step_time_s=predicted, measured_step_time_s=measured)

    # the model ranks r0 first (1.0 s predicted) but it measured 1.5 s against r2's 1.2 s
    results = [run(0, 1.0, 1.5), run(1, 1.1, 1.3), run(2, 1.2, 1.2), run(3, 9.0, 9.0), run(4, 1.0, 1.0)]
    out = regret(results, {"job": ["r0", "r1", "r2"], "pair": ["r3", "r4"]})
    assert out["groups"] == 1  # the pair is too small to have a first and a best apart
    assert out["median"] == pytest.approx(1.25)
    assert out["above"] == []
    assert regret(results, {"job": ["r0", "r1", "r2"]}, min_runs=3)["max"] == pytest.approx(1.5 / 1.2)


def test_runs_the_model_prices_alike_are_not_ordered_by_the_order_they_are_listed_in():
    """Two runs priced the same (a dispatcher priced as NCCL's all-to-all on EFA) are not ordered by the
    model: the pair does not agree in either listing, and the regret of tied favourites is their mean."""
    from clusterplan.planner.studies.runs import RunResult
    from clusterplan.planner.studies.validate import ranking, regret

    def run(i, predicted, measured):
        return RunResult(id=f"r{i}", count=8, predicted_step_time_s=predicted, measured_step_time_s=measured)

    results = [run(0, 1.0, 1.5), run(1, 1.0, 1.0), run(2, 2.0, 2.0)]
    for order in (["r0", "r1", "r2"], ["r1", "r0", "r2"]):
        out = ranking(results, {"job": order})
        assert (out["pairs"], out["agreed"]) == (3, 2)
        assert any("predicted equal" in w for w in out["by_group"][0]["wrong"])
        assert regret(results, {"job": order})["max"] == pytest.approx((1.5 + 1.0) / 2 / 1.0)


def test_ranking_is_tallied_by_the_knob_each_group_s_runs_differ_in():
    """Issue 38: agreement per knob, the knob read from the settings a group's runs publish (a layout
    field without its ``layout.`` prefix, a job field by its key), never from the group's name; free
    text (a fabric note, the source) is no knob."""
    from clusterplan.planner.report.validation_text import knob_tally
    from clusterplan.planner.studies.runs import RunResult, bundled_data_path, run_settings
    from clusterplan.planner.studies.validate import ranking

    base = {"id": "a", "group": "g", "source": "s", "precision": "fp8", "global_batch_size": 8,
            "hardware": {"count": 8, "fabric": "text"}, "layout": {"tp": 2, "cp": 4, "cp_comm": "p2p"},
            "measured": {"step_time_s": 1.0}}
    other = {**base, "id": "b", "source": "t", "hardware": {"count": 8, "fabric": "other text"},
             "layout": {**base["layout"], "cp_comm": "a2a"}, "measured": {"step_time_s": 2.0}}
    assert run_settings(base) == {"precision": "fp8", "global_batch_size": 8, "hardware.count": 8,
                                  "layout.tp": 2, "layout.cp": 4, "layout.cp_comm": "p2p"}

    def result(run, predicted, **changes):
        settings = run_settings({**run, **changes})
        return RunResult(id=run["id"], count=8, predicted_step_time_s=predicted,
                         measured_step_time_s=run["measured"]["step_time_s"], settings=settings)

    rows = [result(base, 1.0), result(other, 3.0), result(base | {"id": "c"}, 2.0, precision="bf16"),
            result(other | {"id": "d"}, 1.0)]
    out = ranking(rows, {"kind": ["a", "b"], "both": ["c", "d"]})
    assert out["by_knob"] == {"cp_comm": {"agreed": 1, "pairs": 1, "groups": 1},
                              "cp_comm+precision": {"agreed": 0, "pairs": 1, "groups": 1}}
    assert [g["knob"] for g in out["by_group"]] == ["cp_comm+precision", "cp_comm"]
    assert knob_tally(out["by_knob"]) == "cp_comm 1/1 (1 group), cp_comm+precision 0/1 (1 group)"
    # the published settings reach the result through evaluate_run
    run = load_runs(bundled_data_path("sweeps.yaml"))[0]
    assert evaluate_run(run, SearchOptions(), best=False).settings == run_settings(run)


def test_memory_verdicts_count_every_peak_and_name_runs_that_ran_but_do_not_fit():
    """Issue 36's figures: every measured peak, and the runs that ran (a measured step or peak, or a
    published 'fits' fact) that the model says do not fit; a published out-of-memory fact is not a
    run that ran, and a run not evaluated counts nowhere."""
    from clusterplan.planner.studies.runs import RunResult
    from clusterplan.planner.studies.validate import memory_line, memory_verdicts
    rows = [RunResult("a", measured_step_time_s=1.0, fits=True, memory_error=0.05),
            RunResult("b", measured_step_time_s=1.0, fits=False, memory_error=-0.20),
            RunResult("c", measured_fits=True, fits=False),
            RunResult("d", measured_fits=False, fits=False, memory_error=0.10),
            RunResult("e", fits=False),  # nothing measured: no evidence it ran
            RunResult("f", measured_step_time_s=1.0, fits=False, reason="unknown device")]
    mv = memory_verdicts(rows)
    assert mv["runs"] == 3 and mv["median_abs_error"] == pytest.approx(0.10) and mv["max_abs_error"] == pytest.approx(0.20)
    assert mv["ran"] == 3 and mv["ran_predicted_not_to_fit"] == ["b", "c"]
    assert "2 of 3 (b, c)" in memory_line(mv)

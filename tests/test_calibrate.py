"""Calibration on a user's measured runs: ``clusterplan calibrate`` fits the site parameters the runs
determine, ``--calibration`` prices with them where they apply, ``validate --calibrate-one`` measures
calibrating on one run (planner.studies.calibrate, planner.studies.calibration)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.planner.inputs import Request
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies import calibration_prior
from clusterplan.planner.studies.calibrate import (calibrate_one, fit, fit_chosen, points_from_runs,
                                                   repository_scatter)
from clusterplan.planner.studies.calibration_prior import Scatter, derive
from clusterplan.planner.studies.calibration import load_calibration, with_factors
from clusterplan.planner.studies.runs import bundled_data_path, load_runs
from clusterplan.topologies.library import build_cluster

TRUTH = {"compute": 0.8, "memory": 0.6}


def _a100_runs(count: int = 8) -> list[dict]:
    """Megatron runs on DGX A100 of several model sizes (their memory-bound shares differ)."""
    runs = [r for r in load_runs(bundled_data_path("runs.yaml"))
            if (r.get("hardware") or {}).get("cluster") == "dgx-a100-superpod" and "megatron" in r["id"]
            and (r.get("measured") or {}).get("step_time_s")]
    return runs[:count]


def _synthetic(runs: list[dict], truth: dict[str, float]) -> list[dict]:
    """The runs with their measured step times replaced by the model's own prediction under ``truth``:
    a calibration that works recovers ``truth`` from them."""
    points, _ = points_from_runs(runs)
    out = []
    for run, p in zip(runs, points):
        assert p.id == run["id"]
        r = copy.deepcopy(run)
        r["measured"]["step_time_s"] = p.priced.step_s(with_factors(p.priced.cluster, truth))
        out.append(r)
    return out


@pytest.fixture(scope="module")
def synthetic_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": _synthetic(_a100_runs(), TRUTH)}))
    return path


WEAK_PRIOR = Scatter(site_log=1.0, within_job_log=0.001, between_jobs_log=0.001, job_log=1.0)


def test_calibrate_recovers_the_factors_the_runs_were_made_with(synthetic_file):
    """Under a prior that trusts runs far more than the bundled figures, the fit finds the factors the
    runs were made with; under the repository's prior it moves toward them, the truth inside the
    fitted factor's 80% interval."""
    points, _ = points_from_runs(load_runs(synthetic_file))
    (entry,) = fit(points, scatter=WEAK_PRIOR)
    assert entry.values["compute"] == pytest.approx(TRUTH["compute"], rel=0.03)
    assert "compute" in entry.fitted
    assert entry.error["after"]["median_abs_error"] < 0.01 < entry.error["before"]["median_abs_error"]
    assert entry.error["leave_one_out"]["runs"] == len(points)
    (entry,) = fit(points)
    low, high = entry.fitted["compute"]["interval"]
    assert TRUTH["compute"] < entry.values["compute"] < 1.0 and low <= TRUTH["compute"] <= high
    assert entry.prior == calibration_prior.stored().as_dict() | entry.prior  # written with the prior it used


def test_one_run_fits_one_parameter_and_says_what_would_tie_down_the_rest():
    points, _ = points_from_runs(_a100_runs(1))
    (entry,) = fit(points)
    assert len(entry.fitted) == 1
    assert set(entry.fitted) | set(entry.kept) == set(entry.values)
    assert all("needs runs" in why for why in entry.kept.values())
    assert entry.interval is None  # too few runs for an interval of its own


def test_factors_never_take_a_rate_past_the_hardware():
    cluster = build_cluster("dgx-h100-superpod", 16)
    fast = with_factors(cluster, {"compute": 5.0, "memory": 5.0, "scale_up": 5.0, "scale_out": 5.0})
    assert fast.device.gemm.large <= 1.0 and fast.device.memory_efficiency <= 1.0
    assert fast.device.matmul_ceiling("bf16") <= 1.0
    up = fast.strided_profile(8, 1)
    base = cluster.strided_profile(8, 1)
    assert base.intra_bytes_per_s < up.intra_bytes_per_s <= 900e9  # NVLink 4: 900 GB/s per direction, nominal


def test_cli_calibrate_then_validate_another_file_with_it(tmp_path, synthetic_file):
    runs = load_runs(synthetic_file)
    fit_file, other_file, cal = tmp_path / "fit.yaml", tmp_path / "other.yaml", tmp_path / "cal.yaml"
    fit_file.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": runs[:5]}))
    other_file.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": runs[5:]}))
    runner = CliRunner()
    res = runner.invoke(main, ["calibrate", str(fit_file), "-o", str(cal)])
    assert res.exit_code == 0, res.output
    assert "leave-one-out" in res.output and cal.is_file()
    before = json.loads(runner.invoke(main, ["validate", str(other_file), "--no-best", "--json"]).output)
    res = runner.invoke(main, ["validate", str(other_file), "--no-best", "--json", "--calibration", str(cal)])
    assert res.exit_code == 0, res.output
    after = json.loads(res.output)
    # five runs of five jobs move the factors most of the way, not all: the prior and the scatter between jobs
    assert after["summary"]["overall"]["median_abs_error"] < before["summary"]["overall"]["median_abs_error"] / 2
    assert "interval_coverage" in after["summary"]


def test_a_calibration_applies_only_to_its_device_and_framework(tmp_path, synthetic_file):
    cal = tmp_path / "cal.yaml"
    assert CliRunner().invoke(main, ["calibrate", str(synthetic_file), "-o", str(cal)]).exit_code == 0
    here = Request(model="gpt3-13b", cluster="dgx-a100-superpod", num_devices=64, calibration=str(cal),
                   framework="megatron").load_cluster()
    assert here.calibration["applied"] and here.device.gemm.large < build_cluster("dgx-a100-superpod", 64).device.gemm.large
    other = Request(model="gpt3-13b", cluster="dgx-h100-superpod", num_devices=64, calibration=str(cal)).load_cluster()
    assert not other.calibration["applied"] and "not applied" in other.calibration["note"]
    assert other.device == build_cluster("dgx-h100-superpod", 64).device
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-13b", "--cluster", "dgx-a100-superpod", "--devices", "64",
                                    "--calibration", str(cal)])
    assert res.exit_code == 0, res.output
    assert "calibrated:" in res.output and "fit without it" in res.output


@pytest.mark.parametrize("doc, message", [
    ({"format": "other/1"}, "format"),
    ({"format": "clusterplan-calibration/1", "entries": []}, "entries"),
    ({"format": "clusterplan-calibration/1", "entries": [{"device": "b200", "framework": "megatron",
                                                          "cluster": "x", "values": {"compute": 99}}]}, "values.compute"),
    ({"format": "clusterplan-calibration/1", "entries": [{"device": "b200", "framework": "megatron",
                                                          "cluster": "x", "values": {"speed": 1}}]}, "unknown parameter"),
    ({"format": "clusterplan-calibration/1", "entries": [{"device": "b200", "framework": "megatron",
                                                          "cluster": "x", "values": {"compute": 1}, "fitted": [1]}]},
     "entries[0].fitted"),
    ({"format": "clusterplan-calibration/1", "entries": [{"device": "b200", "framework": "megatron", "cluster": "x",
                                                          "values": {"compute": 1}, "jobs": [{"job": {"model": "m"},
                                                                                              "cluster": "x",
                                                                                              "values": {}}]}]},
     "entries[0].jobs[0].job.model_shape"),
    ({"format": "clusterplan-calibration/1", "entries": [{"device": "b200", "framework": "megatron", "cluster": "x",
                                                          "values": {"compute": 1}, "jobs": [7]}]}, "entries[0].jobs[0]"),
])
def test_bad_calibration_files_are_refused_by_field(tmp_path, doc, message):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "dgx-a100-superpod", "--devices", "8",
                                    "--calibration", str(path)])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_calibrate_without_a_measured_run_is_bad_input(tmp_path):
    run = copy.deepcopy(_a100_runs(1)[0])
    run["measured"] = {"peak_memory_gib": 30.0}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [run]}))
    res = CliRunner().invoke(main, ["calibrate", str(path), "-o", str(tmp_path / "cal.yaml")])
    assert res.exit_code == 2 and "measured step time" in res.output


def test_calibrating_on_one_run_predicts_the_others_of_its_job(synthetic_file):
    runs = load_runs(synthetic_file)
    points, _ = points_from_runs(runs)
    study = calibrate_one(points, {"a100 megatron": [r["id"] for r in runs]})
    (job,) = [c for c in study["cells"] if c["kind"] == "job"]
    assert job["median_abs_error_after"] < job["median_abs_error_before"]
    assert study["summary"]["job"]["cells"] == 1


def test_the_job_level_fit_takes_its_run_at_its_word_the_site_level_one_moves_other_jobs_less():
    """One run's error is mostly its job's: the site-level fit (for runs of other jobs) moves a step
    time the fraction t^2 / (t^2 + s_b^2) toward it; the job-level fit (for its own job) all the way."""
    (one,), _ = points_from_runs(_a100_runs(1))
    scatter = calibration_prior.stored()
    moved = {}
    for job_level in (False, True):
        _, chosen, x, r, _ = fit_chosen([one], {}, scatter, job_level)
        moved[job_level] = 1 - r[0] / one.log_error({})
    assert moved[False] == pytest.approx(scatter.fraction(False), abs=0.03)
    assert moved[True] == pytest.approx(1.0, abs=0.01) and 0 < moved[False] < moved[True]


def test_runs_of_one_job_count_as_less_than_runs_of_as_many_jobs(synthetic_file):
    """Runs of one job share its error (the covariance between them): three of one job tie the site's
    factors down less than three of three jobs."""
    points, _ = points_from_runs(load_runs(synthetic_file)[:3])
    scatter = calibration_prior.stored()
    moved = {}
    for label in ("one job", "three jobs"):
        runs = [replace(p, group="j" if label == "one job" else p.id) for p in points]
        _, chosen, x, _, cov = fit_chosen(runs, {}, scatter)
        moved[label] = (abs(x[chosen.index("compute")]), cov[chosen.index("compute"), chosen.index("compute")])
    assert moved["one job"][0] < moved["three jobs"][0] and moved["one job"][1] > moved["three jobs"][1]


def test_the_prior_comes_from_what_runs_of_other_jobs_share():
    """``derive`` reads the spreads off the runs: families whose jobs share nothing give t = 0 (a run
    of another job moves nothing); families whose jobs share one bias move the others most of the way."""
    def rows(bias: dict[str, float]) -> list[tuple[float, str, str, str]]:
        noise = [0.1, -0.12, 0.08, -0.09, 0.11, -0.1]
        return [(bias[cell] + n + 0.01 * k, cell, f"{cell}-{j}", "s")
                for cell in bias for j, n in enumerate(noise) for k in (-1, 1)]
    none = derive(rows({"a": 0.0, "b": 0.0, "c": 0.0}))
    assert none.site_log == 0 and none.fraction(False) == 0 and none.within_job_log == pytest.approx(0.01 * math.sqrt(2))
    shared = derive(rows({"a": 0.5, "b": -0.4, "c": 0.6}))
    assert shared.fraction(False) > 0.9 and shared.fraction(True) > 0.99
    assert derive([], fallback=none) is none


def test_a_family_whose_jobs_share_no_error_is_not_made_worse_by_calibrating_on_one_run():
    """Issue 37: four jobs of two layouts each, from four publications, on one device under one
    framework, each job off by its own 10% (two too fast, two too slow) and nothing shared. Fitted on
    one run, the other jobs' predictions must not take its job's error: the prior, derived from the
    other publications' runs, finds nothing shared between jobs (and much within one)."""
    runs = []
    for k in range(8):  # two runs of each job: one model at two batch sizes
        job, error = k // 2, (0.1 if k // 2 % 2 else -0.1) + (0.01 if k % 2 else -0.01)
        run = copy.deepcopy(_a100_runs(4)[job])
        run.update(id=f"{run['id']}-{k}", global_batch_size=run["global_batch_size"] * (1 + k % 2))
        (p,), _ = points_from_runs([run])
        r = copy.deepcopy(run)
        r.update(group=f"job-{job}", source=f"site {job}")
        r["measured"]["step_time_s"] = p.priced.step_s(p.priced.cluster) * math.exp(-error)
        runs.append(r)
    points, _ = points_from_runs(runs)
    study = calibrate_one(points, {f"job-{j}": [r["id"] for r in runs if r["group"] == f"job-{j}"] for j in range(4)})
    (family,) = [c for c in study["cells"] if c["kind"] == "family"]
    assert family["median_abs_error_after"] <= family["median_abs_error_before"]
    assert all(c["median_abs_error_after"] < c["median_abs_error_before"] / 2 for c in study["cells"] if c["kind"] == "job")


def test_the_stored_prior_is_what_the_repository_s_runs_give():
    """planner/data/calibration_prior.yaml (benchmarks/update_docs.py) holds what the code derives from
    the bundled runs and the repository's hold-outs (named here: the installed package CI tests ships none)."""
    from clusterplan.planner.studies.validate import LABEL_HOLDOUT_FILES
    holdouts = [REPO / f for f in LABEL_HOLDOUT_FILES]
    assert repository_scatter(holdouts).as_dict() == calibration_prior.stored().as_dict()


def test_calibrate_one_re_derives_the_prior_without_the_calibrating_source_and_says_so(synthetic_file):
    runs = load_runs(synthetic_file)
    points, _ = points_from_runs(runs)
    study = calibrate_one(points, {"a100 megatron": [r["id"] for r in runs]})
    assert set(study["scatter"]) >= {"site_log", "within_job_log", "between_jobs_log", "job_log"}
    res = CliRunner().invoke(main, ["validate", str(synthetic_file), "--calibrate-one"])
    assert res.exit_code == 0, res.output
    assert "prior:" in res.output and "without its source" in res.output


def test_the_calibrated_interval_is_the_one_plans_quote(synthetic_file, tmp_path):
    cal = tmp_path / "cal.yaml"
    CliRunner().invoke(main, ["calibrate", str(synthetic_file), "-o", str(cal)])
    entry = load_calibration(cal).entries[0]
    assert entry.interval is not None and entry.interval[0] <= 1.0 <= entry.interval[1]
    doc = json.loads(CliRunner().invoke(main, ["evaluate", "--model", "gpt3-13b", "--cluster", "dgx-a100-superpod",
                                               "--devices", "64", "--layout", "tp=8,dp=8", "--calibration", str(cal),
                                               "--json"]).output)
    low, high = doc["step_time_interval_s"]
    assert math.isclose(high / doc["step_time_s"], entry.interval[1], rel_tol=1e-6)
    assert doc["interval"]["calibrated"]


# ---- clusterplan probe: measured figures into a calibration -----------------------------------------------

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _probe_entry(tmp_path, figures: str):
    """The one entry `probe --figures` writes for a DGX H100 pod."""
    cal = tmp_path / "cal.yaml"
    res = CliRunner().invoke(main, ["probe", "--cluster", "dgx-h100-superpod", "-o", str(cal), "--figures",
                                    str(REPO / figures)])
    assert res.exit_code == 0, res.output
    (entry,) = load_calibration(cal).entries
    return entry, cal


def test_probe_turns_recorded_figures_into_factors(tmp_path):
    entry, _ = _probe_entry(tmp_path, "benchmarks/results/gpu_probe_h100_2026-11-26.json")
    dev = build_cluster("dgx-h100-superpod", 8).device
    assert entry.values["compute"] == pytest.approx(799.8e12 / (dev.peak("bf16") * dev.gemm.large), rel=1e-4)
    assert entry.values["host"] == 1.0 and "host" in entry.kept


def test_probe_prices_the_fabric_from_measured_collectives(tmp_path):
    entry, cal = _probe_entry(tmp_path, "tests/data/probe_2x8_h100_fixture.json")
    cluster = build_cluster("dgx-h100-superpod", 1024)
    assert entry.values["scale_up"] == pytest.approx(3.3e11 / cluster.strided_profile(8, 1).intra_bytes_per_s, rel=1e-6)
    assert entry.values["scale_out"] == pytest.approx(4.0e10 / cluster.strided_profile(2, 8).inter_bytes_per_s, rel=1e-6)
    slower = Request(model="llama3-70b", cluster="dgx-h100-superpod", num_devices=64, calibration=str(cal)).load_cluster()
    assert slower.strided_profile(8, 1).intra_bytes_per_s < build_cluster("dgx-h100-superpod", 64).strided_profile(
        8, 1).intra_bytes_per_s


@pytest.mark.parametrize("doc, message", [
    ({"format": "clusterplan-probe/1", "gemm_bf16_flops_per_s": -1}, "gemm_bf16_flops_per_s"),
    ({"format": "clusterplan-probe/1", "collectives": [{"op": "all_gather", "ranks": 8, "nodes": 1}]},
     "collectives[0].busbw_bytes_per_s"),
    ({"format": "clusterplan-probe/1", "collectives": {"all_gather": 1}}, "collectives"),
    ({"format": "clusterplan-probe/1", "device": "h100"}, "device"),
    ({"mamf": {"bf16": {"best_tflops": "800"}}}, "mamf.bf16.best_tflops"),
])
def test_probe_with_bad_figures_is_bad_input(tmp_path, doc, message):
    bad = tmp_path / "figures.json"
    bad.write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["probe", "--cluster", "dgx-h100-superpod", "-o", str(tmp_path / "c.yaml"),
                                    "--figures", str(bad)])
    assert res.exit_code == 2 and message in res.output, res.output


def test_probe_without_pytorch_is_bad_input(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        res = CliRunner().invoke(main, ["probe", "--cluster", "dgx-h100-superpod", "-o", str(tmp_path / "c.yaml")])
        assert res.exit_code == 2 and "PyTorch" in res.output


def test_calibrate_reads_training_logs_and_saves_them_as_runs_validate_scores(tmp_path):
    logs = REPO / "tests/data/logs"
    cal, runs = tmp_path / "cal.yaml", tmp_path / "runs.yaml"
    res = CliRunner().invoke(main, ["calibrate", str(logs / "torchtitan_llama3_8b_fsdp8.log"),
                                    str(logs / "megatron_llama3_8b_tp2.log"), "--cluster", "dgx-h100-superpod",
                                    "-o", str(cal), "--save-runs", str(runs)])
    assert res.exit_code == 0, res.output
    assert {e.framework for e in load_calibration(cal).entries} == {"torchtitan", "megatron"}
    doc = json.loads(CliRunner().invoke(main, ["validate", str(runs), "--no-best", "--json"]).output)
    assert all(r["reason"] is None and r["error"] is not None for r in doc["runs"])
    res = CliRunner().invoke(main, ["calibrate", str(logs / "megatron_llama3_8b_tp2.log"), "-o", str(cal)])
    assert res.exit_code == 2 and "--cluster" in res.output


def test_writing_into_a_missing_folder_is_bad_input_before_any_work(tmp_path):
    runs = str(REPO / "planner/data/runs.yaml")
    res = CliRunner().invoke(main, ["calibrate", runs, "-o", str(tmp_path / "nope" / "cal.yaml")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(main, ["probe", "--cluster", "dgx-superpod", "-o", str(tmp_path / "c.yaml"), "--figures",
                                    str(REPO / "tests/data/probe_2x8_h100_fixture.json"), "--save-figures",
                                    str(tmp_path / "nope" / "f.json")])
    assert res.exit_code == 2 and "--save-figures" in res.output


def test_the_compute_factor_scales_every_precision_s_gemm_fraction():
    """int8's (TPU v6e) as much as bf16's: a calibration of a device applies to whatever it runs."""
    cluster = build_cluster("tpu-v6e-pod", 8)
    half = with_factors(cluster, {"compute": 0.5}).device.gemm
    assert half.large == pytest.approx(cluster.device.gemm.large / 2)
    assert cluster.device.gemm.large_int8 and half.large_int8 == pytest.approx(cluster.device.gemm.large_int8 / 2)


# ---- the job-level fit: the same job priced with its own factors, any other with the site-level ones ----------

def _one_job(error: float = 0.15) -> list[dict]:
    """Two runs of one job (GPT 1.7B in fp16 on DGX A100 under Megatron, at two batch sizes), each
    measured ``error`` slower than the bundled figures predict: what a site's own stack would show."""
    runs = []
    for k in (1, 2):
        run = copy.deepcopy(_a100_runs(1)[0])
        run.update(id=f"{run['id']}-batch{k}", global_batch_size=run["global_batch_size"] * k)
        (p,), _ = points_from_runs([run])
        run["measured"]["step_time_s"] = p.priced.step_s() * (1 + error)
        runs.append(run)
    return runs


def _model_file(run: dict, tmp_path) -> str:
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in run["model"].items() if v is not None} | {"seq_len": run["seq_len"]}))
    return str(path)


def test_a_calibration_prices_the_job_it_was_fitted_on_with_that_job_s_own_fit(tmp_path):
    """Issue 37: calibrated on one run of a job, a plan of the same job (at another size) moves all the
    way to what the run measured; another job (another model, or the same model in bf16) gets the
    site-level fit, shrunk by the prior; the report and the Plan document say which."""
    one, _ = _one_job()
    runs_file, cal = tmp_path / "runs.yaml", tmp_path / "cal.yaml"
    runs_file.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [one]}))
    assert CliRunner().invoke(main, ["calibrate", str(runs_file), "-o", str(cal)]).exit_code == 0
    (entry,) = load_calibration(cal).entries
    (job,) = entry.jobs
    assert job.job["model"] == one["model"]["name"] and job.job["precision"] == "fp16" and job.runs == (one["id"],)
    name = next(iter(job.fitted))
    assert abs(math.log(job.values[name])) > 1.5 * abs(math.log(entry.values[name])) > 0
    bundled = build_cluster("dgx-a100-superpod", 64).device
    model = _model_file(one, tmp_path)
    same = Request(model=model, cluster="dgx-a100-superpod", num_devices=64, precision="fp16",
                   calibration=str(cal)).load_cluster()
    assert same.calibration["level"] == "job" and "job-level fit" in same.calibration["note"]
    assert same.calibration["values"] == pytest.approx(job.values)
    for other in (Request(model="gpt3-13b", cluster="dgx-a100-superpod", num_devices=64, precision="fp16",
                          calibration=str(cal)),
                  Request(model=model, cluster="dgx-a100-superpod", num_devices=64, precision="bf16",
                          calibration=str(cal))):
        got = other.load_cluster()
        assert got.calibration["level"] == "site" and "site-level fit" in got.calibration["note"]
        assert got.calibration["values"] == pytest.approx(entry.values) and got.device != bundled
    args = ["plan", "--model", model, "--cluster", "dgx-a100-superpod", "--devices", "64", "--precision", "fp16",
            "--calibration", str(cal)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and "job-level fit" in res.output, res.output
    doc = json.loads(CliRunner().invoke(main, args + ["--json"]).output)
    assert doc["inputs"]["caveats"]["calibration_level"] == "job"
    doc = json.loads(CliRunner().invoke(main, args[:2] + ["gpt3-13b"] + args[3:] + ["--json"]).output)
    assert doc["inputs"]["caveats"]["calibration_level"] == "site"


def test_calibrate_one_prices_the_others_as_a_user_s_calibration_does(tmp_path):
    """validate --calibrate-one's rule is --calibration's: calibrated on one run of a job, the other
    run of the job is predicted exactly as ``calibrate`` then ``validate --calibration`` predicts it
    (the job-level fit), so a job that is off by a shared 15% is predicted within 1%."""
    one, two = _one_job()
    points, _ = points_from_runs([one, two])
    study = calibrate_one(points, {"gpt 1.7b": [one["id"], two["id"]]})
    (cell,) = [c for c in study["cells"] if c["kind"] == "job"]
    assert cell["levels"] == {"job": 1} and cell["median_abs_error_before"] > 0.1  # the first run calibrates
    assert cell["median_abs_error_after"] < 0.01
    first, second, cal = tmp_path / "one.yaml", tmp_path / "two.yaml", tmp_path / "cal.yaml"
    first.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [one]}))
    second.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": [two]}))
    assert CliRunner().invoke(main, ["calibrate", str(first), "-o", str(cal)]).exit_code == 0
    doc = json.loads(CliRunner().invoke(main, ["validate", str(second), "--no-best", "--json", "--calibration",
                                               str(cal)]).output)
    (run,) = doc["runs"]
    assert abs(run["error"]) == pytest.approx(cell["median_abs_error_after"], abs=1e-4)

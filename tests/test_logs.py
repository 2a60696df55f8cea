"""Training logs of the four frameworks become clusterplan-runs/1 runs (planner.studies.logs):
each fixture of tests/data/logs (written in its framework's own format, README there) parses into
a run whose fields are those of the log and its config, the validation loader scores it, and a
log that is not what it claims gives a SpecError naming the file and the line."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
import yaml

from clusterplan.models.errors import SpecError
from clusterplan.planner.search import SearchOptions
from clusterplan.planner.studies.logs import WARMUP_STEPS, load_inputs, runs_from_log
from clusterplan.planner.studies.runs import evaluate_run

LOGS = Path(__file__).resolve().parent / "data" / "logs"
H100 = "dgx-h100-superpod"

CASES = {
    # fixture: (keywords, expected fields)
    "megatron_llama3_8b_tp2.log": (
        {"cluster": H100},
        {"framework": {"name": "megatron", "date": "2025-05"}, "seq_len": 8192, "global_batch_size": 128,
         "micro_batch_size": 1, "precision": "bf16", "hardware": {"cluster": H100, "count": 8},
         "layout": {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 1, "vp": 1, "sequence_parallel": True, "zero_stage": 1,
                    "tp_overlap": False, "dp_overlap": True, "recompute": "none"},
         "model": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
                   "ffn_hidden_size": 14336, "vocab_size": 128256, "ffn_activation": "swiglu", "dropout": False}}),
    "mbridge_llama3_8b_tp2.log": (
        {"cluster": H100, "model": "llama3-8b", "devices": 8, "framework_version": "Megatron-Bridge 25.09 (NeMo container)"},
        {"framework": {"name": "megatron", "version": "Megatron-Bridge 25.09 (NeMo container)", "date": "2025-09"},
         "seq_len": 8192, "global_batch_size": 128, "micro_batch_size": 1, "precision": "bf16",
         "hardware": {"cluster": H100, "count": 8},
         "layout": {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 1, "vp": 1, "sequence_parallel": True, "zero_stage": 1,
                    "tp_overlap": False, "dp_overlap": True, "recompute": "none"},
         "model": {"num_layers": 32, "vocab_size": 128256, "dropout": False}}),
    "torchtitan_llama3_8b_fsdp8.log": (
        {"cluster": H100},
        {"framework": {"name": "torchtitan", "version": "torchtitan 0.2.2", "date": "2026-02"}, "seq_len": 8192,
         "global_batch_size": 16, "micro_batch_size": 2, "precision": "bf16", "hardware": {"cluster": H100, "count": 8},
         "layout": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vp": 1, "zero_stage": 3, "recompute": "selective"},
         "model": {"name": "Llama 3 8B", "num_layers": 32, "vocab_size": 128256}}),
    "maxtext_llama2_7b_v5p16.log": (
        {"cluster": "tpu-v5p-pod"},
        {"framework": {"name": "maxtext"}, "seq_len": 4096, "global_batch_size": 32, "micro_batch_size": 4,
         "precision": "bf16", "hardware": {"cluster": "tpu-v5p-pod", "count": 8},
         "layout": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vp": 1, "zero_stage": 3, "recompute": "full"},
         "model": {"name": "Llama 2 7B", "num_layers": 32, "vocab_size": 32000, "dropout": False}}),
    "deepspeed_hf_llama3_8b_zero3.log": (
        {"cluster": H100, "seq_len": 4096},
        {"framework": {"name": "deepspeed", "version": "DeepSpeed 0.16.4", "date": "2025-03"}, "seq_len": 4096,
         "global_batch_size": 32, "micro_batch_size": 1, "precision": "bf16", "model_code": "huggingface",
         "hardware": {"cluster": H100, "count": 8},
         "layout": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "vp": 1, "zero_stage": 3},
         "model": {"num_layers": 32, "num_kv_heads": 8, "vocab_size": 128256, "ffn_activation": "swiglu"}}),
}

# each fixture's logged step times, read here with a pattern of the test's own, and its peak memory
STEP_TIMES = {
    "megatron_llama3_8b_tp2.log": (r"iteration\s+(\d+)/.*?per iteration \(ms\): ([\d.]+)", lambda v: v / 1000),
    "mbridge_llama3_8b_tp2.log": (r"iteration\s+(\d+)/.*?per iteration \(ms\): ([\d.]+)", lambda v: v / 1000),
    "torchtitan_llama3_8b_fsdp8.log": (r"step:\s+(\d+).*?tps: ([\d,]+)", lambda v: 16 * 8192 / (8 * v)),
    "maxtext_llama2_7b_v5p16.log": (r"completed step: (\d+), seconds: ([\d.]+)", lambda v: v),
    "deepspeed_hf_llama3_8b_zero3.log": (r"global_step=(\d+),.*?CurrSamplesPerSec=([\d.]+)", lambda v: 32 / v),
}
PEAKS_GIB = {"megatron_llama3_8b_tp2.log": 56424.7 / 1024, "mbridge_llama3_8b_tp2.log": 59.384e9 / 2**30,
             "torchtitan_llama3_8b_fsdp8.log": 51.51, "deepspeed_hf_llama3_8b_zero3.log": 52.51}


def _read(name: str) -> dict:
    runs = runs_from_log(LOGS / name, **CASES[name][0])
    assert len(runs) == 1
    return runs[0]


def _subset(expected: dict, got: dict, where: str = "") -> None:
    for key, value in expected.items():
        assert key in got, f"{where}{key} missing"
        if isinstance(value, dict):
            _subset(value, got[key], f"{where}{key}.")
        else:
            assert got[key] == value, f"{where}{key}: {got[key]!r} != {value!r}"


@pytest.mark.parametrize("name", CASES)
def test_each_fixture_parses_into_its_fields(name):
    run = _read(name)
    _subset(CASES[name][1], run)
    assert run["id"] == f"logs/{Path(name).stem}"
    assert "training log" in run["source"] and str(LOGS / name) in run["source"]


@pytest.mark.parametrize("name", CASES)
def test_step_time_is_the_median_after_the_warm_up(name):
    pattern, to_seconds = STEP_TIMES[name]
    logged = [(int(m.group(1)), to_seconds(float(m.group(2).replace(",", ""))))
              for m in re.finditer(pattern, (LOGS / name).read_text())]
    first = logged[0][0]
    kept = [t for step, t in logged if step >= first + WARMUP_STEPS]
    run = _read(name)
    assert run["measured"]["step_time_s"] == pytest.approx(statistics.median(kept), rel=1e-4)
    dropped = ", ".join(str(step) for step, _ in logged[:WARMUP_STEPS])
    assert any(f"median of {len(kept)} logged steps" in n and f"({dropped})" in n for n in run["notes"]), run["notes"]
    if name in PEAKS_GIB:
        assert run["measured"]["peak_memory_gib"] == pytest.approx(PEAKS_GIB[name], abs=2e-3)


@pytest.mark.parametrize("name", CASES)
def test_each_run_is_scored_by_the_validation_loader(name):
    result = evaluate_run(_read(name), SearchOptions(), best=False)
    assert result.reason is None
    assert result.predicted_step_time_s and result.predicted_step_time_s > 0
    assert result.error is not None and result.framework.startswith(CASES[name][1]["framework"]["name"])


def test_a_run_survives_the_runs_file_round_trip(tmp_path):
    """The runs are plain data: written as a clusterplan-runs/1 file, the loader reads them back."""
    runs = [_read(name) for name in ("megatron_llama3_8b_tp2.log", "maxtext_llama2_7b_v5p16.log")]
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"format": "clusterplan-runs/1", "runs": runs}, sort_keys=False))
    again = load_inputs([path, f"{LOGS / 'torchtitan_llama3_8b_fsdp8.log'}::{LOGS / 'torchtitan_llama3_8b_fsdp8.toml'}"],
                        cluster=H100)
    assert again[:2] == runs and again[2]["framework"]["name"] == "torchtitan"


def test_load_inputs_refuses_an_id_twice():
    log = str(LOGS / "maxtext_llama2_7b_v5p16.log")
    with pytest.raises(SpecError, match="appears|also a run"):
        load_inputs([log, log], cluster="tpu-v5p-pod")


def test_the_config_beside_the_log_is_read_and_an_explicit_one_wins(tmp_path):
    log = tmp_path / "train.log"
    log.write_text((LOGS / "torchtitan_llama3_8b_fsdp8.log").read_text())
    toml = (LOGS / "torchtitan_llama3_8b_fsdp8.toml").read_text()
    (tmp_path / "train.toml").write_text(toml)
    other = tmp_path / "full_ac.toml"
    other.write_text(toml.replace('mode = "selective"', 'mode = "full"'))
    assert runs_from_log(log, cluster=H100)[0]["layout"]["recompute"] == "selective"
    assert runs_from_log(log, other, cluster=H100)[0]["layout"]["recompute"] == "full"
    (tmp_path / "train.toml").unlink()
    assert "recompute" not in runs_from_log(log, cluster=H100)[0]["layout"]  # unknown without a config: left out


def _broken(tmp_path: Path, name: str, line_re: str, new: str) -> tuple[Path, int]:
    """The fixture with the first line matching ``line_re`` replaced by ``new``; (path, its line number)."""
    lines = (LOGS / name).read_text().splitlines()
    k = next(i for i, text in enumerate(lines) if re.search(line_re, text))
    lines[k] = new
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path, k + 1


@pytest.mark.parametrize("name, line_re, new, expected", [
    ("megatron_llama3_8b_tp2.log", r"iteration\s+7/", " [2025-05-14 09:14:40.1] iteration        7/      20 | "
     "consumed samples:          896 | elapsed time per itera", "elapsed time per iteration"),
    ("torchtitan_llama3_8b_fsdp8.log", r"step:\s+7 ", "[rank0]:[titan] 2026-02-25 14:03:01,000 - root - INFO - "
     "step:  7  loss:  9.1  memory: ??GiB  tps: 7,200", "memory"),
    ("maxtext_llama2_7b_v5p16.log", r"completed step: 7,", "completed step: 7, secs: 2.5", "seconds"),
    ("maxtext_llama2_7b_v5p16.log", r"completed step: 7,", "completed step: 7, seconds: 0, TFLOP/s/device: 0.0, "
     "Tokens/s/device: 0.0, total_weights: 131072, loss: 9.1", "seconds: got 0; expected a finite number > 0"),
    ("torchtitan_llama3_8b_fsdp8.log", r"step:\s+7 ", "step:  7  loss:  9.1  memory: 51.20GiB(64.72%)  tps: 0  "
     "tflops: 0.00  mfu: 0.00%", "tps: got 0; expected a finite number > 0"),
    ("deepspeed_hf_llama3_8b_zero3.log", r"global_step=7,", "[2025-03-03 10:01:20,000] [INFO] [timer.py:264:stop] "
     "epoch=0/micro_step=28/global_step=7, RunningAvgSamplesPerSec=6.7, CurrSamplesPerSec=, MemAllocated=16GB", "CurrSamplesPerSec"),
])
def test_a_step_line_that_does_not_parse_names_the_file_and_line(tmp_path, name, line_re, new, expected):
    path, lineno = _broken(tmp_path, name, line_re, new)
    with pytest.raises(SpecError, match=rf"{re.escape(str(path))}:{lineno}: .*{expected}"):
        runs_from_log(path, **CASES[name][0])


def test_an_unknown_log_names_the_formats_it_looked_for(tmp_path):
    path = tmp_path / "nemo2.log"
    path.write_text("Training epoch 0, iteration 9/99 | lr: 1.5e-05 | global_batch_size: 128 | "
                    "train_step_timing in s: 3.142\n")
    with pytest.raises(SpecError, match=r"no training step lines.*Megatron.*torchtitan.*MaxText.*DeepSpeed"):
        runs_from_log(path, cluster=H100)


@pytest.mark.parametrize("name, drop, expected", [
    ("deepspeed_hf_llama3_8b_zero3.log", {"seq_len": None}, r"seq_len: neither the log nor its config gives it"),
    ("mbridge_llama3_8b_tp2.log", {"devices": None}, r"hardware.count: .*devices="),
    ("mbridge_llama3_8b_tp2.log", {"model": None}, r"model: .*no vocabulary size.*model="),
    ("megatron_llama3_8b_tp2.log", {"devices": 16}, r"the log gives 8, devices=16"),
    ("deepspeed_hf_llama3_8b_zero3.log", {"seq_len": 0}, r"seq_len=: got 0; expected an integer >= 1"),
    ("maxtext_llama2_7b_v5p16.log", {"cluster": " "}, r"cluster: a log does not say which cluster it ran on"),
    ("megatron_llama3_8b_tp2.log", {"model": "llama2-70b"}, r"model='llama2-70b' has 80 layers"),
])
def test_a_missing_or_contradicted_value_is_refused(name, drop, expected):
    kwargs = {**CASES[name][0], **drop}
    with pytest.raises(SpecError, match=expected):
        runs_from_log(LOGS / name, **{k: v for k, v in kwargs.items() if v is not None})


def test_a_log_of_warm_up_steps_only_is_refused(tmp_path):
    lines = (LOGS / "maxtext_llama2_7b_v5p16.log").read_text().splitlines()
    path = tmp_path / "short.log"
    path.write_text("\n".join(t for t in lines if not re.search(r"completed step: ([3-9]|1\d),", t)) + "\n")
    with pytest.raises(SpecError, match=r"all 3 logged steps \(0, 1, 2\) are warm-up"):
        runs_from_log(path, cluster="tpu-v5p-pod")


def test_a_step_logged_by_every_rank_counts_once(tmp_path):
    text = (LOGS / "torchtitan_llama3_8b_fsdp8.log").read_text()
    ranks = "".join(t.replace("[rank0]", f"[rank{r}]") + "\n" for t in text.splitlines() for r in (0, 1))
    path = tmp_path / "all_ranks.log"
    path.write_text(ranks)
    run = runs_from_log(path, LOGS / "torchtitan_llama3_8b_fsdp8.toml", cluster=H100)[0]
    assert run["measured"]["step_time_s"] == _read("torchtitan_llama3_8b_fsdp8.log")["measured"]["step_time_s"]


def test_a_2024_torchtitan_log_and_config(tmp_path):
    """torchtitan before 2024-09 named the FSDP mesh dimension 'dp', logged 'wps' and 'Training starts
    at step 1, with local batch size ...', and kept the degrees in [training] and [experimental]."""
    text = (LOGS / "torchtitan_llama3_8b_fsdp8.log").read_text()
    text = text.replace("Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1, "
                        "etp=1", "Building 2-D device mesh with ['dp', 'tp'], [4, 2]").replace("tps:", "wps:")
    text = re.sub(r"Trainer is initialized with .*", "Training starts at step 1, with local batch size 2, global batch "
                  "size 8, sequence length 8192, total steps 20 (warmup 2)", text)
    (tmp_path / "train.log").write_text(text)
    (tmp_path / "train.toml").write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 2\n'
                                         'seq_len = 8192\ndata_parallel_degree = -1\ntensor_parallel_degree = 2\n'
                                         '[experimental]\npipeline_parallel_degree = 1\n[activation_checkpoint]\n'
                                         'mode = "full"\n')
    run = runs_from_log(tmp_path / "train.log", cluster=H100)[0]
    _subset({"global_batch_size": 8, "micro_batch_size": 2, "hardware": {"count": 8},
             "layout": {"tp": 2, "dp": 4, "pp": 1, "zero_stage": 3, "recompute": "full", "sequence_parallel": True}}, run)
    tps = [int(t.replace(",", "")) for t in re.findall(r"wps: ([\d,]+)", text)][WARMUP_STEPS:]
    assert run["measured"]["step_time_s"] == pytest.approx(statistics.median(8 * 8192 / (8 * v) for v in tps), rel=1e-4)


def test_megatron_deepspeed_arguments_name_deepspeed_and_its_zero_stage(tmp_path):
    """Megatron-DeepSpeed's dump has --deepspeed and --zero-stage, and its step lines give seconds."""
    text = (LOGS / "megatron_llama3_8b_tp2.log").read_text()
    dump = ("  deepspeed ....................................... True\n"
            "  zero_stage ...................................... 2\n")
    text = re.sub(r"elapsed time per iteration \(ms\): ([\d.]+)",
                  lambda m: f"elapsed time per iteration (s): {float(m.group(1)) / 1000:.2f}", text)
    path = tmp_path / "mds.log"
    path.write_text(text.replace("  ffn_hidden_size", dump + "  ffn_hidden_size", 1))
    run = runs_from_log(path, cluster=H100)[0]
    assert run["framework"]["name"] == "deepspeed" and run["layout"]["zero_stage"] == 2
    megatron = _read("megatron_llama3_8b_tp2.log")["measured"]["step_time_s"]
    assert run["measured"]["step_time_s"] == pytest.approx(megatron, abs=0.006)


def test_deepspeed_pipeline_engine_lines_give_the_step_and_the_stages(tmp_path):
    stages = "".join(f"[2025-03-03 10:00:20,000] [INFO] [engine.py:165:__init__] RANK={r} STAGE={r} LAYERS=8 [0, 8) "
                     "STAGE_PARAMS=1 (0.000M) TOTAL_PARAMS=4 (0.000M) UNIQUE_PARAMS=4 (0.000M)\n" for r in range(4))
    steps = "".join(f"steps: {s} loss: 2.1000 iter time (s): {1.5 if s < 3 else 1.2 + s / 1000:.3f} samples/sec: 26.7\n"
                    for s in range(1, 11))
    path = tmp_path / "pipe.log"
    path.write_text(stages + steps)
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,'
                      ' "fp16": {"enabled": true}, "zero_optimization": {"stage": 1}}')
    run = runs_from_log(path, config, cluster=H100, model="llama3-8b", seq_len=2048)[0]
    assert run["layout"]["pp"] == 4 and run["layout"]["dp"] == 2 and run["hardware"]["count"] == 8
    assert run["precision"] == "fp16" and run["layout"]["zero_stage"] == 1
    assert run["measured"]["step_time_s"] == pytest.approx(statistics.median(1.2 + s / 1000 for s in range(4, 11)), abs=1e-3)


def test_every_model_a_log_names_is_a_bundled_model_of_that_shape():
    """The torchtitan flavors and MaxText model names the parsers map resolve to bundled models, and
    the Qwen3 ones to the shape the framework builds (torchtitan/models/qwen3/__init__.py: 30B-A3B has
    48 layers, dim 2048, 128 experts of 768, top 8)."""
    from clusterplan.models.library import get_model
    from clusterplan.planner.studies.logs import maxtext, torchtitan

    for bundled in [*torchtitan.FLAVORS.values(), *maxtext.MODELS.values()]:
        get_model(bundled)
    spec = get_model(torchtitan.FLAVORS[("qwen3", "30B-A3B")])
    assert (spec.num_layers, spec.hidden_size, spec.moe.num_experts, spec.moe.expert_ffn_hidden_size,
            spec.moe.top_k) == (48, 2048, 128, 768, 8)
    assert maxtext.MODELS["qwen3-235b-a22b"] == "qwen3-235b-a22b"

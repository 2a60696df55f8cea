"""Input handling of issue 41 ("every path a user walks gives a right answer"): bad input of every
kind is refused with exit 2 and a message naming the field, the value and what is allowed; never a
traceback, a hang or a silently wrong answer."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.models import files
from clusterplan.models.errors import SpecError

SIZE = ["--devices", "8"]


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


# ---- files: YAML bounded in time, duplicate keys refused ---------------------------------------------------
def test_a_large_yaml_list_is_refused_in_seconds_naming_the_node_limit(tmp_path):
    """Issue 41 item 12: a 31 MB YAML model file under the 32 MiB cap was still being composed after
    6 CPU-minutes (PyYAML's pure-Python composer, ~20 us and ~1 KB a node). A list of 250,000 items
    (1 MB, over the node bound) is refused fast, the bound named."""
    path = tmp_path / "model.yaml"
    path.write_text("num_layers: 2\nlayers:\n" + "- 1\n" * 250_000)
    start = time.perf_counter()
    result = run("plan", "--model", str(path), "--cluster", "dgx-h100-superpod", *SIZE)
    assert time.perf_counter() - start < 10.0
    assert result.exit_code == 2, result.stderr
    assert f"more than {files.MAX_YAML_NODES:,} YAML nodes" in result.stderr


def test_the_node_bound_holds_without_libyaml(monkeypatch):
    """Without libyaml's fast count, the composer counts and stops at the bound itself."""
    monkeypatch.setattr(files, "MAX_YAML_NODES", 1000)
    monkeypatch.setattr(files.yaml, "CBaseLoader", None, raising=False)
    with pytest.raises(SpecError, match="more than 1,000 YAML nodes"):
        files.parse_yaml("x:\n" + "- 1\n" * 2000, "f.yaml")
    assert files.parse_yaml("x:\n" + "- 1\n" * 900, "f.yaml") == {"x": [1] * 900}


def test_a_yaml_text_over_the_character_bound_is_refused_before_parsing():
    text = "name: x\n" + "#" * files.MAX_YAML_CHARS
    start = time.perf_counter()
    with pytest.raises(SpecError, match=f"allowed: up to {files.MAX_YAML_CHARS:,}"):
        files.parse_yaml(text, "big.yaml")
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "name: a\nnum_layers: 2\nnum_layers: 4\n"),
    (".json", '{"name": "a", "num_layers": 2, "num_layers": 4}'),
    (".yaml", "moe: {num_experts: 8, num_experts: 16}\n"),
])
def test_a_key_given_twice_is_refused_naming_it_and_the_file(tmp_path, suffix, text):
    """Issue 41 item 8: both parsers kept the last value without a word."""
    path = tmp_path / f"model{suffix}"
    path.write_text(text)
    result = run("plan", "--model", str(path), "--cluster", "dgx-h100-superpod", *SIZE)
    assert result.exit_code == 2, result.stderr
    assert "is given twice" in result.stderr and str(path) in result.stderr
    assert ("'num_layers'" if "num_layers: 4" in text or '"num_layers": 4' in text else "'num_experts'") in result.stderr


def test_a_duplicate_key_in_a_cluster_file_is_refused(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text("base: dgx-h100-superpod\nnum_nodes: 2\nnum_nodes: 4\n")
    result = run("plan", "--model", "llama3-8b", "--cluster", str(path))
    assert result.exit_code == 2 and "key 'num_nodes' is given twice" in result.stderr, result.stderr


def test_a_merge_key_may_be_overridden_and_json_keys_may_repeat_across_objects():
    """What YAML and JSON mean by design stays accepted: an explicit key over a merged one, and the
    same key in two different mappings."""
    assert files.parse_yaml("a: &a {x: 1, y: 2}\nb: {<<: *a, x: 3}\n", "f.yaml")["b"] == {"x": 3, "y": 2}
    assert files.parse_json('[{"x": 1}, {"x": 2}]', "f.json") == [{"x": 1}, {"x": 2}]


# ---- Hugging Face configs -------------------------------------------------------------------------------------
TINY_MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None,
    "tie_word_embeddings": False,
}


def test_a_capped_context_is_said_in_the_report_and_the_plan_document(tmp_path):
    """Issue 41 item 6: Mixtral's 32,768-token context was planned at 8,192 while the report said
    "seq len ... from the model file". The report's job lines and the Plan document say why."""
    path = tmp_path / "mixtral" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_MIXTRAL))
    args = ["plan", "--model", str(path), "--cluster", "dgx-h100-superpod", *SIZE, "--top", "0"]
    text = run(*args)
    assert text.exit_code == 0, text.stderr
    assert "seq len 8,192: the config's max_position_embeddings is 32,768" in text.stdout
    assert "--seq-len 32768 for the whole context" in text.stdout
    assert not any("seq len" in line and "from the model file" in line for line in text.stdout.splitlines())
    doc = json.loads(run(*args, "--json").stdout)
    assert doc["inputs"]["job"]["seq_len"] == 8192 and "32,768" in doc["inputs"]["origin"]["seq_len"]
    given = json.loads(run(*args, "--seq-len", "32768", "--json").stdout)
    assert given["inputs"]["job"]["seq_len"] == 32768 and given["inputs"]["origin"]["seq_len"] == "given"


# ---- prices: compare and cluster files ------------------------------------------------------------------------
def _rows(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return {row["cluster"]: row for row in json.loads(result.stdout)}


def test_compare_takes_a_price_and_a_cluster_file_carries_one(tmp_path):
    """Issue 41 item 7: compare had no --price-per-device-hour and a cluster file could not carry a
    price, so Gaudi 2 or H200 (no catalogue price) showed "-" and ranked last under --objective cost."""
    pod = tmp_path / "h200-pod.yaml"
    pod.write_text("base: dgx-h100-superpod\nnum_nodes: 1\ndevice: h200-sxm-141gb\nprice_per_device_hour_usd: 3.5\n")
    args = ["compare", "--model", "llama3-8b", "--cluster", "gaudi2-cluster:8", "--cluster", str(pod),
            "--objective", "cost", "--json"]
    rows = _rows(run(*args, "--price-per-device-hour", "2"))
    for row in rows.values():  # the option replaces every candidate's price, the file's too
        assert row["cost_per_step_usd"] == pytest.approx(2 * 8 * row["step_time_s"] / 3600)
    filed = _rows(run(*args[:4], *args[6:]))[str(pod)]  # the H200 pod alone: its file's price
    assert filed["cost_per_step_usd"] == pytest.approx(3.5 * 8 * filed["step_time_s"] / 3600)


def test_a_candidate_without_a_price_says_so_in_its_row_under_objective_cost():
    """It was searched for time and ranked last without a word; now its row says why and names the
    option that gives a price."""
    result = run("compare", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod:8", "--cluster",
                 "gaudi2-cluster:8", "--objective", "cost", "--json")
    rows = _rows(result)
    assert rows["dgx-h100-superpod:8"]["cost_per_step_usd"] > 0
    gaudi = rows["gaudi2-cluster:8"]
    assert gaudi["exit_code"] == 2 and "gaudi2 has no price_per_hour_usd" in gaudi["error"]
    assert "--price-per-device-hour" in gaudi["error"] and "price_per_device_hour_usd" in gaudi["error"]
    alone = run("compare", "--model", "llama3-8b", "--cluster", "gaudi2-cluster:8", "--objective", "cost")
    assert alone.exit_code == 2 and "--price-per-device-hour" in alone.stdout


@pytest.mark.parametrize("text, field", [
    ("price_per_device_hour_usd: -1\n", "price_per_device_hour_usd"),
    ("price_per_device_hour_usd: .nan\n", "price_per_device_hour_usd"),
    ("price_per_device_hour_usd: 1.0e+9\n", "price_per_device_hour_usd"),
    ("scale_out: {nic_gbit_per_s: 1.0e+300}\n", "scale_out.nic_gbit_per_s"),
    ("scale_out: {nic_gbit_per_s: 1.0e-300}\n", "scale_out.nic_gbit_per_s"),
    ("power_overhead_w_per_device: 1.0e+300\n", "power_overhead_w_per_device"),
    ("domain_size: 1" + "0" * 400 + "\n", "domain_size"),
    ("links: {ib_ndr: {achieved_fraction: 0.9, latency_us: 1.0e+300}}\n", "latency_us"),
    ("device: {id: x, name: X, vendor: V, family: nvidia-hopper, calibration: nvidia-hopper, peak_tflops: {bf16: 989},"
     " memory_kind: hbm, memory_gib: 1.0e+300, memory_gbyte_per_s: 3350, scale_up_gbyte_per_s_per_dir: 450,"
     " scale_out_gbit_per_s: 400, gemm: {large: 0.7, source: x}}\n", "memory_gib"),
    ("device: {id: x, name: X, vendor: V, family: nvidia-hopper, calibration: nvidia-hopper, peak_tflops: {bf16: 1.0e+300},"
     " memory_kind: hbm, memory_gib: 80, memory_gbyte_per_s: 3350, scale_up_gbyte_per_s_per_dir: 450,"
     " scale_out_gbit_per_s: 400, price_per_hour_usd: .inf, gemm: {large: 0.7, source: x}}\n", "peak_tflops.bf16"),
])
def test_cluster_file_figures_have_a_physically_sane_range(tmp_path, text, field):
    """Issue 41 item 11: nic_gbit_per_s or memory_gib of 1e300 ended in OverflowError (exit 1)."""
    path = tmp_path / "pod.yaml"
    path.write_text("base: dgx-h100-superpod\nnum_nodes: 1\n" + text)
    result = run("plan", "--model", "llama3-8b", "--cluster", str(path), "--top", "0")
    assert result.exit_code == 2, result.stderr
    assert field in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr) < 2000


@pytest.mark.parametrize("command", ["plan", "evaluate", "sweep"])
def test_scale_out_has_one_bound_on_every_command(command):
    """evaluate --scale-out-gbit-per-s 1e-300 exited 0 with a 4e300 s step where plan exited 2."""
    extra = {"plan": [], "evaluate": ["--layout", "dp=16"], "sweep": ["--over", "global-batch=64,128"]}[command]
    result = run(command, "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                 "--scale-out-gbit-per-s", "1e-300", *extra)
    assert result.exit_code == 2 and "--scale-out-gbit-per-s" in result.stderr
    assert "allowed: at least 1 and at most 1e+06" in result.stderr


def test_sweep_points_below_the_nic_bound_say_so_in_their_row():
    result = run("sweep", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "16",
                 "--over", "scale-out-gbit-per-s=1e-300,400", "--json", "--jobs", "1")
    assert result.exit_code == 0, result.stderr
    low, high = json.loads(result.stdout)
    assert low["exit_code"] == 2 and "scale_out_gbit_per_s: got 1e-300; allowed: a number" in low["error"]
    assert high["step_time_s"] > 0


# ---- the Python API: Job, Request, load_cluster -------------------------------------------------------------
@pytest.mark.parametrize("make, field", [
    (lambda: _load_cluster(price_per_device_hour="3"), "price_per_device_hour"),
    (lambda: _load_cluster(pue="1.2"), "pue"),
    (lambda: _load_cluster(host_power_w="500"), "host_power_w"),
    (lambda: _load_cluster(pue=float("nan")), "pue"),
    (lambda: _job(tokens_to_train="300B"), "job.tokens_to_train"),
    (lambda: _job(tokens_to_train=float("nan")), "job.tokens_to_train"),
    (lambda: _job(tokens_to_train=float("inf")), "job.tokens_to_train"),
    (lambda: _job(global_batch_size=True), "job.global_batch_size"),
    (lambda: _job(grad_bytes=True), "job.grad_bytes"),
    (lambda: _job(reliability=None), "job.reliability"),
    (lambda: _request(scale_out_gbit_per_s=float("inf")), "scale_out_gbit_per_s"),
    (lambda: _request(scale_out_gbit_per_s=1e-300), "scale_out_gbit_per_s"),
    (lambda: _request(pue=float("nan")), "pue"),
    (lambda: _request(num_devices=True), "num_devices"),
    (lambda: _request(oversubscription=True), "oversubscription"),
    (lambda: _request(tokens="300B"), "tokens"),
    (lambda: _request(global_batch=64.5), "global_batch"),
])
def test_api_numbers_are_real_finite_numbers(make, field):
    """Issue 41 item 11: strings were stored (load_cluster), TypeError and ValueError escaped (Job,
    Request), and NaN, inf and True passed as numbers."""
    with pytest.raises(SpecError) as err:
        make()
    assert str(err.value).startswith(f"{field}: got ") and "allowed:" in str(err.value)


def _load_cluster(**what_if):
    from clusterplan.planner.inputs import load_cluster
    return load_cluster("dgx-h100-superpod", num_devices=8, **what_if)


def _job(**fields):
    from clusterplan.cost.layout import Job
    return Job(**{"global_batch_size": 64, "seq_len": 2048, **fields})


def _request(**options):
    from clusterplan.planner.inputs import Request
    return Request(model="llama3-8b", cluster="dgx-h100-superpod", **options).load_cluster()


def test_valid_api_numbers_still_pass():
    assert _load_cluster(price_per_device_hour=3, pue=1.2, host_power_w=500).device.price_per_hour_usd == 3
    assert _job(tokens_to_train=3e11).tokens_to_train == 3e11
    assert _request(num_devices=16, scale_out_gbit_per_s=200).num_devices == 16


# ---- numbers too long to read ---------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_5000_digit_integer_in_a_model_file_is_bad_input(tmp_path, suffix):
    path = tmp_path / f"model{suffix}"
    digits = "1" + "0" * 5000
    path.write_text('{"name": "x", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, '
                    f'"ffn_hidden_size": 1024, "vocab_size": {digits}}}')
    result = run("plan", "--model", str(path), "--cluster", "dgx-h100-superpod", *SIZE)
    assert result.exit_code == 2 and "more than 4,300 digits" in result.stderr, result.stderr
    assert len(result.stderr) < 1000


@pytest.mark.parametrize("field, value", [("head_dim", 10**30), ("seq_len", 10**30),
                                          ("moe", {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 10**40})])
def test_model_figures_beyond_their_bounds_are_refused_at_load(tmp_path, field, value):
    """They reached the search, which overflowed its int64 tables (a numpy warning on stderr) before a
    late step-time check refused them."""
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"name": "x", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                                "ffn_hidden_size": 1024, "vocab_size": 32000, field: value}))
    result = run("plan", "--model", str(path), "--cluster", "dgx-h100-superpod", *SIZE)
    assert result.exit_code == 2 and "invalid model spec" in result.stderr and field in result.stderr
    assert "overflow" not in result.stderr


# ---- render of a hand-edited Plan document ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_plan() -> dict:
    result = run("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", *SIZE, "--tokens", "1T", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("value", [True, 0, [1], {"a": 1}, None])
def test_render_refuses_a_rejection_reason_that_is_not_text(tmp_path, saved_plan, value):
    """Issue 41 item 11: a number or list in rejection_reasons stopped rich's table (exit 1)."""
    doc = json.loads(json.dumps(saved_plan))
    doc["rejection_reasons"][next(iter(doc["rejection_reasons"]))] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    result = run("render", str(path))
    assert result.exit_code == 2 and "rejection_reasons." in result.stderr, result.stderr
    assert result.stdout == ""


MUTATIONS = ["x", "", None, -1, 0, 1e308, True, [], {}, [1], "1.5", 10**30, {"a": 1}, [{"x": 1}], "tp=8"]


def _paths(node, path=()):
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, path + (key,))


def test_render_of_fuzzed_plan_documents_is_a_report_or_exit_2(tmp_path, saved_plan):
    """Fields removed, wrong types, strings for numbers: every document gives the report (exit 0)
    or a message naming what is wrong (exit 2), never an internal error."""
    import random
    rng = random.Random(41)
    paths = [p for p in _paths(saved_plan) if p]
    path = tmp_path / "plan.json"
    for _ in range(150):
        doc = json.loads(json.dumps(saved_plan))
        for where in rng.sample(paths, rng.randint(1, 4)):
            parent = doc
            try:
                for key in where[:-1]:
                    parent = parent[key]
                if isinstance(parent, dict) and rng.random() < 0.4:
                    parent.pop(where[-1], None)
                else:
                    parent[where[-1]] = rng.choice(MUTATIONS)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change removed this path
        path.write_text(json.dumps(doc))
        result = run("render", str(path))
        assert result.exit_code in (0, 2), (result.exit_code, result.stderr)


# ---- papercuts --------------------------------------------------------------------------------------------------
def test_plan_version_prints_what_clusterplan_version_prints():
    from clusterplan.cli import plan_main
    version = run("--version")
    plan_version = CliRunner().invoke(plan_main, ["--version"])
    assert version.exit_code == 0 and plan_version.exit_code == 0, plan_version.output
    assert plan_version.stdout == version.stdout and "version" in version.stdout


def test_failure_rate_zero_assumes_no_failures_and_keeps_the_figures_right():
    """``--failure-rate 0`` printed "a failure every inf days" and wrote Infinity into the JSON."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", *SIZE, "--tokens", "1T", "--top", "0",
            "--failure-rate", "0"]
    text = run(*args)
    assert text.exit_code == 0, text.stderr
    assert "inf days" not in text.stdout and "no failures assumed" in text.stdout
    raw = run(*args, "--json").stdout
    assert "Infinity" not in raw and "NaN" not in raw
    doc = json.loads(raw)
    gp = doc["goodput"]
    assert gp["goodput"] == 1.0 and gp["mtbf_s"] is None and gp["checkpoint_interval_s"] is None
    assert doc["time_to_train_s"] == pytest.approx(doc["time_to_train_ideal_s"])
    assert doc["device_hours"] == pytest.approx(8 * doc["time_to_train_ideal_s"] / 3600)
    steps = doc["inputs"]["job"]["tokens_to_train"] / (doc["inputs"]["job"]["global_batch_size"]
                                                     * doc["inputs"]["job"]["seq_len"])
    assert doc["time_to_train_ideal_s"] == pytest.approx(steps * doc["step_time_s"])

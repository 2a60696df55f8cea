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

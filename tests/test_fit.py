"""``clusterplan fit``: the fewest devices on which some layout fits, found by search; and the exit-3
hint, whose number must be a size on which ``plan`` then succeeds (issue 9)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.terms import Context
from clusterplan.planner.search.exhaustive import any_feasible, score_factorization, smallest_memory
from clusterplan.planner.search.space import Bounds, build_space
from clusterplan.planner.search.tables import build_tables
from clusterplan.planner.inputs import Request, build_job
from clusterplan.models.errors import SpecError
from clusterplan.models.library import get_model, list_models
from clusterplan.planner.studies.fit import fewest_devices, layouts_fit
import clusterplan.planner.requests as requests_module
from clusterplan.topologies.library import build_cluster, list_clusters

PRESETS = [c.id for c in list_clusters()]
MODELS = [m.id for m in list_models()]


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("preset", PRESETS)
def test_fit_answers_for_every_model_on_every_preset(preset, model_id):
    """An answer (or a reason) for every pair; the answer is a size plan runs on, and the accepted
    size below it that was checked does not fit."""
    model, request = get_model(model_id), Request(model=model_id, cluster=preset)
    reference = build_cluster(preset)
    step = reference.devices_per_node
    # up to four times the preset's reference size: "none fits up to N" is an answer too
    answer = fewest_devices(model, request, max_devices=4 * reference.num_devices)
    if answer.num_devices is None:
        assert answer.reason and answer.checked
        return
    cluster = build_cluster(preset, num_devices=answer.num_devices)
    assert layouts_fit(model, build_job(model_id, model, cluster)[0], cluster)
    assert all(not ok for n, ok in answer.checked if n < answer.num_devices), answer.checked
    # every size the fabric accepts below the answer, down to the last one checked, was checked
    checked = {n for n, _ in answer.checked}
    below = max([n for n in checked if n < answer.num_devices], default=0)
    for m in range(below + step, answer.num_devices, step):
        if m not in checked:
            with pytest.raises(SpecError):
                build_cluster(preset, num_devices=m)


RUN = CliRunner()


@pytest.mark.parametrize("model_id,preset,devices", [
    ("llama3-405b", "dgx-h100-superpod", 8), ("gpt3-175b", "dgx-a100-superpod", 16),
    ("llama3-70b", "dgx-a100-superpod", 8), ("deepseek-v3", "dgx-h100-superpod", 64),
])
def test_exit_3_hint_names_a_size_plan_runs_on(model_id, preset, devices, monkeypatch):
    # the hint's search stops after HINT_BUDGET_S of wall time (a bound on the wait, not part of
    # the answer): lifted here so that a loaded test machine does not turn the number into a formula
    monkeypatch.setattr(requests_module, "HINT_BUDGET_S", 600.0)
    args = ["plan", "--model", model_id, "--cluster", preset, "--top", "0"]
    fail = RUN.invoke(main, [*args, "--devices", str(devices)])
    assert fail.exit_code == 3, fail.output
    found = re.search(r"some layout fits on ([\d,]+) x", fail.stderr)
    assert found, fail.stderr
    n = int(found.group(1).replace(",", ""))
    ok = RUN.invoke(main, [*args, "--devices", str(n)])
    assert ok.exit_code == 0, ok.stderr


def test_fit_command_and_smallest_device():
    out = RUN.invoke(main, ["fit", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--json"])
    assert out.exit_code == 0, out.stderr
    import json
    doc = json.loads(out.stdout)
    n = doc["num_devices"]
    assert doc["plan"]["fits"] and doc["plan"]["num_devices"] == n
    assert any(not c["fits"] for c in doc["checked"]) or n == 8
    # at a fixed size: the smallest device of the family on which a layout fits
    dev = RUN.invoke(main, ["fit", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "16"])
    assert dev.exit_code == 0, dev.stderr
    assert "the smallest device" in dev.stdout and "devices checked, least memory first" in dev.stdout
    # 8 GPUs: Adam states alone (16 B x 70 B / 8 = 140 GB) exceed every Hopper part: exit 3, devices named
    none = RUN.invoke(main, ["fit", "--model", "llama3-70b", "--cluster", "dgx-h100-superpod", "--devices", "8"])
    assert none.exit_code == 3 and "h200-sxm-141gb" in none.stderr


@pytest.mark.parametrize("model_id,preset,devices,framework", [
    ("deepseek-v3", "dgx-h100-superpod", 256, None), ("mixtral-8x7b", "dgx-h100-superpod", 16, None),
    ("llama3-70b", "dgx-h100-superpod", 64, "torchtitan"), ("llama3-8b", "tpu-v5p-pod", 64, None),
    ("gpt3-175b", "dgx-a100-superpod", 64, "deepspeed"),
])
def test_memory_only_tables_decide_fit_as_the_full_tables(model_id, preset, devices, framework):
    """``fit`` builds the rules and memory tables alone at each size (``memory_only``); every layout's
    rejection code and peak memory, and so the answer, are those of the tables ``plan`` solves, and
    an objective read through the memory-only tables fails instead of pricing nothing."""
    model = get_model(model_id)
    cluster = build_cluster(preset, num_devices=devices)
    job = build_job(model_id, model, cluster, framework=framework)[0]
    bounds = Bounds()
    space = build_space(model, job, cluster, bounds)
    ctx = Context(model, job, cluster)
    full = build_tables(ctx, space, bounds.headroom(job, cluster))
    mem = build_tables(ctx, space, bounds.headroom(job, cluster), memory_only=True)
    for i in range(len(space.factorizations)):
        a, b = score_factorization(full, i, with_objective=False), score_factorization(mem, i, with_objective=False)
        assert np.array_equal(a.code, b.code) and np.array_equal(a.memory, b.memory), space.factorizations[i]
    assert any_feasible(mem) == any_feasible(full)
    assert smallest_memory(mem)[0] == smallest_memory(full)[0]
    with pytest.raises(ValueError, match="memory-only"):
        score_factorization(mem, 0)

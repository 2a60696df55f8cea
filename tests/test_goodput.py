"""Goodput, price and PUE: the what-if controls a buyer needs (issue 11, item 3)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from clusterplan.cli import main
from clusterplan.cost.goodput import (
    CHECKPOINT_BYTES_PER_PARAM, LLAMA3_FAILURES_PER_DEVICE_HOUR, LLAMA3_STORAGE_BYTES_PER_S_PER_DEVICE, Reliability,
    goodput,
)


def test_llama3_failure_rate_is_the_published_count():
    # Dubey et al. 2024, section 3.3.4: 419 unexpected interruptions, 54 days, 16,384 GPUs
    assert LLAMA3_FAILURES_PER_DEVICE_HOUR == pytest.approx(419 / (54 * 24 * 16384))
    assert LLAMA3_STORAGE_BYTES_PER_S_PER_DEVICE == pytest.approx(2e12 / 16384)


def test_goodput_against_a_hand_calculation():
    """405B parameters on 16,384 devices with the defaults: Young's interval and the waste, by hand."""
    n, p, rel = 16384, 405e9, Reliability()
    delta = CHECKPOINT_BYTES_PER_PARAM * p / n / rel.checkpoint_bytes_per_s_per_device
    mtbf = 3600 / (n * rel.failure_rate_per_device_hour)
    tau = math.sqrt(2 * delta * mtbf)
    g = goodput(p, n, rel)
    assert g.checkpoint_write_s == pytest.approx(delta) and g.mtbf_s == pytest.approx(mtbf)
    assert g.checkpoint_interval_s == pytest.approx(tau)
    assert g.goodput == pytest.approx(1 - delta / tau - (tau / 2 + rel.restart_s + delta) / mtbf)
    # Llama 3 reports more than 90% effective training time on this setup (section 3.3.4)
    assert 0.9 < g.goodput < 0.95


def test_goodput_laws():
    base = goodput(70e9, 1024, Reliability())
    assert goodput(70e9, 1024, Reliability(failure_rate_per_device_hour=0.0)).goodput == 1.0
    assert goodput(70e9, 4096, Reliability()).goodput < base.goodput  # more devices fail more often
    assert goodput(70e9, 1024, Reliability(restart_s=3600)).goodput < base.goodput
    assert goodput(70e9, 1024, Reliability(checkpoint_bytes_per_s_per_device=1e9)).goodput > base.goodput
    assert goodput(70e9, 1024, Reliability(failure_rate_per_device_hour=1.0)).goodput == 0.0  # cannot progress


def _plan(*extra: str) -> dict:
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64", "--json", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_options_reach_the_figures():
    base = _plan()
    assert base["goodput"]["goodput"] < 1 and base["time_to_train_s"] > base["time_to_train_ideal_s"]
    assert base["time_to_train_s"] == pytest.approx(base["time_to_train_ideal_s"] / base["goodput"]["goodput"])
    assert base["device_hours"] == pytest.approx(64 * base["time_to_train_s"] / 3600)
    pue = _plan("--pue", "1.3")
    assert pue["energy_per_step_j"] == pytest.approx(1.3 * base["energy_per_step_j"])
    price = _plan("--price-per-device-hour", "2")
    assert price["cost_per_step_usd"] == pytest.approx(2 * 64 * price["step_time_s"] / 3600)
    none = _plan("--failure-rate", "0")
    assert none["goodput"]["goodput"] == 1.0 and none["time_to_train_s"] == pytest.approx(none["time_to_train_ideal_s"])
    slow = _plan("--restart-minutes", "60", "--checkpoint-gbyte-per-s", "0.01")
    assert slow["goodput"]["goodput"] < base["goodput"]["goodput"]
    assert slow["goodput"]["restart_s"] == 3600 and not slow["goodput"]["restart_unvalidated"]


@pytest.mark.parametrize("option, value", [("--pue", "0.9"), ("--pue", "inf"), ("--failure-rate", "-1"),
                                           ("--price-per-device-hour", "nan"), ("--restart-minutes", "1e9"),
                                           ("--checkpoint-gbyte-per-s", "0")])
def test_bad_what_if_values_exit_2(option, value):
    result = CliRunner().invoke(main, ["plan", "--model", "gpt", "--cluster", "dgx-superpod", option, value])
    assert result.exit_code == 2 and option in result.output


def _energy(cluster: str, *extra: str) -> dict:
    args = ["plan", "--model", "llama3-70b", "--cluster", cluster, "--devices", "256", "--tokens", "1T", "--json",
            *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_host_power_is_stated_or_assumed_on_one_basis():
    dgx, hgx = _energy("dgx-h100-superpod"), _energy("hgx-h800")
    assert dgx["inputs"]["cluster"]["host_power_w_per_device"] == 575 and not dgx["inputs"]["cluster"]["host_power_assumed"]
    assert hgx["inputs"]["cluster"]["host_power_w_per_device"] == pytest.approx(0.8 * 700)
    assert hgx["inputs"]["cluster"]["host_power_assumed"]
    assert any("no host power figure" in line for line in hgx["inputs"]["caveats"]["unvalidated"])
    # the same GH100 chips: energy per step within 10% once both count a host
    assert hgx["energy_per_step_j"] == pytest.approx(dgx["energy_per_step_j"], rel=0.10)
    zero = _energy("hgx-h800", "--host-power-w", "0")
    assert zero["inputs"]["cluster"]["host_power_w_per_device"] == 0 and not zero["inputs"]["cluster"]["host_power_assumed"]
    assert zero["energy_per_step_j"] < hgx["energy_per_step_j"]


def test_a_job_that_never_finishes_has_no_time_and_valid_json():
    doc = _plan("--failure-rate", "1")
    assert doc["goodput"]["goodput"] == 0.0
    assert doc["time_to_train_s"] is None and doc["cost_usd"] is None and doc["device_hours"] is None
    text = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices",
                                     "64", "--failure-rate", "1"]).stdout
    assert "never" in text

"""`sweep --ray`: the points run as tasks on a Ray cluster that this test starts and stops
(`ray start --head` in a subprocess), and give the same rows as one local process. Needs the
`ray` extra (`pip install 'clusterplan[ray]'`, which `.ci/run` installs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterplan.cli import main

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'clusterplan[ray]')")

SWEEP = ["sweep", "--model", "llama3-8b", "--cluster", "dgx-h100-superpod", "--devices", "64",
         "--over", "global-batch=64,128,256,512,1024,2048,4096,8192,16384", "--pue", "1.2", "--json"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    # a throwaway cluster on loopback: Ray's token authentication (on by default since 2.5x) off for
    # the head and for this process, which connects to it as the driver
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, env=env, timeout=180)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, env=env, timeout=120)
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def test_sweep_on_a_ray_cluster_gives_the_local_rows(ray_head):
    local = CliRunner().invoke(main, SWEEP + ["--jobs", "1"])
    assert local.exit_code == 0, local.output
    remote = CliRunner().invoke(main, SWEEP + ["--ray", ray_head])
    assert remote.exit_code == 0, remote.output
    rows, expected = json.loads(remote.stdout), json.loads(local.stdout)
    assert [r["point"] for r in rows] == [r["point"] for r in expected]
    for got, want in zip(rows, expected):
        assert got["layout"] == want["layout"] and got["step_time_s"] == pytest.approx(want["step_time_s"])
        assert got["energy_per_step_j"] == pytest.approx(want["energy_per_step_j"])  # --pue reached the workers


def test_ray_address_nothing_answers_at_is_bad_input():
    result = CliRunner().invoke(main, SWEEP + ["--ray", f"127.0.0.1:{_free_port()}"])
    assert result.exit_code == 2 and "nothing answers" in result.output

"""``benchmarks/scale.py --quick``: the rollout side on a simulated cluster (modelled engine, real env actors,
samplers, driver and Ray) plays its point to the end and reports every number the performance page shows."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import cli_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.ci
def test_the_quick_point_reports_throughput_against_its_ideal_memory_and_start_up():
    done = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--quick"],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("SIMULATION:")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["simulation"] is True
    (point,) = summary["points"]
    assert point["point"] == "2x128x2" and point["envs_per_actor"] == 8
    # 128 env instances x 2 episodes each per iteration, one timed iteration after the warm-up
    assert point["episodes"] == 256
    assert 0 < summary["episodes_per_s_vs_ideal"] == point["episodes_per_s_vs_ideal"]
    assert 0 < point["engine_busy"] and point["driver_cpu_s_per_episode"] > 0
    assert point["trajectory_kb_per_episode"] > 0
    # the env actors' start-up is timed on its own, inside the whole pool's
    assert 0 < summary["env_actors_128_ready_s"] == point["env_actors_ready_s"] <= point["ready_s"] + 1
    # 16 env actor processes and a sampler on each of 2 nodes: below the count at which Ray warns
    assert summary["ray_worker_warnings"] == point["ray_worker_warnings"] == 0
    # every actor kind measured beside the two references, in one run
    assert {"Bare", "LibrariesOnly", "EnvHost", "SamplerActor"} <= set(point["pss_mb"])
    above = point["pss_mb"]["EnvHost"] - point["pss_mb"]["LibrariesOnly"]
    assert summary["env_actor_pss_above_libraries_mb"] == pytest.approx(above, abs=0.11)
    assert "| 2x128x2 |" in done.stdout

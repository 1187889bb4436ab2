"""The real CLI: a training run that serves its policy, and `agentgym-rl serve`, polled over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentgym_rl.actors.weight_sync import free_port

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
ITERATIONS = 3


def start_cli(*args: str, cwd: Path, sigint_ignored: bool = False) -> subprocess.Popen:
    """The CLI as a child process with SIGINT's default action, or with SIGINT ignored (``sigint_ignored``) as a
    non-interactive shell starts a background job; either way whatever this process inherited is not passed on."""
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "AGENTGYM_RL_API_KEY")}
    return subprocess.Popen(
        [*command, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The child only sets one signal's disposition before exec (what a shell does for a background job).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.SIG_DFL),  # noqa: PLW1509
    )


@pytest.mark.slow
@pytest.mark.ci
def test_training_run_serves_each_new_version(tmp_path: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = {
        "model.name": "tiny-random",
        # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip (no new version)
        "algorithm.skip_uniform_groups": "false",
        "sampler.sampling.max_new_tokens": 8,
        "curriculum.horizons": "[2]",
        "trainer.iterations": ITERATIONS,
        "trainer.checkpoint_every": ITERATIONS,
        "logging.progress": "false",
        "warm_start.iterations": 0,
        "run.dir": tmp_path / "runs",
        "run.name": "served",
        "serve.enabled": "true",
        "serve.port": port,
        # Long enough for the pollers below to read the final version before the endpoint stops.
        "serve.linger_s": 20,
        "serve.num_cpus": 0.05,
    }
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    process = start_cli("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *overrides, cwd=tmp_path)

    versions: list[int] = []
    errors: list[str] = []
    served = 0
    final_seen = threading.Event()

    def poll_policy() -> None:
        while process.poll() is None and not final_seen.is_set():
            try:
                response = httpx.get(url + "/v1/policy", timeout=30)
            except httpx.TransportError:
                response = None
            if response is None or response.status_code != 200:
                # Serve's proxy answers 503 until the app's replicas are up; once a version has been
                # read the endpoint must stay up until the final one is.
                if versions:
                    errors.append(f"policy poll lost the server: {response and response.status_code}")
                    return
                time.sleep(0.5)
                continue
            versions.append(response.json()["weights_version"])
            if versions[-1] == ITERATIONS:
                final_seen.set()
            time.sleep(0.1)

    def request_stream() -> None:
        nonlocal served
        body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        while process.poll() is None and not final_seen.is_set():
            if not versions:
                time.sleep(0.5)
                continue
            try:
                response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            except httpx.TransportError as exc:
                errors.append(f"request failed: {exc!r}")
                return
            if response.status_code != 200:
                errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            served += 1

    threads = [threading.Thread(target=poll_policy), threading.Thread(target=request_stream)]
    for thread in threads:
        thread.start()
    try:
        output, _ = process.communicate(timeout=600)
    finally:
        process.kill()
        for thread in threads:
            thread.join()
    assert process.returncode == 0, output[-3000:]
    assert errors == []
    assert versions == sorted(versions), versions
    assert versions[-1] == ITERATIONS and len(set(versions)) >= 2, versions
    assert served > 0


@pytest.mark.slow
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "background-job"])
def test_serve_command_until_ctrl_c(tmp_path: Path, sigint_ignored: bool):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ("serve", "--model", "tiny-random", "--port", str(port), "--api-key", "k", "--set", "serve.max_n=1")
    process = start_cli(*args, cwd=tmp_path, sigint_ignored=sigint_ignored)
    lines: list[str] = []
    serving = threading.Event()

    def read_output() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("serving "):
                serving.set()

    reader = threading.Thread(target=read_output)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "server did not come up"
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 401
        models = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k"}, timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["tiny-random"]
        too_many = httpx.post(
            url + "/v1/chat/completions",
            headers={"Authorization": "Bearer k"},
            json={"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 1},
            timeout=120,
        )
        assert too_many.status_code == 400 and "max_n" in too_many.text, too_many.text  # the --set took effect
        # The ingress answers before the command has finished starting every deployment; Ctrl-C comes
        # once it says it is serving.
        assert serving.wait(timeout=300), "".join(lines)[-3000:]
        process.send_signal(signal.SIGINT)
        # About 3 s at load 5; a shutdown stuck for 60 s ends the command with its threads' stacks in the output.
        try:
            process.wait(timeout=360)
        except subprocess.TimeoutExpired:
            pytest.fail("no exit within 360 s of Ctrl-C; output:\n" + "".join(lines)[-3000:])
    finally:
        process.kill()
        reader.join(timeout=30)
    assert process.returncode == 130, "".join(lines)[-3000:]


def test_serve_command_rejects_a_missing_checkpoint(tmp_path: Path):
    process = start_cli("serve", "--checkpoint", str(tmp_path / "nothing"), cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "config.json" in output


def test_serve_command_names_a_bad_setting(tmp_path: Path):
    process = start_cli("serve", "--model", "tiny-random", "--set", "serve.max_batch_sise=4", cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "serve.max_batch_sise: unknown key" in output

"""`agentgym-rl view` on a real tiny run: JSON routes over HTTP, and the page in headless Chromium."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import uvicorn

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.cli import main
from agentgym_rl.envs.babyai import BabyAIEnv
from agentgym_rl.serve.viewer import RunReader, ViewerError, build_app
from tests.factories import make_trajectory

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KEPT = 6  # logging.max_trajectories_per_iteration, below the 8 episodes an iteration plays
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cli(*args: str) -> list[str]:
    return [str(CLI), *args] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli", *args]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-type"], error.read()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def oracle_trajectory(chat: ChatFormat, env: BabyAIEnv, task_id: int) -> Trajectory:
    """The BabyAI bot's episode laid out token by token the way the rollout loop lays out a policy's."""
    actions = env.oracle_episode(task_id)
    first = env.reset(task_id)
    messages = [{"role": "system", "content": env.instruction}, {"role": "user", "content": first.text}]
    ids = chat.prompt_ids(messages)
    prompt_length = len(ids)
    mask, spans, replies, rewards = [0] * len(ids), [], [], []
    for turn, action in enumerate(actions):
        reply = f"Thought: the bot says so.\nAction: {action}"
        sampled = chat.encode(reply)
        spans.append((len(ids), len(ids) + len(sampled)))
        ids, mask = ids + sampled, mask + [1] * len(sampled)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
        result = env.step(reply)
        rewards.append(result.reward)
        if turn < len(actions) - 1:
            messages.append({"role": "user", "content": result.observation})
            continuation = chat.continuation_ids(sampled, result.observation)
            ids, mask = ids + continuation, mask + [0] * len(continuation)
    assert result.done and result.info["success"]
    return make_trajectory(
        ids,
        mask,
        rewards,
        task_id=task_id,
        logprobs=[0.0] * len(ids),
        prompt_length=prompt_length,
        turn_spans=spans,
        messages=messages,
        actions=replies,
        success=True,
    )


@pytest.fixture(scope="module")
def oracle_viewer(tmp_path_factory, tokenizer):
    """A hand-made run directory holding one solved BabyAI episode, served on 127.0.0.1 in a thread."""
    config = Config.model_validate(
        {"model": {"name": "tiny-random"}, "env": {"name": "babyai", "options": {"levels": ["GoToRedBallGrey"]}}}
    )
    run = RunDir(tmp_path_factory.mktemp("oracle") / "run")
    run.create(config)
    env = BabyAIEnv(levels=["GoToRedBallGrey"])
    trajectory = oracle_trajectory(ChatFormat(tokenizer), env, env.tasks("train")[0])
    env.close()
    run.write_trajectories(0, [trajectory])
    server = uvicorn.Server(
        uvicorn.Config(build_app(run.path), host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            pytest.fail("the viewer server thread exited before it started")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.config.port}", trajectory
    server.should_exit = True
    thread.join(timeout=30)


def test_solved_episode_shows_parsed_actions_tokens_and_frames(oracle_viewer, tokenizer):
    base, trajectory = oracle_viewer
    iterations = json.loads(get(f"{base}/api/iterations")[2])
    assert iterations == [{"iteration": 0, "episodes": 1, "successes": 1, "metrics": None}]
    assert [e["index"] for e in json.loads(get(f"{base}/api/episodes?iteration=0&success=true")[2])] == [0]
    assert json.loads(get(f"{base}/api/episodes?iteration=0&success=false")[2]) == []

    episode = json.loads(get(f"{base}/api/episode/0/0")[2])
    assert episode["success"] and episode["frames"]
    assert [t["action"] for t in episode["turns"]] == [a.split("Action: ")[1] for a in trajectory.actions]
    assert all(t["invalid_reason"] is None and t["sampled_mask_ok"] for t in episode["turns"])
    assert [t["reward"] for t in episode["turns"]] == trajectory.step_rewards and episode["reward"] > 0
    for turn, (start, end) in zip(episode["turns"], trajectory.turn_spans, strict=True):
        assert turn["sampled"]["text"] == tokenizer.decode(trajectory.token_ids[start:end])
    assert episode["prompt"]["tokens"] == trajectory.prompt_length
    # The env ended the episode, so no observation follows the last reply.
    assert episode["turns"][-1]["next_observation"] is None

    frames = [get(f"{base}/api/frame/0/0/{step}.png")[2] for step in range(trajectory.num_turns + 1)]
    assert all(frame.startswith(PNG_SIGNATURE) for frame in frames)
    assert frames[0] != frames[-1]  # the agent moved to the ball


def test_episode_without_the_runs_tokenizer_still_shows_turns(oracle_viewer, tmp_path: Path):
    _, trajectory = oracle_viewer
    run = RunDir(tmp_path / "moved")
    run.create(Config.model_validate({"model": {"name": str(tmp_path / "model-that-was-deleted")}}))
    run.write_trajectories(0, [trajectory])
    episode = RunReader(run.path).episode(0, 0)
    assert [t["reply"] for t in episode["turns"]] == trajectory.actions
    assert episode["turns"][0]["sampled"] == {
        "text": None,
        "tokens": trajectory.turn_spans[0][1] - trajectory.turn_spans[0][0],
    }
    assert "model-that-was-deleted" in episode["notes"][0]


def test_half_written_last_line_is_skipped_and_a_broken_line_is_an_error(oracle_viewer, tmp_path: Path):
    _, trajectory = oracle_viewer
    run = RunDir(tmp_path / "run")
    run.create(Config())
    line = trajectory.model_dump_json()
    (run.trajectories / "iter_000000.jsonl").write_text(line + "\n" + line[:50])
    reader = RunReader(run.path)
    assert [e["index"] for e in reader.episodes(0, {})] == [0]
    (run.trajectories / "iter_000001.jsonl").write_text(line[:50] + "\n" + line + "\n")
    with pytest.raises(ViewerError, match="iter_000001.jsonl line 1 is not a trajectory") as caught:
        reader.episodes(1, {})
    assert caught.value.status == 500


def test_view_refuses_a_directory_without_a_run(tmp_path: Path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("viewer")
    settings = {
        "model.name": "tiny-random",
        "sampler.sampling.max_new_tokens": "16",
        "trainer.iterations": "2",
        "trainer.checkpoint_every": "2",
        "curriculum.horizons": "[2, 3]",
        "curriculum.advance_every": "1",
        "logging.progress": "false",
        "warm_start.iterations": "0",
        "logging.max_trajectories_per_iteration": str(KEPT),
        "run.dir": str(root / "runs"),
        "run.name": "tiny",
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    result = subprocess.run(
        cli("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *sets),
        cwd=root,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "runs" / "tiny"


@pytest.fixture(scope="module")
def viewer(run_dir: Path):
    port = free_port()
    process = subprocess.Popen(
        cli("view", str(run_dir), "--port", str(port)),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # readiness wait: the CLI imports torch and ray first
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/run", timeout=5)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"viewer did not start: {process.stdout.read()[-3000:]}")
            time.sleep(0.5)
    yield base
    process.terminate()
    process.wait(timeout=30)


def trajectories(run_dir: Path, iteration: int) -> list[Trajectory]:
    path = run_dir / "trajectories" / f"iter_{iteration:06d}.jsonl"
    return [Trajectory.model_validate_json(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_json_routes_answer_from_the_run_files(run_dir: Path, viewer: str):
    status, _, body = get(f"{viewer}/api/run")
    assert status == 200 and json.loads(body)["model"] == "tiny-random"

    iterations = json.loads(get(f"{viewer}/api/iterations")[2])
    assert [row["iteration"] for row in iterations[:2]] == [0, 1]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["metrics"]["horizon"] for row in iterations[:2]] == [m["horizon"] for m in metrics] == [2, 3]

    stored = trajectories(run_dir, 1)
    assert len(stored) == KEPT
    episodes = json.loads(get(f"{viewer}/api/episodes?iteration=1")[2])
    assert [(e["index"], e["task_id"], e["turns"]) for e in episodes] == [
        (i, t.task_id, t.num_turns) for i, t in enumerate(stored)
    ]
    task = stored[-1].task_id
    filtered = json.loads(get(f"{viewer}/api/episodes?iteration=1&task={task}&success=false")[2])
    assert [e["index"] for e in filtered] == [i for i, t in enumerate(stored) if t.task_id == task and not t.success]
    assert json.loads(get(f"{viewer}/api/episodes?iteration=1&min_reward=0.5")[2]) == [
        e for e in episodes if e["reward"] >= 0.5
    ]

    episode = json.loads(get(f"{viewer}/api/episode/1/0")[2])
    assert [turn["reply"] for turn in episode["turns"]] == stored[0].actions
    assert [turn["sampled"]["tokens"] for turn in episode["turns"]] == [b - a for a, b in stored[0].turn_spans]
    assert all(turn["sampled_mask_ok"] for turn in episode["turns"])

    for step in range(stored[0].num_turns + 1):
        status, kind, png = get(f"{viewer}/api/frame/1/0/{step}.png")
        assert status == 200 and kind == "image/png" and png.startswith(PNG_SIGNATURE)

    for path, message in [
        ("/api/episode/1/99", "not 99"),
        ("/api/episodes?iteration=7", "iteration 7"),
        (f"/api/frame/1/0/{stored[0].num_turns + 1}.png", "frames 0.."),
        ("/api/nothing", "no route"),
    ]:
        status, kind, body = get(viewer + path)
        assert status == 404 and kind == "application/json" and message in json.loads(body)["error"], path
    status, _, body = get(f"{viewer}/api/episodes?iteration=one")
    assert status == 422 and "iteration" in json.loads(body)["error"]


@pytest.mark.slow
def test_page_replays_an_episode_and_follows_the_run(run_dir: Path, viewer: str, tmp_path: Path, tokenizer):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (./install.sh does, as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[dev]'")
    stored = trajectories(run_dir, 1)
    index = 3
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(viewer)
        page.locator("#iterations tbody tr[data-iteration='1']").click()
        page.locator(f"[data-testid=episode-row][data-index='{index}']").click()
        turns = page.locator("[data-testid=turn]")
        sync_api.expect(turns).to_have_count(stored[index].num_turns)

        observations = [m["content"] for m in stored[index].messages if m["role"] == "user"]
        for turn in range(stored[index].num_turns):
            card = turns.nth(turn)
            assert card.locator("[data-testid=reply]").text_content() == stored[index].actions[turn]
            assert card.locator("[data-testid=observation]").text_content() == observations[turn]
            assert float(card.locator("[data-testid=reward]").text_content()) == stored[index].step_rewards[turn]
            assert card.locator("[data-testid=action]").text_content()
        # The first turn's token view: the loss-masked span is the decoded sampled tokens, highlighted.
        turns.nth(0).locator("summary").click()
        sampled = turns.nth(0).locator("[data-testid=sampled]")
        sync_api.expect(sampled).to_be_visible()
        start, end = stored[index].turn_spans[0]
        assert sampled.text_content() == tokenizer.decode(stored[index].token_ids[start:end])
        frames = page.locator("[data-testid=frame]")
        sync_api.expect(frames).to_have_count(stored[index].num_turns + 1)
        page.wait_for_function(
            "() => [...document.querySelectorAll('[data-testid=frame]')].every(i => i.complete && i.naturalWidth > 0)"
        )
        page.screenshot(path=str(tmp_path / "viewer.png"), full_page=True)
        shutil.copy(tmp_path / "viewer.png", "/tmp/viewer.png")

        # A new iteration file appears as a live run would write it; the page's poll picks it up.
        shutil.copy(run_dir / "trajectories" / "iter_000001.jsonl", run_dir / "trajectories" / "iter_000002.jsonl")
        sync_api.expect(page.locator("#iterations tbody tr")).to_have_count(3, timeout=30_000)

        # A multi-env run's line: the row shows each env's horizon, and each env's success rate on hover.
        mixed = {"iteration": 2, "success_rate": 0.5, "horizon": 8, "env/babyai/success_rate": 0.75}
        mixed |= {"env/babyai/horizon": 3, "env/textcraft/success_rate": 0.25, "env/textcraft/horizon": 8}
        with (run_dir / "metrics.jsonl").open("a") as metrics:
            metrics.write(json.dumps(mixed) + "\n")
        row = page.locator("#iterations tbody tr[data-iteration='2'] td")
        sync_api.expect(row.nth(1)).to_have_text("babyai 3 · textcraft 8", timeout=30_000)
        assert row.nth(2).text_content() == "0.50"
        assert row.nth(2).get_attribute("title") == "babyai 0.75 · textcraft 0.25"
        browser.close()

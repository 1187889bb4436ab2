"""Train on an OpenEnv server: `python docs/examples/openenv_train.py`.

The server is written here with the `openenv` package's own classes (an `Environment` subclass served by
`create_app`), as any OpenEnv env is: "reverse the word", its action `{"text": ...}`, its observation the
word to reverse and a hint, reward 1 and done when the reply ends with the word reversed (done after 3
tries otherwise), and the task API (splits `train` and `test`, a word per task) that env `openenv` reads
its task ids from.

Run without arguments, the script starts the server (`python openenv_train.py serve --port N`), plays one
test episode on it through env `openenv` in this process, then trains `--iterations` GRPO iterations on it
with the real actors (`tiny-random` by default: it never reverses a word, so every reward is 0; the run
shows the plumbing) and checks the run's metrics. Needs the openenv extra: `pip install -e '.[openenv]'`.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORDS = {
    "train": ["agent", "reward", "policy", "token", "episode", "action", "memory", "sample"],
    "test": ["gradient", "horizon", "critic"],
}


def serve(port: int) -> None:
    """The reverse-the-word env on 127.0.0.1:``port``, written with openenv's server classes."""
    import uvicorn
    from openenv.core.env_server import Action, Environment, Observation, State, create_app
    from pydantic import Field

    class Reply(Action):
        text: str = Field(description="The reply; its last word is the answer.")

    class Word(Observation):
        word: str = Field(description="The word to reverse.")
        hint: str = Field(description="What the last reply got.")

    class ReverseEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session gets its own instance

        def __init__(self) -> None:
            super().__init__()
            self._state, self._word = State(), ""

        def reset(self, seed=None, episode_id=None, split: str = "train", index: int = 0, **_: Any) -> Word:
            self._state, self._word = State(episode_id=episode_id), WORDS[split][index]
            return Word(word=self._word, hint="Reply with the word spelled backwards.")

        def step(self, action: Reply, timeout_s=None, **_: Any) -> Word:
            self._state.step_count += 1
            words = action.text.split()
            right = bool(words) and words[-1].strip(".\"'").lower() == self._word[::-1]
            hint = "right" if right else "not the word reversed"
            done = right or self._state.step_count >= 3
            return Word(word=self._word, hint=hint, reward=float(right), done=done)

        @property
        def state(self) -> State:
            return self._state

        def list_splits(self) -> list[str]:
            return list(WORDS)

        def num_tasks(self, split: str) -> int:
            return len(WORDS[split])

        def list_tasks(self, split: str) -> list[dict[str, Any]]:
            return [{"split": split, "index": i, "word": word} for i, word in enumerate(WORDS[split])]

    app = create_app(ReverseEnv, Reply, Word, env_name="reverse", max_concurrent_envs=16)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server() -> tuple[subprocess.Popen, str]:
    """This script's server in its own process, once its /health answers; returns it and its URL."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).is_success:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the OpenEnv server did not start at {url}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--run-dir", default=None, help="parent of the run directory (default: a temporary one)")
    args = parser.parse_args(argv)

    from agentgym_rl.driver.cli import main as agentgym_rl
    from agentgym_rl.envs import make

    server, url = start_server()
    try:
        # `text`, the action schema's one string field, receives the reply's "Action:" line; the observation's
        # fields `word` and `hint` are what the model reads.
        options = {"base_url": url, "instruction": "Reverse the word. End your reply with: Action: <reversed word>"}
        env = make("openenv", options)
        try:
            train, test = env.tasks("train"), env.tasks("test")
            print(f"tasks: train {list(train)}, test {list(test)}")
            print(f"task {test[0]}: {env.reset(test[0]).text!r}")
            for reply in ("Action: gradient", "It is spelled backwards.\nAction: tneidarg"):
                step = env.step(reply)
                print(f"{reply!r} -> {step.observation!r} (reward {step.reward}, done {step.done})")
            assert step.done and step.reward == 1.0
        finally:
            env.close()

        runs = args.run_dir or tempfile.mkdtemp(prefix="openenv-train-")
        settings = {
            "env.name": "openenv",
            "env.options": json.dumps(options),
            "model.name": args.model,
            "warm_start.iterations": 0,
            "curriculum.schedule": "fixed",
            "curriculum.horizon": 3,
            "algorithm.skip_uniform_groups": "false",  # tiny-random's groups all score 0: train on them anyway
            "trainer.iterations": args.iterations,
            "trainer.tasks_per_iteration": 2,
            "algorithm.group_size": 2,
            "sampler.envs_per_sampler": 2,
            "sampler.sampling.max_new_tokens": 16,
            "logging.progress": "false",
            "run.dir": runs,
            "run.name": "openenv-reverse",
        }
        overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
        status = agentgym_rl(["train", "warm_start_grpo.yaml", *overrides])
        assert status == 0, f"training exited with {status}"
    finally:
        server.terminate()
        server.wait(10)

    run = Path(runs) / "openenv-reverse"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(args.iterations))
    assert all(r["rollout/episodes"] == 4 and r["rollout/failed"] == 0 for r in records)
    for record in records:
        print(f"iteration {record['iteration']}: success rate {record['success_rate']:.2f}")
    print(f"run directory: {run}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_parser = argparse.ArgumentParser(description="serve the reverse-the-word env")
        serve_parser.add_argument("--port", type=int, required=True)
        serve(serve_parser.parse_args(sys.argv[2:]).port)
    else:
        main()

"""An MCP server's tools as an environment, then trained on: `python docs/examples/mcp_calculator.py`.

This one file is all three things env `mcp` needs beside the task file (`mcp_calculator_tasks.jsonl`):

- the MCP server: `python mcp_calculator.py serve` runs a calculator on stdio with the `mcp` SDK's FastMCP;
- the reward: `mcp_calculator:reward` scores an episode from its task and the agent's answer;
- the check: run without arguments, it plays one episode in this process with hand-written replies (a tool
  call, a tool error, the answer), then trains `--iterations` GRPO iterations on the server with the real
  actors (`tiny-random` by default: it never answers, so every reward is 0; the run shows the plumbing) and
  checks the run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASKS = HERE / "mcp_calculator_tasks.jsonl"


def serve() -> None:
    """The calculator MCP server on stdio (the env starts it as `python mcp_calculator.py serve`)."""
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("calculator", log_level="WARNING")

    @server.tool()
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @server.tool()
    def multiply(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    @server.tool()
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b  # b = 0 raises; the agent reads the error as the tool's result

    server.run("stdio")


def reward(*, task: dict[str, Any], messages: list[dict[str, str]], tool_results: list, answer: str | None):
    """1 when the answer is the task's `target` (within 1e-6); success also needs a tool call that worked."""
    try:
        right = answer is not None and abs(float(answer) - task["target"]) < 1e-6
    except ValueError:  # an answer that is not a number
        right = False
    return float(right), right and any(not result.is_error for result in tool_results)


def env_options() -> dict[str, Any]:
    """`env.options` of env `mcp` for this server, its tasks and its reward."""
    return {
        "command": sys.executable,
        "args": [str(Path(__file__).resolve()), "serve"],
        "tasks": str(TASKS),
        "reward": "mcp_calculator:reward",
        "max_turns": 4,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--run-dir", default=None, help="parent of the run directory (default: a temporary one)")
    args = parser.parse_args(argv)

    # The env actors import the reward as "mcp_calculator:reward": this folder goes on PYTHONPATH before Ray
    # starts (its workers inherit it), and on this process's path for the episode played here.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, str(HERE))
    from agentgym_rl.driver.cli import main as agentgym_rl
    from agentgym_rl.envs import make

    env = make("mcp", env_options())
    try:
        print(env.instruction)
        task = env.tasks("test")[0]
        print(f"task {task}: {env.reset(task).text}")
        for reply in ('Action: divide {"a": 1, "b": 0}', 'Action: multiply {"a": 6, "b": 7}', "Action: answer 42"):
            step = env.step(reply)
            print(f"{reply!r} -> {step.observation!r} (reward {step.reward}, done {step.done})")
        assert step.done and step.reward == 1.0 and step.info["success"]
    finally:
        env.close()

    runs = args.run_dir or tempfile.mkdtemp(prefix="mcp-calculator-")
    settings = {
        "env.name": "mcp",
        "env.options": json.dumps(env_options()),
        "model.name": args.model,
        "warm_start.iterations": 0,
        "curriculum.schedule": "fixed",
        "curriculum.horizon": 4,
        "algorithm.skip_uniform_groups": "false",  # tiny-random's groups all score 0: train on them anyway
        "trainer.iterations": args.iterations,
        "trainer.tasks_per_iteration": 2,
        "algorithm.group_size": 2,
        "sampler.envs_per_sampler": 2,
        "sampler.sampling.max_new_tokens": 24,
        "logging.progress": "false",
        "run.dir": runs,
        "run.name": "mcp-calculator",
    }
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    status = agentgym_rl(["train", "warm_start_grpo.yaml", *overrides])
    assert status == 0, f"training exited with {status}"

    run = Path(runs) / "mcp-calculator"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(args.iterations))
    assert all(r["rollout/episodes"] == 4 for r in records)
    for record in records:
        print(f"iteration {record['iteration']}: success rate {record['success_rate']:.2f}")
    print(f"run directory: {run}")


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        main()

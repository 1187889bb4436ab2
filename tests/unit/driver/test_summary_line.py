"""The one line `agentgym-rl train` ends with, in every mode."""

from pathlib import Path

from agentgym_rl.driver.cli import summary_line
from agentgym_rl.driver.trainer import RunEnd

LAST = {"iteration": 1, "success_rate": 0.5, "mean_reward": 0.25}


def test_a_finished_run_says_its_last_iteration_of_all_and_its_mode():
    line = summary_line(RunEnd(LAST, iterations=2, stopped_early=False), "agentevol", None, Path("runs/a"))
    assert line == "finished iteration 1 of 2 (agentevol): success_rate=0.500 mean_reward=0.250; run directory: runs/a"


def test_only_a_run_stopped_by_the_time_limit_says_so():
    line = summary_line(RunEnd(LAST, iterations=4, stopped_early=True), "sync", 60.0, Path("runs/a"))
    assert line.startswith("agentgym-rl: stopped before --time-limit 60 s after iteration 1 of 4, checkpointed")
    assert line.endswith("Continue with: agentgym-rl train --resume runs/a")
    # a run with fewer iterations than the config's (AgentEvol counts rounds) is not "stopped" unless it was
    assert "stopped" not in summary_line(RunEnd(LAST, iterations=2, stopped_early=False), "sync", None, Path("r"))


def test_a_resumed_run_with_nothing_left_says_it_had_finished():
    line = summary_line(RunEnd({}, iterations=3, stopped_early=False), "offline", None, Path("runs/a"))
    assert line == "nothing to train: the run in runs/a already finished its 3 iterations (offline)"

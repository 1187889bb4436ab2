"""Third-party lines kept out of the output at their source: the helper, and the BabyAI level generator's."""

import sys

import gymnasium
import minigrid  # noqa: F401  (registers the BabyAI levels)
import pytest
from tqdm import tqdm

from agentgym_rl.envs.babyai import BabyAIEnv, gym_id
from agentgym_rl.envs.output import without_lines


def test_without_lines_drops_a_progress_bar_and_the_named_lines_and_keeps_every_other_line(capsys):
    with without_lines("stderr", ("Converting", "retry:")):
        for _ in tqdm(range(3), desc="Converting tensors"):
            print("retry: again", file=sys.stderr)
        print("an error the user must see", file=sys.stderr)
    err = capsys.readouterr().err
    assert err == "an error the user must see\n"


def test_without_lines_lets_an_exception_out_and_still_writes_the_kept_lines(capsys):
    with pytest.raises(RuntimeError, match="boom"), without_lines("stdout", ("retry:",)):
        print("retry: again")
        print("kept")
        raise RuntimeError("boom")
    assert capsys.readouterr().out == "kept\n"


def test_a_babyai_reset_prints_none_of_minigrids_level_generation_retries(capsys):
    # seed 8 of GoToRedBallGrey: minigrid rejects a generated layout before it finds one, and says so
    gymnasium.make(gym_id("GoToRedBallGrey")).reset(seed=8)
    assert "Sampling rejected:" in capsys.readouterr().out
    env = BabyAIEnv(levels=["GoToRedBallGrey"])
    observation = env.reset(8 * 40)
    assert observation.info["seed"] == 8
    assert capsys.readouterr().out == ""

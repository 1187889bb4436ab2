"""Gateway mode's checkpointed state: the harvested episodes still waiting for their group survive a resume."""

from __future__ import annotations

import json

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import Config
from agentgym_rl.driver.modes.gateway import GatewayTrainer, episodes_in, first_episodes
from tests.factories import make_trajectory


def gateway(tmp_path) -> GatewayTrainer:
    config = Config.model_validate({"trainer": {"mode": "gateway"}, "serve": {"enabled": True}})
    return GatewayTrainer(config, RunDir(tmp_path / "run"))


def episode(task: int, reward: float, version: int):
    return make_trajectory([5, 6, 7, 8, 9], [0, 0, 1, 1, 0], [reward], group=task, weights_version=version)


def test_waiting_episodes_come_back_from_a_checkpoint_as_they_were(tmp_path):
    before = gateway(tmp_path)
    before.waiting["task-3"] += [episode(3, 1.0, 4), episode(3, 0.0, 5)]
    before.waiting["task-8"].append(episode(8, 0.0, 5))
    state = json.loads(json.dumps(before.checkpoint_state()))  # as trainer_state.json holds it
    resumed = gateway(tmp_path)
    resumed.load_checkpoint_state(state)
    assert resumed.waiting == before.waiting
    assert dict(gateway(tmp_path).checkpoint_state()) == {"waiting": {}}


def test_a_learner_restart_keeps_the_episodes_harvested_since_the_checkpoint(tmp_path):
    trainer = gateway(tmp_path)
    trainer.waiting["task-3"].append(episode(3, 1.0, 4))
    state = json.loads(json.dumps(trainer.checkpoint_state()))
    trainer.waiting["task-3"].append(episode(3, 0.0, 6))  # harvested after the checkpoint
    trainer.waiting["task-9"].append(episode(9, 1.0, 6))
    trainer.load_checkpoint_state(state)
    assert trainer.waiting == {
        "task-3": [episode(3, 1.0, 4), episode(3, 0.0, 6)],
        "task-9": [episode(9, 1.0, 6)],
    }


def test_a_group_counts_episodes_and_takes_each_with_all_its_segments():
    first, *later = [episode(3, 1.0, 4).model_copy(update={"segment": k}) for k in range(3)]
    second, third = episode(3, 0.0, 4), episode(3, 0.5, 5)
    waiting = [first, *later, second, third]
    assert episodes_in(waiting) == 3
    taken, rest = first_episodes(waiting, 2)
    assert taken == [first, *later, second] and rest == [third]
    assert first_episodes(waiting, 3) == (waiting, [])

"""The actors on a local Ray instance: samplers, curriculum, learner, weight sync."""

import pytest
import ray

from agentgym_rl.actors.curriculum import CurriculumActor
from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.learner.actor import LearnerActor
from tests.factories import RECIPE

OVERRIDES = [
    "model.name=tiny-random",
    "env.options.levels=[GoToRedBall, GoToRedBallNoDists]",
    "sampler.envs_per_sampler=2",
    "sampler.num_cpus=0.25",
    "sampler.sampling.max_new_tokens=10",
    "learner.num_cpus=0.5",
    "learner.micro_batch_size=2",
    "learner.lr=1e-3",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "algorithm.skip_uniform_groups=false",
    "curriculum.schedule=stepwise",
    "curriculum.horizons=[2, 3]",
    "curriculum.advance_every=2",
]


@pytest.fixture(scope="module")
def system(ray_local):
    config = load_config(RECIPE, OVERRIDES)
    sampler_cls = ray.remote(SamplerActor).options(num_cpus=config.sampler.num_cpus, max_concurrency=100)
    samplers = [
        sampler_cls.remote(index=i, model=config.model, sampler=config.sampler, env=config.env, seed=0)
        for i in range(2)
    ]
    curriculum = ray.remote(CurriculumActor).options(num_cpus=0).remote(config.curriculum)
    learner = (
        ray.remote(LearnerActor)
        .options(num_cpus=config.learner.num_cpus)
        .remote(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)
    )
    yield {"config": config, "samplers": samplers, "curriculum": curriculum, "learner": learner}
    for handle in [*samplers, curriculum, learner]:
        ray.kill(handle)


def test_the_curriculums_horizon_reaches_an_episode_on_its_request(system):
    samplers, curriculum = system["samplers"], system["curriculum"]
    assert ray.get(curriculum.start_iteration.remote(1)) == {"horizon": 2, "changed": False}
    moved = ray.get(curriculum.start_iteration.remote(2))
    assert moved == {"horizon": 3, "changed": True}
    refs = start_collect(samplers[1], [EpisodeRequest(task_id=121, group=0, seed=5, horizon=moved["horizon"])])
    assert ray.get(refs[0]).horizon == 3


def test_an_episode_samples_the_same_tokens_whatever_it_is_batched_with(system):
    samplers = system["samplers"]
    alone = ray.get(start_collect(samplers[0], [EpisodeRequest(task_id=121, group=0, seed=77, horizon=2)])[0])
    tasks = [(122, 1), (121, 77), (161, 3)]
    crowd = [EpisodeRequest(task_id=t, group=i, seed=s, horizon=2) for i, (t, s) in enumerate(tasks)]
    batched = ray.get(start_collect(samplers[1], crowd)[1])
    assert batched.token_ids == alone.token_ids
    # Batched rows run GEMMs of other shapes (and left padding), which the CPU's BLAS may sum in another
    # order: a CI machine measured up to 4.9e-4 apart at log-probs near -10.8. 2e-3 is a 0.2 % importance
    # ratio, far inside any clip range; the tokens above are the exact claim.
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=2e-3)


def test_oracle_policy_plays_demonstrations(ray_local):
    overrides = [
        "sampler.policy=oracle",
        "sampler.max_context_tokens=16000",
        "env.options.levels=[GoToRedBall]",
        "env.options.oracle=true",
    ]
    config = load_config(RECIPE, [*OVERRIDES, *overrides])
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.1)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    # No curriculum pushed a horizon to this sampler: each request carries its own.
    refs = start_collect(sampler, [EpisodeRequest(task_id=t, group=0, seed=0, horizon=20) for t in (121, 161)])
    ray.wait(refs, num_returns=len(refs))
    ray.kill(sampler)
    # Each trajectory is a return value of the one call (nothing else stored it), owned by this process: it
    # outlives the sampler that played it.
    assert len(set(refs)) == 2 and len({ref.task_id() for ref in refs}) == 1
    trajectories = ray.get(refs)
    for trajectory in trajectories:
        assert trajectory.horizon == 20
        assert trajectory.success and trajectory.done and not trajectory.truncated
        assert all(action.startswith("Action: ") for action in trajectory.actions)
        assert sum(trajectory.loss_mask) == sum(end - start for start, end in trajectory.turn_spans)


def test_rollout_update_and_weight_sync(system):
    samplers, learner = system["samplers"], system["learner"]
    before = ray.get(samplers[0].state.remote())
    tasks = enumerate([121, 122])
    requests = [EpisodeRequest(task_id=t, group=g, seed=10 * g + k, horizon=2) for g, t in tasks for k in range(2)]
    refs = start_collect(samplers[0], requests)
    assert all(isinstance(ref, ray.ObjectRef) for ref in refs)
    trajectories = ray.get(refs)
    assert [(t.task_id, t.group) for t in trajectories] == [(121, 0), (121, 0), (122, 1), (122, 1)]
    for trajectory in trajectories:
        assert trajectory.weights_version == 0
        assert 1 <= trajectory.num_turns <= 2
        sampled = {i for start, end in trajectory.turn_spans for i in range(start, end)}
        assert {i for i, m in enumerate(trajectory.loss_mask) if m} == sampled
    stats = ray.get(samplers[0].state.remote())
    assert stats["generated_tokens"] - before["generated_tokens"] == sum(t.num_sampled_tokens for t in trajectories)
    # Turns in flight together were decoded together: fewer decode steps than sampled tokens.
    assert stats["batcher_steps"] - before["batcher_steps"] < stats["generated_tokens"] - before["generated_tokens"]

    before = ray.get(learner.publish_weights.remote())
    metrics = ray.get(learner.update.remote(refs))
    # The learner scores exactly the ids the sampler sampled: its log-probabilities agree.
    assert metrics["learner/sampler_logprob_abs_diff"] < 1e-3
    assert metrics["learner/tokens"] == sum(t.num_sampled_tokens for t in trajectories)
    assert metrics["learner/grad_norm"] > 0
    after = ray.get(learner.publish_weights.remote())
    old, new = ray.get(before[0]), ray.get(after[0])
    assert (old.version, new.version) == (0, 1)
    changed = [name for name in old.arrays if not (old.arrays[name] == new.arrays[name]).all()]
    assert changed, "no parameter changed after the update"

    versions = ray.get([s.load_weights.remote(after) for s in samplers])
    assert versions == [1, 1]
    assert [s["weights_version"] for s in ray.get([s.state.remote() for s in samplers])] == [1, 1]
    next_refs = start_collect(samplers[1], [EpisodeRequest(task_id=121, group=0, seed=5, horizon=2)])
    assert ray.get(next_refs[0]).weights_version == 1

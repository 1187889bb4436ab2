"""GPU placement on clusters that declare GPUs they do not have (this machine has none).

Each check runs in a subprocess with its own local Ray instance started with ``num_gpus`` (the session's
``ray_local`` has no GPUs and stays undisturbed): the pre-start resource check counts the learners'
and samplers' GPUs, and an actor that reserves no GPU sees none while one that reserves a GPU sees
the one Ray gives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent(
    """
    import json, os
    import ray
    from agentgym_rl.configs import Config

    ray.init(address="local", num_cpus=16, num_gpus=8, include_dashboard=False, _node_ip_address="127.0.0.1")

    def config(**sections):
        return Config.model_validate({"model": {"name": "tiny-random"}, **sections})
    """
)


def run(body: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    script = PRELUDE + textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_resource_check_counts_learner_and_sampler_gpus_on_an_8_gpu_node():
    found = run(
        """
        from agentgym_rl.actors.cluster import ClusterError
        from agentgym_rl.driver.needs import plan_run

        out = {}
        for samplers in (8, 7):
            sampler = {"count": samplers, "min_count": samplers, "envs_per_sampler": 1, "min_envs_per_sampler": 1,
                       "num_cpus": 0.5, "env_num_cpus": 0.1}
            try:
                out[samplers] = plan_run(config(sampler=sampler))
            except ClusterError as exc:
                out[samplers] = str(exc)
        print(json.dumps(out))
        """
    )
    refusal = found["8"]
    assert isinstance(refusal, str)
    assert (
        "1 learner(s) (learner.count, learner.num_cpus, learner.num_gpus, learner.resources) x {CPU: 1, GPU: 1}"
        in refusal
    )
    assert "8 sampler(s) of env babyai (sampler.min_count) x {CPU: 0.5, GPU: 1}" in refusal
    assert "In all {CPU: 5.8, GPU: 9}" in refusal and "node 0: {CPU: 16, GPU: 8}" in refusal
    assert found["7"] == [[1] * 7]  # one learner GPU + 7 sampler GPUs fill the node


def test_an_actor_without_a_gpu_reservation_sees_no_gpu():
    found = run(
        """
        from agentgym_rl.actors.curriculum import CurriculumActor
        from agentgym_rl.configs.schema import CurriculumConfig
        from agentgym_rl.envs.actor import create_env_actor
        from agentgym_rl.learner.actor import LearnerActor

        def visible(actor):
            return ray.get(actor.__ray_call__.remote(lambda self: os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")))

        cfg = config()
        learner = lambda gpus: ray.remote(LearnerActor).options(num_cpus=1, num_gpus=gpus).remote(
            model=cfg.model, learner=cfg.learner, algorithm=cfg.algorithm, seed=0
        )
        no_gpu, one_gpu = learner(0), learner(1)
        out = {
            "learner without a GPU": visible(no_gpu),
            "learner with one GPU": visible(one_gpu),
            "its device": ray.get(one_gpu.describe.remote())["device"],
            "env actor": visible(create_env_actor("babyai")),
            "curriculum": visible(ray.remote(CurriculumActor).options(num_cpus=0).remote(CurriculumConfig())),
        }
        print(json.dumps(out))
        """
    )
    assert found["learner without a GPU"] == ""
    assert found["env actor"] == "" and found["curriculum"] == ""
    # Ray hands the reserving learner one of the 8 declared GPUs; no CUDA device exists here, so it computes
    # on the CPU (learner.device auto).
    assert found["learner with one GPU"] in {str(i) for i in range(8)}
    assert found["its device"] == "cpu"


def test_colocated_mode_fits_8_learners_and_8_samplers_in_8_bundles_sharing_each_gpu():
    found = run(
        """
        from agentgym_rl.actors.cluster import ClusterError
        from agentgym_rl.driver.samplers.pool import SamplerPool
        from agentgym_rl.driver.learner_group import start_learners
        from agentgym_rl.driver.needs import plan_run

        def run_config(placement, count):
            return config(
                trainer={"placement": placement},
                learner={"backend": "deepspeed", "count": count, "num_cpus": 1},
                sampler={"count": count, "envs_per_sampler": 1, "min_envs_per_sampler": 1, "num_cpus": 0.5,
                         "env_num_cpus": 0.1},
            )

        out = {"colocated": plan_run(run_config("colocated", 8))}
        try:
            out["disaggregated"] = plan_run(run_config("disaggregated", 8))
        except ClusterError as exc:
            out["disaggregated"] = str(exc)

        # One learner and its sampler really started: one bundle, the same GPU for both.
        cfg = config(trainer={"placement": "colocated"}, learner={"num_cpus": 1},
                     sampler={"envs_per_sampler": 1, "num_cpus": 0.5, "env_num_cpus": 0.1})
        group = start_learners(cfg, total_updates=1)
        pool = SamplerPool(cfg)
        pool.bundles = group.colocation
        pool.start([1])
        def visible(actor):
            return ray.get(actor.__ray_call__.remote(lambda self: os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")))
        table = ray.util.placement_group_table(group.placement)
        out["bundle"] = table["bundles"][0]
        out["learner sees"], out["sampler sees"] = visible(group.actors[0]), visible(pool.samplers[0])
        out["gpus free"] = ray.available_resources().get("GPU", 0)
        print(json.dumps(out))
        """
    )
    assert found["colocated"] == [[1] * 8]  # 8 samplers planned, each with its env actor
    assert (
        "8 learner(s) (learner.count, learner.num_cpus, learner.num_gpus, learner.resources) x {CPU: 1, GPU: 1}"
        in (found["disaggregated"])
    )
    assert found["bundle"] == {"CPU": 1.5, "GPU": 1.0}
    assert found["learner sees"] == found["sampler sees"] and found["learner sees"] in {str(i) for i in range(8)}
    assert found["gpus free"] == 7  # the pair holds one GPU between them

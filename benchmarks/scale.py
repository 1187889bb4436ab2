"""The rollout side at scale, on a simulated cluster: a SIMULATION of the model's compute, everything else real.

    python benchmarks/scale.py [--quick] [--points 1x8x1 2x32x4 4x128x16] [--iterations 3] [--envs-per-actor K]

Each point ``NODESxENV_ACTORSxSAMPLERS`` (env actors counted as env instances: with ``--envs-per-actor K`` each env
actor process holds K of them, ``sampler.envs_per_actor``) starts a ``ray.cluster_utils`` cluster of that many Ray
nodes on this machine (every node is a real raylet; they share its cores and memory), then the run's own driver
code: a ``SamplerGroup`` with its pools, one per env, started by the trainer's ``RolloutDispatch`` and plan,
playing BabyAI episodes (real env actors) for a few iterations of GRPO groups. The one thing replaced is the model:
the samplers' engine is ``modelled`` (``actors/engines/modelled.py``), which draws replies and sleeps as long as a
GPU engine with continuous batching would compute them (a 7B model on one H100 by its roofline), so 16 samplers fit
on 2 cores. No learner runs: the point is the rollout side's cost as it grows.

Per point: episodes/s against the modelled engines' ideal for the same load (every engine always full: its
generated tokens in steps of as many rows as it has env instances, plus its prefill, spread over the samplers),
the engines' busy share, driver CPU seconds per episode, trajectory bytes per episode (pickled, as they sit in
the object store), start-up (the whole pool, and the env actors alone: the end of the last one's constructor),
how often Ray warned that a node started too many worker processes, each actor kind's proportional memory
(``/proc/PID/smaps_rollup``, beside two reference actors: a bare one and one that imports only minigrid and
gymnasium), the host's CPU use, and what saturated first. ``--quick`` plays one point, 128 env instances in 16
env actor processes and 2 samplers on 2 nodes, for one timed iteration. The output ends with one JSON line: every
point's numbers, and ``episodes_per_s_vs_ideal`` and ``env_actor_pss_above_libraries_mb`` of the largest point,
``env_actors_128_ready_s`` of the last point with 128 env instances, and ``ray_worker_warnings`` over all points.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Run as a script, this file's folder leads sys.path; nothing here may shadow a package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import psutil
import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors, list_tasks

from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.configs import Config, load_config
from agentgym_rl.driver.needs import plan_run
from agentgym_rl.driver.rollout_dispatch import RolloutDispatch
from agentgym_rl.driver.samplers.group import SamplerGroup
from agentgym_rl.envs.actor import EnvHost
from agentgym_rl.learner.algorithms import build_algorithm

GROUP_SIZE = 4
EPISODES_PER_ENV_ACTOR = 2  # per iteration: each env actor plays about this many episodes
HORIZON = 6
MB = 2**20


@dataclass(frozen=True)
class Point:
    nodes: int
    env_actors: int
    samplers: int

    @classmethod
    def parse(cls, text: str) -> Point:
        try:
            nodes, env_actors, samplers = (int(part) for part in text.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give NODESxENV_ACTORSxSAMPLERS, e.g. 4x128x16") from None
        if min(nodes, env_actors, samplers) < 1 or env_actors % samplers:
            raise argparse.ArgumentTypeError(f"{text!r}: every count at least 1, env actors a multiple of samplers")
        return cls(nodes, env_actors, samplers)

    def __str__(self) -> str:
        return f"{self.nodes}x{self.env_actors}x{self.samplers}"


# The quick point: 128 env instances (16 env actor processes of 8) and 2 samplers on 2 simulated nodes.
QUICK = Point(2, 128, 2)
QUICK_ENVS_PER_ACTOR = 8


def point_config(point: Point, envs_per_actor: int) -> Config:
    per_sampler = point.env_actors // point.samplers  # env instances (episodes at once) per sampler
    if per_sampler % envs_per_actor:
        raise SystemExit(f"{point}: {per_sampler} env instances per sampler is not a multiple of --envs-per-actor")
    tasks = max(1, point.env_actors * EPISODES_PER_ENV_ACTOR // GROUP_SIZE)
    return load_config(
        None,
        [
            "model.name=tiny-random",
            "model.adapter=null",
            "env.name=babyai",
            "sampler.engine=modelled",
            f"sampler.count={point.samplers}",
            f"sampler.envs_per_sampler={per_sampler // envs_per_actor}",
            f"sampler.envs_per_actor={envs_per_actor}",
            f"sampler.max_batch_size={per_sampler}",
            "sampler.num_cpus=0.25",
            "sampler.num_threads=1",
            "sampler.max_context_tokens=4096",
            "sampler.sampling.max_new_tokens=96",
            f"algorithm.group_size={GROUP_SIZE}",
            f"trainer.tasks_per_iteration={tasks}",
            "trainer.heldout_tasks=0",
            "curriculum.schedule=fixed",
            f"curriculum.horizon={HORIZON}",
            "run.seed=0",
        ],
    )


def start_cluster(point: Point, config: Config) -> Cluster:
    """``point.nodes`` Ray nodes, each with logical CPUs for its share of the actors (they are not real cores)."""
    processes = point.env_actors // config.sampler.envs_per_actor
    need = config.sampler.env_num_cpus * processes + config.sampler.num_cpus * point.samplers
    cpus = math.ceil(need / point.nodes) + 2
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus})
    for _ in range(point.nodes - 1):
        cluster.add_node(num_cpus=cpus)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    return cluster


def pss_mb(pid: int) -> float | None:
    """Proportional set size of process ``pid`` (shared pages split among their users), in MB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def env_actors_ready_s(since: float) -> float | None:
    """Seconds from ``since`` (wall clock) until the last env actor had started: the end of the latest ``EnvHost``
    constructor, from Ray's record of its actor creation tasks."""
    ends = [
        task.end_time_ms / 1000
        for task in list_tasks(filters=[("type", "=", "ACTOR_CREATION_TASK")], detail=True, limit=10_000)
        if task.func_or_class_name == "EnvHost.__init__" and task.end_time_ms
    ]
    return round(max(ends) - since, 1) if ends else None


def worker_warnings() -> int:
    """How many times Ray warned that a node started too many worker processes (``raylet.out`` of every node)."""
    logs = os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")
    count = 0
    for name in os.listdir(logs):
        if name.startswith("raylet") and name.endswith(".out"):
            with open(os.path.join(logs, name), errors="replace") as log:
                count += sum("worker processes have been started" in line for line in log)
    return count


@ray.remote(num_cpus=0)
class Bare:
    """A Ray actor that imports nothing of its own: Ray's floor."""

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class LibrariesOnly:
    """A Ray actor that imports what a BabyAI env needs and nothing else: the floor plus the env's libraries."""

    def __init__(self) -> None:
        import gymnasium  # noqa: F401
        import minigrid  # noqa: F401

    def pid(self) -> int:
        return os.getpid()


def memory_by_kind() -> dict[str, float]:
    """Median proportional memory (MB) of every live actor kind on this machine, with the two reference actors."""
    refs = [Bare.remote(), LibrariesOnly.remote()]
    ray.get([r.pid.remote() for r in refs])
    kinds: dict[str, list[float]] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10_000):
        pss = pss_mb(actor.pid) if actor.pid else None
        if pss is not None:
            kinds.setdefault(actor.class_name, []).append(pss)
    for r in refs:
        ray.kill(r)
    return {kind: round(statistics.median(values), 1) for kind, values in sorted(kinds.items())}


def process_kind(proc: psutil.Process) -> str | None:
    """What a process on this machine is to the benchmark: a Ray actor by its class, Ray's own daemons, the driver."""
    if proc.pid == os.getpid():
        return "driver"
    try:
        command = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if command.startswith("ray::"):
        return command.split()[0].removeprefix("ray::")
    for daemon in ("raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env", "monitor.py"):
        if daemon in command:
            return "ray daemons"
    return None


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds used so far by each kind of process (``process_kind``), summed over its processes."""
    seconds: dict[str, float] = {}
    for proc in psutil.process_iter():
        kind = process_kind(proc)
        if kind is None:
            continue
        try:
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        seconds[kind] = seconds.get(kind, 0.0) + times.user + times.system + times.children_user + times.children_system
    return seconds


def sampler_work(states: list[dict], before: dict[int, dict], config: Config) -> tuple[float, float]:
    """(ideal seconds, modelled busy seconds) of the samplers' work since ``before``: the ideal puts every engine's
    generated tokens into steps of all its rows, adds its prefill, and spreads the sum over the samplers."""
    modelled = config.sampler.modelled
    ideal = busy = 0.0
    for state in states:
        old = before.get(state["index"], {})
        generated = state["engine_generated_tokens"] - old.get("engine_generated_tokens", 0)
        prefill = state["engine_prefill_tokens"] - old.get("engine_prefill_tokens", 0)
        rows = min(config.sampler.max_batch_size, state["env_slots"])
        ideal += generated / rows * (modelled.decode_step_s + modelled.decode_row_s * rows)
        ideal += prefill * modelled.prefill_token_s
        busy += (state["engine_modelled_ms"] - old.get("engine_modelled_ms", 0)) / 1000
    return ideal / len(states), busy / len(states)


def run_point(point: Point, iterations: int, envs_per_actor: int) -> dict:
    config = point_config(point, envs_per_actor)
    model_dir(config.model.name)
    cluster = start_cluster(point, config)
    try:
        algorithm = build_algorithm(config.algorithm.name, config.algorithm.model_extra or {})
        samplers = SamplerGroup(config)
        rollouts = RolloutDispatch(config, algorithm, samplers)
        started, started_wall = time.monotonic(), time.time()
        rollouts.open()
        rollouts.start_pools(plan_run(config), bundles=None)
        ready_s = time.monotonic() - started
        env_ready_s = env_actors_ready_s(started_wall)
        actors = samplers.env_actors() + len(samplers.samplers)
        memory = memory_by_kind()
        # A first iteration warms up (imports on first use, caches) and is not counted.
        rollouts.start_horizons(0)
        rollouts.rollout(0, None)
        # Then iterations back to back as the async mode plays them: the next one is launched before the
        # current one is awaited, so its episodes fill the rows that the current one's last episodes leave.
        before = {s["index"]: s for s in ray.get([s.state.remote() for s in samplers.samplers])}
        psutil.cpu_percent()
        kinds0 = cpu_by_kind()
        cpu0, t0 = time.process_time(), time.monotonic()
        rollouts.start_horizons(1)
        pending = rollouts.launch_rollout(1)
        episodes = trajectory_bytes = 0
        for iteration in range(1, iterations + 1):
            following = None
            if iteration < iterations:
                rollouts.start_horizons(iteration + 1)
                following = rollouts.launch_rollout(iteration + 1)
            _, trajectories = rollouts.await_rollout(pending, iteration, None)
            episodes += len(trajectories)
            trajectory_bytes += sum(len(pickle.dumps(t)) for t in trajectories)
            pending = following
        wall, driver_cpu = time.monotonic() - t0, time.process_time() - cpu0
        host_cpu = psutil.cpu_percent() / 100 * psutil.cpu_count() * wall
        kinds = cpu_by_kind()
        states = ray.get([s.state.remote() for s in samplers.samplers])
        ideal, busy = sampler_work(states, before, config)
        warnings = worker_warnings()
        rollouts.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    rate = episodes / wall
    ideal_rate = episodes / ideal
    env_pss = memory.get("EnvHost")
    result = {
        "point": str(point),
        "nodes": point.nodes,
        "env_actors": point.env_actors,
        "envs_per_actor": envs_per_actor,
        "samplers": point.samplers,
        "episodes": episodes,
        "episodes_per_s": round(rate, 2),
        "ideal_episodes_per_s": round(ideal_rate, 2),
        "episodes_per_s_vs_ideal": round(rate / ideal_rate, 3),
        "engine_busy": round(busy / wall, 3),
        "driver_cpu_s_per_episode": round(driver_cpu / episodes, 4),
        "driver_cpu_share": round(driver_cpu / wall, 3),
        "host_cpu_cores_used": round(host_cpu / wall, 2),
        "trajectory_kb_per_episode": round(trajectory_bytes / episodes / 1024, 1),
        # CPU seconds per episode of each kind of process (all its processes together) over the timed iterations
        "cpu_s_per_episode": {
            kind: round((used - kinds0.get(kind, 0.0)) / episodes, 4)
            for kind, used in sorted(kinds.items())
            if used - kinds0.get(kind, 0.0) > 0
        },
        "ready_s": round(ready_s, 1),
        "env_actors_ready_s": env_ready_s,
        "start_s_per_actor": round(ready_s / actors, 3),
        "ray_worker_warnings": warnings,
        "pss_mb": memory,
        "env_actor_pss_above_libraries_mb": round(env_pss - memory["LibrariesOnly"], 1) if env_pss else None,
    }
    result["saturated"] = saturation(result)
    return result


def saturation(result: dict) -> str:
    """What held the point below its ideal, first to saturate: the host's cores, the driver, or the engines."""
    cores = psutil.cpu_count()
    if result["host_cpu_cores_used"] >= 0.9 * cores:
        return f"host CPU ({result['host_cpu_cores_used']} of {cores} cores)"
    if result["driver_cpu_share"] >= 0.9:
        return "driver (one core)"
    if result["engine_busy"] >= 0.9:
        return "nothing: engines full"
    return "turn latency (env steps, actor calls) between engine turns"


def table(results: list[dict]) -> str:
    head = (
        "| point (nodes x env actors x samplers) | episodes/s | vs ideal | engines busy | driver CPU s/episode "
        "| host cores used | KB/episode | start s/actor | env actor PSS MB | saturated |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(
            f"| {r['point']} | {r['episodes_per_s']} | {r['episodes_per_s_vs_ideal']} | {r['engine_busy']} "
            f"| {r['driver_cpu_s_per_episode']} | {r['host_cpu_cores_used']} | {r['trajectory_kb_per_episode']} "
            f"| {r['start_s_per_actor']} | {r['pss_mb'].get('EnvHost')} | {r['saturated']} |"
        )
    return "\n".join(lines)


@ray.remote(num_cpus=0)
class EpisodeCaller:
    """An async actor that plays episodes of random actions on an env actor, as a sampler does, minus the model."""

    def __init__(self, host: ray.actor.ActorHandle, actions: list[str]) -> None:
        self.host = host
        self.actions = [f"Action: {action}" for action in actions]

    def pid(self) -> int:
        return os.getpid()

    async def play(self, episodes: int, seed: int) -> int:
        """Play ``episodes`` of at most ``HORIZON`` steps; returns the env calls made."""
        rng, calls = random.Random(seed), 0
        for task in range(episodes):
            await self.host.reset.remote(task, 0)
            calls += 1
            for _ in range(HORIZON):
                calls += 1
                if (await self.host.step.remote(rng.choice(self.actions), 0)).done:
                    break
        return calls


def process_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_floor(episodes: int = 300) -> dict:
    """What Ray itself costs the rollout side, measured here: the CPU of an env call's round trip beyond the env's
    own work (caller and env actor together), and the CPU an idle actor process burns each second."""
    actions = load_config(None, []).sampler.modelled.actions
    in_process = EnvHost("babyai", None, 1)
    rng, calls = random.Random(0), 0
    cpu0 = time.process_time()
    for task in range(episodes):
        in_process.reset(task, 0)
        calls += 1
        for _ in range(HORIZON):
            calls += 1
            if in_process.step(f"Action: {rng.choice(actions)}", 0).done:
                break
    env_cpu = time.process_time() - cpu0
    ray.init(num_cpus=2, logging_level="ERROR")
    try:
        host = ray.remote(EnvHost).options(num_cpus=0).remote("babyai", None, 1)
        caller = EpisodeCaller.remote(host, actions)
        pids = ray.get([host.__ray_call__.remote(lambda _: os.getpid()), caller.pid.remote()])
        ray.get(caller.play.remote(20, 1))  # imports and first calls, not counted
        before = [process_cpu_s(pid) for pid in pids]
        ray_calls = ray.get(caller.play.remote(episodes, 0))
        host_cpu, caller_cpu = (process_cpu_s(pid) - b for pid, b in zip(pids, before, strict=True))
        time.sleep(1)
        before = [process_cpu_s(pid) for pid in pids]
        time.sleep(5)
        idle = [(process_cpu_s(pid) - b) / 5 for pid, b in zip(pids, before, strict=True)]
    finally:
        ray.shutdown()
    return {
        "env_cpu_ms_per_episode_in_process": round(env_cpu / episodes * 1000, 2),
        "env_calls_per_episode": round(ray_calls / episodes, 2),
        "env_actor_cpu_ms_per_episode": round(host_cpu / episodes * 1000, 2),
        "caller_cpu_ms_per_episode": round(caller_cpu / episodes * 1000, 2),
        "ray_cpu_ms_per_env_call": round((host_cpu + caller_cpu - env_cpu * ray_calls / calls) / ray_calls * 1000, 3),
        "idle_cpu_ms_per_s": {"sync actor": round(idle[0] * 1000, 1), "async actor": round(idle[1] * 1000, 1)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"one point ({QUICK}, {QUICK_ENVS_PER_ACTOR} env instances per env actor), one timed iteration",
    )
    parser.add_argument("--points", nargs="+", type=Point.parse, help="NODESxENV_ACTORSxSAMPLERS points")
    parser.add_argument(
        "--iterations", type=int, default=3, help="timed rollout iterations per point (after one that warms up)"
    )
    parser.add_argument(
        "--envs-per-actor",
        type=int,
        default=None,
        help="env instances each env actor process holds (sampler.envs_per_actor; 1, or with --quick "
        f"{QUICK_ENVS_PER_ACTOR}); a point's env actors count instances",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="measure only what Ray costs per env call and per idle actor process (one node, no cluster)",
    )
    args = parser.parse_args(argv)
    if args.floor:
        print(json.dumps({"floor": cpu_floor(), "cores": psutil.cpu_count()}))
        return
    points = args.points or ([QUICK] if args.quick else [Point(1, 8, 1), Point(2, 32, 4), Point(4, 128, 16)])
    iterations = 1 if args.quick else args.iterations
    envs_per_actor = args.envs_per_actor or (QUICK_ENVS_PER_ACTOR if args.quick else 1)
    print(
        "SIMULATION: the samplers' engine is modelled (replies drawn, GPU time slept); env actors, samplers, "
        f"driver and Ray are real. Machine: {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} "
        "GiB.",
        flush=True,
    )
    results = []
    for point in points:
        results.append(run_point(point, iterations, envs_per_actor))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    last = results[-1]
    at_128 = [r for r in results if r["env_actors"] == 128]
    print(
        json.dumps(
            {
                "simulation": True,
                "episodes_per_s_vs_ideal": last["episodes_per_s_vs_ideal"],
                "env_actor_pss_above_libraries_mb": last["env_actor_pss_above_libraries_mb"],
                "env_actors_128_ready_s": at_128[-1]["env_actors_ready_s"] if at_128 else None,
                "ray_worker_warnings": sum(r["ray_worker_warnings"] for r in results),
                "points": results,
            }
        )
    )


if __name__ == "__main__":
    main()

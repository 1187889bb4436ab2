"""Multi-node runs on a simulated cluster, and a learner killed mid-run (issue: scale out, survive faults).

The cluster is ``ray.cluster_utils.Cluster`` with every node on 127.0.0.1. Its run is the real
``agentgym-rl train`` in a subprocess connected through ``RAY_ADDRESS``, so this pytest process
never connects to the cluster: it only starts and stops nodes, and the session's local Ray
(``ray_local``, which other modules share) is neither replaced nor disturbed. The learner-failure
tests need no second node and run a ``SyncTrainer`` on ``ray_local`` in a thread, killing its learner
from the test's thread. Every wait has a deadline, so a hang fails the test instead of stalling it.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import ray
import ray.experimental.internal_kv

from agentgym_rl.actors.checkpoints import LEARNER_STATE, POLICY_DIR, checkpoint_damage
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.modes.sync import SyncTrainer
from tests.e2e.helpers import same_episodes
from tests.factories import RECIPE

CLI = Path(sys.executable).parent / "agentgym-rl"
TINY = [
    "model.name=tiny-random",
    "model.adapter=null",  # the default config's (the quickstart's) adapter is SmolLM2's
    "trainer.heldout_tasks=0",
    "env.options.levels=[GoToRedBall, GoToRedBallNoDists]",
    "sampler.sampling.max_new_tokens=8",
    "curriculum.schedule=fixed",
    "curriculum.horizon=2",
    "trainer.tasks_per_iteration=2",
    "algorithm.group_size=2",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "algorithm.skip_uniform_groups=false",
    "learner.micro_batch_size=2",
    "learner.lr=1e-3",
    "logging.progress=false",
    "warm_start.iterations=0",
]
# The head node holds the learner (and the driver); samplers need a `rollout` slot, which only
# worker nodes have. Room for env actors (0.25 CPU each): 1 on the head, 2 on a worker beside its
# sampler, 1 on a worker beside a sampler and its first env actor.
POOLS = [
    "learner.num_cpus=0.75",
    "learner.resources={learner_node: 1}",
    "sampler.num_cpus=0.5",
    "sampler.resources={rollout: 1}",
    "sampler.count=1",
    "sampler.max_count=2",
    "sampler.envs_per_sampler=1",
    "sampler.max_envs_per_sampler=3",
    "sampler.env_num_cpus=0.25",
    "trainer.iterations=8",
    "trainer.checkpoint_every=1",  # a resume from the iteration after the lost node's must be exact
    # Episodes long enough (seconds) that a node removed just after a rollout starts is mid-rollout.
    "curriculum.horizon=3",
    "sampler.sampling.max_new_tokens=24",
]
# Ray's memory monitor watches the whole machine and would kill this test's workers when other
# programs there run short of memory; the failures under test here are the ones the tests cause.
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "env_vars": {"RAY_memory_monitor_refresh_ms": "0"}}
# Ray gives a new node's raylet 30 s to register; on a busy machine that can be too short.
NODE_START_ATTEMPTS = 3


def start_node(cluster, **args):
    """``cluster.add_node(**args)``, tried again if the node does not come up in time. The processes of a
    failed attempt are killed by their pids (the ones this process started meanwhile)."""
    for attempt in range(NODE_START_ATTEMPTS):
        head = cluster.head_node is None
        before = {child.pid for child in psutil.Process().children()}
        try:
            return cluster.add_node(**args)
        except Exception:
            if attempt == NODE_START_ATTEMPTS - 1:
                raise
            for child in psutil.Process().children():
                if child.pid not in before:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            if head:
                cluster.head_node = None  # the next attempt starts a head again, not a worker of this one


def keep_own_internal_kv() -> None:
    """Starting a head node in this process points Ray's process-wide internal-KV client (which Serve and
    Ray's own helpers use) at that node's GCS; point it back at the Ray instance this process is connected
    to, or clear it, so nothing later talks to the test cluster once it is gone."""
    if ray.is_initialized():
        ray.experimental.internal_kv._initialize_internal_kv(ray._private.worker.global_worker.gcs_client)
    else:
        ray.experimental.internal_kv._internal_kv_reset()


@pytest.fixture
def cluster():
    """A head node on 127.0.0.1 with its own Ray temp dir; the test adds worker nodes (same temp dir)."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="raycl-", dir="/tmp")  # short: Ray's socket paths live below it
    nodes = {**NODE, "temp_dir": temp_dir}
    cluster = Cluster(initialize_head=False, connect=False)
    # Cluster writes the head's address to `<Ray temp dir>/ray_current_cluster`, where a bare
    # `ray.init()` anywhere on this machine (this session's `ray_local` too) would find and join it.
    os.makedirs(os.path.join(temp_dir, "ray"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp_dir)
        start_node(cluster, **nodes, resources={"learner_node": 1}, include_dashboard=False)
    keep_own_internal_kv()
    yield cluster, nodes
    # Node by node: Cluster.shutdown would also reset this process's internal-KV client, which the
    # session's local Ray instance may be using.
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node, allow_graceful=False)
    cluster.remove_node(cluster.head_node)
    keep_own_internal_kv()
    shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for(condition: Callable[[], object], what: str, timeout: float, proc: subprocess.Popen | None = None):
    """Poll ``condition`` until it is truthy (returned) or ``timeout`` passes; fail early if ``proc`` ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def json_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # Ray's own lines, and a line being written
            if line.startswith("{"):
                records.append(json.loads(line))
    return records


@pytest.mark.slow
@pytest.mark.ci  # the one test of elastic pools: 80 s alone, about 3 min beside CI's other workers
def test_pools_grow_on_a_new_node_and_the_run_survives_losing_one(cluster, tmp_path: Path):
    cluster, nodes = cluster
    first = start_node(cluster, **nodes, resources={"rollout": 1})
    run_dir = tmp_path / "runs" / "elastic"
    settings = [*TINY, *POOLS, f"run.dir={tmp_path / 'runs'}", "run.name=elastic"]
    command = [str(CLI), "train", *[item for s in settings for item in ("--set", s)]]
    log_path = tmp_path / "driver.log"
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        metrics = run_dir / "metrics.jsonl"
        wait_for(lambda: json_lines(metrics), "iteration 0", 420, proc)
        start_node(cluster, **nodes, resources={"rollout": 1})
        joined_at = len(json_lines(metrics))  # iterations finished once the new node is up
        grown = wait_for(
            lambda: [r for r in json_lines(metrics) if r["pool/samplers"] == 2], "a second sampler", 300, proc
        )[0]["iteration"]
        # Remove the first worker (the first sampler and its env actors) while a rollout is running.
        lost_at = wait_for(
            lambda: [
                e["iteration"]
                for e in json_lines(log_path)
                if e.get("event") == "rollout started" and e.get("iteration", -1) > grown
            ],
            "the next rollout",
            120,
            proc,
        )[0]
        time.sleep(0.2)
        cluster.remove_node(first, allow_graceful=False)
        assert proc.wait(timeout=300) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)

    records = json_lines(metrics)
    assert [r["iteration"] for r in records] == list(range(8))
    by_iteration = {r["iteration"]: r for r in records}
    # Iteration 0 already grew the first sampler's env actors into the room there was (1 -> 3).
    assert (by_iteration[0]["pool/samplers"], by_iteration[0]["pool/env_actors"]) == (1, 3)
    assert by_iteration[0]["pool/env_actors_added"] == 2
    # Iteration `joined_at` may have started before the node was up; the next one at the latest grew both pools.
    assert grown <= joined_at + 1
    assert all(by_iteration[i]["pool/samplers"] == 1 for i in range(grown))
    assert by_iteration[grown]["pool/env_actors"] > by_iteration[0]["pool/env_actors"]
    assert by_iteration[grown]["pool/samplers_added"] == 1
    # The lost node's task group was played again on the surviving sampler within the same iteration.
    assert by_iteration[lost_at]["pool/samplers_lost"] == 1
    assert by_iteration[lost_at]["pool/redispatched"] >= 1
    assert all(by_iteration[i]["pool/samplers"] == 1 for i in range(lost_at + 1, 8))
    for record in records:  # every iteration played all of its episodes
        assert record["rollout/episodes"] + record["rollout/failed"] == 4
    assert (run_dir / "checkpoints" / "iter_000008" / "trainer.json").is_file()
    version_before = 0
    for iteration in range(8):
        episodes = [json.loads(line) for line in trajectories(run_dir, iteration).read_text().splitlines()]
        # Each task of the iteration trained on exactly once: its group of 2, never a lost episode's replay beside it.
        assert sorted(e["group"] for e in episodes) == [0, 0, 1, 1], iteration
        # Every episode sampled with the weights the iteration started with: a sampler that joined holds them before
        # its first episode.
        assert {e["weights_version"] for e in episodes} == {version_before}, iteration
        version_before = by_iteration[iteration]["weights_version"]
    assert version_before > 0
    # A resume from the checkpoint after the lost node's iteration plays the rest exactly as the run did.
    resumed_dir = tmp_path / "resumed" / "elastic"
    shutil.copytree(run_dir, resumed_dir)
    start = min(lost_at + 1, 7)
    resume = [str(CLI), "train", "--resume", str(resumed_dir), "--from", f"iter_{start}"]
    done = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for iteration in range(start, 8):
        # The same tokens from the same seeds; the log-probabilities as the engine computed them in batches that
        # the lost node made different (its dtype's round-off: 2e-3 measured in bfloat16).
        same_episodes(trajectories(run_dir, iteration), trajectories(resumed_dir, iteration), logprobs_within=1e-2)


def trajectories(run_dir: Path, iteration: int) -> Path:
    return run_dir / "trajectories" / f"iter_{iteration:06d}.jsonl"


def learner_run(tmp_path: Path, name: str, policy: str) -> SyncTrainer:
    settings = [
        *TINY,
        "sampler.envs_per_sampler=2",
        "sampler.num_cpus=0.25",
        "learner.num_cpus=0.5",
        "trainer.iterations=3",
        "trainer.checkpoint_every=1",
        f"trainer.on_learner_failure={policy}",
        f"run.dir={tmp_path}",
        f"run.name={name}",
    ]
    config = load_config(RECIPE, settings)
    run_dir = RunDir(tmp_path / name)
    run_dir.create(config)
    return SyncTrainer(config, run_dir)


def run_and_kill_learner(trainer: SyncTrainer, when: Callable[[], bool]) -> dict:
    """Run ``trainer`` in a thread, kill its learner once ``when()`` holds, wait for the run to end."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["last"] = trainer.run()
        except Exception as exc:  # noqa: BLE001 -- handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_for(lambda: when() or not thread.is_alive(), "the moment to kill the learner", 420)
        assert thread.is_alive(), f"the run ended before the kill: {outcome}"
        killed = trainer.learner_group.rank0
        ray.kill(killed, no_restart=True)
        thread.join(timeout=420)
        assert not thread.is_alive(), "the run hangs after its learner was killed"
        outcome["killed"] = killed
        return outcome
    finally:
        trainer.stop_actors()


@pytest.mark.slow
def test_a_killed_learner_ends_the_run_with_a_clear_error_under_fail(ray_local, tmp_path: Path):
    trainer = learner_run(tmp_path, "fail", "fail")
    outcome = run_and_kill_learner(trainer, when=lambda: trainer.run_dir.read_metrics())
    assert isinstance(outcome.get("error"), TrainError), outcome
    assert "a learner actor died during" in str(outcome["error"])
    assert "trainer.on_learner_failure=restart" in str(outcome["error"])


@pytest.mark.slow
def test_a_killed_learner_is_restarted_from_the_last_checkpoint_under_restart(ray_local, tmp_path: Path):
    trainer = learner_run(tmp_path, "restart", "restart")
    # Killed once the first checkpoint is complete, so there is one to go back to.
    outcome = run_and_kill_learner(trainer, when=lambda: trainer.run_dir.complete_checkpoints())
    assert "error" not in outcome, outcome
    assert trainer.learner_group.rank0 != outcome["killed"]
    records = trainer.run_dir.read_metrics()
    assert [r["iteration"] for r in records] == [0, 1, 2]  # each exactly once
    # Iteration 0 (before the checkpoint) was kept, not played again; the rest ran after the restart.
    assert records[0]["learner/restarts"] == 0 and records[-1]["learner/restarts"] == 1
    # The new learner went on from the checkpoint's weights: one weight version per update throughout.
    assert [r["weights_version"] for r in records] == [1, 2, 3]
    assert [p.name for p in trainer.run_dir.complete_checkpoints()][-1] == "iter_000003"


GROUP_SCRIPT = """
import json, sys
import ray
from agentgym_rl.configs import Config
from agentgym_rl.driver.learner_group import start_learners
from tests.unit.learner.helpers import batch_of

ray.init(address=sys.argv[1])
config = Config.model_validate({
    "model": {"name": "tiny-random"},
    "algorithm": {"name": "grpo"},
    "learner": {"backend": "deepspeed", "count": 2, "zero_stage": 2, "num_cpus": 1, "num_threads": 1,
                "lr": 1e-3, "micro_batch_size": 2},
})
group = start_learners(config, total_updates=2)
refs = [ray.put(t) for t in batch_of(n_groups=2, group_size=2)]
metrics = [ray.get([learner.update.remote(refs) for learner in group.actors]) for _ in range(2)]
where = ray.get([a.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for a in group.actors])
nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
print(json.dumps({"master_addr": group.master_addr, "nodes": where, "node_addresses": nodes, "metrics": metrics}))
group.stop()
"""


@pytest.mark.slow
def test_a_deepspeed_learner_group_spans_two_nodes_and_meets_on_rank_0s_node(cluster, tmp_path: Path):
    cluster, nodes = cluster
    start_node(cluster, **nodes)  # one CPU each: the two learners' bundles cannot share a node
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", GROUP_SCRIPT, cluster.address],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # The learners' own log lines reach this stdout too; the script's report is the line of JSON it printed.
    [found] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"master_addr"')]
    rank0, rank1 = found["nodes"]
    assert rank0 != rank1, "the two ranks should sit on the two nodes"
    assert found["master_addr"] == found["node_addresses"][rank0]
    for first, second in found["metrics"]:  # every rank reports the group's summed metrics
        assert first["learner/loss"] == pytest.approx(second["learner/loss"])
        assert first["learner/grad_norm"] > 0 and first["learner/optimizer_steps"] == 1


# One iteration and its checkpoint, the learner on the node with `checkpoint_node`, run.dir relative to the driver.
CHECKPOINT_RUN = [
    *TINY,
    "learner.num_cpus=0.5",
    "learner.resources={checkpoint_node: 1}",
    "sampler.num_cpus=0.5",
    "sampler.count=1",
    "sampler.envs_per_sampler=1",
    "sampler.env_num_cpus=0.25",
    "trainer.iterations=1",
    "trainer.checkpoint_every=1",
    "run.dir=runs",
]
# Runs a command in its own mount namespace with a private tmpfs over ./runs: a filesystem no other node sees.
PRIVATE_RUNS = ("unshare", "--mount", "--map-root-user", "sh", "-c", 'mount -t tmpfs tmpfs runs && exec "$@"', "sh")


def train_in(
    folder: Path, address: str, settings: list[str], prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``agentgym-rl train`` with ``settings`` run from ``folder`` against the cluster at ``address``."""
    command = [*prefix, str(CLI), "train", *[item for s in settings for item in ("--set", s)]]
    env = {**os.environ, "RAY_ADDRESS": address}
    return subprocess.run(
        command,
        cwd=folder,
        env=env,
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_learner_on_another_node_checkpoints_where_the_driver_reads_or_the_run_stops(cluster, tmp_path: Path):
    """The learner's node is started under another working directory than the driver's: a Ray worker runs in its
    raylet's working directory, as on a second machine where ``ray start`` ran elsewhere, so a relative run.dir
    handed to the learner would land under that node's folder. The driver resolves it, and the checkpoint is
    complete where the driver reads it. Then the driver runs with a private tmpfs over run.dir (its own mount
    namespace): on one machine, the honest way to give the two nodes different filesystems at one path. The
    learner's files land on the disk the driver does not see, and the run stops naming the learner's node."""
    cluster, nodes = cluster
    learner_cwd = tmp_path / "learner-node"
    learner_cwd.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(learner_cwd)
        learner_node = start_node(cluster, **nodes, resources={"checkpoint_node": 1})
    driver_cwd = tmp_path / "driver"
    (driver_cwd / "runs").mkdir(parents=True)

    shared = train_in(driver_cwd, cluster.address, [*CHECKPOINT_RUN, "run.name=shared"])
    assert shared.returncode == 0, shared.stdout[-3000:]
    checkpoint = RunDir(driver_cwd / "runs" / "shared").latest_checkpoint()
    assert checkpoint.name == "iter_000001" and checkpoint_damage(checkpoint) is None
    assert (checkpoint / LEARNER_STATE).is_file() and (checkpoint / POLICY_DIR).is_dir()
    assert not (learner_cwd / "runs").exists()

    if subprocess.run([*PRIVATE_RUNS, "true"], cwd=driver_cwd, capture_output=True, check=False).returncode:
        pytest.skip("the shared case passed; the unshared one needs `unshare --mount --map-root-user`, refused here")
    apart = train_in(driver_cwd, cluster.address, [*CHECKPOINT_RUN, "run.name=apart"], prefix=PRIVATE_RUNS)
    assert apart.returncode == 2, apart.stdout[-3000:]
    error = apart.stdout[apart.stdout.index("agentgym-rl: error:") :]
    assert f"node 127.0.0.1 (id {learner_node.node_id}): " in error
    assert "run.dir must be on a filesystem that every node shares" in error
    # The learner wrote to the absolute path the driver resolved, on the disk outside the driver's tmpfs.
    assert (driver_cwd / "runs" / "apart" / "checkpoints" / ".iter_000001.partial" / LEARNER_STATE).is_file()

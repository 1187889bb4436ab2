"""The learner group of a run: its learner actors (one, or a DeepSpeed group, in one placement group), their
updates, checkpoint saves and loads, their restart after one died, and each weights version as the source that
``SamplerGroup.sync_weights`` and the serving endpoint read it from.

Each learner gets a bundle of ``learner.num_cpus`` CPUs, ``learner.num_gpus`` GPUs and ``learner.resources``
(in colocated mode the bundle also holds its sampler's CPUs and resources, and the two share its GPUs);
the bundles are packed onto as few nodes as fit and spread over more when they do not. The process group
meets at rank 0's node: a task in rank 0's bundle reports that node's address and a port free there, and
every rank joins it. Each learner sees only the GPU it reserved (Ray sets ``CUDA_VISIBLE_DEVICES`` per
actor), so its local device is always its first visible one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
import structlog
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentgym_rl.actors.checkpoints import unseen_files, written_files
from agentgym_rl.actors.cluster import ClusterError, Colocation, colocated_bundle, learner_request
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights
from agentgym_rl.actors.weight_sync import GroupAddress, free_address
from agentgym_rl.configs import Config
from agentgym_rl.driver.errors import LearnerLost, TrainError
from agentgym_rl.driver.samplers import SamplerGroup
from agentgym_rl.learner.actor import LearnerActor

log = structlog.get_logger()

# How long the learners' bundles may wait for room (the pre-start check already saw that they fit).
PLACEMENT_TIMEOUT_S = 300.0


@dataclass
class LearnerActors:
    """The learner actors of a run (rank order) and the placement group that holds their resources."""

    actors: list[ray.actor.ActorHandle]
    placement: PlacementGroup
    master_addr: str
    colocation: Colocation | None = None  # colocated mode: the bundles' sampler shares

    def stop(self) -> None:
        """Kill the learners and give their bundles back."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.placement)


def start_learners(config: Config, total_updates: int) -> LearnerActors:
    """``learner.count`` learner actors, one per bundle; rank 0 publishes weights, every rank trains, saves and
    restores (collectives under DeepSpeed).

    Raises:
        ClusterError: the bundles found no room within ``PLACEMENT_TIMEOUT_S``.
    """
    cfg = config.learner
    colocated = config.trainer.placement == "colocated"
    bundle = colocated_bundle(config) if colocated else learner_request(cfg)  # never empty: learner.num_cpus > 0
    group = placement_group([bundle] * cfg.count, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise ClusterError(
            f"the {cfg.count} learner bundle(s) of {bundle} found no room within {PLACEMENT_TIMEOUT_S:g} s "
            "(learner.count, learner.num_cpus, learner.num_gpus, learner.resources"
            f"{'; colocated: sampler.num_cpus, sampler.resources' if colocated else ''})"
        )
    gpus = bundle.get("GPU", 0.0)
    colocation = Colocation(group, cfg.count, gpus / 2) if colocated else None
    master_addr, master_port = "127.0.0.1", 0
    if cfg.backend == "deepspeed":
        in_rank0 = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0)
        master_addr, master_port = ray.get(meeting_point.options(scheduling_strategy=in_rank0).remote())
    actors = [
        ray.remote(LearnerActor)
        .options(
            num_cpus=cfg.num_cpus,
            num_gpus=colocation.gpus_each if colocation else gpus,
            resources=cfg.resources or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=rank
            ),
        )
        .remote(
            model=config.model,
            learner=cfg,
            algorithm=config.algorithm,
            seed=config.run.seed,
            sampler_dtype=config.sampler.dtype,
            total_updates=total_updates,
            rank=rank,
            world_size=cfg.count,
            master_addr=master_addr,
            master_port=master_port,
            offload_optimizer=colocated,
        )
        for rank in range(cfg.count)
    ]
    return LearnerActors(actors, group, master_addr, colocation)


@ray.remote(num_cpus=0)
def meeting_point() -> tuple[str, int]:
    """This node's address and a TCP port free on it: where a learner group's process group meets."""
    return free_address()


@dataclass(frozen=True)
class LearnerFiles:
    """The files one learner sees in a checkpoint folder it wrote, and the node it runs on."""

    node_id: str
    node_ip: str
    files: dict[str, int]  # path relative to the checkpoint folder -> bytes (``written_files``)


def files_in_learner(_learner: LearnerActor, folder: str) -> LearnerFiles:
    """Run inside a learner's process (``ActorHandle.__ray_call__``): ``folder``'s files as that learner sees
    them, and its node."""
    node_id = ray.get_runtime_context().get_node_id()
    return LearnerFiles(node_id, ray.util.get_node_ip_address(), written_files(Path(folder)))


def check_visible(folder: Path, seen: list[LearnerFiles]) -> None:
    """Check that the driver sees, in checkpoint ``folder``, every file that each learner sees there.

    Raises:
        TrainError: files a learner wrote are missing (or of another size) where the driver reads them; the
            message names each such learner's node and the shared-filesystem requirement of ``run.dir``.
    """
    missing: dict[str, set[str]] = {}  # node -> files; learners on one node see the same files
    for learner in seen:
        lacking = unseen_files(folder, learner.files)
        if lacking:
            missing.setdefault(f"node {learner.node_ip} (id {learner.node_id})", set()).update(lacking)
    if not missing:
        return
    nodes = "; ".join(
        f"{node}: {min(names)}{f' and {len(names) - 1} more' if len(names) > 1 else ''}"
        for node, names in missing.items()
    )
    raise TrainError(
        f"the checkpoint in {folder} is incomplete where the driver reads it: it lacks files the learners wrote "
        f"on {nodes}. With learners on other nodes than the driver, run.dir must be on a filesystem that every "
        "node shares at the same path (NFS or another shared mount); set run.dir to such a path and start again"
    )


def total_updates(config: Config) -> int:
    """The optimizer steps of a whole run, which the learning-rate schedule spans."""
    return config.trainer.iterations * config.learner.epochs * config.learner.minibatches


class LearnerGroup:
    """The learners of a run as one: start, update, checkpoint save and load, restart.

    A call that finds a learner dead raises what ``died`` returns: ``LearnerLost`` (the trainer restarts the
    learners) or a ``TrainError`` that ends the run, never a hang.

    Args:
        config: the resolved run config.
        run_dir: the run directory (its checkpoints decide what a dead learner's error suggests).
        samplers: the run's samplers, put to sleep during each update in colocated mode (they share the learners'
            GPUs).
    """

    def __init__(self, config: Config, run_dir: RunDir, samplers: SamplerGroup) -> None:
        self.config = config
        self.run_dir = run_dir
        self.samplers = samplers
        self.started: LearnerActors | None = None
        self.device = "cpu"  # where the learners compute (``cpu`` or ``cuda``), from their description
        self.restarts = 0
        self.payload: list[ray.ObjectRef] | None = None  # the current version in the object store, once published

    @property
    def actors(self) -> list[ray.actor.ActorHandle]:
        """The learner actors in rank order (none before ``start``)."""
        return self.started.actors if self.started is not None else []

    @property
    def rank0(self) -> ray.actor.ActorHandle:
        """Learner rank 0, the one that publishes and sends weights."""
        return self.actors[0]

    @property
    def placement(self) -> PlacementGroup:
        """The placement group that holds the learners' bundles."""
        return self.started.placement

    @property
    def colocation(self) -> Colocation | None:
        """Colocated mode: the bundles' shares for the samplers (sampler i goes in learner i's bundle)."""
        return self.started.colocation if self.started is not None else None

    def start(self) -> None:
        """Start ``learner.count`` learners (see ``start_learners``)."""
        self.started = start_learners(self.config, total_updates(self.config))

    def describe(self) -> dict:
        """Rank 0's description (algorithm, precision, parameters, ...) for the start-up log, once every learner
        has started; it also tells where the learners compute (``device``)."""
        try:
            described = ray.get([learner.describe.remote() for learner in self.actors])[0]
        except ray.exceptions.RayActorError as exc:
            raise self.died("start-up", exc) from exc
        self.device = described["device"].partition(":")[0]
        return described

    def died(self, during: str, exc: BaseException) -> Exception:
        """What a dead learner raises: ``LearnerLost`` to restart, or a ``TrainError`` that ends the run."""
        if self.config.trainer.on_learner_failure == "restart":
            return LearnerLost(f"a learner actor died during {during} ({exc.__class__.__name__})")
        latest = self.run_dir.latest_checkpoint()
        hint = f"resume with --resume {self.run_dir.path}" if latest else "no checkpoint was saved yet"
        return TrainError(
            f"a learner actor died during {during} ({exc.__class__.__name__}); {hint} "
            "(trainer.on_learner_failure=restart recovers from the last checkpoint by itself)"
        )

    def restart(self, lost: LearnerLost) -> None:
        """Replace every learner after ``lost``; the new ones hold the starting weights until a checkpoint loads.

        Raises:
            TrainError: the learners were already restarted ``trainer.max_learner_restarts`` times.
        """
        limit = self.config.trainer.max_learner_restarts
        if self.restarts >= limit:
            raise TrainError(
                f"{lost}; the learners were restarted {self.restarts} time(s) already "
                f"(trainer.max_learner_restarts={limit}); continue with --resume {self.run_dir.path}"
            )
        self.restarts += 1
        log.warning("learner lost; restarting the learners", reason=str(lost), restart=self.restarts)
        self.started.stop()
        self.start()

    def update(self, refs: list[ray.ObjectRef]) -> dict:
        """Train every learner on ``refs``; returns rank 0's metrics (see ``finish_update``). In colocated mode
        the samplers sleep meanwhile (the learners bring their optimizer state in and out themselves)."""
        if self.config.trainer.placement != "colocated":
            return self.finish_update(self.start_update(refs))
        slept = self.samplers.call_all("sleep")
        try:
            metrics = self.finish_update(self.start_update(refs))
        finally:
            woke = self.samplers.call_all("wake")
        return {**metrics, "time/sleep_s": slept, "time/wake_s": woke}

    def start_update(self, refs: list[ray.ObjectRef]) -> list[ray.ObjectRef]:
        """Start every learner's update on ``refs``; returns the calls for ``finish_update``."""
        return [learner.update.remote(refs) for learner in self.actors]

    def finish_update(self, calls: list[ray.ObjectRef]) -> dict:
        """Wait for ``start_update``'s calls; returns rank 0's metrics."""
        try:
            return ray.get(calls)[0]
        except ray.exceptions.RayActorError as exc:
            raise self.died("the update", exc) from exc

    def save_checkpoint(self, path: Path) -> None:
        """Every learner writes its part of a checkpoint into ``path`` (rank 0 the policy); then each lists the
        files it sees there, and the driver checks that it sees them too (``check_visible``).

        Raises:
            TrainError: the driver lacks files a learner wrote (``run.dir`` is not shared by their nodes), or a
                learner died (see ``died``).
        """
        try:
            ray.get([learner.save_checkpoint.remote(str(path)) for learner in self.actors])
            seen = ray.get([learner.__ray_call__.remote(files_in_learner, str(path)) for learner in self.actors])
        except ray.exceptions.RayActorError as exc:
            raise self.died("a checkpoint write", exc) from exc
        check_visible(path, seen)

    def load_checkpoint(self, path: Path) -> int:
        """Every learner loads the checkpoint at ``path``; returns the weights version it holds."""
        try:
            return ray.get([learner.load_checkpoint.remote(str(path)) for learner in self.actors])[0]
        except ray.exceptions.RayActorError as exc:
            raise self.died("a checkpoint load", exc) from exc

    # ----------------------------------------------------------------------------- the source of each version
    # (``driver.samplers.WeightSource``: rank 0 sends; under ZeRO-3 every learner takes part in gathering)

    def new_version(self) -> None:
        """The learners hold a new version: the object store's copy of the last one is stale."""
        self.payload = None

    def published(self) -> list[ray.ObjectRef]:
        """The current version in the object store (``[ref]``), put there by the learners on first need."""
        if self.payload is None:
            try:
                bucket_bytes = int(self.config.trainer.weight_sync.bucket_mb * 2**20)
                self.payload = ray.get([learner.publish_weights.remote(bucket_bytes) for learner in self.actors])[0]
            except ray.exceptions.RayActorError as exc:
                raise self.died("the weight sync", exc) from exc
        return self.payload

    def published_bytes(self) -> int:
        """The size of the version rank 0 put in the object store last."""
        return ray.get(self.rank0.last_published_bytes.remote())

    def device_identity(self) -> DeviceIdentity:
        """Where rank 0 holds the tensors it sends."""
        return ray.get(self.rank0.device_identity.remote())

    def weight_group_address(self) -> tuple[str, int]:
        """Where rank 0 hosts a weight group: its node's address and a port free there."""
        return ray.get(self.rank0.weight_group_address.remote())

    def join_weight_group(self, address: GroupAddress) -> ray.ObjectRef:
        """Start rank 0's join of the weight group at ``address``."""
        return self.rank0.join_weight_group.remote(address)

    def broadcast_weights(self, bucket_bytes: int) -> list[ray.ObjectRef]:
        """Start every learner's part of a broadcast of the current version in buckets of ``bucket_bytes``."""
        return [learner.broadcast_weights.remote(bucket_bytes) for learner in self.actors]

    def share_weights(self) -> SharedWeights:
        """Share the current version's tensors by CUDA IPC from rank 0's GPU (every learner takes part)."""
        return ray.get([learner.share_weights.remote() for learner in self.actors])[0]

    def release_shared_weights(self) -> None:
        """Let rank 0 go of the tensors ``share_weights`` shared."""
        ray.get(self.rank0.release_shared_weights.remote())

    def stop(self) -> None:
        """Kill the learners and give their bundles back."""
        if self.started is not None:
            self.started.stop()

"""Build, start and stop the policy application: model replicas that answer HTTP themselves."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import ray
import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from agentgym_rl.actors.adapters import is_policy_dir, policy_source, read_checked_adapter
from agentgym_rl.actors.cluster import actor_gpus
from agentgym_rl.actors.engines import Engine, EngineUnavailableError, UnknownEngineError, engine_class
from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.rundir import POLICY_DIR, latest_if_run
from agentgym_rl.actors.tool_formats import ToolFormatError, ToolTemplate, tool_format
from agentgym_rl.configs import Config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.envs.registry import names as env_names
from agentgym_rl.serve.deployment import (
    MAX_ONGOING_REQUESTS,
    STORE_NAMESPACE,
    PolicyModel,
    episode_store,
    episodes_name,
    store_name,
)
from agentgym_rl.serve.policy_api import PolicyAPI
from agentgym_rl.serve.routes import build_api
from agentgym_rl.serve.routing import EpisodeAffinityRouter

API_KEY_ENV = "AGENTGYM_RL_API_KEY"
APP_NAME = "agentgym-rl"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MODEL_DEPLOYMENT = "PolicyModel"
# Longest wait for the first model replica to load and catch up (a large model on a loaded CPU is slow).
READY_TIMEOUT_S = 900.0
# Serve's per-request access log line in the proxy and in both replicas: 5-12 % of the served
# tokens/s at 32 clients on 2 cores (docs/results/performance.md). Warnings and errors are still logged.
SERVE_LOGGING = {"enable_access_log": False}

log = structlog.get_logger()


class ServeArgs(BaseModel):
    """Arguments of :func:`build_app`: where the weights come from and the serve config."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        None,
        description="A checkpoint directory (its `policy/` Hugging Face dir), a run directory (its latest checkpoint) "
        "or a Hugging Face or adapter dir itself.",
    )
    model: str | None = Field(
        None, description="A built-in model name, a local Hugging Face directory or a LoRA adapter directory."
    )
    model_id: str | None = Field(None, description="Id clients send as `model`; default: the model name or dir name.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Dtype the replica computes in (`auto`: bfloat16 where the hardware is fast at it)."
    )
    seed: int = Field(0, description="Seeds the sampling stream of each replica (requests without a seed).")
    sampler_engine: str = Field(
        "transformers", description="The training sampler's engine: what `serve.engine: null` serves with."
    )
    app_name: str = Field(APP_NAME, description="Serve application name.")
    tool_format: str = Field(
        "hermes", description="How tool calls are written in text (`model.tool_format`: a registered format or a path)."
    )
    tool_template: ToolTemplate = Field(
        "auto", description="What renders a prompt with functions (`model.tool_template`: auto, builtin or model)."
    )
    serve: ServeConfig = Field(default_factory=ServeConfig, description="Engine, limits, auth and scaling.")
    lora_rank: int | None = Field(
        None,
        description="A LoRA run's adapter rank (`learner.lora.r`): the versions it publishes reach the replicas as "
        "adapters (vLLM adds each by id); None: full weights.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ServeArgs:
        if (self.checkpoint is None) == (self.model is None):
            raise ValueError("give exactly one of checkpoint or model")
        if self.checkpoint is not None:
            self.source  # noqa: B018 -- resolving the directory now makes a bad checkpoint a validation error
        return self

    @property
    def source(self) -> str:
        """The model name, Hugging Face directory or LoRA adapter directory the weights are read from."""
        if self.model is not None:
            return self.model
        try:
            folder = latest_if_run(Path(self.checkpoint).expanduser())
        except FileNotFoundError as exc:
            raise ValueError(f"checkpoint {self.checkpoint!r}: run directory without a complete checkpoint") from exc
        if is_policy_dir(folder / POLICY_DIR):
            return str(folder / POLICY_DIR)
        if is_policy_dir(folder):
            return str(folder)
        raise ValueError(
            f"checkpoint {self.checkpoint!r}: neither {POLICY_DIR}/ nor the directory itself holds a model "
            "(config.json) or a LoRA adapter (adapter_config.json)"
        )

    @property
    def engine(self) -> str:
        """The replicas' engine: ``serve.engine``, else the training sampler's."""
        return self.serve.engine or self.sampler_engine

    @classmethod
    def for_training(cls, config: Config) -> ServeArgs:
        """The endpoint a training run serves: its model (or the adapter it starts from), the sampler's dtype and
        engine, the run seed."""
        return cls(
            model=config.model.adapter or config.model.name,
            dtype=config.sampler.dtype,
            seed=config.run.seed,
            sampler_engine=config.sampler.engine,
            tool_format=config.model.tool_format,
            tool_template=config.model.tool_template,
            serve=config.serve,
            lora_rank=config.learner.lora.r if config.learner.lora.enabled else None,
        )

    @property
    def served_id(self) -> str:
        if self.model_id is not None:
            return self.model_id
        if self.model is not None:
            return self.model
        return Path(self.checkpoint).expanduser().resolve().name


def resolve_api_key(config: ServeConfig) -> ServeConfig:
    """``config`` with ``api_key`` filled from AGENTGYM_RL_API_KEY when it is unset there."""
    if config.api_key is None and os.environ.get(API_KEY_ENV):
        return config.model_copy(update={"api_key": os.environ[API_KEY_ENV]})
    return config


@serve.ingress()
class PolicyServer(PolicyModel):
    """A model replica that also answers HTTP: Serve's proxy hands each request straight to it, where the
    prompt is rendered and the reply decoded beside the running batch (no second deployment to cross)."""

    def __init__(
        self, *, model_id: str, limits: ServeConfig, tool_format: str, tool_template: ToolTemplate, **model: Any
    ) -> None:
        super().__init__(**model)
        self.api = PolicyAPI(
            self,
            model_id=model_id,
            source=self.source,
            limits=limits,
            model_ready=self.model_loaded,
            episodes=episode_store(
                model["app_name"], self.source, limits, tool_format=tool_format, tool_template=tool_template
            ),
            tool_format=tool_format,
            tool_template=tool_template,
            replica=serve.get_replica_context().replica_id.unique_id,
        )

    async def ready(self) -> int:
        """The weights version, once this replica has caught up and the episode book answers (the book's actor
        loads a tokenizer as it starts: the first episode call must not wait for that)."""
        version = await super().ready()
        if self.api.episodes is not None:
            await self.api.episodes.stats.remote()
        return version

    def __serve_build_asgi_app__(self):
        return build_api(self.api)


def build_app(args: ServeArgs) -> serve.Application:
    """The Serve application for ``args`` (run it with ``serve.run`` or :func:`start_server`).

    Raises:
        ServeError: the engine cannot run here (``serve.engine: vllm`` without vllm), or the tool format is unknown.
        ValueError: the checkpoint or model cannot be found, or ``serve.act_envs`` names an env that is not
            registered (checked here, before any replica starts).
    """
    check_engine(args.engine)
    try:
        tool_format(args.tool_format)
    except ToolFormatError as exc:
        raise ServeError(f"model.tool_format: {exc}") from None
    source = args.source
    name, adapter = policy_source(source)
    model_dir(name)  # fail here, not in a replica, on an unknown model; builds a built-in once
    if adapter is not None:
        read_checked_adapter(adapter, name)
    limits = resolve_api_key(args.serve)
    unknown = [name for name in limits.act_envs or [] if name not in env_names()]
    if unknown:
        raise ValueError(f"serve.act_envs names unregistered envs {unknown}; registered: {', '.join(env_names())}")
    scaling: dict = {"num_replicas": limits.num_replicas}
    if limits.autoscaling is not None:
        scaling = {"autoscaling_config": limits.autoscaling.model_dump()}
    if limits.episode_affinity:
        scaling["request_router_config"] = RequestRouterConfig(request_router_class=EpisodeAffinityRouter)
    model = serve.deployment(PolicyServer, name=MODEL_DEPLOYMENT).options(
        ray_actor_options={"num_cpus": limits.num_cpus, "num_gpus": replica_gpus(limits)},
        # Every request reaches a replica; its engine answers 429 beyond what it may hold.
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
        **scaling,
    )
    return model.bind(
        model_id=args.served_id,
        limits=limits,
        tool_format=args.tool_format,
        tool_template=args.tool_template,
        source=source,
        engine=args.engine,
        dtype=args.dtype,
        seed=args.seed,
        max_batch_size=limits.max_batch_size,
        kv_cache_tokens=limits.kv_cache_tokens,
        max_queued_requests=limits.max_queued_requests,
        torch_threads=limits.torch_threads,
        app_name=args.app_name,
        vllm=limits.vllm,
        prefix_cache_tokens=limits.prefix_cache_tokens,
        lora_rank=args.lora_rank,
    )


class ServeError(AgentGymError, RuntimeError):
    """The application cannot start here; the message says which setting to change."""


def replica_gpus(config: ServeConfig) -> float:
    """GPUs per model replica: ``serve.num_gpus``, or with None one GPU when the cluster has any."""
    return actor_gpus(config.num_gpus)


def check_engine(engine: str) -> None:
    """Raise ServeError when the registered ``engine`` cannot serve here: it cannot be imported, has no serving
    form, or lacks a package (checked before any replica starts)."""
    try:
        cls = engine_class(engine)
    except UnknownEngineError as exc:
        raise ServeError(f"serve.engine: {exc}") from None
    try:
        cls.check_available(f"serve.engine={engine!r}")
    except EngineUnavailableError as exc:
        raise ServeError(str(exc)) from None
    if cls.build_serving.__func__ is Engine.build_serving.__func__:  # the base's: no serving form
        raise ServeError(
            f"serve.engine={engine!r} has no serving form (its class does not override Engine.build_serving); "
            "set serve.engine=transformers"
        )


def check_resources(config: ServeConfig) -> None:
    """Raise ServeError when the cluster's free CPUs or GPUs cannot hold the first replicas (Serve would
    wait forever)."""
    replicas = config.autoscaling.min_replicas if config.autoscaling is not None else config.num_replicas
    needed = replicas * config.num_cpus
    free = ray.available_resources().get("CPU", 0.0)
    if free + 1e-9 < needed:
        raise ServeError(
            f"serving needs {needed:g} free CPUs ({replicas} x serve.num_cpus={config.num_cpus:g}) but Ray has "
            f"{free:g} free; lower serve.num_cpus or the samplers'/learner's num_cpus, or raise ray.num_cpus"
        )
    gpus, free_gpus = replicas * replica_gpus(config), ray.available_resources().get("GPU", 0.0)
    if free_gpus + 1e-9 < gpus:
        raise ServeError(
            f"serving needs {gpus:g} free GPUs ({replicas} x serve.num_gpus) but Ray has {free_gpus:g} free; "
            "set serve.num_gpus (0 serves on CPUs) or free GPUs"
        )


def start_server(args: ServeArgs) -> DeploymentHandle:
    """Start Serve's HTTP proxy on ``serve.host:serve.port`` and run the app; returns the model deployment
    handle once a model replica is up and caught up with the weights store (the endpoint answers 503 before).

    Raises:
        ServeError: the engine cannot run here, or not enough free CPUs/GPUs for the replicas (checked
            first: Serve itself would wait forever), or the model replicas failed to start.
    """
    check_engine(args.engine)
    check_resources(args.serve)
    if args.serve.host not in LOOPBACK_HOSTS and resolve_api_key(args.serve).api_key is None:
        log.warning("serving on a public interface without an API key", host=args.serve.host)
    serve.start(http_options={"host": args.serve.host, "port": args.serve.port}, logging_config=SERVE_LOGGING)
    try:
        serve.run(build_app(args), name=args.app_name, route_prefix="/", logging_config=SERVE_LOGGING)
        handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=args.app_name)
        # The first replicas load the model after Serve has them running: `ready` waits for that load.
        handle.ready.remote().result(timeout_s=READY_TIMEOUT_S)
    except (RuntimeError, ray.exceptions.RayError) as exc:  # e.g. the engine refused to start in a replica
        raise ServeError(f"the model deployment did not start: {exc}") from exc
    return handle


def delete_app(app_name: str = APP_NAME) -> None:
    """Delete the application, its weights store and its episodes; Serve itself keeps running."""
    serve.delete(app_name)
    for name in (store_name(app_name), episodes_name(app_name)):
        with contextlib.suppress(ValueError):  # no replica ever started, so there is no such actor
            ray.kill(ray.get_actor(name, namespace=STORE_NAMESPACE))


def stop_server(app_name: str = APP_NAME) -> None:
    """Delete the application, its weights store and its episodes, and shut Serve down."""
    delete_app(app_name)
    serve.shutdown()

"""The configuration schema: one pydantic model per component, all ``extra="forbid"``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str | None = Field(
        None, description="Run name; the run directory is `<dir>/<name>`. None: `<env>-<date>-<time>`."
    )
    dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, description="The one seed behind task sampling, generation sampling and model init.")


class ModelConfig(Section):
    name: str = Field(
        "smollm2-135m-instruct",
        description="A built-in model (`smollm2-135m-instruct`, `tiny-random`) or a local Hugging Face "
        "model directory.",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for sampler and learner.")


class EnvConfig(Section):
    name: str = Field("babyai", description="Registered environment name (see `agentgym-rl envs`).")
    split: Literal["train", "test"] = Field("train", description="Split that training tasks are drawn from.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific options, validated by the env's own Options model."
    )


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 disables.")
    max_new_tokens: int = Field(64, ge=1, description="Per-turn cap on generated tokens.")


class SamplerConfig(Section):
    engine: Literal["transformers", "vllm"] = Field("transformers", description="Generation engine.")
    count: int = Field(1, ge=1, description="Number of sampler actors.")
    envs_per_sampler: int = Field(4, ge=1, description="Env actors owned by each sampler (episodes run concurrently).")
    max_batch_size: int = Field(32, ge=1, description="Largest generation batch a sampler forms from pending turns.")
    max_context_tokens: int = Field(
        2048, ge=16, description="Episode token budget; an episode that would exceed it ends with truncated=True."
    )
    num_cpus: float = Field(0.5, gt=0.0, description="CPUs reserved by each sampler actor.")
    num_threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads; 0 = every core of the node (right in sync mode, where "
        "rollout and update take turns).",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters.")

    @model_validator(mode="after")
    def _engine_available(self) -> SamplerConfig:
        if self.engine == "vllm":
            raise ValueError(
                "sampler.engine='vllm' is not available in this version; use sampler.engine='transformers'"
            )
        return self


class AlgorithmConfig(Section):
    name: str = Field(
        "grpo", description="Registered algorithm name (`grpo`) or `package.module:Class` of a user algorithm."
    )
    group_size: int = Field(4, ge=1, description="Episodes sampled per task (the GRPO group).")
    clip_eps: float = Field(0.2, gt=0.0, description="PPO-style ratio clip epsilon.")
    kl_coef: float = Field(
        0.001, ge=0.0, description="Weight of the KL-to-reference loss term (0 disables the reference)."
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Weight of the entropy bonus.")
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the group std when normalising advantages.")


class LearnerConfig(Section):
    backend: Literal["torch", "deepspeed"] = Field("torch", description="Training backend.")
    count: int = Field(1, ge=1, description="Learner actors (data parallel).")
    lr: float = Field(1e-6, gt=0.0, description="AdamW learning rate (constant).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per forward/backward; gradients accumulate.")
    num_cpus: float = Field(1.0, gt=0.0, description="CPUs reserved by each learner actor.")
    num_threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads; 0 = every core of the node (right in sync mode, where "
        "rollout and update take turns).",
    )

    @model_validator(mode="after")
    def _backend_available(self) -> LearnerConfig:
        if self.backend == "deepspeed":
            raise ValueError(
                "learner.backend='deepspeed' is not available in this version; use learner.backend='torch'"
            )
        if self.count != 1:
            raise ValueError("learner.count > 1 needs the deepspeed backend, which this version does not have; set 1")
        return self


class CurriculumConfig(Section):
    schedule: Literal["fixed", "stepwise"] = Field(
        "fixed", description="Horizon schedule (ScalingInter-RL is `stepwise`)."
    )
    horizon: int = Field(10, ge=1, description="Max turns per episode for the `fixed` schedule.")
    horizons: list[int] = Field(
        default_factory=lambda: [5, 10, 15], description="Horizons of the `stepwise` schedule, in order."
    )
    advance_every: int = Field(10, ge=1, description="`stepwise`: iterations spent at each horizon.")

    @model_validator(mode="after")
    def _horizons_grow(self) -> CurriculumConfig:
        if self.schedule == "stepwise":
            if not self.horizons:
                raise ValueError("curriculum.horizons must list at least one horizon for the stepwise schedule")
            if any(h < 1 for h in self.horizons) or self.horizons != sorted(self.horizons):
                raise ValueError(f"curriculum.horizons must be positive and non-decreasing, got {self.horizons}")
        return self


class TrainerConfig(Section):
    iterations: int = Field(100, ge=1, description="Training iterations (rollout + update each).")
    tasks_per_iteration: int = Field(
        4, ge=1, description="Distinct tasks per iteration; each is played group_size times."
    )
    mode: Literal["sync"] = Field("sync", description="Rollout/training overlap; `sync` alternates them.")
    checkpoint_every: int = Field(10, ge=1, description="Save a checkpoint every N iterations (and after the last).")


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    progress: bool = Field(True, description="Show a live progress bar per iteration.")


class RayConfig(Section):
    address: str | None = Field(None, description="Ray cluster address; None starts a local instance on 127.0.0.1.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray instance (None: all cores).")


class Config(Section):
    """The whole training configuration; each component receives its own section."""

    run: RunConfig = Field(default_factory=RunConfig, description="Run name, directory and seed.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Training environment.")
    sampler: SamplerConfig = Field(default_factory=SamplerConfig, description="Rollout samplers.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Interaction-horizon schedule.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Driver loop.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Logs and progress display.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster connection.")

"""The configuration schema: one pydantic model per component, all ``extra="forbid"``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from agentgym_rl.configs.engines import SIMULATED_ENGINES, config_engine
from agentgym_rl.configs.strict import StrictNumbers

# Driver loops that train on a weighted mix of envs (`envs`).
MIX_MODES = ("sync", "async")

# How configs/loader.py resolves the input paths (files and folders a run reads).
RELATIVE_INPUT = (
    "A relative path resolves, in a config file inside the repository (the presets, the committed stage configs, a "
    "run directory under it), against the repository root; in any other config file, against that file's folder; "
    "in `--set`, against the working directory. The loaded config holds it absolute (`~` expanded)."
)


class Section(StrictNumbers):
    """Base of every config section: unknown keys are errors, assignments are validated, numbers refuse booleans."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str | None = Field(
        None, description="Run name; the run directory is `<dir>/<name>`. None: `<env>-<date>-<time>`."
    )
    dir: str = Field(
        "runs", description="Parent directory of run directories; a relative one is taken from the working directory."
    )
    seed: int = Field(0, description="The one seed behind task sampling, generation sampling and model init.")


class ModelConfig(Section):
    name: str = Field(
        "smollm2-135m-instruct",
        description="A built-in model (`smollm2-135m-instruct`, `tiny-random`) or a local Hugging Face "
        "model directory. A relative directory resolves as `adapter` does when it exists there (the loaded config "
        "then holds it absolute); otherwise the name is kept as given: a built-in, or a directory taken from the "
        "working directory.",
    )
    adapter: str | None = Field(
        None,
        description="A LoRA adapter directory trained on `name` (a LoRA run's `checkpoints/iter_N/policy`, or a "
        "committed stage's `adapter`) to start from: a LoRA run (`learner.lora.enabled`) goes on training it, a "
        "full run starts from the base with it merged in. Its base model's weights hash is checked on load. "
        + RELATIVE_INPUT,
    )
    tool_format: str = Field(
        "hermes",
        description="How tool calls are written in text, for the endpoint's function calling, the episode book and "
        "`env.action_format: tools` rollouts: a registered format (`hermes`: functions in `<tools>` in the system "
        'prompt, calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, results in '
        "`<tool_response>`, the Qwen2.5/Qwen3 and Hermes convention) or a `package.module:Class` path (see "
        "`actors.tool_formats.register_tool_format`). Checked when a sampler or replica starts.",
    )
    tool_template: Literal["auto", "builtin", "model"] = Field(
        "auto",
        description="What renders a conversation's opening when functions are offered: `model`, the model's own chat "
        "template (it must render tools, and a call's result the way the format appends it after a reply); "
        "`builtin`, the format's own text through the plain template (SmolLM2's template renders no tools); `auto`, "
        "the model's own where it qualifies, else the built-in one.",
    )


ACTION_FORMAT = (
    "How the trainer's own rollouts and evaluations talk to the env: `text`, each reply is the action as the env's "
    "instruction asks for it; `tools`, the env's functions are offered (rendered by `model.tool_format`), each "
    "reply's first call is the action and the observation comes back as its result. `tools` needs an env that "
    "describes its actions as functions (babyai, textcraft, search, mcp, openenv; `train` names them otherwise)."
)


class EnvConfig(Section):
    name: str = Field("babyai", description="Registered environment name (see `agentgym-rl envs`).")
    split: Literal["train", "test"] = Field("train", description="Split that training tasks are drawn from.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific options, validated by the env's own Options model."
    )
    action_format: Literal["text", "tools"] = Field("text", description=ACTION_FORMAT)


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 disables.")
    max_new_tokens: int = Field(64, ge=1, description="Per-turn cap on generated tokens.")
    stop: list[str] = Field(
        default_factory=list,
        description="Strings that end a turn once a reply contains one (kept in the reply, like a stop token); "
        "the end-of-turn token always ends a turn.",
    )

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, stop: list[str]) -> list[str]:
        if any(not s for s in stop):
            raise ValueError(f"sampling.stop strings must be non-empty, got {stop!r}")
        return stop


class VLLMConfig(Section):
    """Settings of the vLLM engine (`engine: vllm`); the transformers engine ignores them."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one engine shards the model over; needs that many reserved (`num_gpus`)."
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Share of each of its GPUs' memory the engine may take for weights and its key/value cache "
        "(vLLM's CPU build bounds its cache by VLLM_CPU_KVCACHE_SPACE instead).",
    )
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="Longest sequence (prompt + completion) the engine accepts and sizes its cache for; None: "
        "the model's own limit.",
    )

    enable_sleep_mode: bool = Field(
        False,
        description="Let the engine sleep (give back its GPU memory: weights to host memory, key/value cache "
        "dropped) while the learner trains, and wake for the next rollout; `trainer.placement: colocated` "
        "needs it. vLLM's CPU build has no sleep mode: there the engine sleeps and wakes without freeing anything.",
    )

    def check_fits(self, section: str, num_gpus: float | None, longest: int) -> None:
        """Raise ValueError naming the key when these settings do not fit the actor's GPUs or longest sequence."""
        gpus = num_gpus if num_gpus is not None else 1.0
        if self.tensor_parallel_size > gpus:
            raise ValueError(
                f"{section}.vllm.tensor_parallel_size={self.tensor_parallel_size} needs that many GPUs per engine, "
                f"but {section}.num_gpus={num_gpus} reserves {gpus:g}; set {section}.num_gpus="
                f"{self.tensor_parallel_size}"
            )
        if self.max_model_len is not None and self.max_model_len < longest:
            raise ValueError(
                f"{section}.vllm.max_model_len={self.max_model_len} is shorter than the longest sequence the "
                f"{section} sends ({longest} tokens); raise it or leave it unset"
            )


class ModelledEngineConfig(Section):
    """Settings of the modelled engine (`engine: modelled`), a simulation for scale benchmarks: no model runs.

    Each reply is drawn, not computed: its length from a log-normal distribution (agents' replies are long-tailed),
    its text filler ending in ``Action: <one of actions>`` and the end-of-turn token, so episodes play on to their end.
    Time passes as a GPU engine with continuous batching would spend it, asleep (no CPU): a decode step of ``rows``
    rows takes ``decode_step_s + decode_row_s * rows``, and every prompt id not cached from the episode's previous
    turn costs ``prefill_token_s`` while the batch waits. The defaults model a 7B model (Qwen2.5-7B, bfloat16) on one
    H100 SXM by its roofline (docs/results/performance.md derives them). Never a learning claim: `eval`, `compare`
    and the stage scripts refuse it, and a run with it plays no held-out tasks.
    """

    reply_tokens_median: int = Field(32, ge=1, description="Median reply length in tokens (log-normal).")
    reply_tokens_sigma: float = Field(
        0.7, ge=0.0, description="Spread of the log-normal reply length (sigma of its log); 0: every reply the median."
    )
    actions: list[str] = Field(
        default_factory=lambda: ["turn left", "turn right", "move forward"],
        min_length=1,
        description="What a reply's last line says after `Action: `, drawn uniformly per reply: actions the env accepts "
        "(the defaults are BabyAI's, always available there).",
    )
    decode_step_s: float = Field(
        0.0065, ge=0.0, description="Seconds of one decode step whatever its rows (reading the weights)."
    )
    decode_row_s: float = Field(
        5.5e-5, ge=0.0, description="Seconds one more row adds to a decode step (its compute and its keys/values)."
    )
    prefill_token_s: float = Field(
        3.1e-5,
        ge=0.0,
        description="Seconds per prompt id prefilled (ids cached from the episode's last turn cost none).",
    )


class SamplerConfig(Section):
    engine: str = Field(
        "transformers",
        description="Generation engine: `transformers` (CPU or one GPU), `vllm` (needs a CUDA GPU and "
        "`pip install agentgym-rl[vllm]`; checked when the sampler starts), `modelled` (a simulation for scale "
        "benchmarks: replies drawn, GPU time modelled; see `modelled`), a name registered with "
        "`actors.engines.register_engine` (kept as the `package.module:Class` it stands for) or such a path.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Dtype the sampler's engine (and a serving replica) computes in. `auto`: bfloat16 on a GPU that "
        "supports it, a CPU with AMX, or a CPU with AVX512-BF16 where a matmul probe finds bfloat16 at least 1.25x "
        "faster than float32 (0.55x on one of this project's machines, 4.4x on another); else float32.",
    )
    kv_cache_tokens: int | None = Field(
        None,
        ge=0,
        description="`transformers` engine: token positions of keys/values kept between the turns of running "
        "episodes (all of them together; least recently used evicted), so a turn prefills only its new ids; "
        "0 re-prefills every turn. None: room for every concurrent episode's whole context (the most env actors "
        "a sampler has x `envs_per_actor` x `max_context_tokens`), on a GPU at most what half the memory free after the model loads "
        "holds (a decode batch copies the keys/values it reuses); a number is used as given. vLLM manages its own "
        "prefix cache.",
    )
    policy: Literal["model", "oracle"] = Field(
        "model",
        description="Who writes the replies: the model, or the env's oracle (demonstrations for `sft`).",
    )
    count: int = Field(1, ge=1, description="Number of sampler actors.")
    envs_per_sampler: int = Field(4, ge=1, description="Env actors owned by each sampler (episodes run concurrently).")
    envs_per_actor: int = Field(
        1,
        ge=1,
        description="Env instances each env actor holds, each playing its own episode. 1: a process per instance. More "
        "share Ray's cost per process (about 60 MB of proportional memory, a second of start-up and 1 % of a core "
        "idle, measured on a 2-core CPU) among them, and their steps then run one after another in that process: "
        "for envs with quick steps and no waiting on I/O (babyai, textcraft, target-word), at many env actors per "
        "node. A sampler plays `envs_per_sampler x envs_per_actor` episodes at once; pool sizes count env actors.",
    )
    max_batch_size: int = Field(
        32,
        ge=1,
        description="Most turns a sampler has in its engine at once (rows decoding together); a turn that is ready "
        "while that many decode waits for the first to finish. On a CPU a decode step costs nearly the same for 1 row "
        "as for 16 (it reads every weight once), so more rows in flight is more tokens per second.",
    )
    max_context_tokens: int = Field(
        2048, ge=16, description="Episode token budget; an episode that would exceed it ends with truncated=True."
    )
    num_cpus: float = Field(0.5, gt=0.0, description="CPUs reserved by each sampler actor.")
    num_threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads; 0 = on a GPU, the CPUs Ray reserved for the actor (`num_cpus`, "
        "rounded, at least 1), so the actors sharing a GPU node do not oversubscribe its cores; on a CPU-only "
        "node, every core (in sync mode rollout and update take turns, each on the whole machine).",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters.")
    env_timeout_s: float = Field(
        60.0,
        gt=0.0,
        description="Longest wait for one env reset/step; a slower or dead env actor is replaced and the "
        "episode retried once on a fresh one, then recorded as failed (not trained on).",
    )
    min_count: int = Field(
        1,
        ge=1,
        description="Elastic pool: fewest live samplers. Dead samplers are dropped (their episodes move to the "
        "others) and replaced at the next iteration when the cluster has room; fewer than this ends the run.",
    )
    max_count: int | None = Field(
        None,
        ge=1,
        description="Elastic pool: at each iteration start the pool grows toward this many samplers while some "
        "node has room for one; None: `count` (no growth beyond the start).",
    )
    min_envs_per_sampler: int = Field(
        1,
        ge=1,
        description="Elastic pool: fewest env actors per sampler. Dead env actors are replaced while the cluster "
        "has room and dropped otherwise; a sampler left with fewer at an iteration start ends the run.",
    )
    max_envs_per_sampler: int | None = Field(
        None,
        ge=1,
        description="Elastic pool: at each iteration start every sampler grows toward this many env actors "
        "while the cluster has room; None: `envs_per_sampler` (no growth beyond the start).",
    )
    env_num_cpus: float = Field(
        0.05, gt=0.0, description="CPUs reserved by each env actor (env actors are spread over the nodes)."
    )
    num_gpus: float | None = Field(
        None,
        ge=0.0,
        description="GPUs reserved by each sampler actor (its engine runs on the GPU it is given); None: 1 "
        "when the Ray cluster has GPUs, else 0.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each sampler actor reserves, e.g. `{rollout_node: 1}` to place "
        "samplers only on nodes started with `ray start --resources='{\"rollout_node\": 4}'`.",
    )
    start_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="Longest wait for a new sampler or env actor to start (process, imports, model load); one "
        "that has not started by then is removed and the pool stays smaller. Samplers that start at once wait this "
        "long for each one a node starts beside others (8 on one node: 8 times as long), as their engines share the "
        "node's disk and CPUs while they load.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings (`engine: vllm`).")
    modelled: ModelledEngineConfig = Field(
        default_factory=ModelledEngineConfig,
        description="Modelled engine settings (`engine: modelled`, a simulation for scale benchmarks only).",
    )

    @property
    def episode_cache_tokens(self) -> int:
        """Key/value positions the engine keeps between turns: ``kv_cache_tokens``, or when it is unset every
        concurrent episode's whole context."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        return (self.max_envs_per_sampler or self.envs_per_sampler) * self.envs_per_actor * self.max_context_tokens

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, engine: str) -> str:
        return config_engine(engine)

    @model_validator(mode="after")
    def _pool_bounds(self) -> SamplerConfig:
        top = self.max_count if self.max_count is not None else self.count
        if not self.min_count <= self.count <= top:
            raise ValueError(
                f"sampler pool bounds must satisfy min_count <= count <= max_count, got "
                f"{self.min_count} <= {self.count} <= {top}"
            )
        top = self.max_envs_per_sampler if self.max_envs_per_sampler is not None else self.envs_per_sampler
        if not self.min_envs_per_sampler <= self.envs_per_sampler <= top:
            raise ValueError(
                f"env pool bounds must satisfy min_envs_per_sampler <= envs_per_sampler <= max_envs_per_sampler, "
                f"got {self.min_envs_per_sampler} <= {self.envs_per_sampler} <= {top}"
            )
        if self.engine == "vllm":
            self.vllm.check_fits("sampler", self.num_gpus, self.max_context_tokens)
        return self


class AlgorithmConfig(Section):
    """``name`` and ``group_size`` here; every other key is a hyperparameter of the chosen algorithm,
    validated against that algorithm's own Config when the run starts (see docs/concepts/algorithms.md)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = Field(
        "grpo",
        description="Registered algorithm (`grpo`, `rloo`, `reinforce_pp`, `ppo`, `gigpo`, `gspo`, `cispo`, `sft`, "
        "`dpo`) or `package.module:Class`.",
    )
    group_size: int = Field(4, ge=1, description="Episodes sampled per task (the group of GRPO and RLOO).")


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights (needs `peft`).")
    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: int = Field(32, ge=1, description="Adapter scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names to adapt, or `all-linear`: every linear layer of the decoder (attention and "
        "MLP; not the output head), the choice that matches full fine-tuning in RL at about 10x its lr.",
    )


class LearnerConfig(Section):
    backend: Literal["torch", "deepspeed"] = Field("torch", description="Training backend.")
    count: int = Field(1, ge=1, description="Learner actors (data parallel; more than 1 needs deepspeed).")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2,
        description="DeepSpeed ZeRO stage (deepspeed backend only). 3 partitions the parameters too: every "
        "learner holds a share, and publishing, saving and the parameter-norm metric gather them.",
    )
    lr: float = Field(1e-6, gt=0.0, description="AdamW peak learning rate.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate decay after warm-up, over trainer.iterations updates."
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0 to lr.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")
    epochs: int = Field(1, ge=1, description="Passes over each iteration's batch (PPO epochs).")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per epoch; the batch is split in this many parts.")
    micro_batch_size: int = Field(
        4, ge=1, description="Sequences (or packed rows) per forward/backward; gradients accumulate."
    )
    packing: bool = Field(False, description="Pack several trajectories into one row (same loss, less padding).")
    pack_tokens: int = Field(0, ge=0, description="Tokens per packed row; 0 = the longest trajectory of the batch.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    precision: Literal["auto", "float32", "bf16-mixed"] = Field(
        "auto",
        description="`bf16-mixed`: forward and backward in bfloat16 while the optimizer updates float32 master "
        "weights (updates far below bfloat16's resolution still accumulate; checkpoints and published weights "
        "come from the master). `auto`: bf16-mixed where bfloat16 is fast (see sampler.dtype), else float32.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")
    num_cpus: float = Field(1.0, gt=0.0, description="CPUs reserved by each learner actor.")
    num_gpus: float | None = Field(
        None,
        ge=0.0,
        description="GPUs reserved by each learner actor; None: one when the cluster has GPUs, else none. A "
        "learner that reserves none sees no GPU (its CUDA_VISIBLE_DEVICES is empty).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the learner computes: the policy, reference model, critic, optimizer state and every "
        "micro-batch live there. `auto`: `cuda` when the learner reserved a GPU (it sees only that one), else "
        "`cpu`.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each learner actor reserves, to place learners on chosen nodes "
        "(e.g. `{learner_node: 1}`).",
    )
    old_logprobs: Literal["auto", "recompute", "sampler"] = Field(
        "auto",
        description="Ratio denominators: `recompute` scores the batch with the learner's weights in a pass of its "
        "own before the update; `sampler` uses the sampler's log-probs (off-policy correction; needs temperature "
        "1; the only choice in trainer.mode=async); `auto`: `sampler` in async mode, otherwise, when each batch "
        "gets one optimizer step (epochs 1, minibatches 1) and the algorithm's advantages do not read them, the "
        "training forward's own detached log-probs (equal to `recompute` without its extra forward), else "
        "`recompute`.",
    )
    num_threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads; 0 = on a GPU, the CPUs Ray reserved for the actor (`num_cpus`, "
        "rounded, at least 1), so the actors sharing a GPU node do not oversubscribe its cores; on a CPU-only "
        "node, every core (in sync mode rollout and update take turns, each on the whole machine).",
    )

    @model_validator(mode="after")
    def _backend_fits(self) -> LearnerConfig:
        if self.backend == "torch" and self.count != 1:
            raise ValueError("learner.count > 1 needs learner.backend='deepspeed'")
        if self.device == "cuda" and self.num_gpus == 0:
            raise ValueError(
                "learner.device='cuda' needs a GPU, but learner.num_gpus=0 reserves none: set learner.num_gpus "
                "(or leave it unset on a cluster with GPUs), or learner.device='auto'"
            )
        return self


class CurriculumConfig(Section):
    schedule: Literal["fixed", "stepwise", "adaptive"] = Field(
        "fixed",
        description="Horizon schedule: `fixed`, `stepwise` (ScalingInter-RL: advance every `advance_every` "
        "iterations) or `adaptive` (advance when the rolling success or truncation rate passes a threshold).",
    )
    horizon: int = Field(10, ge=1, description="Max turns per episode for the `fixed` schedule.")
    horizons: list[int] = Field(
        default_factory=lambda: [5, 10, 15],
        description="Horizons of the `stepwise` and `adaptive` schedules, in order.",
    )
    advance_every: int = Field(10, ge=1, description="`stepwise`: iterations spent at each horizon.")
    window: int = Field(
        5, ge=1, description="`adaptive`: iterations (at the current horizon) the rolling rates are averaged over."
    )
    success_threshold: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="`adaptive`: advance when the rolling `success_rate` reaches this value.",
    )
    truncation_threshold: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="`adaptive`: also advance when the rolling `rollout/truncated_rate` reaches this value "
        "(the horizon binds); None disables this trigger.",
    )
    min_iterations_per_stage: int = Field(
        10, ge=1, description="`adaptive`: fewest iterations spent at a horizon before the next advance."
    )

    @model_validator(mode="after")
    def _horizons_grow(self) -> CurriculumConfig:
        if self.schedule in ("stepwise", "adaptive"):
            if not self.horizons:
                raise ValueError(f"curriculum.horizons must list at least one horizon for the {self.schedule} schedule")
            if any(h < 1 for h in self.horizons) or self.horizons != sorted(self.horizons):
                raise ValueError(f"curriculum.horizons must be positive and non-decreasing, got {self.horizons}")
        return self


class MixEntry(Section):
    """One env of a multi-env run (`envs`): its share of every iteration's tasks and its own horizon schedule."""

    name: str = Field(description="Registered environment name (see `agentgym-rl envs`); each env at most once.")
    weight: float = Field(
        1.0,
        gt=0.0,
        description="Share of each iteration's `trainer.tasks_per_iteration` tasks, relative to the other entries' "
        "weights (largest remainder; every env gets at least one task).",
    )
    split: Literal["train", "test"] = Field("train", description="Split that this env's training tasks are drawn from.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific options, validated by the env's own Options model."
    )
    action_format: Literal["text", "tools"] = Field("text", description=ACTION_FORMAT)
    curriculum: CurriculumConfig | None = Field(
        None, description="This env's horizon schedule (its own CurriculumActor); None: the run's `curriculum`."
    )
    warm_start_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Env options merged over `options` for this env's warm-start demonstrations (e.g. BabyAI's "
        "`oracle: true`); the mix's counterpart of `warm_start.env_options`.",
    )


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling (Yu et al. 2025): refill the batch with tasks whose episodes differ."""

    enabled: bool = Field(
        False,
        description="After an iteration's rollout, draw and play more tasks until `trainer.tasks_per_iteration` "
        "groups are informative (the algorithm keeps them: for grpo and rloo, their episodes' rewards differ), "
        "at most `max_extra_tasks` more per iteration. Needs trainer.mode=sync and an algorithm that skips "
        "uninformative groups (grpo, rloo with skip_uniform_groups, dpo).",
    )
    max_extra_tasks: int = Field(
        8, ge=1, description="Most extra tasks (each played group_size times) one iteration may draw."
    )


class WeightSyncConfig(Section):
    method: Literal["auto", "object_store", "broadcast"] = Field(
        "auto",
        description="How each weights version reaches the samplers: `object_store` puts it in Ray's object store "
        "once and every sampler reads it (on CPUs the transformers engine then uses it in place, without a copy); "
        "`broadcast` sends it from learner rank 0 straight into the engines, vLLM's workers included, by the way "
        "the devices of both ends call for: CUDA IPC when every engine is on the learner's GPU, NCCL when every "
        "end has a GPU of its own, gloo otherwise; `auto` is `broadcast` when the learner computes on a GPU, "
        "else `object_store`. The serving endpoint and samplers that join between syncs always read the object "
        "store.",
    )
    bucket_mb: float = Field(
        256.0, gt=0, description="`broadcast`: tensors are packed into buffers of about this size, one broadcast each."
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="`broadcast`: how long a weight group may take to form, one broadcast to arrive, or one "
        "engine to load a version shared by CUDA IPC, before the sync fails (and that version goes through the "
        "object store).",
    )


class GatewayConfig(Section):
    """`trainer.mode: gateway`: how an iteration waits for the episodes clients record on the endpoint."""

    timeout_s: float = Field(
        600.0,
        gt=0,
        description="An iteration trains once `trainer.tasks_per_iteration` groups are complete, or after this "
        "long with at least one complete group (it keeps waiting while none is).",
    )
    poll_s: float = Field(1.0, gt=0, description="How often the trainer collects closed episodes from the endpoint.")


class TrainerConfig(Section):
    iterations: int = Field(100, ge=1, description="Training iterations (rollout + update each).")
    tasks_per_iteration: int = Field(
        4, ge=1, description="Distinct tasks per iteration; each is played group_size times."
    )
    mode: Literal["sync", "async", "offline", "agentevol", "gateway"] = Field(
        "sync",
        description="`sync` alternates rollout and update; `async` runs the next iterations' rollout while the "
        "learner trains (needs learner.old_logprobs=sampler, the default in async mode); `offline` trains on "
        "logged trajectories (`data.files`), no rollout; `agentevol` runs AgentEvol rounds (`agentevol`); "
        "`gateway` serves the policy (`serve.enabled`) and trains on the episodes clients record through it "
        "(`/v1/episodes`, `trainer.gateway`).",
    )
    max_staleness: int = Field(
        1,
        ge=1,
        description="`async`: iterations rollout may run ahead of training; a trajectory sampled more than this "
        "many weight versions before the learner's version is dropped (`rollout/dropped_stale`). `gateway`: "
        "the same for recorded episodes.",
    )
    checkpoint_every: int = Field(10, ge=1, description="Save a checkpoint every N iterations (and after the last).")
    keep_checkpoints: int = Field(0, ge=0, description="Keep only the newest N complete checkpoints; 0 keeps all.")
    heldout_tasks: int = Field(
        0,
        ge=0,
        description="Held-out tasks: this many tasks of the env's `test` split (evenly spaced; shared among the "
        "envs of a mix by weight), played once each by the run's samplers before the first update and every "
        "`heldout_every` iterations, always the same tasks from the same seeds at the curriculum's largest "
        "horizon with the sampler's sampling settings; recorded as `heldout/success_rate` with its Wilson 95 % "
        "interval (`heldout/success_low`, `heldout/success_high`) and shown in the progress display. 0 turns "
        "it off. `offline` and `gateway` modes play no episodes and skip it (with a warning).",
    )
    heldout_every: int = Field(
        4, ge=1, description="Play the held-out tasks (`heldout_tasks`) at iteration 0 and every N iterations."
    )
    on_learner_failure: Literal["fail", "restart"] = Field(
        "fail",
        description="When a learner actor dies: `fail` ends the run with an error (continue it with --resume); "
        "`restart` starts new learner actors, loads the last complete checkpoint (weights, optimizer, "
        "curriculum, task order; the start of the run if none) and goes on from there (`sync` mode).",
    )
    max_learner_restarts: int = Field(
        3, ge=0, description="`restart`: learner restarts allowed in one run before it ends with an error."
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig, description="Refill each batch with informative task groups."
    )
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="How new weights reach the samplers."
    )
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="`gateway` mode: waiting for clients' episodes."
    )
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="`disaggregated`: learners and samplers hold resources of their own (samplers generate "
        "while nothing else needs their GPUs); `colocated`: learner i and sampler i share one placement bundle "
        "(`learner.num_cpus` + `sampler.num_cpus` CPUs and the learner's `learner.num_gpus` GPUs, half of them "
        "reserved by each), the samplers sleep while the learners train, and the learners keep their optimizer "
        "state in host memory while the samplers generate. Needs `trainer.mode: sync`, one env, "
        "`sampler.count` = `learner.count` (no `sampler.max_count`), and with the vLLM engine "
        "`sampler.vllm.enable_sleep_mode: true`.",
    )

    @model_validator(mode="after")
    def _dynamic_sampling_fits_mode(self) -> TrainerConfig:
        if self.dynamic_sampling.enabled and self.mode != "sync":
            raise ValueError(
                f"trainer.dynamic_sampling.enabled needs trainer.mode=sync (got {self.mode!r}); "
                "set trainer.dynamic_sampling.enabled=false"
            )
        return self

    @model_validator(mode="after")
    def _restart_fits_mode(self) -> TrainerConfig:
        if self.on_learner_failure == "restart" and self.mode != "sync":
            raise ValueError(
                f"trainer.on_learner_failure=restart needs trainer.mode=sync (got {self.mode!r}); "
                "use on_learner_failure=fail and --resume instead"
            )
        return self


class DataConfig(Section):
    files: list[str] = Field(
        default_factory=list,
        description="Logged trajectories: `trajectories/*.jsonl` files, run directories (all their trajectory "
        "files) or glob patterns. `offline` trains on them; `agentevol` adds them to every round's data. "
        + RELATIVE_INPUT,
    )


class AgentEvolConfig(Section):
    rounds: int = Field(3, ge=1, description="Rounds of explore, filter, merge, SFT (the run's iterations).")
    tasks_per_round: int = Field(8, ge=1, description="Distinct training tasks explored per round.")
    samples_per_task: int = Field(4, ge=1, description="Episodes the current policy plays per task and round.")
    filter: Literal["success", "top_k"] = Field(
        "success",
        description="Episodes kept: every success, or per task the `k` highest-reward ones with reward > 0.",
    )
    k: int = Field(1, ge=1, description="`top_k`: episodes kept per task.")
    eval_tasks: int = Field(
        0, ge=0, description="Test-split tasks played once after each round's update (`eval/test_success_rate`)."
    )


class WarmStartConfig(Section):
    """SFT warm start: behaviour cloning of the env's oracle, run by ``train`` before the RL iterations."""

    iterations: int = Field(0, ge=0, description="Warm-start (SFT) iterations before RL; 0 turns the phase off.")
    tasks_per_iteration: int = Field(8, ge=1, description="Training tasks the oracle plays per warm-start iteration.")
    lr: float = Field(1.0e-5, gt=0, description="Learning rate of the warm-start updates.")
    epochs: int = Field(1, ge=1, description="Passes over each warm-start iteration's demonstrations.")
    minibatches: int = Field(2, ge=1, description="Optimizer steps per warm-start epoch.")
    horizon: int | None = Field(
        None, ge=1, description="Turn limit of the demonstrations; None uses the curriculum's largest horizon."
    )
    env_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Env options merged over env.options for the demonstrations (e.g. BabyAI's `oracle: true`).",
    )


class WandbConfig(Section):
    enabled: bool = Field(False, description="Log metrics, horizon changes and sample episodes to Weights & Biases.")
    project: str = Field("agentgym-rl", description="W&B project name.")
    entity: str | None = Field(None, description="W&B entity (user or team); None: wandb's default.")
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="`offline` writes the run under `dir` and needs no network; sync later with `wandb sync`.",
    )
    dir: str | None = Field(
        None,
        description="Where wandb writes its files (a relative path is taken from the working directory); None: the "
        "run directory.",
    )
    episodes_per_iteration: int = Field(
        4, ge=0, description="Episodes per iteration added to the `episodes` table (0: no table)."
    )


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    progress: bool = Field(True, description="Show a live progress bar per iteration.")
    max_trajectories_per_iteration: int = Field(
        0,
        ge=0,
        description="Write at most this many trajectories per iteration to trajectories/ (0 = all): every "
        "success first, then failures drawn with the run seed; the learner still trains on all of them.",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging.")


class RayConfig(Section):
    address: str | None = Field(None, description="Ray cluster address; None starts a local instance on 127.0.0.1.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray instance (None: all cores).")
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of each of the cluster's GPUs in GiB, for the memory plan that `train` checks before "
        "it starts (`agentgym-rl plan`); None: the GPU this machine sees, else 80.",
    )


class AutoscalingConfig(Section):
    min_replicas: int = Field(1, ge=0, description="Fewest model replicas kept running.")
    max_replicas: int = Field(2, ge=1, description="Most model replicas started under load.")
    target_ongoing_requests: float = Field(
        8.0, gt=0.0, description="Ongoing requests per replica that autoscaling aims for."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"serve.autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self


class EpisodesConfig(Section):
    """Episodes recorded on the endpoint (`/v1/episodes`): agents outside this project play through it."""

    ttl_s: float = Field(
        600.0, gt=0, description="An episode with no call or reward for this long expires and is dropped."
    )
    max_open: int = Field(1000, ge=1, description="Episodes kept at once (open or awaiting training); more: 429.")
    max_open_per_client: int = Field(
        100,
        ge=1,
        description="Open episodes one client may hold (a client: the bearer key it sends and its address); its "
        "next one gets 429 while other clients still open theirs.",
    )
    reward_range: tuple[float, float] = Field(
        (-10.0, 10.0), description="Lowest and highest reward a client may post (outside: 400)."
    )
    on_rewrite: Literal["segment", "mismatch"] = Field(
        "segment",
        description="A call whose history does not continue the recorded one (the agent compacted, rewrote or "
        "restarted it): `segment` starts a new segment of the episode from that call's messages, recorded "
        "token-exact as always, and every segment trains; `mismatch` marks the episode, which then never trains.",
    )

    @model_validator(mode="after")
    def _range_is_ordered(self) -> EpisodesConfig:
        low, high = self.reward_range
        if low > high:
            raise ValueError(f"serve.episodes.reward_range must be [low, high] with low <= high, got [{low}, {high}]")
        return self


class ServeConfig(Section):
    enabled: bool = Field(False, description="Serve the policy over HTTP while training, updated every iteration.")
    host: str = Field("127.0.0.1", description="Interface the HTTP server binds; anything but loopback is public.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    api_key: str | None = Field(
        None,
        min_length=1,
        description="Bearer key every request must send; None reads AGENTGYM_RL_API_KEY, unset means no auth.",
    )
    engine: str | None = Field(
        None,
        description="Engine of the model replicas: `transformers` (continuous batching over the sampler's decode "
        "step), `vllm` (vLLM's own async engine; needs `pip install agentgym-rl[vllm]`, checked at start), or a "
        "registered engine with a serving form (as for `sampler.engine`). None: the training sampler's engine "
        "(`sampler.engine`); `agentgym-rl serve`: transformers.",
    )
    num_replicas: int = Field(1, ge=1, description="Model replicas when `autoscaling` is not set.")
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Scale model replicas with load instead of a fixed `num_replicas`."
    )
    num_cpus: float = Field(
        0.05,
        gt=0.0,
        description="CPUs reserved by each model replica (small, so it fits beside samplers and the learner; "
        "the replica's torch threads use the cores regardless).",
    )
    num_gpus: float | None = Field(
        None,
        ge=0.0,
        description="GPUs reserved by each model replica (its engine runs on the GPU it is given); None: 1 when "
        "the Ray cluster has GPUs, else 0.",
    )
    max_batch_size: int = Field(
        32,
        ge=1,
        description="Most completions one replica decodes at once (continuous batching: a request joins the "
        "running batch at the next step and leaves it the step it finishes).",
    )
    kv_cache_tokens: int = Field(
        32768,
        ge=1,
        description="`transformers` engine: bound on the running batch's key/value positions (rows x the longest "
        "row's prompt + max_tokens); a request waits until it fits. vLLM sizes its own paged cache.",
    )
    prefix_cache_tokens: int = Field(
        0,
        ge=0,
        description="`transformers` engine: key/value positions a replica keeps between an episode's calls (each "
        "call's prefix, under its episode), so its next call prefills only the new turn; the least recently used "
        "are dropped beyond it. 0: none kept. vLLM caches prefixes itself.",
    )
    episode_affinity: bool = Field(
        True,
        description="Route every call of an episode (tagged by the `X-Episode-Token` header) to the replica that "
        "served its first call, where its prefix is cached; another replica only if that one is gone.",
    )
    max_queued_requests: int = Field(
        64,
        ge=0,
        description="Requests a replica holds waiting for a free row, beyond `max_batch_size` decoding ones; "
        "more get 429.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="Torch threads of each model replica; None: the node's cores minus one (the one left to "
        "Serve's HTTP proxy and the replica's request handling), between 1 and 4 (measured in "
        "docs/results/performance.md).",
    )
    max_tokens: int = Field(256, ge=1, description="Cap on generated tokens per request (larger requests get 400).")
    max_prompt_tokens: int = Field(2048, ge=1, description="Longest accepted prompt, in tokens (longer: 400).")
    max_n: int = Field(4, ge=1, description="Largest `n` (completions per request) accepted (larger: 400).")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Largest accepted request body (larger: 413).")
    linger_s: float = Field(
        0.0, ge=0.0, description="Training: keep serving the final policy this long after the last iteration."
    )
    act_envs: list[str] | None = Field(
        None,
        description="Registered envs `/v1/act` may parse for (others: 404); each replica builds an env on its first "
        "call, which starts a simulator for some (SciWorld's Java, Deep Search's index). None: every registered "
        "env that needs no options.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="vLLM engine settings (`engine: vllm`).")
    episodes: EpisodesConfig = Field(
        default_factory=EpisodesConfig, description="Episodes recorded from clients' chat calls (`/v1/episodes`)."
    )

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, engine: str | None) -> str | None:
        return None if engine is None else config_engine(engine)

    @model_validator(mode="after")
    def _one_scaling_mode(self) -> ServeConfig:
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("set serve.num_replicas or serve.autoscaling, not both")
        if self.engine == "vllm":
            self.vllm.check_fits("serve", self.num_gpus, self.max_prompt_tokens + self.max_tokens)
        return self

    @model_validator(mode="after")
    def _largest_request_fits(self) -> ServeConfig:
        if self.max_n > self.max_batch_size:
            raise ValueError(
                f"serve.max_n ({self.max_n}) exceeds serve.max_batch_size ({self.max_batch_size}): a request's "
                "choices decode together; lower max_n or raise max_batch_size"
            )
        largest = self.max_n * (self.max_prompt_tokens + self.max_tokens)
        if largest > self.kv_cache_tokens:
            raise ValueError(
                f"serve.kv_cache_tokens ({self.kv_cache_tokens}) cannot hold the largest accepted request: max_n "
                f"({self.max_n}) x (max_prompt_tokens {self.max_prompt_tokens} + max_tokens {self.max_tokens}) = "
                f"{largest}; raise kv_cache_tokens or lower those limits"
            )
        return self


class Config(Section):
    """The whole training configuration; each component receives its own section."""

    run: RunConfig = Field(default_factory=RunConfig, description="Run name, directory and seed.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    env: EnvConfig = Field(
        default_factory=EnvConfig, description="Training environment (unused for training when `envs` is set)."
    )
    envs: list[MixEntry] = Field(
        default_factory=list,
        description="Multi-env training: a weighted mix of envs, each with its own samplers, env actors, task draw "
        "and horizon schedule (metrics `env/<name>/*`). Empty: train on `env` alone.",
    )
    sampler: SamplerConfig = Field(default_factory=SamplerConfig, description="Rollout samplers.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Interaction-horizon schedule.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Driver loop.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Logs and progress display.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster connection.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="Policy HTTP endpoint.")
    data: DataConfig = Field(default_factory=DataConfig, description="Logged trajectories to train on.")
    agentevol: AgentEvolConfig = Field(default_factory=AgentEvolConfig, description="AgentEvol rounds.")
    warm_start: WarmStartConfig = Field(
        default_factory=WarmStartConfig, description="SFT warm start on oracle demonstrations before RL."
    )

    @model_validator(mode="after")
    def _data_fits_mode(self) -> Config:
        if self.warm_start.iterations and self.trainer.mode not in ("sync", "async"):
            raise ValueError(
                f"warm_start runs before RL iterations: it needs trainer.mode=sync or async (got "
                f"{self.trainer.mode!r}); set warm_start.iterations=0"
            )
        if self.trainer.mode == "gateway" and not self.serve.enabled:
            raise ValueError(
                "trainer.mode=gateway trains on the episodes clients play through the endpoint: set serve.enabled=true"
            )
        if self.trainer.mode == "offline" and not self.data.files:
            raise ValueError("trainer.mode=offline trains on logged trajectories: set data.files=[FILE_OR_RUN_DIR]")
        if self.trainer.mode == "agentevol" and self.algorithm.name != "sft":
            raise ValueError(
                f"trainer.mode=agentevol fine-tunes on filtered episodes: set algorithm.name=sft "
                f"(got {self.algorithm.name!r})"
            )
        return self

    @model_validator(mode="after")
    def _simulation_claims_nothing(self) -> Config:
        if self.trainer.heldout_tasks and self.sampler.engine in SIMULATED_ENGINES:
            raise ValueError(
                "sampler.engine=modelled is a simulation for scale benchmarks; held-out success rates from it would "
                f"claim what no model did: set trainer.heldout_tasks=0 (got {self.trainer.heldout_tasks})"
            )
        return self

    @model_validator(mode="after")
    def _mix_fits(self) -> Config:
        if not self.envs:
            return self
        names = [entry.name for entry in self.envs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"envs lists {repeated} more than once; give each env one entry (its weight sets its share)"
            )
        if self.trainer.mode not in MIX_MODES:
            raise ValueError(
                f"envs (multi-env training) supports trainer.mode {' or '.join(MIX_MODES)}, got {self.trainer.mode!r}"
            )
        if self.warm_start.iterations and self.warm_start.env_options:
            raise ValueError(
                "warm_start.env_options are options of `env`, which a multi-env run (envs) does not play; give each "
                "entry its own envs[i].warm_start_options (e.g. {oracle: true} for babyai) and set "
                "warm_start.env_options={}"
            )
        if self.warm_start.iterations and self.warm_start.tasks_per_iteration < len(self.envs):
            raise ValueError(
                f"warm_start.tasks_per_iteration={self.warm_start.tasks_per_iteration} is below the {len(self.envs)} "
                f"envs of envs (each env plays at least one task per iteration); raise it to {len(self.envs)} or more"
            )
        if self.trainer.tasks_per_iteration < len(self.envs):
            raise ValueError(
                f"trainer.tasks_per_iteration={self.trainer.tasks_per_iteration} is below the {len(self.envs)} envs "
                f"of envs (each env plays at least one task per iteration); raise it to {len(self.envs)} or more"
            )
        return self

    @model_validator(mode="after")
    def _colocation_fits(self) -> Config:
        if self.trainer.placement != "colocated":
            return self
        sampler, count = self.sampler, self.learner.count
        problems = []
        if self.trainer.mode != "sync":
            problems.append(f"trainer.mode=sync (got {self.trainer.mode!r})")
        if self.envs:
            problems.append("one env (envs is set)")
        if sampler.count != count:
            problems.append(f"sampler.count = learner.count = {count} (got sampler.count={sampler.count})")
        if sampler.max_count not in (None, sampler.count):
            problems.append(f"no pool growth: sampler.max_count unset (got {sampler.max_count})")
        if sampler.num_gpus is not None:
            problems.append(f"sampler.num_gpus unset: samplers share their learner's GPUs (got {sampler.num_gpus})")
        if self.trainer.on_learner_failure != "fail":
            problems.append("trainer.on_learner_failure=fail (new learners would not find their samplers' bundles)")
        if sampler.engine == "vllm" and not sampler.vllm.enable_sleep_mode:
            problems.append("sampler.vllm.enable_sleep_mode=true")
        if problems:
            raise ValueError(f"trainer.placement=colocated needs {'; '.join(problems)}")
        return self

    @model_validator(mode="after")
    def _old_logprobs_fit_mode(self) -> Config:
        if self.trainer.mode == "async":
            if self.learner.old_logprobs == "recompute" and "old_logprobs" in self.learner.model_fields_set:
                raise ValueError(
                    "trainer.mode=async trains on data from older weights, so the ratio needs the sampler's "
                    "log-probs: set learner.old_logprobs=sampler (or leave it unset)"
                )
            if self.learner.old_logprobs != "sampler":
                self.learner.old_logprobs = "sampler"
        if self.learner.old_logprobs == "sampler" and self.sampler.sampling.temperature != 1.0:
            raise ValueError(
                f"learner.old_logprobs=sampler needs sampler.sampling.temperature=1.0 (got "
                f"{self.sampler.sampling.temperature}): the learner scores tokens at temperature 1"
            )
        return self

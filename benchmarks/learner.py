"""Learner update time as ratios between learner settings measured in the same process.

    python benchmarks/learner.py [--quick] [--model tiny-random|smollm2-135m-instruct]

Every row is one GRPO update (``LearnerActor.update_batch``) of one batch of synthetic multi-turn
trajectories: a prompt, then alternating replies (~30 sampled tokens) and env text (~90 tokens), most
of them short and a few long. Tasks come in groups of 4 whose rewards differ (0, 1, 0, 1), so every
group is informative. All learners share gradient checkpointing and micro-batches of 2 sequences (the
quickstart's); each learner is warmed up by an update on two short trajectories, then timed (median of
the repeats); one learner exists at a time. tokens/s counts every non-padding token of the batch.

Rows:
* new defaults: ``learner.precision: auto`` (resolved on this machine), ``learner.old_logprobs: auto``
  (ratio denominators from the training forward itself, detached: no scoring pass) and
  ``algorithm.kl_coef: 0`` (no reference model);
* the other precision: the same with ``float32`` and ``bf16-mixed`` swapped (bfloat16 forward and
  backward on float32 master weights) -> ``learner_bf16_vs_float32``, bf16-mixed tokens/s over float32
  tokens/s (> 1: bfloat16 is faster);
* previous defaults: ``precision: float32``, ``old_logprobs: recompute`` (a scoring pass before the
  update), ``kl_coef: 0.001`` (a reference model loaded and scored) and ``skip_uniform_groups: false``
  -> ``learner_new_vs_previous_defaults``, new-default seconds over previous-default seconds
  (< 1: the new defaults are faster);
* half the groups uniform: the same batch with every second group's rewards all 0, updated by the new
  defaults (``skip_uniform_groups: true``: those groups never enter forward or backward) and by the new
  defaults with ``skip_uniform_groups: false`` -> ``learner_skip_uniform_vs_all``, seconds with the skip
  over seconds without (< 1: skipping is faster);
* LoRA: the new defaults with ``learner.lora`` r16 (alpha 32) on every linear layer and no gradient
  checkpointing (the LoRA path's settings) -> ``learner_lora_vs_full``, its seconds over the new defaults'
  (full weights, checkpointing: the quickstart's update; < 1: LoRA is faster), and ``publish_lora_vs_full``,
  the bytes a weights version publishes (the adapter alone) over the full policy's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

# Run as a script, this file's folder leads sys.path and its envs.py / learner.py would shadow the packages.
REPO = Path(__file__).resolve().parents[1]
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [str(REPO)] + [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor
from agentgym_rl.learner.precision import resolve_precision

GROUP_SIZE = 4
# Settings every row shares (the quickstart's).
COMMON = {"gradient_checkpointing": True, "micro_batch_size": 2, "lr": 1e-6}
NEW = {"precision": "auto", "old_logprobs": "auto"}
LORA = {
    **NEW,
    "gradient_checkpointing": False,
    "lora": {"enabled": True, "r": 16, "alpha": 32, "target_modules": "all-linear"},
}
PREVIOUS = {"precision": "float32", "old_logprobs": "recompute"}


def length_mix(n: int, generator: torch.Generator, short: int, long: int) -> list[int]:
    """Mostly short episodes (success early) and a long tail (episodes that ran to the horizon)."""
    lengths = []
    for _ in range(n):
        if torch.rand(1, generator=generator).item() < 0.75:
            lengths.append(int(torch.randint(short // 2, short, (1,), generator=generator)))
        else:
            lengths.append(int(torch.randint(long // 2, long, (1,), generator=generator)))
    return lengths


def synthetic_trajectory(length: int, group: int, reward: float, generator: torch.Generator) -> Trajectory:
    """A multi-turn layout: a prompt, then alternating replies (~30 tokens) and env text (~90 tokens)."""
    ids = torch.randint(10, 5000, (length,), generator=generator).tolist()
    mask, spans, pos = [0] * min(length, 120), [], min(length, 120)
    while pos < length:
        reply = min(30, length - pos)
        spans.append((pos, pos + reply))
        mask += [1] * reply
        pos += reply
        env = min(90, length - pos)
        mask += [0] * env
        pos += env
    return Trajectory(
        env="babyai",
        task_id=group,
        group=group,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * length,
        prompt_length=min(length, 120),
        turn_spans=spans,
        messages=[],
        actions=["x"] * len(spans),
        step_rewards=[0.0] * (len(spans) - 1) + [reward],
        reward=reward,
        success=reward > 0,
        done=True,
        truncated=False,
        horizon=len(spans),
        weights_version=0,
    )


def uniform_half(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The same episodes with every odd group's rewards all 0 (a group with nothing to learn from)."""
    return [
        t.model_copy(update={"reward": 0.0, "success": False, "step_rewards": [0.0] * len(t.step_rewards)})
        if t.group % 2
        else t
        for t in trajectories
    ]


def make_learner(model: str, learner: dict, *, kl_coef: float, skip_uniform_groups: bool) -> LearnerActor:
    config = Config.model_validate(
        {
            "model": {"name": model},
            "algorithm": {
                "name": "grpo",
                "group_size": GROUP_SIZE,
                "kl_coef": kl_coef,
                "skip_uniform_groups": skip_uniform_groups,
            },
            "learner": {**COMMON, **learner},
        }
    )
    return LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)


def timed_update(learner: LearnerActor, trajectories: list[Trajectory], repeats: int) -> tuple[float, dict]:
    """Median seconds of ``repeats`` updates on ``trajectories`` and the last update's metrics."""
    seconds, metrics = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        metrics = learner.update_batch(trajectories)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), metrics


def measure(
    model: str, learner: dict, batches: list[list[Trajectory]], warm: list[Trajectory], repeats: int, **algorithm
) -> tuple[list[tuple[float, dict]], int]:
    """Build one learner, warm it up on ``warm``, time an update of each of ``batches``, then free it
    (so that a single learner's memory is resident at a time). Also returns the bytes of the weights version
    it publishes."""
    actor = make_learner(model, learner, **algorithm)
    actor.update_batch(warm)  # first-call overheads: allocator, autograd, checkpointing, bf16 copy
    results = [timed_update(actor, batch, repeats) for batch in batches]
    published = actor.weights_payload().num_bytes
    del actor
    gc.collect()
    return results, published


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="8 short trajectories, one repeat (tiny-random: well under a minute)"
    )
    parser.add_argument("--model", default="tiny-random", help="built-in model name or model directory")
    args = parser.parse_args()
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    # --quick: 2 groups of short episodes (an update of them took SmolLM2 20-150 s on 2 shared CPU cores)
    n, short, long, repeats = (8, 300, 1200, 1) if args.quick else (32, 400, 1600, 3)
    lengths = length_mix(n, generator, short=short, long=long)
    # group = i // 4 and reward = i % 2: every group has two successes and two failures
    batch = [synthetic_trajectory(length, i // GROUP_SIZE, float(i % 2), generator) for i, length in enumerate(lengths)]
    half_uniform = uniform_half(batch)
    warm = [synthetic_trajectory(160, 0, float(i), generator) for i in range(2)]
    tokens = sum(lengths)
    auto = resolve_precision("auto", torch.device("cpu"))
    other = "float32" if auto == "bf16-mixed" else "bf16-mixed"

    # The new-defaults learner also times the half-uniform batch (its skip_uniform_groups is true).
    [(new_s, new_m), (skip_s, skip_m)], full_bytes = measure(
        args.model, NEW, [batch, half_uniform], warm, repeats, kl_coef=0.0, skip_uniform_groups=True
    )
    [(other_s, other_m)], _ = measure(
        args.model, {**NEW, "precision": other}, [batch], warm, repeats, kl_coef=0.0, skip_uniform_groups=True
    )
    [(previous_s, previous_m)], _ = measure(
        args.model, PREVIOUS, [batch], warm, repeats, kl_coef=0.001, skip_uniform_groups=False
    )
    [(all_s, all_m)], _ = measure(
        args.model, NEW, [half_uniform], warm, repeats, kl_coef=0.0, skip_uniform_groups=False
    )
    [(lora_s, lora_m)], lora_bytes = measure(
        args.model, LORA, [batch], warm, repeats, kl_coef=0.0, skip_uniform_groups=True
    )
    seconds = {auto: new_s, other: other_s}

    print(
        f"model {args.model}: {n} trajectories in {n // GROUP_SIZE} groups of {GROUP_SIZE}, {tokens} tokens "
        f"(lengths {min(lengths)}-{max(lengths)}), {sum(sum(t.loss_mask) for t in batch)} sampled; "
        f"{torch.get_num_threads()} threads; precision auto = {auto} here; "
        f"median of {repeats} update(s) after a warm-up update on 2 trajectories of 160 tokens"
    )
    rows = [
        (f"new defaults ({auto}, old log-probs from the forward, no KL)", new_s, new_m),
        (f"{other} (otherwise the new defaults)", other_s, other_m),
        ("previous defaults (float32, recompute, KL 0.001 + reference)", previous_s, previous_m),
        ("half the groups uniform, skipped (new defaults)", skip_s, skip_m),
        ("half the groups uniform, all trained (skip_uniform_groups false)", all_s, all_m),
        ("LoRA r16 on every linear layer, no checkpointing (new defaults)", lora_s, lora_m),
    ]
    # trained: the trajectories and sampled tokens that entered forward and backward
    print(f"{'update':<66} {'seconds':>8} {'tokens/s':>9} {'trained':>8} {'sampled':>8}")
    for label, secs, metrics in rows:
        trained = f"{metrics['learner/trajectories']:.0f}/{n}"
        print(f"{label:<66} {secs:>8.2f} {tokens / secs:>9.0f} {trained:>8} {metrics['learner/tokens']:>8.0f}")
    ratios = {
        "learner_bf16_vs_float32": seconds["float32"] / seconds["bf16-mixed"],
        "learner_new_vs_previous_defaults": new_s / previous_s,
        "learner_skip_uniform_vs_all": skip_s / all_s,
        "learner_lora_vs_full": lora_s / new_s,
        "publish_lora_vs_full": lora_bytes / full_bytes,
    }
    print(f"\n{'ratio':<66} {'value':>8}")
    print(f"{'tokens/s bf16-mixed / float32 (> 1: bfloat16 faster)':<66} {ratios['learner_bf16_vs_float32']:>8.2f}")
    print(
        f"{'seconds new defaults / previous defaults (< 1: new faster)':<66} "
        f"{ratios['learner_new_vs_previous_defaults']:>8.2f}"
    )
    print(
        f"{'seconds skipping uniform groups / training on all (< 1: faster)':<66} "
        f"{ratios['learner_skip_uniform_vs_all']:>8.2f}"
    )
    print(
        f"{'seconds LoRA / full weights (the new defaults; < 1: LoRA faster)':<66} {ratios['learner_lora_vs_full']:>8.2f}"
    )
    print(
        f"{'bytes published per version, LoRA / full':<66} {ratios['publish_lora_vs_full']:>8.3f}"
        f"  ({lora_bytes / 1e6:.1f} MB / {full_bytes / 1e6:.1f} MB)"
    )
    # The first and the "all trained" row run the same passes over the same tokens (only rewards differ).
    print(
        f"(timing noise: the first row and the 'all trained' row do the same work; their seconds differ by "
        f"{max(new_s, all_s) / min(new_s, all_s):.2f}x in this run)"
    )
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is in KiB on Linux
    print(f"(peak resident memory {peak_gb:.2f} GiB; {time.perf_counter() - started:.0f} s in all)")
    print(json.dumps({"ratios": {name: round(value, 4) for name, value in ratios.items()}}))


if __name__ == "__main__":
    main()

"""Learner throughput as ratios against baselines measured in the same process.

    python benchmarks/learner.py [--quick] [--model tiny-random|smollm2-135m-instruct]

Rows (tokens/s counts every non-padding token of the batch):
* bare torch: one padded forward, cross-entropy on the sampled tokens, backward, AdamW step;
* learner (GRPO, no KL): old-log-prob scoring pass + masked forward/backward + step;
* learner (GRPO, KL): the same plus the reference model's scoring pass;
* learner packed vs padded on the same realistic length mix (most trajectories short, a few long).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.models import load_model  # noqa: E402
from actors.trajectory import Trajectory  # noqa: E402
from configs import Config  # noqa: E402
from learner.actor import LearnerActor  # noqa: E402
from learner.batching import collate  # noqa: E402


def length_mix(n: int, generator: torch.Generator, short: int, long: int) -> list[int]:
    """Mostly short episodes (success early) and a long tail (episodes that ran to the horizon)."""
    lengths = []
    for _ in range(n):
        if torch.rand(1, generator=generator).item() < 0.75:
            lengths.append(int(torch.randint(short // 2, short, (1,), generator=generator)))
        else:
            lengths.append(int(torch.randint(long // 2, long, (1,), generator=generator)))
    return lengths


def synthetic_trajectory(length: int, group: int, generator: torch.Generator) -> Trajectory:
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
        step_rewards=[0.0] * (len(spans) - 1) + [float(group % 2)],
        reward=float(group % 2),
        success=bool(group % 2),
        done=True,
        truncated=False,
        horizon=len(spans),
        weights_version=0,
    )


def make_learner(model: str, *, kl: bool, packing: bool, micro: int) -> LearnerActor:
    config = Config.model_validate(
        {
            "model": {"name": model},
            "algorithm": {"name": "grpo", "kl_coef": 0.001 if kl else 0.0},
            "learner": {"micro_batch_size": micro, "packing": packing, "lr": 1e-6},
        }
    )
    return LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)


def bare_step(model: torch.nn.Module, optimizer, batch: dict, micro: int) -> None:
    optimizer.zero_grad()
    n = batch["input_ids"].shape[0]
    total = batch["loss_mask"].sum()
    for start in range(0, n, micro):
        ids = batch["input_ids"][start : start + micro]
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"][start : start + micro]).logits
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="none"
        )
        (nll * batch["loss_mask"][start : start + micro].reshape(-1)).sum().div(total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batch, one repeat (about a minute)")
    parser.add_argument("--model", default="tiny-random")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    generator = torch.Generator().manual_seed(0)
    n, repeats = (16, 1) if args.quick else (32, 3)
    lengths = length_mix(n, generator, short=400, long=1600)
    trajectories = [synthetic_trajectory(length, i // 4, generator) for i, length in enumerate(lengths)]
    tokens = sum(lengths)
    micro = 4

    model = load_model(args.model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch = collate(trajectories, pad_token_id=0)
    bare_s = timed(lambda: bare_step(model, optimizer, batch, micro), repeats)
    rows = [("bare torch fwd/bwd/step (padded)", bare_s)]
    for label, kl, packing in [
        ("learner GRPO, no KL, padded", False, False),
        ("learner GRPO, KL, padded", True, False),
        ("learner GRPO, no KL, packed", False, True),
        ("learner GRPO, KL, packed", True, True),
    ]:
        learner = make_learner(args.model, kl=kl, packing=packing, micro=micro if not packing else 2)
        rows.append((label, timed(lambda learner=learner: learner.update_batch(trajectories), repeats)))

    print(
        f"model {args.model}, {n} trajectories, {tokens} tokens (lengths {min(lengths)}-{max(lengths)}), "
        f"{sum(sum(t.loss_mask) for t in trajectories)} sampled, {torch.get_num_threads()} threads"
    )
    print(f"{'path':<36} {'seconds':>8} {'tokens/s':>10} {'vs bare':>8}")
    for label, seconds in rows:
        print(f"{label:<36} {seconds:>8.2f} {tokens / seconds:>10.0f} {bare_s / seconds:>8.2f}")
    padded = dict(rows)["learner GRPO, KL, padded"]
    packed = dict(rows)["learner GRPO, KL, packed"]
    print(f"packed / padded throughput (GRPO, KL): {padded / packed:.2f}")


if __name__ == "__main__":
    main()

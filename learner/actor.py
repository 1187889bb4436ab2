"""``LearnerActor``: owns the trainable policy, updates it from trajectories, publishes weights."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray
import structlog
import torch

from actors.models import load_model, load_tokenizer
from actors.trajectory import Trajectory
from actors.weights import pack_state_dict
from configs.schema import AlgorithmConfig, LearnerConfig, ModelConfig
from learner.algorithms import resolve_algorithm
from learner.algorithms.base import ADVANTAGES, LOGPROBS, LOSS_MASK, OLD_LOGPROBS, REF_LOGPROBS
from learner.batching import collate, select_rows
from learner.forward import masked_token_outputs
from learner.losses import masked_mean

log = structlog.get_logger()

POLICY_DIR = "policy"
LEARNER_STATE = "learner.pt"


class LearnerActor:
    """Run it with ``ray.remote``.

    Args:
        model: model section (the policy and, when the algorithm needs one, the frozen reference).
        learner: learner section.
        algorithm: algorithm section.
        seed: the run seed.
    """

    def __init__(self, *, model: ModelConfig, learner: LearnerConfig, algorithm: AlgorithmConfig, seed: int) -> None:
        torch.set_num_threads(learner.num_threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        self.config = learner
        self.tokenizer = load_tokenizer(model.name)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.policy = load_model(model.name, model.dtype)
        self.policy.train()
        self.algorithm = resolve_algorithm(algorithm.name)(algorithm)
        self.reference = None
        if self.algorithm.needs_reference:
            self.reference = load_model(model.name, model.dtype)
            self.reference.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=learner.lr, weight_decay=learner.weight_decay)
        self.version = 0
        self.num_parameters = sum(p.numel() for p in self.policy.parameters())

    def describe(self) -> dict:
        """Derived numbers logged once at start."""
        return {
            "parameters": self.num_parameters,
            "algorithm": type(self.algorithm).__name__,
            "reference_model": self.reference is not None,
        }

    @torch.no_grad()
    def _score(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probabilities of the sampled tokens under ``model``, micro-batch by micro-batch. -> (B, L-1)"""
        result = torch.zeros_like(batch[LOSS_MASK])
        size = self.config.micro_batch_size
        for start in range(0, result.shape[0], size):
            part = select_rows(batch, slice(start, start + size))
            scored = masked_token_outputs(
                model, part["input_ids"], part["attention_mask"], part[LOSS_MASK], entropy=False
            )
            result[start : start + size, : part[LOSS_MASK].shape[1]] = scored[LOGPROBS]
        return result

    def update(self, trajectory_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """One optimisation step on the trajectories behind ``trajectory_refs``; returns metrics."""
        started = time.perf_counter()
        trajectories: list[Trajectory] = ray.get(trajectory_refs)
        batch = collate(trajectories, self.pad_token_id)
        mask = batch[LOSS_MASK]
        total_tokens = float(mask.sum())
        metrics: dict[str, float] = {"learner/tokens": total_tokens, "learner/trajectories": float(len(trajectories))}
        if total_tokens == 0:
            log.warning("no sampled tokens in batch; skipping update", trajectories=len(trajectories))
            return metrics

        # The data was sampled by the weights the learner holds now (sync mode), so their
        # log-probabilities are the ratio denominators; recomputing them here (rather than trusting
        # the sampler's) keeps the ratio exact whatever the sampling temperature.
        self.policy.eval()
        batch[OLD_LOGPROBS] = self._score(self.policy, batch)
        if self.reference is not None:
            batch[REF_LOGPROBS] = self._score(self.reference, batch)
        batch[ADVANTAGES] = self.algorithm.compute_advantages(batch)
        self.policy.train()
        metrics["learner/sampler_logprob_abs_diff"] = float(
            masked_mean((batch[OLD_LOGPROBS] - batch["sampler_logprobs"]).abs(), mask)
        )
        metrics["learner/advantage_abs_mean"] = float(masked_mean(batch[ADVANTAGES].abs(), mask))

        self.optimizer.zero_grad(set_to_none=True)
        summed: dict[str, float] = {}
        size = self.config.micro_batch_size
        for start in range(0, mask.shape[0], size):
            part = select_rows(batch, slice(start, start + size))
            part_tokens = float(part[LOSS_MASK].sum())
            if part_tokens == 0:
                continue
            forward_out = masked_token_outputs(
                self.policy, part["input_ids"], part["attention_mask"], part[LOSS_MASK], entropy=True
            )
            loss, part_metrics = self.algorithm.compute_loss(part, forward_out)
            # Weight each micro-batch by its share of sampled tokens: the sum is the batch token-mean.
            (loss * (part_tokens / total_tokens)).backward()
            part_metrics["learner/loss"] = float(loss.detach())
            for key, value in part_metrics.items():
                summed[key] = summed.get(key, 0.0) + value * part_tokens / total_tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.version += 1

        metrics.update(summed)
        metrics["learner/grad_norm"] = float(grad_norm)
        metrics["learner/param_norm"] = float(
            torch.sqrt(sum((p.detach().float() ** 2).sum() for p in self.policy.parameters()))
        )
        metrics["time/update_s"] = time.perf_counter() - started
        return metrics

    def publish_weights(self) -> list[ray.ObjectRef]:
        """Put the current weights in the object store once; returns ``[ref]`` (a list, so Ray passes the ref)."""
        return [ray.put(pack_state_dict(self.policy.state_dict(), self.version))]

    def save_checkpoint(self, path: str) -> None:
        """Write ``path/policy`` (a Hugging Face model dir) and ``path/learner.pt`` (optimizer, version, RNG)."""
        folder = Path(path)
        self.policy.save_pretrained(folder / POLICY_DIR)
        self.tokenizer.save_pretrained(folder / POLICY_DIR)
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "version": self.version, "torch_rng": torch.get_rng_state()},
            folder / LEARNER_STATE,
        )

    def load_checkpoint(self, path: str) -> int:
        """Restore policy weights, optimizer, version and RNG from ``path``; returns the weights version."""
        folder = Path(path)
        restored = load_model(str(folder / POLICY_DIR), str(self.policy.dtype).removeprefix("torch."))
        self.policy.load_state_dict(restored.state_dict())
        state = torch.load(folder / LEARNER_STATE, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])
        return self.version

"""The decode step's token draw: inverse-CDF sampling (``sample_tokens``) against ``torch.multinomial``.

    python benchmarks/sampling.py [--quick] [--model tiny-random]

Rows, both measured in this process:
* the draw alone: one token per row from (B, 49152) probabilities (SmolLM2's vocabulary), B = 1, 8, 32;
* whole generation: the transformers engine's ``generate`` on B copies of a chat prompt, 32 new tokens
  each at temperature 1, once drawing with ``sample_tokens`` and once with ``torch.multinomial`` in
  its place (the engine's sampler before the change). Each setting runs three times, alternating, and
  its fastest pass counts, which filters out other processes' load on a shared machine.

The output ends with one JSON line: ``{"ratios": {"draw_inverse_cdf_vs_multinomial_b<B>": ...,
"generate_inverse_cdf_vs_multinomial_b<B>": ...}}`` (> 1: the inverse-CDF draw is faster).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import decode, make_engine
from agentgym_rl.actors.engines.sampling import sample_tokens
from agentgym_rl.actors.models import load_tokenizer
from agentgym_rl.configs.schema import SamplingConfig

VOCAB = 49_152
BATCHES = (1, 8, 32)
MESSAGES = [{"role": "user", "content": "Go to the red ball. What is your next action?"}]
Draw = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def multinomial(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The baseline: the draw the decode step used before ``sample_tokens``."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def draws_per_s(draw: Draw, batch: int, repeats: int) -> float:
    probs = torch.softmax(torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(0)), dim=-1)
    generator = torch.Generator().manual_seed(0)
    draw(probs, generator)
    started = time.perf_counter()
    for _ in range(repeats):
        draw(probs, generator)
    return repeats / (time.perf_counter() - started)


def generate_tokens_per_s(model: str, batch: int, rounds: int) -> dict[str, float]:
    """Fastest of three alternating passes per draw: tokens/s of ``generate`` on ``batch`` prompts."""
    tokenizer = load_tokenizer(model)
    prompt = ChatFormat(tokenizer).prompt_ids(MESSAGES)
    engine = make_engine(
        "transformers",
        model_name=model,
        dtype="auto",
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=32)
    best = {"inverse_cdf": 0.0, "multinomial": 0.0}
    try:
        for _ in range(3):
            for name, draw in (("inverse_cdf", sample_tokens), ("multinomial", multinomial)):
                decode.sample_tokens = draw  # the name the decode step calls
                engine.generate([prompt] * batch, sampling)  # warm-up
                tokens, started = 0, time.perf_counter()
                for _ in range(rounds):
                    tokens += sum(len(g.token_ids) for g in engine.generate([prompt] * batch, sampling))
                best[name] = max(best[name], tokens / (time.perf_counter() - started))
    finally:
        decode.sample_tokens = sample_tokens
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under a minute on tiny-random)")
    parser.add_argument("--model", default="tiny-random", help="built-in model name or model directory")
    args = parser.parse_args()
    repeats, rounds = (20, 1) if args.quick else (100, 3)

    ratios: dict[str, float] = {}
    print(f"token draw over a {VOCAB}-token vocabulary; generation: {args.model}, 32 new tokens, temperature 1")
    print(f"{'rows':>5} {'draws/s multinomial':>20} {'draws/s inverse CDF':>20} {'ratio':>6}", end="")
    print(f" {'gen tok/s multinomial':>22} {'gen tok/s inverse CDF':>22} {'ratio':>6}")
    for batch in BATCHES:
        base, new = draws_per_s(multinomial, batch, repeats), draws_per_s(sample_tokens, batch, repeats)
        generated = generate_tokens_per_s(args.model, batch, rounds)
        ratios[f"draw_inverse_cdf_vs_multinomial_b{batch}"] = round(new / base, 4)
        ratios[f"generate_inverse_cdf_vs_multinomial_b{batch}"] = round(
            generated["inverse_cdf"] / generated["multinomial"], 4
        )
        print(
            f"{batch:>5} {base:>20.0f} {new:>20.0f} {new / base:>6.1f} {generated['multinomial']:>22.1f} "
            f"{generated['inverse_cdf']:>22.1f} {generated['inverse_cdf'] / generated['multinomial']:>6.2f}"
        )
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    main()

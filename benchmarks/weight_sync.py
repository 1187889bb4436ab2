"""Seconds to get one weights version from the learner into an engine: object store against broadcast.

    python benchmarks/weight_sync.py [--quick] [--model smollm2-135m-instruct] [--engines transformers vllm]

The weights are the model's full state dict in the samplers' dtype (float32 here). The baseline is the
object-store path a run takes with ``trainer.weight_sync.method: object_store``: the learner packs the
tensors and ``ray.put``s them once, the engine reads them and loads them (the transformers engine adopts
the arrays in place; the vLLM engine sends their bytes to its workers). The other column is
``broadcast``: learner rank 0 sends the tensors over a gloo group of its own, in 256 MB buckets, straight
into the engine (vLLM's workers receive them themselves). Sender and engine run in this process on
127.0.0.1 (vLLM's workers in its own processes), so neither path crosses a network; on GPUs NCCL would
carry the broadcast instead. The output ends with one JSON line of ratios
``broadcast_vs_object_store_<engine>`` (seconds; below 1 means the broadcast is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
import torch

from agentgym_rl.actors.engines import make_engine
from agentgym_rl.actors.model_store import load_model, load_tokenizer
from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup, free_address
from agentgym_rl.actors.weights import pack_state_dict

BUCKET_BYTES = 256 << 20


def object_store(state: dict[str, torch.Tensor], engine, version: int) -> float:
    started = time.perf_counter()
    ref = ray.put(pack_state_dict(state, version, dtype="float32"))
    engine.load_weights(ray.get(ref))
    seconds = time.perf_counter() - started
    del ref
    return seconds


def broadcast(sender: WeightGroup, state: dict[str, torch.Tensor], engine, version: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(sender.send, state, version, None, BUCKET_BYTES)
        engine.receive_weights()
        sent.result()
    return time.perf_counter() - started


def join(engine) -> WeightGroup:
    """A gloo group of this process (rank 0) and ``engine``'s receiving ranks."""
    host, port = free_address()
    address = GroupAddress(host, port, 1 + engine.weight_group_ranks(False), "gloo", 300.0)
    with ThreadPoolExecutor(1) as pool:
        sender = pool.submit(WeightGroup, address, 0)
        engine.join_weight_group(address, 1, False)
        return sender.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 versions per path instead of 7")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--engines", nargs="+", default=["transformers"], choices=["transformers", "vllm"])
    args = parser.parse_args()
    versions = 3 if args.quick else 7
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    tokenizer = load_tokenizer(args.model)
    state = {name: t.detach().float() for name, t in load_model(args.model, "float32").state_dict().items()}
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    print(f"{args.model}: {len(state)} tensors, {size_mb:.0f} MiB per version (float32), {versions} versions per path")
    ratios = {}
    for name in args.engines:
        engine = make_engine(
            name,
            model_name=args.model,
            dtype="float32",
            seed=0,
            stop_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
        )
        sender = join(engine)
        # Each path loads a first version untimed (allocations, vLLM's first reload).
        store = [object_store(state, engine, v) for v in range(versions + 1)][1:]
        sent = [broadcast(sender, state, engine, v) for v in range(versions + 1)][1:]
        engine.close()
        median_store, median_sent = statistics.median(store), statistics.median(sent)
        print(
            f"{name:>12}: object store {median_store:.3f} s, broadcast {median_sent:.3f} s per version (median); "
            f"broadcast {size_mb / median_sent:.0f} MiB/s"
        )
        ratios[f"broadcast_vs_object_store_{name}"] = round(median_sent / median_store, 3)
    print(json.dumps(ratios))
    ray.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# One stage of the BabyAI experiment (README "Learning results"), run from the repository root:
#
#   docs/results/babyai/run_stage.sh STAGE [RUNS_DIR]
#   STAGE_SECONDS=5400 docs/results/babyai/run_stage.sh STAGE   # a part: stop training, checkpointed, within that long
#
# STAGE is `base` (the base model, evaluated only), `gateway` (the final adapter of docs/results/gateway/run.sh's
# run in RUNS_DIR, evaluated only, written to docs/results/gateway/) or the name of a config in configs/babyai/ (`sft`,
# `grpo_stepwise`, `grpo_fixed_short`, `grpo_fixed_long`, `gigpo_stepwise`). A training stage trains its
# config into RUNS_DIR (default runs/babyai), resuming the run if RUNS_DIR already holds it, then writes
# docs/results/babyai/STAGE/: adapter/ (the final adapter, its tensors stored in bfloat16 to keep the
# repository small), config.yaml (the run's resolved config), metrics.jsonl (its per-iteration metrics, for
# `agentgym-rl plot`), eval.json and stage.json (commit, commands, wall times, machine), and records the adapter
# weights' SHA-256 in docs/results/adapters.sha256. Only the SFT stage's adapter_model.safetensors stays in the tracked
# tree; another stage's is ignored by git (docs/results/.gitignore): commit it once (`git add -f`), then remove it
# (`git rm --cached`) in the next commit, and `python docs/results/restore_adapter.py STAGE` brings it back from
# history. Every row is evaluated the same way: its committed adapter (or the base model) on the
# 200 held-out tasks, one episode each at temperature 1, at most 10 turns, with the RL stages' sampler
# settings (configs/babyai/grpo_stepwise.yaml), the same tasks and sampling seeds for every row.
#
# A stage too long for one sitting runs in parts: with STAGE_SECONDS set, training stops by itself, checkpointed,
# after the last iteration that ends within that many seconds (`train --time-limit`) if it has not finished,
# and the run as the next part needs it (config.yaml, metrics.jsonl and that checkpoint: adapter, optimizer
# state, trainer state) is copied to docs/results/babyai/STAGE/part/ to be committed; the next call restores
# the run from there and resumes it.
set -euo pipefail
stage=${1:?usage: run_stage.sh STAGE [RUNS_DIR]}
runs=${2:-runs/babyai}
cli=.venv/bin/agentgym-rl
python=.venv/bin/python
out=docs/results/babyai/$stage
[[ $stage == gateway ]] && out=docs/results/gateway
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

eval_args=(--env babyai --split test --max-turns 10 --config configs/babyai/grpo_stepwise.yaml
  --set sampler.envs_per_sampler=16 --set sampler.max_batch_size=16 --set sampler.start_timeout_s=900)
commands=()
mkdir -p "$out"
started=$(date -u +%FT%TZ)
train_s=0

if [[ $stage == base ]]; then
  eval_cmd=("$cli" eval --model smollm2-135m-instruct "${eval_args[@]}" --output "$out/eval.json")
elif [[ $stage == gateway ]]; then  # trained by docs/results/gateway/run.sh; evaluated here like every row
  run=$runs/babyai-gateway
  latest=$(find "$run/checkpoints" -maxdepth 1 -name 'iter_*' | sort | tail -1)
  [[ -n $latest ]] || { echo "run_stage.sh: no checkpoint in $run; run docs/results/gateway/run.sh first" >&2; exit 1; }
else
  config=configs/babyai/$stage.yaml
  [[ -f $config ]] || { echo "run_stage.sh: no $config; stages: base, $(ls configs/babyai | sed 's/.yaml//' | xargs)" >&2; exit 2; }
  name=$("$python" -c "import sys; from agentgym_rl.configs import load_config; print(load_config(sys.argv[1]).run.name)" "$config")
  run=$runs/$name
  part=$out/part
  if [[ ! -f $run/config.yaml && -d $part ]]; then  # a part committed by an earlier sitting
    mkdir -p "$run/checkpoints"
    cp "$part/config.yaml" "$part/metrics.jsonl" "$run/"
    cp -r "$part/checkpoint" "$run/checkpoints/$(cat "$part/checkpoint_name")"
  fi
  if [[ -f $run/config.yaml ]]; then
    train_cmd=("$cli" train --resume "$run")
  else
    train_cmd=("$cli" train "$config" --set "run.dir=$runs")
  fi
  if [[ -n ${STAGE_SECONDS:-} ]]; then
    train_cmd+=(--time-limit "$STAGE_SECONDS")
  fi
  commands+=("${train_cmd[*]}")
  t0=$(date +%s)
  status=0
  "${train_cmd[@]}" || status=$?
  train_s=$(( $(date +%s) - t0 ))
  latest=$(find "$run/checkpoints" -maxdepth 1 -name 'iter_*' | sort | tail -1)
  if [[ -z $latest ]]; then
    echo "run_stage.sh: training ended (status $status) before its first checkpoint; nothing to keep" >&2
    exit 1
  fi
  if [[ $status -ne 0 ]]; then
    [[ $status -eq 3 ]] || exit "$status"  # 3: stopped, checkpointed, by --time-limit with iterations left
    # keep the earlier parts' commands and training times, replace their checkpoint by this part's
    mkdir -p "$part"
    rm -rf "$part/checkpoint"
    echo "${train_cmd[*]}" >> "$part/commands"
    echo "$train_s" >> "$part/train_seconds"
    cp "$run/config.yaml" "$run/metrics.jsonl" "$part/"
    cp -r "$latest" "$part/checkpoint"
    basename "$latest" > "$part/checkpoint_name"
    echo "run_stage.sh: training stopped after ${train_s} s at $(basename "$latest"); commit $part and run again to resume"
    exit 0
  fi
  if [[ -f $part/train_seconds ]]; then  # the earlier parts' commands and training time count too
    train_s=$(( train_s + $(awk '{s += $1} END {print s + 0}' "$part/train_seconds") ))
    mapfile -t earlier_commands < "$part/commands"
    commands=("${earlier_commands[@]}" "${commands[@]}")
  fi
  rm -rf "$part"
fi
if [[ $stage != base ]]; then
  rm -rf "$out/adapter" && mkdir -p "$out/adapter"
  cp "$latest/policy/adapter_config.json" "$latest/policy/base_model.json" "$out/adapter/"
  "$python" - "$latest/policy/adapter_model.safetensors" "$out/adapter/adapter_model.safetensors" <<'EOF'
import sys

import torch
from safetensors.torch import load_file, save_file

save_file({k: v.to(torch.bfloat16) for k, v in load_file(sys.argv[1]).items()}, sys.argv[2])
EOF
  weights=$out/adapter/adapter_model.safetensors manifest=docs/results/adapters.sha256
  { grep -v "  $weights\$" "$manifest" || true; sha256sum "$weights"; } | sort -k2 > "$manifest.new"
  mv "$manifest.new" "$manifest"
  cp "$run/config.yaml" "$run/metrics.jsonl" "$out/"
  eval_cmd=("$cli" eval --checkpoint "$out/adapter" "${eval_args[@]}" --output "$out/eval.json")
fi
commands+=("${eval_cmd[*]}")
t0=$(date +%s)
"${eval_cmd[@]}"
eval_s=$(( $(date +%s) - t0 ))

"$python" - "$out/stage.json" "$stage" "$started" "$train_s" "$eval_s" "${run:-}" "${commands[@]}" <<'EOF'
import json
import os
import subprocess
import sys
import time
from pathlib import Path

path, stage, started, train_s, eval_s, run, *commands = sys.argv[1:]
metrics = Path(run, "metrics.jsonl") if run else None
iterations = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics and metrics.is_file() else []
cpu = {}
for line in Path("/proc/cpuinfo").read_text().splitlines():
    key, _, value = line.partition(":")
    if key.strip() in ("model name", "cpu family") and key.strip() not in cpu:
        cpu[key.strip()] = value.strip()
record = {
    "stage": stage,
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "started": started,
    "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    # this command's training time (0 when the run was already finished), and the run's iterations summed
    "train_seconds": int(train_s),
    "iterations": len(iterations),
    "iteration_seconds_sum": round(sum(r["time/iteration_s"] for r in iterations)),
    "eval_seconds": int(eval_s),
    "commands": commands,
    "machine": {"cpu": cpu.get("model name"), "cpu_family": cpu.get("cpu family"), "cores": len(os.sched_getaffinity(0))},
}
Path(path).write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record, indent=2))
EOF

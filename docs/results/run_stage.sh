#!/usr/bin/env bash
# One stage of a learning experiment (docs/results/<EXPERIMENT>.md), run from the repository root:
#
#   docs/results/run_stage.sh EXPERIMENT STAGE [RUNS_DIR]
#   STAGE_SECONDS=5400 docs/results/run_stage.sh EXPERIMENT STAGE   # a part: stop training, checkpointed, within that long
#
# EXPERIMENT names a folder of configs/ that holds experiment.yaml (how every row of the experiment is evaluated:
# the env, split, turn limit, episodes, the config whose sampler settings every row plays with, the base model)
# and one config per training stage. STAGE is `base` (the base model, evaluated only), `gateway` (the final
# adapter of the run of experiment.yaml's `gateway.config` in RUNS_DIR, evaluated only, written to its
# `gateway.output`) or the name of a stage config (`sft`, `grpo_stepwise`, ...). A training stage trains its config
# into RUNS_DIR (default runs/EXPERIMENT), resuming the run if RUNS_DIR already holds it, then writes
# docs/results/EXPERIMENT/STAGE/: adapter/ (the final adapter, its tensors stored in bfloat16 to keep the
# repository small), config.yaml (the run's resolved config), metrics.jsonl (its per-iteration metrics, for
# `agentgym-rl plot`), eval.json and stage.json (commit, commands, wall times, machine), and records the adapter
# weights' SHA-256 in docs/results/adapters.sha256. Adapter weights are ignored by git (docs/results/.gitignore)
# except the BabyAI SFT stage's, which the quickstart loads: commit a stage's once (`git add -f`), then remove it
# (`git rm --cached`) in a later commit, and `python docs/results/restore_adapter.py EXPERIMENT/STAGE` brings it back
# from history; a stage config that starts from a committed adapter no longer in the tree gets it restored here.
# Every row of an experiment is evaluated the same way: its adapter (or the base model) on the same held-out
# tasks with the same sampling seeds, at temperature 1, as experiment.yaml says.
#
# A stage too long for one sitting runs in parts: with STAGE_SECONDS set, training stops by itself, checkpointed,
# after the last iteration that ends within that many seconds (`train --time-limit`) if it has not finished,
# and the run as the next part needs it (config.yaml, metrics.jsonl and that checkpoint: adapter, optimizer
# state, trainer state) is copied to docs/results/EXPERIMENT/STAGE/part/ to be committed; the next call restores
# the run from there and resumes it. The checkpoint (tens of MB) is committed once and then removed from the tree
# like an adapter: part/checkpoint.sha256 lists its files, and the next call restores them from history.
set -euo pipefail
usage="usage: run_stage.sh EXPERIMENT STAGE [RUNS_DIR]"
experiment=${1:?$usage}
stage=${2:?$usage}
runs=${3:-runs/$experiment}
cli=.venv/bin/agentgym-rl
python=.venv/bin/python
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
settings=configs/$experiment/experiment.yaml
if [[ ! -f $settings ]]; then
  echo "run_stage.sh: no $settings; experiments: $(ls configs/*/experiment.yaml | cut -d/ -f2 | xargs)" >&2
  exit 2
fi
# experiment.yaml -> the base model, the gateway run and its output folder, then the eval arguments every row shares
mapfile -d '' -t fields < <("$python" - "$settings" <<'EOF'
import sys

import yaml

from agentgym_rl.configs import load_config

settings = yaml.safe_load(open(sys.argv[1]))
ev = settings["eval"]
args = ["--env", ev["env"], "--split", ev.get("split", "test"), "--config", ev["config"]]
for key, flag in (("max_turns", "--max-turns"), ("episodes", "--episodes"), ("samples", "--samples")):
    if key in ev:
        args += [flag, str(ev[key])]
for override in ev.get("set", []):
    args += ["--set", override]
gateway = settings.get("gateway", {})
gateway_run = load_config(gateway["config"]).run.name if gateway else ""
fields = [settings["base_model"], gateway_run, gateway.get("output", ""), *args]
sys.stdout.write("".join(f + "\0" for f in fields))
EOF
)
base_model=${fields[0]} gateway_run=${fields[1]} gateway_out=${fields[2]}
eval_args=("${fields[@]:3}")
out=docs/results/$experiment/$stage
if [[ $stage == gateway ]]; then
  [[ -n $gateway_run ]] || { echo "run_stage.sh: $settings names no gateway run" >&2; exit 2; }
  out=$gateway_out
fi
config=configs/$experiment/$stage.yaml
if [[ $stage != base && $stage != gateway && ( $stage == experiment || ! -f $config ) ]]; then
  stages=$(ls "configs/$experiment" | grep -v '^experiment.yaml$' | sed 's/.yaml$//' | xargs)
  echo "run_stage.sh: no stage $stage in configs/$experiment; stages: base, $stages" >&2
  exit 2
fi
# A run's config.yaml names its input paths absolutely; a committed copy names those inside the repository relative to
# its root (as the loader reads a file inside the repository), so it means the same in any clone.
keep_config() { sed "s#$PWD/##g" "$1" > "$2"; }
commands=()
mkdir -p "$out"
started=$(date -u +%FT%TZ)
train_s=0

if [[ $stage == base ]]; then
  eval_cmd=("$cli" eval --model "$base_model" "${eval_args[@]}" --output "$out/eval.json")
elif [[ $stage == gateway ]]; then  # trained through the endpoint by the experiment's gateway script; evaluated like every row
  run=$runs/$gateway_run
  latest=$(find "$run/checkpoints" -maxdepth 1 -name 'iter_*' | sort | tail -1)
  [[ -n $latest ]] || { echo "run_stage.sh: no checkpoint in $run; run the experiment's gateway run first" >&2; exit 1; }
else
  # the run's name, and the committed adapter the stage starts from (model.adapter), if any; a simulated engine
  # (modelled) is refused before anything trains: no row of an experiment may come from it
  facts_text=$("$python" -c "import sys; from agentgym_rl.configs import load_config
from agentgym_rl.configs.engines import SimulatedEngineError, refuse_simulated
c = load_config(sys.argv[1])
try: refuse_simulated(c.sampler.engine, 'run_stage.sh (' + sys.argv[1] + ')')
except SimulatedEngineError as exc: sys.exit(str(exc))
import os; print(c.run.name); print(os.path.relpath(c.model.adapter) if c.model.adapter else '')" "$config") || exit 2
  mapfile -t facts <<< "$facts_text"
  name=${facts[0]} start_adapter=${facts[1]:-}
  if [[ $start_adapter == docs/results/*/adapter && ! -f $start_adapter/adapter_model.safetensors ]]; then
    start_stage=${start_adapter#docs/results/}
    "$python" docs/results/restore_adapter.py "${start_stage%/adapter}"
  fi
  run=$runs/$name
  part=$out/part
  if [[ ! -f $run/config.yaml && -d $part ]]; then  # a part committed by an earlier sitting
    if ! sha256sum --check --quiet "$part/checkpoint.sha256" >/dev/null 2>&1; then  # its checkpoint lives in history
      "$python" docs/results/restore_adapter.py --files "$part/checkpoint.sha256"
    fi
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
    keep_config "$run/config.yaml" "$part/config.yaml"
    cp "$run/metrics.jsonl" "$part/"
    cp -r "$latest" "$part/checkpoint"
    basename "$latest" > "$part/checkpoint_name"
    find "$part/checkpoint" -type f | sort | xargs sha256sum > "$part/checkpoint.sha256"
    echo "run_stage.sh: training stopped after ${train_s} s at $(basename "$latest"). Commit the part, its checkpoint"
    echo "  once, then take the checkpoint out of the tree (the next call restores it from history):"
    echo "  git add -f $part && git commit -m '...' && git rm -r -q --cached $part/checkpoint && git commit -m '...'"
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
  keep_config "$run/config.yaml" "$out/config.yaml"
  cp "$run/metrics.jsonl" "$out/"
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

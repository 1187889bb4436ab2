#!/usr/bin/env bash
# A learning run through the endpoint (README "Training your own agent through the endpoint"), from the repository
# root:
#
#   docs/results/gateway/run.sh [EXPERIMENT [RUNS_DIR]]      # EXPERIMENT: babyai (default) or babyai_tools
#   AGENT_PYTHON=/path/to/python docs/results/gateway/run.sh   # the agent in a Python of your own
#
# The agent is a program apart from this project: docs/examples/gateway_agent.py needs only `openai` and
# `requests`, docs/examples/agents_sdk_agent.py the OpenAI Agents SDK (`openai-agents`) too; `./install.sh --dev`
# puts them in .venv, or name a Python of your own with AGENT_PYTHON.
#
# configs/EXPERIMENT/experiment.yaml's `gateway` section names the gateway run's config, the agent, the action
# format of its system prompt, its turn limit and where the results go. The script starts a BabyAI env server
# (AgentGym's protocol, port 36001) and the gateway run (the policy served on 127.0.0.1:8000), then plays the
# agent against both: the env's own system prompt for that action format, the run's `trainer.tasks_per_iteration`
# training tasks per round (BabyAI's four easiest levels, seeds 50 and up), `algorithm.group_size` games each,
# until the run has trained its `trainer.iterations`, each round once the run has taken the one before
# (`--paced`). Writes to the output folder: metrics.jsonl (the run's per-iteration metrics; success_rate is that
# of the games each iteration trained on), config.yaml, commands, wall_seconds, and the agent's per-round lines in
# agent.log. `docs/results/run_stage.sh EXPERIMENT gateway RUNS_DIR` then evaluates the final adapter like every
# row of the experiment.
set -euo pipefail
experiment=${1:-babyai}
runs=${2:-runs}
cli=.venv/bin/agentgym-rl
python=.venv/bin/python
agent_python=${AGENT_PYTHON:-$python}
settings=configs/$experiment/experiment.yaml
[[ -f $settings ]] || { echo "run.sh: no $settings" >&2; exit 2; }
# experiment.yaml's gateway section and the run's config -> what the agent plays
mapfile -t facts < <("$python" - "$settings" <<'EOF'
import sys

import yaml

from agentgym_rl.configs import load_config

gateway = yaml.safe_load(open(sys.argv[1])).get("gateway")
if not gateway:
    sys.exit(f"run.sh: {sys.argv[1]} has no gateway section")
config = load_config(gateway["config"])
for fact in (gateway["config"], config.run.name, gateway["output"], gateway["agent"], gateway["action_format"],
             gateway["turns"], config.trainer.tasks_per_iteration, config.algorithm.group_size,
             config.trainer.iterations, config.serve.max_tokens, config.model.adapter or ""):
    print(fact)
EOF
)
[[ ${#facts[@]} -eq 11 ]] || exit 2
config=${facts[0]} name=${facts[1]} out=${facts[2]} agent=${facts[3]} action_format=${facts[4]} turns=${facts[5]}
per_round=${facts[6]} group_size=${facts[7]} rounds=${facts[8]} max_tokens=${facts[9]} start_adapter=${facts[10]}
# the agent's own imports (openai, requests, the Agents SDK): checked before anything starts
if ! missing=$("$agent_python" "$agent" --help 2>&1 >/dev/null); then
  echo "run.sh: $agent_python cannot run $agent (${missing##*$'\n'}); run ./install.sh --dev or set AGENT_PYTHON" >&2
  exit 2
fi
if [[ $start_adapter == docs/results/*/adapter && ! -f $start_adapter/adapter_model.safetensors ]]; then
  start_stage=${start_adapter#docs/results/}  # a committed adapter no longer in the tree: restore it from history
  "$python" docs/results/restore_adapter.py "${start_stage%/adapter}"
fi
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
levels='{"levels": ["GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6"], "test_seeds": 50}'
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

mkdir -p "$out"
"$cli" envs babyai --instruction --action-format "$action_format" > "$work/system.txt"
read -ra tasks <<< "$("$cli" envs babyai --tasks train --options "$levels")"
"$cli" env-server babyai --port 36001 > "$work/env-server.log" 2>&1 &
train_cmd=("$cli" train "$config" --set "run.dir=$runs")
agent_cmd=("$agent_python" "$agent" --policy http://127.0.0.1:8000 --env http://127.0.0.1:36001
  --system-file "$work/system.txt" --tasks "${tasks[@]:0:$(( rounds * per_round ))}" --tasks-per-round "$per_round"
  --group-size "$group_size" --rounds "$rounds" --turns "$turns" --max-tokens "$max_tokens"
  --parallel $(( per_round * group_size )) --paced --transcripts "$work/games.jsonl")
t0=$(date +%s)
"${train_cmd[@]}" > "$work/train.log" 2>&1 &
trainer=$!
until curl -sf http://127.0.0.1:8000/healthz > /dev/null; do
  kill -0 $trainer 2>/dev/null || { tail -50 "$work/train.log"; exit 1; }
  sleep 5
done
"${agent_cmd[@]}" | tee "$out/agent.log"
wait $trainer
wall=$(( $(date +%s) - t0 ))
run=$runs/$name
cp "$run/metrics.jsonl" "$run/config.yaml" "$out/"
{
  echo "$cli envs babyai --instruction --action-format $action_format > $work/system.txt"
  echo "$cli env-server babyai --port 36001"
  echo "${train_cmd[*]}"
  echo "${agent_cmd[*]}"
} > "$out/commands"
echo "$wall" > "$out/wall_seconds"
"$python" - "$out/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"iteration {r['iteration']:>2}  version {r['weights_version']:>2}  success {r['success_rate']:.3f}  "
          f"episodes {r['rollout/episodes']:.0f}  stale dropped {r['rollout/dropped_stale']:.0f}  {r['time/iteration_s']:.0f} s")
PY

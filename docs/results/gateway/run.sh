#!/usr/bin/env bash
# The learning run of README "Training your own agent through the endpoint", from the repository root:
#
#   docs/results/gateway/run.sh [RUNS_DIR]
#   AGENT_PYTHON=/path/to/python docs/results/gateway/run.sh   # the agent in a Python of your own
#
# The agent is a program apart from this project: it needs only `openai` and `requests`, which
# `./install.sh --dev` puts in .venv, or a Python of your own named by AGENT_PYTHON.
#
# Starts a BabyAI env server (AgentGym's protocol, port 36001) and a gateway run of
# configs/babyai_gateway.yaml (the SFT policy served on 127.0.0.1:8000), then plays
# docs/examples/gateway_agent.py against both: the env's own system prompt, 6 training tasks per round
# (BabyAI's four easiest levels, seeds 50 and up), 4 games each, at most 4 turns, until the run has
# trained its 12 iterations, each round once the run has taken the one before (`--paced`). Writes
# docs/results/gateway/: metrics.jsonl (the run's per-iteration metrics; success_rate is that of the
# games each iteration trained on), config.yaml, commands, wall_seconds, and the agent's per-round lines
# in agent.log.
set -euo pipefail
runs=${1:-runs}
cli=.venv/bin/agentgym-rl
python=.venv/bin/python
agent_python=${AGENT_PYTHON:-$python}
"$agent_python" -c "import openai, requests" 2>/dev/null || {
  echo "run.sh: $agent_python lacks openai or requests; run ./install.sh --dev or set AGENT_PYTHON" >&2
  exit 2
}
out=docs/results/gateway
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
levels='{"levels": ["GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6"], "test_seeds": 50}'
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

"$cli" envs babyai --instruction > "$work/system.txt"
read -ra tasks <<< "$("$cli" envs babyai --tasks train --options "$levels")"
"$cli" env-server babyai --port 36001 > "$work/env-server.log" 2>&1 &
train_cmd=("$cli" train configs/babyai_gateway.yaml --set "run.dir=$runs")
agent_cmd=("$agent_python" docs/examples/gateway_agent.py --policy http://127.0.0.1:8000 --env http://127.0.0.1:36001
  --system-file "$work/system.txt" --tasks "${tasks[@]:0:72}" --tasks-per-round 6
  --group-size 4 --rounds 12 --turns 4 --max-tokens 48 --parallel 24 --paced --transcripts "$work/games.jsonl")
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
run=$runs/babyai-gateway
cp "$run/metrics.jsonl" "$run/config.yaml" "$out/"
{
  echo "$cli envs babyai --instruction > $work/system.txt"
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

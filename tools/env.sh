# Sourced by tools/kimik3 and tools/test: makes sure the Python environment and the control-plane
# binaries exist (built once per machine, cached outside the repository), then exports:
#   KIMIK3_VENV      the virtualenv (~/.cache/kimik3/venv-<hash of pyproject.toml>)
#   KIMIK3_BIN_DIR   etcd / kube-apiserver binaries (~/.cache/kimik3/bin)
# and puts the venv first on PATH. Safe to source repeatedly: cached steps are skipped and print
# nothing. A step that does work prints one line; the tools' own output (pip, go) goes to a log
# beside what it builds (~/.cache/kimik3/venv-<hash>.log, bin/<binary>.log, vllm-*.log), whose
# last lines a failure prints.
set -euo pipefail
KIMIK3_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KIMIK3_CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3}"
export KIMIK3_BIN_DIR="${KIMIK3_BIN_DIR:-$KIMIK3_CACHE/bin}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

deps_hash="$(sha256sum "$KIMIK3_REPO/pyproject.toml" | cut -c1-12)"
export KIMIK3_VENV="$KIMIK3_CACHE/venv-$deps_hash"
mkdir -p "$KIMIK3_CACHE"
exec 9>"$KIMIK3_CACHE/.env.lock"
# One set-up at a time (several test runs may start together); a warm one holds the lock for
# milliseconds, so only a longer wait is worth a line.
flock -w 2 9 || { echo "[env] waiting for another set-up on this machine to finish" >&2; flock 9; }
if [ ! -f "$KIMIK3_VENV/.complete" ]; then
  venv_log="$KIMIK3_VENV.log"
  echo "[env] creating the Python environment $KIMIK3_VENV (first run with this pyproject.toml, ~2 min; log: $venv_log)" >&2
  rm -rf "$KIMIK3_VENV"
  pip=("$KIMIK3_VENV/bin/pip" install --disable-pip-version-check --progress-bar off)
  # One && chain, not `set -e` in a subshell: on the left of || bash would ignore set -e there.
  { "$PYTHON" -m venv "$KIMIK3_VENV" && "${pip[@]}" --upgrade pip && "${pip[@]}" -e "$KIMIK3_REPO[test]"; } \
    >"$venv_log" 2>&1 || {
    echo "[env] FAILED to create $KIMIK3_VENV; log: $venv_log (last lines below)" >&2
    tail -n 15 "$venv_log" >&2
    exit 1
  }
  touch "$KIMIK3_VENV/.complete"
fi
# The venv is shared by every clone with these dependencies; PYTHONPATH makes `kimik3` and the
# tests import this checkout's package whichever clone the venv's editable install points at.
export PYTHONPATH="$KIMIK3_REPO/operator${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$KIMIK3_VENV/bin:$PATH"
# KIMIK3_BINARIES=0 skips them (tools/test sets it when only the unit and process tiers run).
[ "${KIMIK3_BINARIES:-1}" = 0 ] ||
  "$KIMIK3_REPO/tools/build-binaries.sh" etcd kube-apiserver kube-controller-manager kube-scheduler kwok lws kueue helm \
  prometheus-operator prometheus epp envoy
flock -u 9
# The vLLM venvs of tests/conformance (tools/test only; cached: ~0 s warm, ~8 min cold; KIMIK3_VLLM_ENVS=0
# skips, as tools/test -m does when no conformance test is selected). A failed build has said why;
# the conformance tests then fall back or fail naming the venv.
[ "$(basename "$0")" != test ] || [ "${KIMIK3_VLLM_ENVS:-1}" = 0 ] || "$KIMIK3_REPO/tools/vllm-envs.sh" || true
set +euo pipefail

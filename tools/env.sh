# Sourced by tools/kimik3 and tools/test: makes sure the Python environment and the control-plane
# binaries exist (built once per machine, cached outside the repository), then exports:
#   KIMIK3_VENV      the virtualenv (~/.cache/kimik3/venv-<hash of pyproject.toml>)
#   KIMIK3_BIN_DIR   etcd / kube-apiserver binaries (~/.cache/kimik3/bin)
# and puts the venv first on PATH. Safe to source repeatedly: cached steps are skipped.
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
flock 9  # one setup at a time (several test runs may start together)
if [ ! -f "$KIMIK3_VENV/.complete" ]; then
  echo "[env] creating $KIMIK3_VENV (first run on this machine)" >&2
  rm -rf "$KIMIK3_VENV"
  "$PYTHON" -m venv "$KIMIK3_VENV"
  "$KIMIK3_VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
  "$KIMIK3_VENV/bin/pip" install --quiet --disable-pip-version-check -e "$KIMIK3_REPO[test]"
  touch "$KIMIK3_VENV/.complete"
fi
# The venv is shared by every clone with these dependencies; PYTHONPATH makes `kimik3` and the
# tests import this checkout's package whichever clone the venv's editable install points at.
export PYTHONPATH="$KIMIK3_REPO/operator${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$KIMIK3_VENV/bin:$PATH"
"$KIMIK3_REPO/tools/build-binaries.sh" etcd kube-apiserver kube-controller-manager kube-scheduler kwok lws kueue helm >&2
flock -u 9
# The vLLM venvs of tests/conformance (tools/test only; cached: ~0 s warm, ~8 min cold; KIMIK3_VLLM_ENVS=0 skips).
[ "$(basename "$0")" != test ] || [ "${KIMIK3_VLLM_ENVS:-1}" = 0 ] || "$KIMIK3_REPO/tools/vllm-envs.sh" >&2 || echo "[env] a vLLM venv failed to build: see ~/.cache/kimik3/*.log" >&2
set +euo pipefail

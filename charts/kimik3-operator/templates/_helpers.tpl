{{/* Names and labels. */}}
{{- define "kimik3-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kimik3-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kimik3-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kimik3-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kimik3-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kimik3-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kimik3-operator
{{- end }}

{{- define "kimik3-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kimik3-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kimik3-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's permissions on namespaced resources: exactly the calls it makes (see
operator/kimik3/controller/kube.py, reconcile.py and operator.py), one rule per resource.
tests/chart/test_rbac_minimal.py removes each verb of each rule in turn, runs the operator under
what is left and shows which behaviour breaks. Children are written by server-side apply only:
"patch", plus "create" because the API server authorizes an apply that creates the object as a
create (seen here: "cannot create resource computedomains"); nothing is ever updated with PUT.
*/}}
{{- define "kimik3-operator.namespacedRules" -}}
# KimiK3Deployments: kopf lists and watches them; the reconciler reads one (get) and adds or
# removes its teardown finalizer (patch).
- apiGroups: ["inference.kimik3.io"]
  resources: ["kimik3deployments"]
  verbs: ["get", "list", "watch", "patch"]
# The CR's status (conditions, groups, endpoint, plan): a merge patch of the status subresource.
- apiGroups: ["inference.kimik3.io"]
  resources: ["kimik3deployments/status"]
  verbs: ["patch"]
# The engine groups, a LeaderWorkerSet per revision of their templates: applied (server-side
# apply: create + patch), watched for drift and status (list also on teardown), deleted when a
# rollout is done with one and first on teardown.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Multi-node NVLink (NVIDIA DRA driver): applied, watched, read and deleted on teardown and at
# zero groups once no pod holds its channel.
- apiGroups: ["resource.nvidia.com"]
  resources: ["computedomains"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Engine scraping (Prometheus Operator): applied, watched, deleted when monitoring is disabled.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Gateway exposure (spec.service.httpRoute): applied, watched, deleted when the route is removed.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Group-aware disruption budget: applied, watched, deleted at <= 1 group (F3).
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The launcher ConfigMaps (one per launch plan): applied and watched; one no group's revision
# mounts any more is deleted once a rollout settled (controller/launchers.py), the others go by
# garbage collection through their owner reference.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The client Service and, with spec.routing, the endpoint picker's: applied and watched; the
# picker's deleted when routing is turned off (the client Service goes by garbage collection
# through its owner reference, never by the operator).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Engine pods: listed for group status (F1) and teardown order (F4), watched to follow them; get:
# held to grant it in the endpoint picker's Role (a Role grants only what its creator holds).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# spec.routing: the InferencePool of the group leaders, applied, watched (its status.parents are
# mirrored into the CR's status) and deleted when routing is turned off; get, list and watch are
# also what the endpoint picker's Role grants on it.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.routing: never read by the operator; held only to grant them in the endpoint picker's Role
# (the picker v1.2.1 watches the namespace's InferenceObjectives).
- apiGroups: ["inference.networking.x-k8s.io"]
  resources: ["inferenceobjectives"]
  verbs: ["get", "list", "watch"]
# spec.routing: the endpoint picker's Deployment, applied, watched (RoutingReady follows its
# available replicas) and deleted when routing is turned off.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# spec.service.httpRoute: the Gateways the route names, read for GatewayReady (missing, not
# Programmed, no listener admitting the namespace); never written.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways"]
  verbs: ["get"]
# Kueue placement: each group's Workload, listed for why a group waits (QuotaExhausted, NoRackFits,
# Preempted in ScalingLimited), deleted when Kueue split its group across racks or lists a failed
# tray, for Kueue to create it again and admit the group whole (kueue#6957, controller/readmit.py),
# and with placement.burstPriorityClass patched: spec.priority of reserved and burst groups
# (controller/capacity.py).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "patch", "delete"]
# Kueue placement: the deployment's LocalQueue, read before a group is created; no group while it
# is missing, its ClusterQueue missing or inactive, or Kueue not installed (controller/queues.py).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
# Weight staging (spec.model.source.cache with hub): the model cache's and compile cache's claims
# (read first, created once by server-side apply, never changed or deleted: they outlive
# deployments); one Job per repository and revision, read for its progress annotation and
# conditions, never deleted; applied with it, the stager's ServiceAccount and a Role granting
# get/patch of that Job by name, with its RoleBinding (to grant it, the operator holds get/patch
# on jobs itself). With spec.routing, the endpoint picker's ServiceAccount, Role and RoleBinding
# too: watched (children of the deployment) and deleted when routing is turned off.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- if .Values.wake.enabled }}
# With the wake: a tenant namespace's wake ReferenceGrant goes once the namespace is gone or
# terminating (controller/grants.py); a Role in a watched namespace grants get on that namespace.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
{{- end }}
# Events on the CR (Applied, InvalidSpec, DisruptionBudgetSkipped, TeardownWaiting, ...); list:
# the kubelet's FailedPrepareDynamicResources Events of a pod that cannot start (F19 b).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}

{{/*
Cluster-wide only. No rule on CustomResourceDefinitions: a kind whose CRD is installed after the
operator (the Gateway API, the Prometheus Operator) is found by the operator's own discovery
look-up, and one whose CRD is deleted is waited out (controller/lateapis.py).
*/}}
{{- define "kimik3-operator.clusterRules" -}}
# Placement kueue, only while Kueue finds no rack for a group (cluster-wide installs only): the
# nodes are listed to name the largest free block of trays in ScalingLimited NoRackFits.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
# Placement kueue with burstPriorityClass: the values of the reserved and burst WorkloadPriorityClasses
# (cluster-scoped; a namespaced install cannot read them: PriorityClassUnreadable, controller/capacity.py).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get"]
# With ComputeDomains: the trays where engine pods run and the DRA driver publishes no channel
# device (no ResourceSlice) are named in ComputeDomainReady=False ResourceSliceMissing.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceslices"]
  verbs: ["list"]
{{- end }}

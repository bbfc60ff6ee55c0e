"""Labels, annotations and resource names the operator sets or reads, each declared once.

Sources: LeaderWorkerSet v0.9 (``leaderworkerset.sigs.k8s.io/*``), NVIDIA GPU Feature Discovery
(``nvidia.com/gpu.*``, see gb300-on-kubernetes.md), the Kubernetes recommended labels.
"""

from __future__ import annotations

from kimik3.kube.kinds import GROUP

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
"""``"0"`` on the leader pod of a group, ``"1"``... on its workers."""
LEADER_WORKER_INDEX = "0"
"""``LWS_WORKER_INDEX_LABEL`` of a group's leader."""
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LWS_REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
"""LWS v0.9.0: the revision (a hash of the leaderWorkerTemplate) a group's pods were created from."""
"""Annotation: each group alone in one domain of the named node label."""

DEPLOYMENT_LABEL = f"{GROUP}/deployment"
ROLE_LABEL = f"{GROUP}/role"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kimik3-operator"
"""Value of ``MANAGED_BY_LABEL`` on every child and pod; the operator watches only objects with it."""

CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""GFD label equal on every tray of one NVLink domain (``<clusterUUID>.<cliqueID>``)."""
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

KUEUE_QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
"""On the LeaderWorkerSet: the LocalQueue its groups are submitted to (Kueue refuses a change while a group is Ready)."""
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
"""On the LeaderWorkerSet: the WorkloadPriorityClass of its groups' Workloads."""
KUEUE_SUSPENDING_PARENT_ANNOTATION = "kueue.x-k8s.io/pod-suspending-parent"
"""On a LeaderWorkerSet's pod templates: written by Kueue's LeaderWorkerSet webhook when Kueue manages
the set (v0.17.0 to v0.19.2, ``leaderworkerset_webhook.go``); Kueue's pod webhook gates pods that carry it."""
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
"""Pod template annotation: every pod of the podset inside one domain of this node label."""
KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
"""Pod template annotation: podsets with the same value (leader and workers) share one domain."""
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On each Workload: the uid of the LeaderWorkerSet it belongs to."""
KUEUE_WORKLOAD_INDEX_ANNOTATION = "kueue.x-k8s.io/component-workload-index"
"""On each Workload of a LeaderWorkerSet: the group index it admits."""
CAPACITY_ANNOTATION = f"{GROUP}/capacity"
"""On each Workload of a deployment with ``placement.burstPriorityClass``: ``reserved`` or ``burst``,
written by the operator with the Workload's ``spec.priority`` (``controller.capacity``)."""

WAKE_REQUESTED_ANNOTATION = f"{GROUP}/wake-requested-at"
"""On a KimiK3Deployment: an RFC 3339 time; a deployment stopped for idleness before it wakes
(``kimik3 wake`` writes it), and the idle clock counts from it."""

STAGER_LABEL = f"{GROUP}/stager"
"""On a staging Job and its pod (value ``"true"``): the pod the dev cluster's stager runner runs."""

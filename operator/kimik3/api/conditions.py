"""The conditions of a KimiK3Deployment's status, their reasons, and the reasons of the Events the
operator posts, declared once.

Every condition the operator writes has one of the ``ConditionType`` types and, for that type,
one of the reasons ``REASONS`` lists (CamelCase words, Kubernetes API conventions). The status
model (``v1alpha1.Condition``) keeps ``type`` and ``reason`` plain strings, so conditions other
writers set are kept as they are; the operator writes only these.

=================  ======  =====================================================================
type               status  reasons
=================  ======  =====================================================================
Ready              True    AllGroupsReady, ScaledToZero (replicas 0), IdleTimeout (stopped: Stopped)
                   False   GroupsNotReady (the message says what the groups wait for), InvalidSpec;
                           under placement kueue, a queue reason of ScalingLimited (below) while
                           groups are held back for it
Progressing        True    GroupsStarting, ApplyFailed (retried with back-off),
                           RolloutInProgress (two LeaderWorkerSets live; the figures per revision),
                           CanaryAnalysis (canary groups bake; the last check's figures),
                           Paused (spec.rollout.paused holds a rollout), SurgeBlocked (a surge
                           group has no room: no rack or no Kueue admission; nothing taken down)
                   False   Stable, InvalidSpec, RolledBack (a canary failed its analysis: its
                           LeaderWorkerSet is deleted, the measured figure quoted),
                           ProgressDeadlineExceeded (new groups not Ready by
                           rollout.progressDeadline: rolled back, what they waited on quoted),
                           MetricSourceUnreadable (the canary analysis cannot read its source:
                           the rollout is paused, never promoted on no reading)
Degraded           True    ApplyFailed, InvalidSpec, GroupCrashLooping (groups failed 3 times in
                           10 min: the message gives the last exit codes and the start back-off)
                   False   AsExpected
ScalingLimited     True    GroupSplitAcrossRacks (a group's pods are in more than one NVLink domain,
                           whatever the placement: the group, its racks and the fix; the group
                           is not counted Ready); Unschedulable (a group's pod has
                           ``PodScheduled=False`` reason ``Unschedulable``: no rack or node can
                           hold it); under placement
                           kueue: QuotaExhausted, NoRackFits (with the largest free block of
                           trays), Preempted, KueuePending (a group's Workload is not admitted;
                           Kueue's message quoted once; each group's in status.groups); the queue
                           not served, no new group created (controller/queues.py): KueueNotInstalled,
                           LocalQueueMissing, ClusterQueueMissing, QueueInactive, QueueUnreadable,
                           KueueWebhookMissing (the missing object and the fix in the message)
                   False   AllGroupsPlaced (every group the deployment wants exists, every pod bound
                           to a tray, each group inside one rack)
                   Unknown GroupsNotCreated (fewer groups exist than wanted: nothing to say of
                           the others), GroupsNotPlaced (every group exists, a pod is bound to no tray and
                           nothing else says why: the pod and its scheduling gates named)
MetricsAvailable   True    Measured, ScaledToZero (no groups: nothing to measure)
                   False   NoTargets, WarmingUp, ScrapeFailed, NoLatencyMetric, NoSeries,
                           PrometheusUnreachable, PrometheusError (the autoscaler holds replicas)
                   Unknown NotYetMeasured
WeightsReady       True    Staged (revisions, commits, size, when verified), DeclaredReady
                           (pvc, hostPath or a cache declared ready), NotStaged (hub: each
                           engine downloads at start)
                   False   Staging (bytes and files done of total, ETA), StagingFailed (the
                           hub's or the storage's error quoted); no engine pod exists meanwhile
Stopped            True    IdleTimeout (spec.idle.stopAfter passed without a request: 0 groups; also
                           Ready's reason then; the wake estimate in the message)
                   False   Active (requests seen within stopAfter, or woken: the idle clock runs)
ComputeDomainReady True    AllNodesJoined (every node of the engine pods is in the ComputeDomain)
                   False   ResourceSliceMissing (a tray of an engine pod publishes no ResourceSlice of
                           the driver: its kubelet plugin is down, so its daemon cannot start; checked first),
                           NodesNotReady (the driver lists a tray's IMEX daemon NotReady),
                           NodesMissing (nodes seen and missing; none decides Ready: F19),
                           PrepareFailed (a pod the kubelet cannot start: FailedPrepareDynamicResources
                           past its bound; pod, node and the kubelet's message: F19 b)
                   Unknown NotReported
RoutingReady       True    Routed (spec.routing.enabled: the picker is available, no gateway
                           refuses the InferencePool)
                   False   InferencePoolNotServed (the cluster lacks the InferencePool CRD: the
                           route goes to the Service, nothing refused), EndpointPickerNotReady
                           (its Deployment has no available replica; what that means under the
                           failure mode), PoolNotAccepted (a gateway's condition on the pool quoted)
GatewayReady       True    GatewayAccepts (spec.service.httpRoute: every Gateway named exists, is
                           Programmed and has a listener admitting the deployment's namespace)
                   False   GatewayNotFound, GatewayNotProgrammed, NamespaceNotAllowed (no
                           listener admits the route's namespace: the "silent 404")
                   Unknown GatewayUnreadable (the operator may not read the Gateway)
PlacementConflict  True    PlacementModesMixed (a deployment of placement kueue and one of placement
                           exclusive share a node pool: each other deployment named with its
                           mode and racks, the fix; set only once a clash was seen)
                   False   OnePlacementMode (the clash is gone)
=================  ======  =====================================================================

Events on the KimiK3Deployment have one of the ``EventReason`` reasons; a condition reason that is
also posted as an Event (ScalingLimited's, ``GroupCrashLooping``, ``InvalidSpec``...) is an
``EventReason`` of the same value, and ``event_reason`` turns one into the other. An ``Event`` is
one Event to post: (type, reason, message). No module spells a reason as a string
(tests/test_vocabulary.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

ConditionStatus = Literal["True", "False", "Unknown"]


class ConditionType(StrEnum):
    """The ``type`` of each condition the operator writes."""

    READY = "Ready"
    """Every desired group serves (or replicas is 0)."""
    PROGRESSING = "Progressing"
    """Children are being applied or groups are starting."""
    DEGRADED = "Degraded"
    """The operator cannot make the children what the spec says."""
    SCALING_LIMITED = "ScalingLimited"
    """The scheduler cannot place a group now."""
    METRICS_AVAILABLE = "MetricsAvailable"
    """The autoscaler has a reading of decode latency (autoscaling enabled only)."""
    WEIGHTS_READY = "WeightsReady"
    """The target and the drafter are where the engines load them (a cache: staged and verified)."""
    COMPUTE_DOMAIN_READY = "ComputeDomainReady"
    """The DRA driver lists every node of the engine pods in the ComputeDomain (reported only)."""
    ROUTING_READY = "RoutingReady"
    """spec.routing.enabled: requests reach the leaders through the InferencePool's endpoint picker (reported only)."""
    GATEWAY_READY = "GatewayReady"
    """spec.service.httpRoute: the Gateways the route names exist, are programmed and admit it (reported only)."""
    STOPPED = "Stopped"
    """spec.idle.stopAfter passed without a request: no group runs until a wake (only with stopAfter set)."""
    PLACEMENT_CONFLICT = "PlacementConflict"
    """Another deployment of the other placement mode shares the node pool (controller.placementmix)."""


class Reason(StrEnum):
    """The ``reason`` of each condition the operator writes (the table in the module docstring)."""

    ALL_GROUPS_READY = "AllGroupsReady"
    SCALED_TO_ZERO = "ScaledToZero"
    GROUPS_NOT_READY = "GroupsNotReady"
    INVALID_SPEC = "InvalidSpec"
    """The spec was refused: nothing was changed, the message names every problem."""
    GROUPS_STARTING = "GroupsStarting"
    STABLE = "Stable"
    APPLY_FAILED = "ApplyFailed"
    """A child could not be applied; the message quotes the API server."""
    AS_EXPECTED = "AsExpected"
    GROUP_CRASH_LOOPING = "GroupCrashLooping"
    """Groups keep failing: recreated with a start back-off (kimik3.controller.recreation)."""
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    """Groups run on two LeaderWorkerSets: the old templates' and the new ones' (controller.fleet)."""
    CANARY_ANALYSIS = "CanaryAnalysis"
    """Canary groups of the new revision bake beside every old group and are checked."""
    PAUSED = "Paused"
    """spec.rollout.paused: no old group is replaced; a template change waits."""
    ROLLED_BACK = "RolledBack"
    """The new revision failed its canary analysis: its LeaderWorkerSet is deleted; the old groups serve on."""
    SURGE_BLOCKED = "SurgeBlocked"
    """A surge group cannot be placed (no rack free, or Kueue does not admit it); no serving old group is
    taken down (one that is not Ready gives its place to a new group)."""
    METRIC_SOURCE_UNREADABLE = "MetricSourceUnreadable"
    """The canary analysis cannot read its metric source (the source and its error quoted): the
    rollout is paused, the canary is never promoted on no reading, no old group is replaced."""
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    """New-revision groups were not Ready within spec.rollout.progressDeadline: the release is
    rolled back, the message quoting what they waited on."""
    UNSCHEDULABLE = "Unschedulable"
    QUOTA_EXHAUSTED = "QuotaExhausted"
    """Kueue: the queue's GPU quota cannot hold another group (Kueue's message quoted)."""
    NO_RACK_FITS = "NoRackFits"
    """Kueue: no NVLink domain has a free block of trays for a whole group."""
    PREEMPTED = "Preempted"
    """Kueue evicted a group for a higher-priority Workload; it comes back when room returns."""
    KUEUE_PENDING = "KueuePending"
    """Kueue has not admitted a group for another reason (its message quoted)."""
    KUEUE_NOT_INSTALLED = "KueueNotInstalled"
    """Placement kueue, but the API server does not serve Kueue's API: no group is created."""
    LOCAL_QUEUE_MISSING = "LocalQueueMissing"
    """The LocalQueue ``queueName`` does not exist in the namespace: no group is created."""
    CLUSTER_QUEUE_MISSING = "ClusterQueueMissing"
    """The LocalQueue's ClusterQueue does not exist (Kueue says so on the LocalQueue): no group is created."""
    QUEUE_INACTIVE = "QueueInactive"
    """Kueue says the LocalQueue cannot take Workloads (its ClusterQueue inactive, or stopped): no group is created."""
    QUEUE_UNREADABLE = "QueueUnreadable"
    """The operator may not read the LocalQueue (RBAC): no group is created until it can check it."""
    KUEUE_WEBHOOK_MISSING = "KueueWebhookMissing"
    """Kueue runs, but a dry run of the LeaderWorkerSet came back without its webhook's mark: no group is created."""
    GROUP_SPLIT_ACROSS_RACKS = "GroupSplitAcrossRacks"
    """A group's pods are in more than one NVLink domain: it cannot run as one engine and is not
    counted Ready (the group, its racks and the fix in the message; ``kube.groups.Group.split``)."""
    ALL_GROUPS_PLACED = "AllGroupsPlaced"
    """Every group the deployment wants exists and every pod of it is bound to a tray, inside one rack."""
    GROUPS_NOT_CREATED = "GroupsNotCreated"
    """Fewer groups exist than the deployment wants: nothing is placed or refused for the others yet."""
    GROUPS_NOT_PLACED = "GroupsNotPlaced"
    """Every group exists but some pod is bound to no tray and nothing says why yet (e.g. gated by
    Kueue with no Workload made for it: the message names the pod and its scheduling gates)."""
    ALL_NODES_JOINED = "AllNodesJoined"
    NODES_MISSING = "NodesMissing"
    """The ComputeDomain lacks nodes that run engine pods (kimik3.controller.computedomains)."""
    NODES_NOT_READY = "NodesNotReady"
    """The DRA driver lists the daemon NotReady on a node that runs engine pods."""
    RESOURCE_SLICE_MISSING = "ResourceSliceMissing"
    """A node that runs engine pods publishes no ResourceSlice of the ComputeDomain driver."""
    PREPARE_FAILED = "PrepareFailed"
    """A pod's resource claims could not be prepared for longer than its bound (the kubelet's
    FailedPrepareDynamicResources Event quoted; kimik3.controller.computedomains)."""
    NOT_REPORTED = "NotReported"
    ROUTED = "Routed"
    INFERENCE_POOL_NOT_SERVED = "InferencePoolNotServed"
    """spec.routing.enabled, but the API server does not serve InferencePool: the route goes to the Service."""
    ENDPOINT_PICKER_NOT_READY = "EndpointPickerNotReady"
    """The endpoint picker's Deployment has no available replica."""
    POOL_NOT_ACCEPTED = "PoolNotAccepted"
    """A gateway wrote a False condition on the InferencePool (its status.parents)."""
    GATEWAY_ACCEPTS = "GatewayAccepts"
    GATEWAY_NOT_FOUND = "GatewayNotFound"
    GATEWAY_NOT_PROGRAMMED = "GatewayNotProgrammed"
    """The Gateway's Programmed condition is not True (its controller's message quoted)."""
    NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
    """No listener of the Gateway admits routes from the deployment's namespace (allowedRoutes)."""
    GATEWAY_UNREADABLE = "GatewayUnreadable"
    PLACEMENT_MODES_MIXED = "PlacementModesMixed"
    """A deployment of placement kueue and one of placement exclusive (exclusive topology) share a
    node pool: the other deployments named, their racks, the fix (kimik3.controller.placementmix)."""
    ONE_PLACEMENT_MODE = "OnePlacementMode"
    """No deployment of the other placement mode shares the node pool (any more)."""
    MEASURED = "Measured"
    NOT_YET_MEASURED = "NotYetMeasured"
    NO_TARGETS = "NoTargets"
    """Pod scrape: no Running group leader to scrape."""
    WARMING_UP = "WarmingUp"
    """Pod scrape: every leader was scraped once only, so no window exists yet."""
    SCRAPE_FAILED = "ScrapeFailed"
    """Pod scrape: no leader answered its /metrics."""
    NO_LATENCY_METRIC = "NoLatencyMetric"
    """Neither vLLM's inter-token latency histogram nor its deprecated name is exposed."""
    NO_SERIES = "NoSeries"
    """Prometheus has no series of the deployment's engines."""
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    PROMETHEUS_ERROR = "PrometheusError"
    """Prometheus answered with an error, or with an answer the operator cannot read."""
    STAGING = "Staging"
    """The staging Jobs download into the model cache; the message gives bytes, files and an ETA."""
    STAGED = "Staged"
    """Every artifact of the cache was downloaded and verified against the hub's hashes."""
    STAGING_FAILED = "StagingFailed"
    """A staging Job failed (after its back-off retries, or its latest attempt while it retries)."""
    DECLARED_READY = "DeclaredReady"
    """The spec says the weights are in place (pvc, hostPath, or a cache with declaredReady)."""
    NOT_STAGED = "NotStaged"
    """spec.model.source.hub: every engine downloads the weights at start; nothing is staged."""
    BUCKET_LAYOUTS_DIFFER = "BucketLayoutsDiffer"
    """Groups expose the latency histogram with different bucket bounds (mid-rollout, F21b):
    their buckets cannot be summed, replicas are held."""
    IDLE_TIMEOUT = "IdleTimeout"
    """No request for spec.idle.stopAfter: the engine groups are gone, the staged weights kept (status.idle)."""
    ACTIVE = "Active"
    """spec.idle.stopAfter is set and the deployment runs: requests seen, or woken, within it."""
    GROUPS_UNMEASURED = "GroupsUnmeasured"
    """A reading, but some serving groups gave no metrics: the message names them and since when;
    the autoscaler may scale up on it, never down (missing data is not low load)."""


METRICS_UNAVAILABLE: tuple[Reason, ...] = (
    Reason.NO_TARGETS, Reason.WARMING_UP, Reason.SCRAPE_FAILED, Reason.NO_LATENCY_METRIC, Reason.NO_SERIES,
    Reason.PROMETHEUS_UNREACHABLE, Reason.PROMETHEUS_ERROR, Reason.BUCKET_LAYOUTS_DIFFER)
"""Reasons of ``MetricsAvailable=False``: why the metric source has no reading."""

QUEUE_NOT_SERVED: tuple[Reason, ...] = (
    Reason.KUEUE_NOT_INSTALLED, Reason.LOCAL_QUEUE_MISSING, Reason.CLUSTER_QUEUE_MISSING, Reason.QUEUE_INACTIVE,
    Reason.QUEUE_UNREADABLE, Reason.KUEUE_WEBHOOK_MISSING)
"""Reasons of ``ScalingLimited=True`` (and ``Ready=False``) when placement kueue's queue is not served
(``controller.queues``): the operator creates no group meanwhile."""

REASONS: dict[ConditionType, tuple[Reason, ...]] = {
    ConditionType.READY: (Reason.ALL_GROUPS_READY, Reason.SCALED_TO_ZERO, Reason.IDLE_TIMEOUT, Reason.GROUPS_NOT_READY,
                          Reason.INVALID_SPEC, *QUEUE_NOT_SERVED),
    ConditionType.STOPPED: (Reason.IDLE_TIMEOUT, Reason.ACTIVE),
    ConditionType.PROGRESSING: (Reason.GROUPS_STARTING, Reason.STABLE, Reason.APPLY_FAILED, Reason.INVALID_SPEC,
                                Reason.ROLLOUT_IN_PROGRESS, Reason.CANARY_ANALYSIS, Reason.PAUSED,
                                Reason.ROLLED_BACK, Reason.SURGE_BLOCKED, Reason.METRIC_SOURCE_UNREADABLE,
                                Reason.PROGRESS_DEADLINE_EXCEEDED),
    ConditionType.DEGRADED: (Reason.AS_EXPECTED, Reason.APPLY_FAILED, Reason.INVALID_SPEC,
                             Reason.GROUP_CRASH_LOOPING),
    ConditionType.SCALING_LIMITED: (Reason.GROUP_SPLIT_ACROSS_RACKS, Reason.UNSCHEDULABLE, Reason.QUOTA_EXHAUSTED,
                                    Reason.NO_RACK_FITS, Reason.PREEMPTED, Reason.KUEUE_PENDING, *QUEUE_NOT_SERVED,
                                    Reason.ALL_GROUPS_PLACED, Reason.GROUPS_NOT_CREATED, Reason.GROUPS_NOT_PLACED),
    ConditionType.COMPUTE_DOMAIN_READY: (Reason.ALL_NODES_JOINED, Reason.NODES_MISSING, Reason.NODES_NOT_READY,
                                         Reason.RESOURCE_SLICE_MISSING, Reason.PREPARE_FAILED,
                                         Reason.NOT_REPORTED),
    ConditionType.PLACEMENT_CONFLICT: (Reason.PLACEMENT_MODES_MIXED, Reason.ONE_PLACEMENT_MODE),
    ConditionType.METRICS_AVAILABLE: (Reason.MEASURED, Reason.GROUPS_UNMEASURED, Reason.SCALED_TO_ZERO,
                                      Reason.NOT_YET_MEASURED, *METRICS_UNAVAILABLE),
    ConditionType.WEIGHTS_READY: (Reason.STAGED, Reason.DECLARED_READY, Reason.NOT_STAGED, Reason.STAGING,
                                  Reason.STAGING_FAILED),
    ConditionType.ROUTING_READY: (Reason.ROUTED, Reason.INFERENCE_POOL_NOT_SERVED, Reason.ENDPOINT_PICKER_NOT_READY,
                                  Reason.POOL_NOT_ACCEPTED),
    ConditionType.GATEWAY_READY: (Reason.GATEWAY_ACCEPTS, Reason.GATEWAY_NOT_FOUND, Reason.GATEWAY_NOT_PROGRAMMED,
                                  Reason.NAMESPACE_NOT_ALLOWED, Reason.GATEWAY_UNREADABLE),
}
"""The reasons the operator writes for each condition type."""


@dataclass(frozen=True)
class Verdict:
    """What one condition says now; ``lastTransitionTime`` and ``observedGeneration`` are added
    when it is written into a status (``controller.status.set_condition``)."""

    status: ConditionStatus
    reason: Reason
    message: str


class EventReason(StrEnum):
    """The ``reason`` of each Event the operator posts on a KimiK3Deployment, with when it is posted."""

    # -- the spec, the children ------------------------------------------------------------------
    INVALID_SPEC = Reason.INVALID_SPEC.value
    """Warning: admission refused the spec; nothing was changed (every problem named)."""
    APPLIED = "Applied"
    """Normal: every child of a new generation was applied (the kinds and the group shape)."""
    APPLY_FAILED = Reason.APPLY_FAILED.value
    """Warning: a child could not be applied (the API server quoted); retried with back-off."""
    DELETED = "Deleted"
    """Normal: a child the spec no longer needs was deleted (a kind, a retired LeaderWorkerSet or launcher)."""
    DELETE_FAILED = "DeleteFailed"
    """Warning: a LeaderWorkerSet the rollout is done with could not be deleted (the API server quoted)."""
    COMPUTE_DOMAIN_SKIPPED = "ComputeDomainSkipped"
    """Warning: the groups need a ComputeDomain but the operator runs with --no-compute-domains."""
    DISRUPTION_BUDGET_SKIPPED = "DisruptionBudgetSkipped"
    """Warning: no PodDisruptionBudget is rendered for this spec (the message says why)."""
    ENGINE_SETTING_OVERRIDDEN = "EngineSettingOverridden"
    """Warning: vLLM 0.33 will change or narrow a setting of the spec without an error (fields, the value it uses, the change that avoids it; status.engineOverrides)."""
    COMPUTE_DOMAIN_NODES_MISSING = "ComputeDomainNodesMissing"
    """Warning: ComputeDomainReady=False NodesMissing, NodesNotReady or ResourceSliceMissing (nodes of
    engine pods not in the ComputeDomain, not Ready in it, or without the driver's ResourceSlice)."""
    COMPUTE_DOMAIN_PREPARE_FAILED = "ComputeDomainPrepareFailed"
    """Warning: ComputeDomainReady=False PrepareFailed (the kubelet cannot prepare a pod's claims)."""
    TEARDOWN_STARTED = "TeardownStarted"
    """Normal: the CR is deleted; its LeaderWorkerSets go first."""
    TEARDOWN_WAITING = "TeardownWaiting"
    """Normal: teardown waits for the last pods before it releases the ComputeDomain."""
    # -- readiness, engines ----------------------------------------------------------------------
    GROUPS_READY = "GroupsReady"
    """Normal: Ready went False -> True."""
    GROUPS_NOT_READY = Reason.GROUPS_NOT_READY.value
    """Warning: Ready went True -> False (the condition's message)."""
    ENGINE_FAILED = "EngineFailed"
    """Warning: an engine container exited non-zero (pod, node, exit code; controller.crashes)."""
    ENGINE_DISRUPTED = "EngineDisrupted"
    """Warning: an engine pod got DisruptionTarget=True (taint, eviction, preemption; controller.crashes)."""
    GROUP_CRASH_LOOPING = Reason.GROUP_CRASH_LOOPING.value
    """Warning: Degraded=True GroupCrashLooping (controller.recreation)."""
    # -- rollout ---------------------------------------------------------------------------------
    ROLLOUT_STEP = "RolloutStep"
    """Normal: a rollout moved (the figures per revision), once per change of a figure."""
    ROLLOUT_COMPLETE = "RolloutComplete"
    """Normal: the last old LeaderWorkerSet was deleted; every group runs the new templates."""
    CANARY_STARTED = "CanaryStarted"
    """Normal: canary groups of new templates start beside every old group."""
    CANARY_PROMOTED = "CanaryPromoted"
    """Normal: the canary baked and passed its analysis; the rollout goes on to every group."""
    ROLLED_BACK = Reason.ROLLED_BACK.value
    """Warning: the canary failed its analysis; its LeaderWorkerSet is deleted."""
    METRIC_SOURCE_UNREADABLE = Reason.METRIC_SOURCE_UNREADABLE.value
    """Warning: the canary analysis cannot read its metric source; the rollout is paused (the error quoted)."""
    PROGRESS_DEADLINE_EXCEEDED = Reason.PROGRESS_DEADLINE_EXCEEDED.value
    """Warning: new-revision groups missed spec.rollout.progressDeadline; the release is rolled back."""
    SCALE_DOWN_HELD = "ScaleDownHeld"
    """Normal: the autoscaler's scale-down waits until the rollout is done."""
    # -- placement (Kueue, the scheduler) --------------------------------------------------------
    GROUP_ADMITTED = "GroupAdmitted"
    """Normal: Kueue admitted a group's Workload (controller.groups)."""
    GROUP_PENDING = "GroupPending"
    """Warning: a group's Workload waits for Kueue (Kueue's message quoted)."""
    GROUP_PREEMPTED = "GroupPreempted"
    """Warning: Kueue preempted a group for a higher-priority Workload."""
    GROUP_EVICTED = "GroupEvicted"
    """Warning: Kueue evicted a group for another reason (e.g. NodeFailures)."""
    GROUP_CAPACITY = "GroupCapacity"
    """Normal: with placement.burstPriorityClass, the operator set a group's Workload priority to its
    capacity's class: reserved (raised) or burst (lowered) (controller.capacity)."""
    PRIORITY_NOT_SET = "PriorityNotSet"
    """Warning: the API server refused the patch of a group's Workload priority (its answer quoted; controller.capacity)."""
    PRIORITY_CLASS_UNREADABLE = "PriorityClassUnreadable"
    """Warning: a WorkloadPriorityClass of placement.priorityClass or burstPriorityClass cannot be
    read; the reserved groups stay at the burst priority Kueue gave them (controller.capacity)."""
    GROUP_SPLIT_ACROSS_RACKS = Reason.GROUP_SPLIT_ACROSS_RACKS.value
    """Warning: a group's pods landed in two racks: ScalingLimited=True GroupSplitAcrossRacks (the
    group, its racks, the fix), and under placement kueue its Workload is deleted to re-admit it
    whole (controller.readmit)."""
    GROUP_TRAY_FAILED = "GroupTrayFailed"
    """Warning: a tray of an admitted group failed; its Workload is deleted to re-admit it whole (controller.readmit)."""
    PLACEMENT_MODES_MIXED = Reason.PLACEMENT_MODES_MIXED.value
    """Warning: PlacementConflict=True (the other deployment and its mode named), once per generation."""
    UNSCHEDULABLE = Reason.UNSCHEDULABLE.value
    """Warning: ScalingLimited=True Unschedulable, posted as the condition says it."""
    QUOTA_EXHAUSTED = Reason.QUOTA_EXHAUSTED.value
    """Warning: ScalingLimited=True QuotaExhausted."""
    NO_RACK_FITS = Reason.NO_RACK_FITS.value
    """Warning: ScalingLimited=True NoRackFits."""
    PREEMPTED = Reason.PREEMPTED.value
    """Warning: ScalingLimited=True Preempted."""
    KUEUE_PENDING = Reason.KUEUE_PENDING.value
    """Warning: ScalingLimited=True KueuePending."""
    KUEUE_NOT_INSTALLED = Reason.KUEUE_NOT_INSTALLED.value
    """Warning: ScalingLimited=True KueueNotInstalled (no group created)."""
    LOCAL_QUEUE_MISSING = Reason.LOCAL_QUEUE_MISSING.value
    """Warning: ScalingLimited=True LocalQueueMissing (no group created)."""
    CLUSTER_QUEUE_MISSING = Reason.CLUSTER_QUEUE_MISSING.value
    """Warning: ScalingLimited=True ClusterQueueMissing (no group created)."""
    QUEUE_INACTIVE = Reason.QUEUE_INACTIVE.value
    """Warning: ScalingLimited=True QueueInactive (no group created)."""
    QUEUE_UNREADABLE = Reason.QUEUE_UNREADABLE.value
    """Warning: ScalingLimited=True QueueUnreadable (no group created)."""
    KUEUE_WEBHOOK_MISSING = Reason.KUEUE_WEBHOOK_MISSING.value
    """Warning: ScalingLimited=True KueueWebhookMissing (no group created)."""
    # -- the autoscaler's decisions (``autoscaler.policy.Decision.reason``, also status.lastScale) --
    SCALE_UP = "ScaleUp"
    """Normal: more groups, for the measured decode latency."""
    SCALE_UP_PREDICTED = "ScaleUpPredicted"
    """Normal: more groups, for the latency the forecast load would bring."""
    SCALE_DOWN = "ScaleDown"
    """Normal: fewer groups, after a whole scale-down window allowed it."""
    SCALED_TO_ZERO = Reason.SCALED_TO_ZERO.value
    """Normal: no groups (minReplicas 0 and no traffic)."""
    HOLD = "Hold"
    """(No Event) the groups stay as they are."""
    GROUPS_LOADING = "GroupsLoading"
    """Normal: groups still loading count as coming; nothing added or removed meanwhile."""
    UNPLACEABLE = "Unplaceable"
    """Warning: a scale-up is due but a group cannot be placed; no more are added."""
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    """Warning: no reading of decode latency; replicas held."""
    METRICS_INCOMPLETE = "MetricsIncomplete"
    """Warning: a scale-down is due but serving groups gave no metrics; replicas held."""
    REPLICA_BOUNDS = "ReplicaBounds"
    """Normal: spec.autoscaling's minReplicas or maxReplicas overrode the policy."""
    # -- idle stop and wake (``controller.idle``) ---------------------------------------------------
    IDLE_TIMEOUT = Reason.IDLE_TIMEOUT.value
    """Normal: stopped after spec.idle.stopAfter without a request; the wake estimate and how to wake."""
    WOKEN = "Woken"
    """Normal: a stopped deployment wakes (what woke it, the groups asked for, the wake estimate)."""
    WAKE_REQUEST_INVALID = "WakeRequestInvalid"
    """Warning: the wake-requested-at annotation is not an RFC 3339 time; it wakes nothing."""
    WAKE_ROUTE_REFUSED = "WakeRouteRefused"
    """Warning: the ReferenceGrant that lets the HTTPRoute name the operator's wake Service could not be
    applied; the route stays on its backend, and requests through the gateway wake nothing."""


EventType = Literal["Normal", "Warning"]
"""The ``type`` of a core/v1 Event."""


class Event(NamedTuple):
    """One Event to post on the KimiK3Deployment."""

    type: EventType
    reason: EventReason
    message: str
    once: bool = True
    """Posted once per generation, reason and message (False: each time it is asked for, e.g. a
    change of a group's Kueue state the status saw)."""


def event_reason(reason: str) -> EventReason:
    """The Event reason a condition's reason (a ``Reason``, or one read back from a status) is
    posted with: the same word. ValueError for a reason no Event has."""
    return EventReason(reason)

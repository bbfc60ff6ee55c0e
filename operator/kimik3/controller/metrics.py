"""The operator's own Prometheus metrics (served on /metrics of the health server)."""

from prometheus_client import Counter, Gauge, Histogram

from kimik3.kube.kinds import CHILD_KINDS

RECONCILES = Counter("kimik3_reconciles", "Reconciles of KimiK3Deployments by result "
                     "(applied, apply-failed, invalid, tearing-down, deleted, gone, error)", ["result"])
RECONCILE_SECONDS = Histogram("kimik3_reconcile_duration_seconds", "Wall time of one reconcile, seconds",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
CHILDREN_APPLIED = Counter("kimik3_children_applied", "Server-side applies of child objects by kind", ["kind"])
APPLIES_SKIPPED = Counter("kimik3_applies_skipped", "Child applies skipped: the watched object is what was applied")
APPLY_ERRORS = Counter("kimik3_apply_errors", "Failed applies of child objects by kind", ["kind"])
for _child in CHILD_KINDS:  # each kind's series from the start (0): no failure is not no data
    APPLY_ERRORS.labels(kind=_child.kind)
GROUPS = Gauge("kimik3_groups", "Engine groups of each KimiK3Deployment: desired (the LeaderWorkerSet's "
               "replicas) and ready", ["namespace", "deployment", "state"])
PLACED_GROUPS = Gauge("kimik3_placement_groups", "Engine groups of each KimiK3Deployment (status.groups) by rack "
                      "(the NVLink domain of the group's trays; empty while unbound) and Kueue Workload state "
                      "(Admitted, Pending, Preempted, Evicted; empty outside placement kueue)",
                      ["namespace", "deployment", "rack", "kueue"])
READY_LOST = Counter("kimik3_ready_lost", "Times a KimiK3Deployment's Ready condition went True -> False "
                     "(a pod, tray or engine of a group failed)", ["namespace", "deployment"])
ENGINE_FAILURES = Counter("kimik3_engine_failures", "Engine container exits with a non-zero code seen on the "
                          "pod watch, by termination reason", ["namespace", "deployment", "reason"])
ENGINE_DISRUPTIONS = Counter("kimik3_engine_disruptions", "Engine pods Kubernetes marked DisruptionTarget before "
                             "deleting them (taint eviction, drain, preemption), by reason",
                             ["namespace", "deployment", "reason"])
QUEUE_DEPTH = Gauge("kimik3_workqueue_depth", "KimiK3Deployments waiting to be reconciled")
WATCH_EVENTS = Counter("kimik3_watch_events", "Watch events received by resource", ["resource"])
CANARY_CHECKS = Counter("kimik3_canary_checks", "Canary analysis checks of a new revision by result (Passed, "
                        "Failed, NoTraffic, NoReading, SourceUnreadable; status.rollout.canary.history)",
                        ["namespace", "deployment", "result"])
CANARY_PROBE_REQUESTS = Counter("kimik3_canary_probe_requests", "Requests the canary analysis sent to engine groups "
                                "itself, by purpose (traffic: probes filling a canary's windows without traffic, at "
                                "most analysis.probeRequests per check; parity: the golden prompts to a canary and an "
                                "old group) and result (ok, failed)",
                                ["namespace", "deployment", "purpose", "result"])
DESIRED_GROUPS = Gauge("kimik3_autoscaler_desired_groups", "Groups the autoscaler wants", ["namespace", "deployment"])
CURRENT_GROUPS = Gauge("kimik3_autoscaler_ready_groups", "Groups serving at the last decision",
                       ["namespace", "deployment"])
OBSERVED_LATENCY = Gauge("kimik3_autoscaler_observed_latency_seconds",
                         "Decode latency the autoscaler holds under its target, over the last window, seconds: "
                         "spec.autoscaling.target.metric (label metric: timePerOutputToken or interTokenLatency) "
                         "at target.percentile (label percentile); status.decode.latencySeconds",
                         ["namespace", "deployment", "metric", "percentile"])
SLO_ATTAINMENT = Gauge("kimik3_autoscaler_slo_attainment",
                       "Share of decision windows of the past hour with latency <= target (0..1)",
                       ["namespace", "deployment"])
DECISIONS = Counter("kimik3_autoscaler_decisions", "Autoscaler decisions by reason", ["reason"])
LEADER = Gauge("kimik3_operator_leader", "1 while this replica holds the operator's Lease (reconciles and writes), "
               "else 0 (a standby)")
LEADER_TRANSITIONS = Counter("kimik3_operator_leader_transitions", "Times this replica became the leader")

"""kimik3-operator: serves Kimi K3 on GB300 NVL72 racks with vLLM's megakernel decode path and DSpark.

Data flow (docs/architecture.md): the CR -> ``admission.admit`` (one ``Admitted``: the spec, the
group plan of ``topology``, durations in seconds) -> ``controller.snapshot`` (the cluster, read
once) -> the named steps of ``controller.steps`` (staging, autoscaling with ``autoscaler``,
``render`` with each rank's vLLM arguments from ``engine``, rollout) -> server-side apply ->
the snapshot read again -> status. ``api`` holds the models the CRD is generated from; ``kube``
the Kubernetes facts every layer reads.
"""

"""Engine simulator and load generator for the local cluster (``kimik3 dev sim``, ``kimik3 dev load``).

- ``perfmodel``: a pure performance model of Kimi K3 decode per engine group, calibrated to the
  published GB300 figures (reused by the fleet/trace simulator).
- ``engine``: one simulated vLLM server (OpenAI API, ``/health``, vLLM 0.32's ``/metrics``).
- ``vllm_metrics``: our definitions of vLLM 0.32's metric names, label names and buckets.
- ``supervisor``: starts/stops one engine per running LeaderWorkerSet group at its leader pod's
  IP and port, and plays kube-proxy for the Services (``services``).
- ``load``: the request generator that prints what users see.
- ``cli``: the ``sim`` and ``load`` click commands.

The simulator is the one allowed fake: it stands in for GPUs and the 2.8T-parameter model and
imitates vLLM's interface. It only ever listens on and connects to 127.0.0.1.
"""

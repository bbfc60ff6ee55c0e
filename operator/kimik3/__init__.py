"""kimik3-operator: serves Kimi K3 on GB300 NVL72 racks with vLLM's megakernel decode path and DSpark.

Data flow (one subpackage per arrow): ``api`` (the KimiK3Deployment models and CRD) ->
``topology`` (accelerator profiles, parallel plan) -> ``engine`` (per-rank vLLM arguments, the
in-pod launcher) -> ``render`` (child objects) -> ``controller`` (kopf handlers that apply them
and write status).
"""

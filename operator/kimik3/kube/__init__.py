"""Kubernetes facts, declared once: the kinds the operator reads and writes (``kinds``), the labels
and annotations it sets or reads (``labels``), what a pod's or a node's state means (``pods``,
``nodes``, over ``objects``: every object as the API's JSON, plain dicts), and how each GPU
system's nodes look to Kubernetes (``accelerators``). The bottom layer of the core: it imports
nothing else of ``kimik3``."""

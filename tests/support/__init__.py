"""Helpers the tests share, one of each (the tests import them as ``support.<module>``: pytest puts
``tests/`` on ``sys.path`` through ``tests/conftest.py``).

- ``waiting``: ``wait_for``, the one bounded poll every test uses.
- ``recipes``: the shipped recipes (``recipes/*.yaml``) as fresh dicts, with overrides.
- ``cluster``: working against a real API server: a suite's control plane (``serving_control_plane``),
  object references, namespaces, applying a
  KimiK3Deployment and waiting for its status, events, the operator's ``/metrics``.
- ``rendering``: what the controller renders for a stored CR (``render_cr``), one object by kind.
- ``files``: the repository's own files as tests read them (a file's leading comment block).
- ``lws_pods``: the pods LeaderWorkerSet makes for a rendered group, for tests with no LWS controller.
"""

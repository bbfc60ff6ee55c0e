"""The weight stager: a hub repository at one revision, downloaded into a model cache and verified.

It runs in the cluster as the staging Job's container (``kimik3 stage --repo ... --report-job``,
rendered by ``kimik3.render.staging``) and on a workstation (``kimik3 stage -f recipe.yaml --to
DIR``), the same code both ways:

- ``files``: which files of a repository vLLM loads (the rest is never downloaded);
- ``stager``: ``stage(...)`` resolves the revision to a commit, downloads with
  ``huggingface_hub.snapshot_download`` (pinned to the commit, resumable, parallel), verifies
  every file's size and hash against the hub's metadata and writes the completion manifest;
- ``progress``: the ``Progress`` document it reports (bytes and files done of total, the error),
  and where: the Job's annotation, which the operator reads (``kimik3.controller.staging``).
"""

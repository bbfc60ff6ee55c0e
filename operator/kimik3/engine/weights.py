"""Where an engine finds its target model and its drafter, and what a staged model cache holds.

Every weight source is mounted read-only at ``MODEL_MOUNT`` in the engine pods. A ``cache``
source (``spec.model.source.cache``) is laid out one folder per hub repository and revision::

    /models/<org>/<name>/<revision>/            e.g. /models/moonshotai/Kimi-K3/main/
        config.json, *.safetensors, ...          the files vLLM loads (``kimik3.staging.files``)
        .kimik3-staged.json                      the completion manifest (``MANIFEST``)

so a new revision is staged beside the one groups still load from, and several deployments of a
namespace naming the same claim share each folder. The drafter of ``spec.speculativeDecoding``
lives beside the target the same way. Engines run with ``HF_HUB_OFFLINE=1`` for every source but
``hub``, and vLLM resolves a hub id offline only for the target and its tokenizer (vllm#29706,
failure case F23): so both get local paths here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Literal

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec

MODEL_MOUNT = "/models"
"""Where every engine pod mounts the weights volume (read-only)."""
MANIFEST = ".kimik3-staged.json"
"""The completion manifest in a staged folder: written last, after every file was verified."""
DEFAULT_REVISION = "main"
"""The hub's default branch: the revision of a repository whose spec names none."""


@dataclass(frozen=True)
class Artifact:
    """One hub repository at one revision, staged into ``folder`` of the cache volume."""

    role: Literal["target", "drafter"]
    repo_id: str
    """``org/name`` on the hub."""
    revision: str
    """Branch, tag or commit as the spec names it (``main`` when unset)."""

    @property
    def folder(self) -> str:
        """The folder relative to the volume's root: ``<repo id>/<revision>`` (a ``/`` in a
        revision such as ``refs/pr/1`` becomes ``--``)."""
        return f"{self.repo_id}/{self.revision.replace('/', '--')}"

    @property
    def path(self) -> str:
        """The folder as an engine pod sees it (below ``MODEL_MOUNT``)."""
        return f"{MODEL_MOUNT}/{self.folder}"


def is_local_path(model: str) -> bool:
    """A drafter named by a folder in the weights volume (absolute, below ``MODEL_MOUNT``, no ``..``)
    rather than by hub id: the form an offline engine can load (the CEL rule
    ``drafter-local-when-offline`` reads it the same way)."""
    return model.startswith(MODEL_MOUNT + "/") and ".." not in model and posixpath.isabs(model)


def artifacts(spec: KimiK3DeploymentSpec) -> list[Artifact]:
    """What a model cache holds for this spec: the target, then the drafter when speculative
    decoding names one by hub id (``kimik3 stage -f`` stages these for any source)."""
    out = [Artifact("target", spec.model.name, spec.model.revision or DEFAULT_REVISION)]
    sd = spec.speculative_decoding
    if sd.method != "none" and sd.draft_model and not is_local_path(sd.draft_model):
        out.append(Artifact("drafter", sd.draft_model, sd.draft_revision or DEFAULT_REVISION))
    return out


def cache_artifacts(spec: KimiK3DeploymentSpec) -> list[Artifact]:
    """``artifacts(spec)`` for a ``cache`` source, where the engines load them; empty otherwise."""
    return artifacts(spec) if spec.model.source.cache is not None else []


def offline(spec: KimiK3DeploymentSpec) -> bool:
    """Whether the engines run with ``HF_HUB_OFFLINE=1``: every source but ``hub`` is pre-staged."""
    return spec.model.source.hub is None


def model_path(spec: KimiK3DeploymentSpec) -> str:
    """What ``vllm serve`` loads: the mounted checkpoint folder, the staged cache folder, or the hub id."""
    src = spec.model.source
    if src.pvc is not None:
        return f"{MODEL_MOUNT}/{src.pvc.sub_path.strip('/')}" if src.pvc.sub_path else MODEL_MOUNT
    if src.host_path is not None:
        return MODEL_MOUNT
    if src.cache is not None:
        return cache_artifacts(spec)[0].path
    return spec.model.name


def drafter_path(spec: KimiK3DeploymentSpec) -> str | None:
    """The ``model`` of ``--speculative-config``: the drafter's staged folder (cache source), its
    folder as the spec gives it, or its hub id (hub source, online). None without a drafter."""
    sd = spec.speculative_decoding
    if sd.method == "none" or not sd.draft_model:
        return None
    staged = [a for a in cache_artifacts(spec) if a.role == "drafter"]
    return staged[0].path if staged else sd.draft_model

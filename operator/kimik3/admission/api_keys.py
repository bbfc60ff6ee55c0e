"""No secret in plain text (failure case F22): no API key in ``extraArgs`` (``--api-key``) or
``env`` (``VLLM_API_KEY``), no hub token in ``extraArgs`` (``--hf-token``) or ``env``
(``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, the names ``huggingface_hub`` reads).

Written into the spec a secret would sit in the CR and the launcher ConfigMap, readable by anyone
who may read those; ``--api-key`` would silently override ``service.apiKeySecret`` (vLLM reads
``--api-key`` first, then ``VLLM_API_KEY``). The API key belongs in a Secret named by
``spec.service.apiKeySecret``, the hub token in one named by ``spec.model.source.hub.tokenSecret``
(engines downloading at start) or ``spec.model.source.cache.hub.tokenSecret`` (the stager only).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Check, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.engine.args import API_KEY_ENV, API_KEY_FLAG, HUB_TOKEN_ENV, HUB_TOKEN_FLAG, normalize_flag

KEY_FIX = "put the key in a Secret and name it in spec.service.apiKeySecret (the pods then read it from there)"
HUB_FIX = ("put the token in a Secret and name it in spec.model.source.hub.tokenSecret, or "
           "spec.model.source.cache.hub.tokenSecret when the operator stages the weights")


def not_in_extra_args(slug: str, what: str, flag: str, fix: str) -> Check:
    """A check refusing ``flag`` (any spelling ``normalize_flag`` reads as it) in ``engine.extraArgs``."""
    def check(c: Candidate) -> list[SpecError]:
        return [SpecError(f"spec.engine.extraArgs[{i}]",
                          f"{flag} would put the {what} in plain text in the CR and its launcher ConfigMap: {fix}")
                for i, arg in enumerate(c.spec.engine.extra_args) if normalize_flag(arg) == flag]
    check.__name__ = f"{slug}_not_in_extra_args"
    return check


def not_in_env(slug: str, what: str, names: tuple[str, ...], fix: str) -> Check:
    """A check refusing an ``engine.env`` variable named one of ``names``."""
    def check(c: Candidate) -> list[SpecError]:
        return [SpecError(f"spec.engine.env[{i}].name", f"{env.name} here would be the {what} in plain text in the CR: "
                                                        f"{fix}")
                for i, env in enumerate(c.spec.engine.env) if env.name in names]
    check.__name__ = f"{slug}_not_in_env"
    return check


API_KEYS = Table("api_keys", (
    Rule(not_in_extra_args("api_key", "API key", API_KEY_FLAG, KEY_FIX),
         example(engine={"extraArgs": ["--api_key=sk-plain"]}), cel=("api-key-not-in-extra-args",)),
    Rule(not_in_env("api_key", "API key", (API_KEY_ENV,), KEY_FIX),
         example(engine={"env": [{"name": "VLLM_API_KEY", "value": "sk-plain"}]}), cel=("api-key-not-in-env",)),
    Rule(not_in_extra_args("hub_token", "hub token", HUB_TOKEN_FLAG, HUB_FIX),
         example(engine={"extraArgs": ["--hf_token=hf_plain"]}), cel=("hub-token-not-in-extra-args",)),
    Rule(not_in_env("hub_token", "hub token", (HUB_TOKEN_ENV, "HUGGING_FACE_HUB_TOKEN"), HUB_FIX),
         example(engine={"env": [{"name": "HUGGING_FACE_HUB_TOKEN", "value": "hf_plain"}]}),
         cel=("hub-token-not-in-env",)),
))

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

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.engine.args import API_KEY_ENV, API_KEY_FLAG, HUB_TOKEN_ENV, HUB_TOKEN_FLAG, normalize_flag

FIX = "put the key in a Secret and name it in spec.service.apiKeySecret (the pods then read it from there)"
HUB_TOKEN_ENVS = (HUB_TOKEN_ENV, "HUGGING_FACE_HUB_TOKEN")
HUB_FIX = ("put the token in a Secret and name it in spec.model.source.hub.tokenSecret, or "
           "spec.model.source.cache.hub.tokenSecret when the operator stages the weights")


def api_key_not_in_extra_args(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.extraArgs[{i}]",
                      f"{API_KEY_FLAG} would put the API key in plain text in the CR and its launcher ConfigMap: {FIX}")
            for i, arg in enumerate(c.spec.engine.extra_args) if normalize_flag(arg) == API_KEY_FLAG]


def api_key_not_in_env(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.env[{i}].name", f"{API_KEY_ENV} here would be the API key in plain text in the CR: "
                                                    f"{FIX}")
            for i, env in enumerate(c.spec.engine.env) if env.name == API_KEY_ENV]


def hub_token_not_in_extra_args(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.extraArgs[{i}]",
                      f"{HUB_TOKEN_FLAG} would put the hub token in plain text in the CR and its launcher ConfigMap: "
                      f"{HUB_FIX}")
            for i, arg in enumerate(c.spec.engine.extra_args) if normalize_flag(arg) == HUB_TOKEN_FLAG]


def hub_token_not_in_env(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.env[{i}].name", f"{env.name} here would be the hub token in plain text in the CR: "
                                                    f"{HUB_FIX}")
            for i, env in enumerate(c.spec.engine.env) if env.name in HUB_TOKEN_ENVS]


API_KEYS = Table("api_keys", (
    Rule(api_key_not_in_extra_args, example(engine={"extraArgs": ["--api_key=sk-plain"]}),
         cel=("api-key-not-in-extra-args",)),
    Rule(api_key_not_in_env, example(engine={"env": [{"name": "VLLM_API_KEY", "value": "sk-plain"}]}),
         cel=("api-key-not-in-env",)),
    Rule(hub_token_not_in_extra_args, example(engine={"extraArgs": ["--hf_token=hf_plain"]}),
         cel=("hub-token-not-in-extra-args",)),
    Rule(hub_token_not_in_env, example(engine={"env": [{"name": "HUGGING_FACE_HUB_TOKEN", "value": "hf_plain"}]}),
         cel=("hub-token-not-in-env",)),
))

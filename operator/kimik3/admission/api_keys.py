"""No API key in plain text: not in ``extraArgs`` (``--api-key``) nor in ``env`` (``VLLM_API_KEY``).

Written into the spec the key would sit in the CR and the launcher ConfigMap, readable by anyone
who may read those, and ``--api-key`` would silently override ``service.apiKeySecret`` (vLLM reads
``--api-key`` first, then ``VLLM_API_KEY``). The key belongs in a Secret named by
``spec.service.apiKeySecret``.
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.engine.args import API_KEY_ENV, API_KEY_FLAG, normalize_flag

FIX = "put the key in a Secret and name it in spec.service.apiKeySecret (the pods then read it from there)"


def api_key_not_in_extra_args(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.extraArgs[{i}]",
                      f"{API_KEY_FLAG} would put the API key in plain text in the CR and its launcher ConfigMap: {FIX}")
            for i, arg in enumerate(c.spec.engine.extra_args) if normalize_flag(arg) == API_KEY_FLAG]


def api_key_not_in_env(c: Candidate) -> list[SpecError]:
    return [SpecError(f"spec.engine.env[{i}].name", f"{API_KEY_ENV} here would be the API key in plain text in the CR: "
                                                    f"{FIX}")
            for i, env in enumerate(c.spec.engine.env) if env.name == API_KEY_ENV]


API_KEYS = Table("api_keys", (
    Rule(api_key_not_in_extra_args, example(engine={"extraArgs": ["--api_key=sk-plain"]}),
         cel=("api-key-not-in-extra-args",)),
    Rule(api_key_not_in_env, example(engine={"env": [{"name": "VLLM_API_KEY", "value": "sk-plain"}]}),
         cel=("api-key-not-in-env",)),
))

"""Greedy completions from one engine group's leader, as the canary analysis sends them.

``Completions.greedy(url, model, prompt, max_tokens)`` POSTs vLLM's OpenAI ``/v1/completions`` at
the leader's address (``leader_url``: the pod-scrape resolver's ``/metrics`` URL without its
path, so on a cluster the leader pod's IP and the rendered port) with ``temperature: 0``,
``return_token_ids: true`` (vLLM's extension since 0.10.2: the choice carries the output's
``token_ids``) and ``logprobs: 0`` (the choice's ``logprobs.tokens``: each output token's text),
and returns the output's token ids and texts. The requests are the operator's own: they carry no
API key (with ``spec.service.apiKeySecret`` the engines refuse them, ``CompletionFailed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

REQUEST_TIMEOUT_S = 30.0
"""Bound on one request, seconds: a short greedy completion takes well under a second on a
serving group; a group that takes longer is not one to judge parity on."""


class CompletionFailed(Exception):
    """The leader did not answer a completion with token ids (the message says what it did)."""


@dataclass(frozen=True)
class Completion:
    """One greedy output."""

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...] | None
    """Each token's text (``logprobs.tokens``), None when the engine sent none."""


def leader_url(metrics_url: str) -> str:
    """The base URL of a leader's API from its ``/metrics`` URL (``canary.ScrapeURL``)."""
    return metrics_url.removesuffix("/metrics")


class Completions:
    """Greedy completions over one ``requests.Session`` (thread-safe for concurrent posts)."""

    def __init__(self, session: requests.Session | None = None, timeout_s: float = REQUEST_TIMEOUT_S):
        self.session = session or requests.Session()
        self.timeout_s = timeout_s

    def greedy(self, url: str, model: str, prompt: str, max_tokens: int) -> Completion:
        """The greedy output of ``prompt`` (``max_tokens`` tokens) from the engine at ``url``.
        Raises ``CompletionFailed`` naming the URL and what went wrong."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "return_token_ids": True, "logprobs": 0}
        try:
            resp = self.session.post(f"{url}/v1/completions", json=body, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise CompletionFailed(f"POST {url}/v1/completions: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise CompletionFailed(f"POST {url}/v1/completions: HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            choice: dict[str, Any] = resp.json()["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise CompletionFailed(f"POST {url}/v1/completions: not a completion: {resp.text[:200]}") from None
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise CompletionFailed(f"POST {url}/v1/completions: no token_ids in the answer (the engine does not "
                                   "honour return_token_ids: vLLM 0.10.2 or later does)")
        tokens = (choice.get("logprobs") or {}).get("tokens")
        return Completion(tuple(int(i) for i in ids),
                          tuple(str(t) for t in tokens) if isinstance(tokens, list) and len(tokens) == len(ids)
                          else None)


Greedy = Callable[[str, str, str, int], Completion]
"""``Completions.greedy``'s shape: (url, model, prompt, max_tokens) -> Completion."""

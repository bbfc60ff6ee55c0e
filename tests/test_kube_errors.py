"""``kimik3.controller.kube``'s errors: one family built from the API server's answer (its
Kubernetes ``Status`` body when there is one), a subclass per refusal the code tells apart."""

from __future__ import annotations

import json

from kimik3.controller.kube import ApiError, Conflict, Forbidden, Invalid, NotFound, api_error


def status(code: int, reason: str, message: str, **details: object) -> str:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": code,
                       "reason": reason, "message": message, "details": details})


def test_each_refusal_has_its_class_and_the_status_message() -> None:
    missing = api_error(404, "Not Found", status(404, "NotFound", 'pods "x" not found', name="x", kind="pods"))
    assert isinstance(missing, NotFound) and missing.is_status
    assert (missing.status, missing.reason, missing.message) == (404, "Not Found", 'pods "x" not found')
    assert str(missing) == '404 Not Found: pods "x" not found'
    assert missing.payload is not None and missing.payload["details"] == {"name": "x", "kind": "pods"}
    for code, cls in ((403, Forbidden), (409, Conflict), (422, Invalid)):
        assert type(api_error(code, "", status(code, "", "no"))) is cls
    other = api_error(500, "Internal Server Error", status(500, "InternalError", "etcd timed out"))
    assert type(other) is ApiError and other.message == "etcd timed out"


def test_an_answer_that_is_no_status_keeps_its_text() -> None:
    """``404 page not found``: no API serves the path (a kind whose CRD is not installed)."""
    unserved = api_error(404, "Not Found", "404 page not found\n")
    assert isinstance(unserved, NotFound) and not unserved.is_status and unserved.payload is None
    assert unserved.message == "404 page not found\n" == unserved.body
    assert api_error(502, "Bad Gateway", "x" * 5000).message == "x" * 1000
    assert api_error(409, "Conflict", json.dumps({"kind": "Pod"})).message == '{"kind": "Pod"}'  # not a Status

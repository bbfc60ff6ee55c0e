"""Times as the Kubernetes API writes them: RFC 3339 in UTC, formatted and parsed here only.

``metav1.Time`` (``creationTimestamp``, a condition's ``lastTransitionTime``, a core/v1 Event's
``firstTimestamp``, every time the operator writes into a status) has whole seconds and ``Z``;
``metav1.MicroTime`` (a Lease's ``renewTime``, an events.k8s.io ``eventTime``) six fractional
digits. ``parse_rfc3339`` reads both, and any offset.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["MICRO_TIME_FORMAT", "TIME_FORMAT", "parse_rfc3339", "rfc3339", "rfc3339_seconds"]

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""``metav1.Time``: RFC 3339 in UTC, whole seconds."""
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""``metav1.MicroTime``: RFC 3339 in UTC, microseconds."""


def rfc3339(at: dt.datetime | float | None = None, *, micro: bool = False) -> str:
    """``at`` in RFC 3339, UTC: a datetime (one without a time zone is taken as UTC), Unix
    seconds, or None for now. Whole seconds (cut, as ``metav1.Time``), or with ``micro``
    microseconds (``metav1.MicroTime``)."""
    if at is None:
        moment = dt.datetime.now(dt.timezone.utc)
    elif isinstance(at, dt.datetime):
        moment = at.astimezone(dt.timezone.utc) if at.tzinfo is not None else at
    else:
        moment = dt.datetime.fromtimestamp(at, dt.timezone.utc)
    return moment.strftime(MICRO_TIME_FORMAT if micro else TIME_FORMAT)


def parse_rfc3339(value: str | None) -> dt.datetime | None:
    """An RFC 3339 time (``Z`` or an offset, any fractional digits) as a datetime in UTC; one
    without a time zone is taken as UTC. None for None or "". ValueError for anything else."""
    if not value:
        return None
    at = dt.datetime.fromisoformat(value)
    return at.replace(tzinfo=dt.timezone.utc) if at.tzinfo is None else at.astimezone(dt.timezone.utc)


def rfc3339_seconds(value: str | None) -> float | None:
    """``parse_rfc3339`` as Unix seconds."""
    at = parse_rfc3339(value)
    return None if at is None else at.timestamp()

"""Unit check of the F6 fix: a re-listed owner's applied records are dropped, so a child deleted
while the watch was down (no DELETED event ever arrives) is applied again instead of skipped."""

from kimik3.controller.cache import ObjectCache, desired_hash


def child(rv: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "k3", "namespace": "ns", "resourceVersion": rv,
                         "ownerReferences": [{"kind": "KimiK3Deployment", "name": "k3"}]}}


def test_relisted_owner_children_are_applied_again():
    cache = ObjectCache()
    desired = child("")
    digest = desired_hash(desired)
    cache.record_apply(child("10"), digest)
    assert cache.unchanged(desired, digest)  # skipped while nothing changed
    # The Service is deleted during a cut; the re-list after the 410 brings no DELETED event.
    cache.forget_applied("ns", "other")
    assert cache.unchanged(desired, digest)  # another owner's re-list changes nothing
    cache.forget_applied("ns", "k3")
    assert not cache.unchanged(desired, digest)

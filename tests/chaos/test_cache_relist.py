"""Unit check of the F6 fix: a re-listed owner's applied records are dropped, so a child deleted
while the watch was down (no DELETED event ever arrives) is applied again instead of skipped."""

import pytest

from kimik3.controller.cache import ObjectCache, desired_hash

pytestmark = pytest.mark.tier("unit")  # no control plane here, though in tests/chaos


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


def pod(name: str, rv: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv),
                         "labels": {"leaderworkerset.sigs.k8s.io/name": "k3-engine",
                                    "inference.kimik3.io/deployment": "k3"}}}


def names(cache: ObjectCache) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cache.pods("ns", "k3"))


def test_pods_deleted_while_the_watch_was_down_are_dropped_after_a_relist():
    cache = ObjectCache()
    for name, rv in (("k3-engine-0", 5), ("k3-engine-0-1", 6), ("k3-engine-1", 7)):
        cache.update("ADDED", pod(name, rv))
    assert not cache.pods_stale("ns", "k3")
    # Cut: k3-engine-1 is deleted, no DELETED event arrives; the CR is re-listed afterwards.
    cache.forget_applied("ns", "k3")
    assert cache.pods_stale("ns", "k3")
    # A watch event newer than the list (a pod created after it) must survive the replace.
    cache.update("ADDED", pod("k3-engine-2", 30))
    cache.replace_pods("ns", "k3", [pod("k3-engine-0", 5), pod("k3-engine-0-1", 9)], list_version=20)
    assert names(cache) == ["k3-engine-0", "k3-engine-0-1", "k3-engine-2"]
    assert next(p for p in cache.pods("ns", "k3")
                if p["metadata"]["name"] == "k3-engine-0-1")["metadata"]["resourceVersion"] == "9"
    assert not cache.pods_stale("ns", "k3")


def test_a_pod_deleted_after_the_list_is_not_brought_back():
    cache = ObjectCache()
    cache.update("ADDED", pod("k3-engine-0", 5))
    cache.forget_applied("ns", "k3")
    listed = [pod("k3-engine-0", 5)]  # the list is taken, then the DELETED event arrives first
    cache.update("DELETED", pod("k3-engine-0", 12))
    cache.replace_pods("ns", "k3", listed, list_version=10)
    assert names(cache) == []

"""The compile cache (``spec.engine.compileCache``): one claim per namespace, engine image and
group plan, mounted where vLLM 0.33 writes what it compiles (``VLLM_CACHE_ROOT`` and the FlashInfer
autotune folder, read in its source: kimik3.engine.args.compile_cache_env)."""

from __future__ import annotations

from kimik3.admission import admit
from kimik3.engine.args import engine_env
from kimik3.render.compilecache import claim_name, compile_cache_claim
from support.recipes import recipe
from support.rendering import by_kind, render_cr

CACHE = {"compileCache": {"size": "300Gi", "storageClassName": "fast-rwx"}}


def test_engines_mount_the_cache_where_vllm_writes_its_compiled_artifacts():
    cr = recipe(uid="u", engine=CACHE)
    admitted = admit(cr["spec"])
    name = claim_name(admitted)
    assert name is not None and name.startswith("kimik3-compile-") and len(name) == len("kimik3-compile-") + 12
    env = engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)
    assert (env["VLLM_CACHE_ROOT"], env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]) == (
        "/compile-cache", "/compile-cache/flashinfer_autotune")
    lws = by_kind(render_cr(cr, compute_domains=False).objects, "LeaderWorkerSet")
    for key in ("leaderTemplate", "workerTemplate"):  # every rank compiles its own part
        pod = lws["spec"]["leaderWorkerTemplate"][key]["spec"]
        assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": name}} in pod["volumes"]
        assert {"name": "compile-cache", "mountPath": "/compile-cache"} in pod["containers"][0]["volumeMounts"]
    pvc = compile_cache_claim(admitted, "tenant-a")
    assert pvc["metadata"]["namespace"] == "tenant-a" and "ownerReferences" not in pvc["metadata"]
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "300Gi"}},
                           "storageClassName": "fast-rwx"}


def test_the_key_is_the_engine_image_and_the_group_plan():
    base = claim_name(admit(recipe(engine=CACHE)["spec"]))
    assert claim_name(admit(recipe(name="other", engine=CACHE)["spec"])) == base  # same engine: shared
    assert claim_name(admit(recipe(engine={**CACHE, "image": "vllm/vllm-openai:v0.33.1"})["spec"])) != base
    assert claim_name(admit(recipe(engine={**CACHE, "maxNumSeqs": 128})["spec"])) != base
    assert claim_name(admit(recipe(engine=CACHE, topology={"tensorParallelSize": 16})["spec"])) != base


def test_no_cache_no_claim_and_no_cache_env():
    admitted = admit(recipe()["spec"])
    assert claim_name(admitted) is None
    assert "VLLM_CACHE_ROOT" not in engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)

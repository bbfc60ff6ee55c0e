"""The weight stager (``kimik3.staging``) with the real huggingface_hub client against the fake hub.

The hub is ``kimik3_dev.hub.FakeHub`` on 127.0.0.1 (the one fake: it answers the endpoints
huggingface_hub 2.4.0 calls, with the hub's headers), serving a tiny checkpoint made here. The
checks: only the files vLLM loads are downloaded; every file is verified against the hub's
sha256 / git blob id; progress rises to the total; a connection cut mid-file is resumed with a
Range request; a killed run resumes from its partial file; a 500 and a missing revision end with
the hub's error quoted; a staged folder is not downloaded again; a corrupt file is caught.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kimik3.cli import main
from kimik3.engine.weights import MANIFEST, Artifact
from kimik3.staging.files import loaded
from kimik3.staging.progress import Progress
from kimik3.staging.stager import StagingError, stage
from kimik3_dev.hub.checkpoint import NOT_LOADED, write_checkpoint
from kimik3_dev.hub.server import FakeHub, Fault

TARGET = Artifact("target", "moonshotai/Kimi-K3", "main")
CHUNK = 10 * 1024 * 1024
"""huggingface_hub's DOWNLOAD_CHUNK_SIZE: a partial file grows by whole chunks."""


@pytest.fixture
def hub(tmp_path):
    hub = FakeHub()
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def checkpoint(tmp_path) -> tuple[Path, dict[str, int]]:
    src = tmp_path / "src"
    return src, write_checkpoint(src, shards=2, shard_bytes=24 << 20)


def test_stages_only_what_vllm_loads_verified_with_rising_progress(hub, checkpoint, tmp_path):
    src, files = checkpoint
    commit = hub.add(TARGET.repo_id, src)
    reports: list[Progress] = []
    done = stage(TARGET, tmp_path / "cache", endpoint=hub.url, max_workers=4, report=reports.append,
                 report_interval_s=0.02)
    folder = tmp_path / "cache/moonshotai/Kimi-K3/main"
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert on_disk == set(files) | {MANIFEST}
    assert not any(loaded(n) for n in NOT_LOADED) and not set(NOT_LOADED) & on_disk
    assert (done.phase, done.commit, done.bytes_total, done.files_done) == ("complete", commit, sum(files.values()),
                                                                           len(files))
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["commit"] == commit and manifest["bytes"] == sum(files.values())
    by_path = {f["path"]: f for f in manifest["files"]}
    shard = "model-00001-of-00002.safetensors"
    assert by_path[shard] == {"path": shard, "size": files[shard],
                              "sha256": hashlib.sha256((src / shard).read_bytes()).hexdigest()}
    config = (src / "config.json").read_bytes()
    assert by_path["config.json"]["gitBlobSha1"] == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    phases = [r.phase for r in reports]
    assert phases[0] == "resolving" and phases[-2:] == ["verifying", "complete"]
    downloading = [r.bytes_done for r in reports if r.phase == "downloading"]
    assert downloading == sorted(downloading) and downloading[-1] == sum(files.values())
    assert all(r.bytes_total == sum(files.values()) for r in reports[1:])
    # pinned: every file request names the commit, not the branch
    assert {p.split("/")[4] for m, p, _ in hub.requests if "/resolve/" in p} == {commit}


def test_a_connection_cut_mid_file_is_resumed_with_a_range_request(hub, checkpoint, tmp_path):
    src, files = checkpoint
    hub.add(TARGET.repo_id, src)
    hub.fault(Fault("/lfs/", cut_at=CHUNK + (1 << 20)))
    done = stage(TARGET, tmp_path / "cache", endpoint=hub.url, max_workers=1)
    assert done.phase == "complete"
    assert ("GET", f"/lfs/{hashlib.sha256((src / 'model-00001-of-00002.safetensors').read_bytes()).hexdigest()}",
            f"bytes={CHUNK}-") in hub.requests


def test_a_killed_run_keeps_its_complete_files_and_fetches_only_the_rest(hub, checkpoint, tmp_path):
    """huggingface_hub 2.4.0 resumes a file by Range within a run only: each download goes to a
    process-unique temporary file that a failed run removes (its PR #4228). So a killed stager
    restarts the files it was downloading; every file it finished is kept and not fetched again."""
    src, files = checkpoint
    hub.add(TARGET.repo_id, src)
    first, second = (hashlib.sha256((src / f"model-0000{i}-of-00002.safetensors").read_bytes()).hexdigest()
                     for i in (1, 2))
    hub.fault(Fault(f"/lfs/{second}", cut_at=CHUNK + 1, times=100))  # no attempt gets past it: the run gives up
    with pytest.raises(StagingError, match="peer closed connection"):
        stage(TARGET, tmp_path / "cache", endpoint=hub.url, max_workers=1)
    assert (tmp_path / "cache/moonshotai/Kimi-K3/main/model-00001-of-00002.safetensors").is_file()
    hub.faults.clear()
    hub.requests.clear()
    assert stage(TARGET, tmp_path / "cache", endpoint=hub.url, max_workers=1).phase == "complete"
    fetched = {p for _, p, _ in hub.requests if p.startswith("/lfs/")}
    assert fetched == {f"/lfs/{second}"}


@pytest.mark.parametrize("fault,revision,message", [
    (Fault("/api/", status=500), "main", "500 Internal Server Error"),
    (None, "no-such-branch", "RevisionNotFoundError"),
])
def test_hub_errors_are_reported_quoted(hub, checkpoint, tmp_path, fault, revision, message):
    src, _ = checkpoint
    hub.add(TARGET.repo_id, src)
    if fault:
        hub.fault(fault)
    reports: list[Progress] = []
    with pytest.raises(StagingError, match=message):
        stage(Artifact("target", TARGET.repo_id, revision), tmp_path / "cache", endpoint=hub.url, report=reports.append)
    assert reports[-1].phase == "failed" and message in (reports[-1].error or "")
    if revision != "main":
        assert "Invalid rev id: no-such-branch" in (reports[-1].error or "")


def test_a_staged_folder_is_not_downloaded_again(hub, checkpoint, tmp_path):
    src, _ = checkpoint
    hub.add(TARGET.repo_id, src)
    stage(TARGET, tmp_path / "cache", endpoint=hub.url)
    hub.requests.clear()
    assert stage(TARGET, tmp_path / "cache", endpoint=hub.url).phase == "complete"
    assert [p for _, p, _ in hub.requests] == ["/api/models/moonshotai/Kimi-K3/revision/main"]


def test_a_file_that_does_not_match_the_hubs_hash_is_refused_and_removed(hub, checkpoint, tmp_path):
    src, _ = checkpoint
    hub.add(TARGET.repo_id, src)
    shard = src / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the bytes served no longer hash to what the hub's metadata says
    shard.write_bytes(bytes(data))
    with pytest.raises(StagingError, match="verification failed: model-00002-of-00002.safetensors: sha256"):
        stage(TARGET, tmp_path / "cache", endpoint=hub.url)
    folder = tmp_path / "cache/moonshotai/Kimi-K3/main"
    assert not (folder / shard.name).exists() and not (folder / MANIFEST).exists()


def test_kimik3_stage_runs_a_recipes_target_and_drafter_on_a_workstation(hub, checkpoint, tmp_path):
    src, files = checkpoint
    hub.add("moonshotai/Kimi-K3", src)
    drafter = tmp_path / "drafter"
    write_checkpoint(drafter, shards=1, shard_bytes=1 << 20, seed=1)
    hub.add("Inferact/Kimi-K3-DSpark", drafter, ref="v1")
    recipe = Path(__file__).resolve().parents[1] / "recipes/gb300-tp8-megakernel-dspark.yaml"
    text = recipe.read_text().replace("numSpeculativeTokens: 7", "numSpeculativeTokens: 7\n    draftRevision: v1")
    (tmp_path / "r.yaml").write_text(text)
    result = CliRunner().invoke(main, ["stage", "-f", str(tmp_path / "r.yaml"), "--to", str(tmp_path / "cache"),
                                       "--endpoint", hub.url, "--workers", "2"])
    assert result.exit_code == 0, result.output
    for folder in ("moonshotai/Kimi-K3/main", "Inferact/Kimi-K3-DSpark/v1"):
        assert json.loads((tmp_path / "cache" / folder / MANIFEST).read_text())["files"]
        assert f"{tmp_path / 'cache' / folder}: " in result.output

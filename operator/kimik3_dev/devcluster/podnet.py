"""Each dev cluster's pod network: a /16 of its own inside 127.0.0.0/8.

kwok hands pods their IPs from the cluster's network (its ``cidr`` option), and the engine
simulator serves each engine on its leader pod's IP and rendered port, as vLLM would
(``kimik3_dev.sim.supervisor``). Linux routes all of 127.0.0.0/8 to ``lo`` (the kernel's
``local 127.0.0.0/8 dev lo`` route), so any 127.a.b.c can be bound and connected to with no set-up,
and nothing but loopback is ever contacted.

Several dev clusters may run on one machine at once (the test session's, tests that start their
own, ``tools/kimik3 demo``), and their engines all listen on the same rendered port (e.g. 8000):
two live clusters must not share a network. ``claim(state_dir)`` takes the lowest ``127.N.0.0/16``
(N in 1..254: never 127.0.0.0/16, where 127.0.0.1 and the resolvers' 127.0.0.53 live, nor 127.255,
the broadcast's) that no live cluster holds. The claims are files in ``CLAIMS_DIR``, one per
network (``127.N.0.0-16``), holding the claiming state dir; a claim is live while a component of
that state dir runs (its pidfiles, ``processes.records``), so a cluster that crashed or was
killed without ``dev down`` leaves nothing to clean: its network is free again once its
processes are gone. The choice and the write happen under an exclusive ``flock`` of
``CLAIMS_DIR/.lock``, so two ``dev up`` at once cannot pick the same network. ``dev up`` claims
after the API server started (so a live claimant always has a running process) and ``dev down``
releases (``release``).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kimik3_dev.devcluster import processes

__all__ = ["CLAIMS_DIR", "NetworkExhausted", "claim", "release"]

CLAIMS_DIR = Path(tempfile.gettempdir()) / "kimik3-pod-networks"
"""Machine-wide folder of the claims (``$TMPDIR``, else /tmp)."""
SECOND_OCTETS = range(1, 255)
"""``127.N.0.0/16`` candidates (not 0: 127.0.0.1 lives there; not 255: 127.255.255.255 is the broadcast)."""


class NetworkExhausted(RuntimeError):
    """Every candidate /16 is held by a live dev cluster."""


def _file(octet: int) -> Path:
    return CLAIMS_DIR / f"127.{octet}.0.0-16"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLAIMS_DIR / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _holder(octet: int) -> Path | None:
    """The state dir whose live cluster holds ``127.<octet>.0.0/16``, else None."""
    try:
        owner = Path(_file(octet).read_text().strip())
    except OSError:
        return None
    return owner if any(r.alive for r in processes.records(owner)) else None


def claim(state_dir: Path) -> ipaddress.IPv4Network:
    """The pod network of the cluster in ``state_dir`` (its earlier claim, else the lowest free
    candidate), recorded in ``CLAIMS_DIR``. Raises ``NetworkExhausted`` naming the holders when
    254 live clusters hold them all."""
    state_dir = Path(state_dir).resolve()
    with _locked():
        holders = {n: _holder(n) for n in SECOND_OCTETS}
        mine = [n for n, h in holders.items() if h == state_dir]
        free = [n for n, h in holders.items() if h is None]
        if not mine and not free:
            raise NetworkExhausted(f"every 127.N.0.0/16 (N 1-254) is held by a live dev cluster (claims in "
                                   f"{CLAIMS_DIR}): run `kimik3 dev down` on one of them")
        octet = (mine or free)[0]
        _file(octet).write_text(f"{state_dir}\n")
    return ipaddress.IPv4Network(f"127.{octet}.0.0/16")


def release(state_dir: Path) -> None:
    """Drop every claim of ``state_dir`` (``dev down``)."""
    state_dir = Path(state_dir).resolve()
    with _locked():
        for octet in SECOND_OCTETS:
            path = _file(octet)
            with contextlib.suppress(OSError):
                if Path(path.read_text().strip()) == state_dir:
                    path.unlink()

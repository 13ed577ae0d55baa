"""A fleet for rolling updates: members whose model fits once in GPU memory, behind HAProxy.

Each member is a :class:`~tests.support.fleet.Fleet` member (a pooled Triton and a daemon on
the shared store) with a GPU stand-in of its own whose used memory follows what that member's
Triton has loaded of the model's slots (16 GiB, 9 GiB a release: it fits once), and HAProxy in
front of all of them, balancing each gRPC call and health-checking each daemon's ``/readyz``.
Tests and ``bench/rolling.py`` build it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.support.fleet import Fleet, Member
from tests.support.gpu_exporter import GIB, GpuExporter
from tests.support.grpc_load import LoadClient
from tests.support.haproxy import HAProxy, RotationRecorder
from tests.support.haproxy import Member as Backend
from tests.support.models import write_scale_release, write_sha256sums

TOTAL = 16 * GIB
PER_RELEASE = 9 * GIB
GPU = "GPU-0"  # the stand-in's one GPU: memory that follows Triton, and utilisation
HEALTHY = 0.30  # its utilisation until a test overloads it
UNREADY_SECONDS = 1.5  # HAProxy notices within 0.3 s (inter 300ms fall 1): room to spare


def write_big_release(
    store: Path, model: str, release: str, *, k: float, hint: int = PER_RELEASE, **knobs: Any
) -> Path:
    """A scale release (answers ``k`` x; ``knobs`` as :func:`write_scale_release` takes them)
    that says it needs ``hint`` bytes of GPU memory (9 GiB: it fits once in 16) and leaves its
    instance kind to Triton (KIND_AUTO: the GPU figures apply; Triton here loads it on CPU)."""
    release_dir = write_scale_release(store, model, release, k=k, **knobs)
    config = release_dir / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace(
        "instance_group [ { kind: KIND_CPU count: 1 } ]", "instance_group [ { count: 1 } ]"
    )
    hinted = f'key: "controlplane.memory_hint_bytes" value {{ string_value: "{hint}" }}'
    config.write_text(text + f"parameters {{ {hinted} }}\n", encoding="utf-8")
    (release_dir / "SHA256SUMS").unlink()
    write_sha256sums(release_dir)
    return release_dir


def rolling_env(exporter: GpuExporter, **more: str) -> dict[str, str]:
    """The environment of a member that reads its GPU from ``exporter``: its memory for the
    headroom and rolling checks, its utilisation for the overload watcher."""
    return {
        "CONTROLPLANE_MEMORY__GPU_METRICS_URL": exporter.url,
        "CONTROLPLANE_ROLLBACK__METRICS_URL": exporter.url,
        "CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__UNREADY_SECONDS": str(UNREADY_SECONDS),
        "CONTROLPLANE_MODEL_DEFAULTS__DRAIN_TIMEOUT_SECONDS": "10",
        "CONTROLPLANE_MEMORY__RETURN_SECONDS": "20",
        **more,
    }


@dataclass(frozen=True)
class Watch:
    """What a test watches during a rollout: clients calling the model through HAProxy, and
    HAProxy's view of who is out of rotation."""

    rotation: RotationRecorder
    load: LoadClient

    def assert_each_left_once(self, members: Iterable[str]) -> None:
        """No call failed, never more than one member out of rotation at once, and each of
        ``members`` left rotation exactly once. Stops the clients."""
        summary = self.load.stop()
        assert summary.failures == (), summary.failures[:5]
        assert self.rotation.max_out_at_once == 1, self.rotation.timeline
        for name in members:
            assert self.rotation.left_rotation(name) == 1, (name, self.rotation.timeline)


@dataclass
class RollingFleet:
    fleet: Fleet
    haproxy: HAProxy
    exporters: dict[str, GpuExporter] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # every member's, beyond its GPU's

    @property
    def model(self) -> str:
        return self.fleet.model

    @property
    def members(self) -> list[Member]:
        return self.fleet.members

    def restart(self, member: Member, *, wait_ready: bool = False) -> None:
        """``member``'s daemon started again (after a kill), on its own GPU stand-in and its
        port (where HAProxy checks it), as its pod's sidecar would be."""
        env = rolling_env(self.exporters[member.name], **self.env)
        port = urlsplit(member.api.url).port
        self.fleet.start(member, wait_ready=wait_ready, extra_env=env, port=port)

    @contextmanager
    def watched(self) -> Iterator[Watch]:
        """Clients call the model through HAProxy (answering already when the block starts)
        and HAProxy's rotation is recorded, until the block ends."""
        with (
            RotationRecorder(self.haproxy) as rotation,
            LoadClient(self.haproxy.frontend_url, self.model, pause=0.01) as load,
        ):
            load.wait_for_answers(20)
            yield Watch(rotation, load)

    def start_deploy(self, via: Member, release: str) -> None:
        """A deploy through ``via`` that does not wait (202)."""
        with via.api.client() as client:
            started = client.post(
                f"/v1/models/{self.model}/deploy", json={"release": release, "wait": False}
            )
        assert started.status_code == 202, started.text

    def deploy(self, via: Member, release: str, **body: Any) -> httpx.Response:
        """A deploy through ``via`` that waits for every member (``"fleet": true``)."""
        with via.api.client() as client:
            return client.post(
                f"/v1/models/{self.model}/deploy",
                json={"release": release, "wait": True, "fleet": True, **body},
            )


def _slots_of(model: str) -> Callable[[str], bool]:
    """Counts the model's slots (``<model>__blue``, ...): not its alias, nor other tests'."""
    return lambda name: name.startswith(f"{model}__")


@contextmanager
def rolling_fleet(fleet: Fleet, workdir: Path, size: int, **env: str) -> Iterator[RollingFleet]:
    """``size`` members of ``fleet``, each with its GPU stand-in, behind a started HAProxy."""
    with ExitStack() as stack:
        exporters: dict[str, GpuExporter] = {}
        for _ in range(size):
            exporter = stack.enter_context(GpuExporter())
            exporter.set(**{GPU: HEALTHY})
            member = fleet.add(extra_env=rolling_env(exporter, **env))
            exporter.follow(
                member.triton.http_url,
                total_bytes=TOTAL,
                per_model_bytes=PER_RELEASE,
                counts=_slots_of(fleet.model),
                gpu=GPU,
            )
            exporters[member.name] = exporter
        backends = [
            Backend(m.name, m.triton.grpc_url, urlsplit(m.api.url).port or 0) for m in fleet.members
        ]
        haproxy = stack.enter_context(HAProxy(workdir / "haproxy", backends))
        yield RollingFleet(fleet, haproxy, exporters, dict(env))

"""Read-outs of a service under test: what a user would inspect after an operation."""

from __future__ import annotations

from controlplane.domain.slots import Slot
from controlplane.ports import ModelRecord
from tests.support.fakes import Parts
from tests.support.models import write_scale_release

MODEL = "scale"


def publish(parts: Parts, *releases: str, model: str = MODEL) -> None:
    """Publish releases whose model multiplies by the release number (r2 -> k=2.0)."""
    for release in releases:
        write_scale_release(parts.store_path, model, release, k=float(release.lstrip("r")))


async def record(parts: Parts, model: str = MODEL) -> ModelRecord:
    found = await parts.repos.serving.get(model)
    assert found is not None, f"no record for {model}"
    return found


async def slot(parts: Parts, model: str = MODEL) -> Slot:
    (only,) = (await record(parts, model)).slots
    return only


def marker_release(parts: Parts, model: str = MODEL) -> str | None:
    marker = parts.staging.read_marker(model)
    return None if marker is None else marker.release

"""The SHA256SUMS a store holds for a release, as a deploy reads it: its marker files'
bytes, parsed (None when the release has none yet)."""

from __future__ import annotations

from controlplane.domain.checksums import decode_manifest
from controlplane.ports import ModelStore


def manifest_of(store: ModelStore, model: str, release: str) -> dict[str, str] | None:
    data = store.read_marker_files(model, release).manifest
    return None if data is None else decode_manifest(data, f"{model}/{release}")

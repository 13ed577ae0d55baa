"""Small files that must not be big are read whole, never past one byte over their bound, and
with a buffer the size of the file, not of the bound."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from controlplane.adapters.stores.markers import read_at_most


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 5000])
def test_a_file_is_read_whole_up_to_one_byte_past_the_bound(tmp_path: Path, size: int) -> None:
    path = tmp_path / "SHA256SUMS"
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))

    with path.open("rb") as stream:
        data = read_at_most(stream, 100)

    assert data == path.read_bytes()[:101]


def test_a_file_that_grew_since_its_stat_is_read_on_to_the_bound(tmp_path: Path) -> None:
    """A pipe's size is 0 whatever it holds: what a file that grew after its stat looks like."""
    reader, writer = os.pipe()
    payload = b"0123456789" * 30

    def feed() -> None:
        os.write(writer, payload)
        os.close(writer)

    feeding = threading.Thread(target=feed)
    feeding.start()
    try:
        with os.fdopen(reader, "rb") as stream:
            short = read_at_most(stream, 1000)
    finally:
        feeding.join()

    assert short == payload
    reader, writer = os.pipe()
    os.write(writer, payload)
    os.close(writer)
    with os.fdopen(reader, "rb") as stream:
        capped = read_at_most(stream, 100)
    assert capped == payload[:101]

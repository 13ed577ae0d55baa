"""Unit-test guard: any attempt to open an AF_INET/AF_INET6 connection fails loudly.

Unit tests run without Triton, S3 or the network. A test that reaches for one by mistake
should fail at once with a clear message, not hang on a timeout or pass by luck because
something happened to be listening. Unix sockets stay allowed. This is a guard, not a fake:
nothing is answered on the network's behalf.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import settings

from tests.support.filesystems import other_filesystem  # noqa: F401  (a fixture)

_INET = (socket.AF_INET, socket.AF_INET6)

# Property tests judge behaviour, not speed: Hypothesis's 200 ms deadline per example failed a
# run on a busy 2-core host (372 ms for a first call), so there is none.
settings.register_profile("controlplane", deadline=None)
settings.load_profile("controlplane")


def _refuse(original: Any) -> Any:
    def guarded(self: socket.socket, address: Any, /) -> Any:
        if self.family in _INET:
            # Closed here because callers such as socket.create_connection only clean up
            # after OSError; otherwise a ResourceWarning would hide this message.
            self.close()
            raise RuntimeError(
                f"unit tests must not touch the network: connect to {address!r} was attempted; "
                "use a fake through the Protocol, or move the test to tests/integration"
            )
        return original(self, address)

    return guarded


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _refuse(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse(socket.socket.connect_ex))

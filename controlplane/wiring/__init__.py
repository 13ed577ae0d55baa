"""The one place where concrete adapters are built from settings and handed to services.

``startup`` checks the filesystem and locks the state before anything else; ``sources`` builds
the adapters whose kind the settings choose (the store, the fleet's records, the utilisation
source); ``parts`` builds each subsystem around them, and ``graph`` puts the subsystems
together into the :class:`Container` the API holds (``container``). Everything the rest of
the project uses is imported from here.
"""

from __future__ import annotations

from controlplane.wiring.container import Container
from controlplane.wiring.graph import build
from controlplane.wiring.sources import build_records, build_store, build_utilization_source
from controlplane.wiring.startup import check_filesystem, check_keyring, claim_state

__all__ = [
    "Container",
    "build",
    "build_records",
    "build_store",
    "build_utilization_source",
    "check_filesystem",
    "check_keyring",
    "claim_state",
]

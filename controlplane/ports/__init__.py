"""The seams between the use cases and the world, as Protocols.

Services depend on these and nothing else; ``wiring`` hands them concrete adapters. Tests
hand them fakes that implement the same Protocols (no patching). Blocking ports (store,
staging, state) are called from worker threads by the services; the Triton port is async.

One module per seam, each standard library and domain only (``.importlinter`` checks it), and
every name importable from here (``from controlplane.ports import ModelStore``)::

    store        ModelStore, what it lists and fetches, its change events, the keyring
    staging      Staging (temp dirs, the content cache, placement), ModelConfigEditor
    triton       Triton, its metrics, memory and processes, the stress preflight's load
    persistence  one repository per aggregate: serving, operations, releases, rollbacks, ...
    telemetry    Telemetry, what the use cases report for /metrics
    fleet        DesiredStates (the fleet's records in the store), DesiredStateEvents, FleetPeers
    clock        Clock
"""

from controlplane.ports.clock import Clock
from controlplane.ports.fleet import DesiredStateEvents, DesiredStates, FleetPeers
from controlplane.ports.persistence import (
    AlertBook,
    MemoryBook,
    ModelRecord,
    OperationLog,
    ReleaseBook,
    RollbackBook,
    Serving,
    ServingRepo,
)
from controlplane.ports.staging import (
    CachedFiles,
    ModelConfigEditor,
    ModelSummary,
    Placement,
    ReleaseMarker,
    Staging,
)
from controlplane.ports.store import (
    ChangeEvents,
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ModelStore,
    ReleaseListing,
    SignatureVerifier,
    StoreChanges,
    StoredFile,
)
from controlplane.ports.telemetry import Telemetry
from controlplane.ports.triton import (
    GpuMemory,
    IndexEntry,
    InferenceLoad,
    MemoryFigures,
    MetricsSource,
    ResidueProbe,
    ShmSpace,
    Triton,
    TritonMemory,
    TritonProcesses,
    UtilizationSource,
)

__all__ = [
    "AlertBook",
    "CachedFiles",
    "ChangeEvents",
    "Clock",
    "DesiredStateEvents",
    "DesiredStates",
    "FetchProgress",
    "FetchedRelease",
    "FleetPeers",
    "GpuMemory",
    "IndexEntry",
    "InferenceLoad",
    "MarkerFiles",
    "MemoryBook",
    "MemoryFigures",
    "MetricsSource",
    "ModelConfigEditor",
    "ModelRecord",
    "ModelStore",
    "ModelSummary",
    "OperationLog",
    "Placement",
    "ReleaseBook",
    "ReleaseListing",
    "ReleaseMarker",
    "ResidueProbe",
    "RollbackBook",
    "Serving",
    "ServingRepo",
    "ShmSpace",
    "SignatureVerifier",
    "Staging",
    "StoreChanges",
    "StoredFile",
    "Telemetry",
    "Triton",
    "TritonMemory",
    "TritonProcesses",
    "UtilizationSource",
]

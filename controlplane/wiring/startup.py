"""The start-up checks that come before the object graph: the filesystem, the keyring of
publisher keys (a key the daemon cannot use is refused now, naming its file, not at the first
deploy) and the state lock.

``serve`` runs them before the app is built: placement must be one ``rename(2)``, so staging and
the repository have to share a filesystem, and only one daemon may own a repository, its
staging dir and its database (schema migration and start-up reconcile run in that one alone).
"""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.adapters.instance_lock import InstanceLock, places
from controlplane.adapters.keyring import Keyring
from controlplane.adapters.staging.fs import StagingArea
from controlplane.settings import Settings


def check_filesystem(settings: Settings) -> StagingArea:
    """Start-up check: refuse to run where placement could not be atomic."""
    staging = StagingArea(
        settings.repository.path,
        settings.staging_path,
        cache_max_bytes=settings.staging.cache_max_bytes,
        refuse_python_syntax_errors=settings.staging.refuse_python_syntax_errors,
    )
    staging.check()
    return staging


def check_keyring(settings: Settings) -> list[str]:
    """Start-up check: every PEM of ``store.keyring`` is a key the daemon can verify with
    (``KeyringError`` names the file that is not); the names of the trusted keys."""
    if settings.store.keyring is None:
        return []
    return Keyring(settings.store.keyring, now=lambda: datetime.now(UTC)).check()


def claim_state(settings: Settings) -> InstanceLock:
    """Lock the repository, staging dir and database for this daemon alone, before anything
    reads or writes them; raises ``InstanceLockError`` naming the daemon that holds them."""
    host = settings.api.host
    address = f"[{host}]" if ":" in host else host
    return InstanceLock.acquire(
        places(
            repository=settings.repository.path,
            staging=settings.staging_path,
            database=settings.database_path,
        ),
        api=f"http://{address}:{settings.api.port}",
    )

"""The fleet's seams: its desired state and heartbeats in the shared store, and waking peers.

The store's conditional writes are the only coordination (:meth:`DesiredStates.swap`); a wake
carries nothing, so a member that missed one converges at its next poll all the same.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from controlplane.domain.fleet import DesiredModel, MemberBeat
from controlplane.domain.refusals import Refusal


class DesiredStates(Protocol):
    """The fleet's desired state and its members' heartbeats, in the store the fleet shares
    (under ``_controlplane/``). Blocking: services call it from worker threads.

    Errors: :class:`StoreUnavailable` (retry later), :class:`StoreError` (refused, or a record
    that is not readable), :class:`DesiredStateConflict` from :meth:`swap`."""

    @property
    def where(self) -> str:
        """Where the records are, for messages (``s3://bucket/prefix/_controlplane``)."""
        ...

    def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        """The model's record; None when the fleet has none. A store that does not answer is
        tried again for a few seconds; ``patient``, for as long as a fetch is (as for
        :meth:`ModelStore.describe`)."""
        ...

    def read_all(self, named: Collection[str] = ()) -> dict[str, DesiredModel]:
        """Every model's record, by model. A record that cannot be read is left out (and
        kept for :meth:`unreadable`): a model the fleet cannot read is not acted on.
        ``named``: models an event said changed, read from the store whatever a cheaper
        summary of the records (an S3 store's generations index) says."""
        ...

    def unreadable(self) -> dict[str, Refusal]:
        """The records the last :meth:`read_all` and the last :meth:`beats` refused, by where
        each is: shown to operators, since no member acts on a model whose record cannot be
        read, and a member whose heartbeat cannot be read is not seen."""
        ...

    def swap(self, desired: DesiredModel) -> None:
        """Write ``desired`` if the stored record is still generation
        ``desired.generation - 1`` (absent, for generation 1); else
        :class:`DesiredStateConflict`, naming the record that won."""
        ...

    def beat(self, beat: MemberBeat) -> None:
        """Write this member's heartbeat (replacing its last one)."""
        ...

    def beats(self) -> dict[str, MemberBeat]:
        """Every member's last heartbeat, alive or not, by member."""
        ...

    def beat_of(self, member: str) -> MemberBeat | None:
        """One member's last heartbeat; None when it has none (or not one that can be read)."""
        ...

    def forget(self, member: str) -> None:
        """Delete a member's heartbeat (it left the fleet for good)."""
        ...


class DesiredStateEvents(Protocol):
    """The store's announcements of changes of the desired state, heard by this member alone
    (its own queue on the bucket's topic): while they are heard throughout, the desired state
    need not be read to know that it did not change."""

    def vouch(self) -> int | None:
        """A token that stays the same for as long as every change announced since it was
        given has been (or will be) passed on (a poke of the fleet sync); None when nothing
        can be vouched for now (the queue not reached yet, or unreachable)."""
        ...


class FleetPeers(Protocol):
    """The other members' APIs, to wake them after this member changed the desired state. A
    wake carries nothing: a woken member reads the store, as at its next poll."""

    async def wake(self, urls: Sequence[str]) -> dict[str, str | None]:
        """Wake each member at ``urls`` (at once, each bounded by a short timeout); by URL,
        None when it answered, else why not."""
        ...

"""The fleet's records this member refuses, as of its last look: said, and said again.

The fleet sync reads every record each pass; what it cannot act on is refused for its model
or member alone (:mod:`controlplane.domain.refusals`): the records the store gives that cannot
be read (the adapters say which), a desired state whose generation went back
(:mod:`controlplane.domain.generations`), and one whose release for this member the store does
not hold or is not signed as required (its deploy said so; tried again only when the record
changes). :class:`SyncRefusals` keeps all three for the sync, and :class:`RefusedRecords` says
them.

Every member reads every record every poll interval, so a refused record (a hand edit gone
wrong, a copy, a backup put back, a release the store does not hold) would be a log line per
poll, and one logged once is lost from view the next hour. So each refused record is logged
when it is first refused, again when why changes, and again once a minute while it stays
refused; once it is fixed (or gone), one line says so. What is refused now is kept for status
(``/healthz``), and counted by kind and reason.

A refused desired state is an error (no member acts on its model until it is fixed); a refused
heartbeat a warning (it hides one member until its next beat).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.fleet import DesiredModel
from controlplane.domain.generations import Generations
from controlplane.domain.refusals import RecordKind, Refusal, RefusalReason
from controlplane.ports import Clock

log = logging.getLogger(__name__)
SAY_AGAIN = 60.0  # s between two log lines about one record that stays refused


class RefusedRecords:
    """What is refused now, by where the record is. Used from the event loop only."""

    def __init__(self, clock: Clock, *, say_again: float = SAY_AGAIN) -> None:
        self._clock = clock
        self._say_again = say_again
        self.now: dict[str, Refusal] = {}
        self._said: dict[str, tuple[Refusal, float]] = {}  # where -> what was said, and when

    def update(self, found: Mapping[str, Refusal]) -> None:
        """The refusals as of this look: each new or changed one is logged, each that stays
        refused once a minute, each that is no longer refused once."""
        now = self._clock.monotonic()
        for where, refusal in sorted(found.items()):
            said = self._said.get(where)
            if said is not None and said[0] == refusal and now - said[1] < self._say_again:
                continue
            self._said[where] = (refusal, now)
            desired = refusal.kind is RecordKind.DESIRED
            log.log(
                logging.ERROR if desired else logging.WARNING,
                "refusing the fleet's record %s (%s%s): %s",
                where,
                refusal.reason.value,
                f" in {refusal.field}" if refusal.field else "",
                refusal.message,
                extra={"model" if desired else "member": refusal.name},
            )
        for where in sorted(set(self._said) - set(found)):
            refusal, _ = self._said.pop(where)
            log.info(
                "the fleet's record %s is no longer refused (it was: %s)",
                where,
                refusal.reason.value,
            )
        self.now = dict(found)

    def counts(self) -> dict[tuple[RecordKind, RefusalReason], int]:
        return count(self.now)


def refusal_json(where: str, refusal: Refusal) -> dict[str, object]:
    """A refused record as the API shows it: where it is, its kind, the model or member it is
    named for, why (a label, and in words) and the field at fault (None: the whole record)."""
    return {
        "record": where,
        "kind": refusal.kind.value,
        "name": refusal.name,
        "reason": refusal.reason.value,
        "field": refusal.field,
        "error": refusal.message,
    }


def count(refusals: Mapping[str, Refusal]) -> dict[tuple[RecordKind, RefusalReason], int]:
    """How many records are refused, by kind and reason."""
    return dict(Counter((r.kind, r.reason) for r in refusals.values()))


def release_refused(
    wanted: DesiredModel, target: str, reason: RefusalReason, error: str
) -> Refusal:
    """The refusal of a desired state whose release for this member (``target``) the store
    does not hold, or is not signed as this member requires (``error``: the deploy's)."""
    signed = "" if reason is RefusalReason.RELEASE_NOT_FOUND else ", signed,"
    return Refusal(
        RecordKind.DESIRED,
        wanted.model,
        reason,
        f"the desired state of {wanted.model} (generation {wanted.generation}, set by "
        f"{wanted.set_by}) wants {target} here, which this member refuses: {error}. It keeps "
        "serving what it has and looks again when the desired state changes: deploy a "
        f"release the store holds{signed} through any member",
        "release" if target == wanted.release else "rollout.stable",
    )


@dataclass(frozen=True)
class _RefusedRelease:
    target: str
    generation: int
    refusal: Refusal


class SyncRefusals:
    """What the fleet sync refuses of the records it reads, by model, as of its last pass."""

    def __init__(self, clock: Clock, *, where: str) -> None:
        self._where = where  # the fleet's records (DesiredStates.where)
        self.generations = Generations()  # the newest desired state read, by model
        self.book = RefusedRecords(clock)  # every record refused, said and counted
        self._behind: dict[str, Refusal] = {}  # records that went back, as of the last pass
        self._releases: dict[str, _RefusedRelease] = {}  # by model

    def screen(
        self, desired: Mapping[str, DesiredModel], unreadable: Mapping[str, Refusal]
    ) -> dict[str, DesiredModel]:
        """What to follow of ``desired`` as just read: each record that went back replaced by
        the newer one read before. ``unreadable``: the records the read refused (their models
        are not gone, so what was read of them before is kept)."""
        self._behind = self.behind(desired)
        for gone in set(self._releases) - set(desired):
            del self._releases[gone]
        refused = {r.name for r in unreadable.values() if r.kind is RecordKind.DESIRED}
        return self.generations.screen(desired, refused=refused)

    def behind(self, desired: Mapping[str, DesiredModel]) -> dict[str, Refusal]:
        """The records of ``desired`` that went back, by where each is."""
        return {
            self.where(model): Refusal(
                RecordKind.DESIRED, model, RefusalReason.GENERATION_WENT_BACK, why, "generation"
            )
            for model, why in self.generations.behind(desired).items()
        }

    def refuse_release(
        self, wanted: DesiredModel, target: str, reason: RefusalReason, error: str
    ) -> None:
        """``wanted`` asks this member for ``target``, which its deploy refused (``error``)."""
        refusal = release_refused(wanted, target, reason, error)
        self._releases[wanted.model] = _RefusedRelease(target, wanted.generation, refusal)

    def of_release(self, wanted: DesiredModel, target: str | None) -> Refusal | None:
        """The refusal of ``target`` as ``wanted`` asks for it, while the record is the one it
        was refused for; a record changed since is looked at anew."""
        refused = self._releases.get(wanted.model)
        if refused is None:
            return None
        if (refused.target, refused.generation) == (target, wanted.generation):
            return refused.refusal
        del self._releases[wanted.model]
        return None

    def served(self, model: str) -> None:
        """``model`` serves what the fleet wants here: nothing of it is refused any more."""
        self._releases.pop(model, None)

    def found(self) -> dict[str, Refusal]:
        """Records that went back and desired releases refused, by where each record is."""
        releases = {self.where(model): r.refusal for model, r in self._releases.items()}
        return {**releases, **self._behind}

    def say(self, unreadable: Mapping[str, Refusal]) -> None:
        """Log (once a minute each) and keep every record refused as of this pass."""
        self.book.update({**unreadable, **self.found()})

    def where(self, model: str) -> str:
        """Where ``model``'s desired state is, for a refusal."""
        return f"{self._where}/desired/{model}.json"

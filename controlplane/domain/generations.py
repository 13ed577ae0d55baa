"""A desired state whose generation went back is said, not followed.

Every write of a model's desired state is one generation after the one it replaced (a
compare-and-swap), so a member never reads a lower generation than one it has read, unless
the record was put back from elsewhere: a restored backup, a lagging replica of a bucket, a
copy edited by hand. Following it would move the whole fleet back to an old release without a
word. So each member remembers the newest record it has read of each model, and a record
below it is not followed: the member keeps the record it had and says what it found.

It is followed again once a person decides: a deploy, rollback or unload through the API or the
CLI writes the next generation over the record put back (counting from the record in the
store, so it may still be below the one remembered), set after the one remembered. What the
daemons write on their own over it (a turn, a rollout's step, the watcher's claim) carries the
record put back forward, and is not followed either. A model whose record is gone is
forgotten, so a record written afresh after a deletion starts again from generation 1; one
whose record is there but refused (a hand edit gone wrong) is not: its next readable record
is judged against the newest read before.

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from controlplane.domain.fleet import DesiredModel
from controlplane.domain.operations import Trigger

# The triggers of a person's (or CI's) decision: what follows a record put back.
DECIDED = frozenset({Trigger.API.value, Trigger.CLI.value})


def went_back(newest: DesiredModel, read: DesiredModel) -> bool:
    """Whether ``read`` is an older record put back over ``newest`` (read before)."""
    if read.generation >= newest.generation:
        return False
    return not (read.trigger in DECIDED and read.set_at > newest.set_at)


@dataclass
class Generations:
    seen: dict[str, DesiredModel] = field(default_factory=dict)  # the newest read, by model

    def screen(
        self, read: Mapping[str, DesiredModel], *, refused: Collection[str] = ()
    ) -> dict[str, DesiredModel]:
        """What to follow of ``read``: each record, or the newer one seen before it; the newest
        seen is remembered. ``refused``: models whose record is there but cannot be read (not
        forgotten: they are not gone)."""
        kept = dict(read)
        for model, wanted in read.items():
            last = self.seen.get(model)
            if last is not None and went_back(last, wanted):
                kept[model] = last
            else:
                self.seen[model] = wanted
        for gone in set(self.seen) - set(read) - set(refused):
            del self.seen[gone]
        return kept

    def behind(self, read: Mapping[str, DesiredModel]) -> dict[str, str]:
        """Why each record of ``read`` that went back is not followed, by model."""
        return {
            model: (
                f"the desired state of {model} went back from generation {last.generation} "
                f"({last.release or 'unloaded'}, set by {last.set_by}) to {wanted.generation} "
                f"({wanted.release or 'unloaded'}, set by {wanted.set_by} at "
                f"{wanted.set_at.isoformat()}): a restored backup or a lagging replica? Not "
                f"followed; this member keeps {last.release or 'it unloaded'}. Deploy the "
                "release the fleet should serve (API or CLI) to write a new generation"
            )
            for model, wanted in read.items()
            if (last := self.seen.get(model)) is not None and went_back(last, wanted)
        }

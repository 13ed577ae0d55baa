"""A desired state whose generation went back is said, not followed.

Every write of a model's desired state is one generation after the one it replaced (a
compare-and-swap), so a member never reads a lower generation than one it has read, unless
the record was put back from elsewhere: a restored backup, a lagging replica of a bucket, a
copy edited by hand. Following it would move the whole fleet back to an old release without a
word. So each member remembers the highest generation it has read of each model, and a record
below it is not followed: the member keeps the record it had and says what it found, until a
deploy writes a new generation over the old one (which counts from the record in the store,
so it is accepted). A model whose record is gone is forgotten, so a record written afresh
after a deletion starts again from generation 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane.domain.fleet import DesiredModel


@dataclass
class Generations:
    seen: dict[str, DesiredModel] = field(default_factory=dict)  # the newest read, by model

    def screen(self, read: Mapping[str, DesiredModel]) -> dict[str, DesiredModel]:
        """What to follow of ``read``: each record, or the newer one seen before it; the newest
        seen is remembered."""
        kept = dict(read)
        for model, wanted in read.items():
            last = self.seen.get(model)
            if last is not None and wanted.generation < last.generation:
                kept[model] = last
            else:
                self.seen[model] = wanted
        for gone in set(self.seen) - set(read):
            del self.seen[gone]
        return kept

    def behind(self, read: Mapping[str, DesiredModel]) -> dict[str, str]:
        """Why each record of ``read`` that went back is not followed, by model."""
        return {
            model: (
                f"the desired state of {model} went back from generation {last.generation} "
                f"({last.release or 'unloaded'}, set by {last.set_by}) to {wanted.generation} "
                f"({wanted.release or 'unloaded'}): a restored backup or a lagging replica? "
                f"Not followed; this member keeps {last.release or 'it unloaded'}. Deploy the "
                "release the fleet should serve to write a new generation"
            )
            for model, wanted in read.items()
            if (last := self.seen.get(model)) is not None and wanted.generation < last.generation
        }

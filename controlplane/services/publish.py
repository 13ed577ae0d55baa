"""``controlplane release publish``: a checked release uploaded in the order that makes it
safe to watch.

The invariant: a member sees a release only once it is whole. A deploy or the watcher takes a
release only when its ``SHA256SUMS`` is there (``release_incomplete`` before), so that file
goes last, after every file it lists and after each signature (a member checks the signature
before it fetches anything else). A publish cut anywhere before the marker leaves a release
no member takes; running it again uploads what is missing or differs, deletes what the cut
left that is not part of the release, and then writes the marker. A release whose marker is
there is published and immutable: publishing it again is ``release_exists``, and the marker's
write itself refuses to replace one (a race between two publishers ends the same way).

The release is checked first, by the deploy's own checks (:mod:`.release_check`), so what is
uploaded is what a deploy would accept up to the load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from controlplane.domain.checksums import MANIFEST_NAME
from controlplane.domain.errors import ReleaseExists
from controlplane.ports import ReleaseSigner, ReleaseTarget, ReleaseToPublish, SideFile
from controlplane.services.release_check import CheckedRelease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedRelease:
    """What a publish did."""

    uri: str
    checked: CheckedRelease
    uploaded: tuple[str, ...]  # files written now
    kept: tuple[str, ...]  # files an earlier, cut publish had written already
    removed: tuple[str, ...]  # leftovers of an earlier publish deleted
    signed_by: tuple[str, ...]  # the signers, one per signature file


def exists(target: ReleaseTarget, model: str, release: str) -> ReleaseExists:
    return ReleaseExists(
        f"release {release!r} of model {model!r} is already published at {target.uri} (its "
        f"{MANIFEST_NAME} is there): a release is immutable, so publish this one under a new "
        "release name",
        details={"model": model, "release": release},
    )


async def publish_release(
    release: ReleaseToPublish,
    *,
    check: Callable[[], Awaitable[CheckedRelease]],
    target: ReleaseTarget,
    signers: Sequence[ReleaseSigner] = (),
    say: Callable[[str], None] = lambda _line: None,
) -> PublishedRelease:
    """Check ``release``, then upload it to ``target``: files, signatures, ``SHA256SUMS``."""
    model, name = release.model, release.release
    checked = await check()
    if await asyncio.to_thread(target.committed):
        raise exists(target, model, name)
    side: list[SideFile] = [await asyncio.to_thread(s.sign, release) for s in signers]
    keep = {*release.files, *(f.name for f in side)}
    removed = await asyncio.to_thread(target.clear_except, keep)
    for rel in removed:
        say(f"  removed   {rel} (left by an earlier publish; not in this release)")
    uploaded, kept = [], []
    for rel in sorted(release.files):
        digest = release.files[rel]
        if await asyncio.to_thread(target.holds, rel, digest):
            kept.append(rel)
            say(f"  kept      {rel} (uploaded before)")
            continue
        await asyncio.to_thread(target.put_file, rel, release.path / rel, digest)
        uploaded.append(rel)
        say(f"  uploaded  {rel} ({digest.size} bytes)")
    for signature in side:
        await asyncio.to_thread(target.put_side_file, signature.name, signature.data)
        say(f"  uploaded  {signature.name} (signed by {signature.signer})")
    await asyncio.to_thread(target.commit, release.manifest)
    say(f"  uploaded  {MANIFEST_NAME} (the commit marker: the release is published)")
    log.info("published %s/%s at %s", model, name, target.uri)
    return PublishedRelease(
        uri=target.uri,
        checked=checked,
        uploaded=tuple(uploaded),
        kept=tuple(kept),
        removed=tuple(removed),
        signed_by=tuple(f.signer for f in side),
    )

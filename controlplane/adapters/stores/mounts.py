"""Which filesystem holds a path, to tell whether its change events can be trusted.

inotify reports changes made through this host's kernel. On a network or FUSE filesystem (NFS,
EFS, SMB, CephFS, gcsfuse, ...) a release published from another host raises no event at all,
yet every call to watch it succeeds: nothing fails that could warn the watcher. So the local
store reads the mount table (``/proc/self/mountinfo``) before it trusts events, and on such a
filesystem lists the whole store on every beat, as if there were no events.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# Shared or remote filesystems: a change made elsewhere is invisible to this host's inotify.
REMOTE = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "9p",
        "virtiofs",
        "vboxsf",
        "fuse",  # a FUSE mount of unknown kind: its data may come from anywhere
    }
)
_ESCAPE = re.compile(r"\\([0-7]{3})")


def filesystem_of(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem mounted where ``path`` lives (``ext4``, ``nfs4``,
    ``fuse.gcsfuse``); None when the mount table cannot be read (not Linux)."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path)
    found: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:] or len(fields) < 5:
            continue
        mount_point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = (
            target == mount_point
            or mount_point == "/"
            or target.startswith(mount_point.rstrip("/") + "/")
        )
        if not inside:
            continue
        fstype = fields[fields.index("-", 6) + 1]
        # The deepest mount point wins; of equal ones, the last (mounted over the others).
        if found is None or len(mount_point) >= found[0]:
            found = (len(mount_point), fstype)
    return found[1] if found is not None else None


def events_miss_remote_changes(fstype: str) -> bool:
    """Whether changes to a filesystem of type ``fstype`` can be made where this host's
    inotify does not see them."""
    return fstype in REMOTE or fstype.startswith("fuse.")

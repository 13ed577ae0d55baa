"""``find``, started last in its pipeline: the order a busy machine may pick, made certain.

In ``find . | sort | xargs sha256sum > .SHA256SUMS.tmp`` the shell starts every stage at once,
so whether ``find`` sees the temp file its own pipeline creates depends on which process runs
first; the README's old publisher snippet listed it in 5 runs of 6. Tests put this script first
on ``PATH`` as ``find``: it waits until the dir it searches holds an entry created since the
block started (``README_BLOCK_STARTED``, seconds since the epoch), or ``README_FIND_WAIT``
seconds have passed, then runs the real ``find`` (``README_REAL_FIND``) with the same
arguments. A snippet that lists its own temp file then does so on every run.
"""

from __future__ import annotations

import os
import sys
import time


def _searched_dir(args: list[str]) -> str:
    """find's first path argument ('.' when it gives none)."""
    for arg in args:
        if arg.startswith(("-", "!", "(")):
            break
        return arg
    return "."


def _has_new_entry(directory: str, since: float) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(entry.stat(follow_symlinks=False).st_ctime >= since for entry in entries)
    except OSError:
        return True  # nothing to wait for: let the real find report it


def main() -> None:
    args = sys.argv[1:]
    # The kernel stamps files with a clock that may lag time.time() by a tick: allow for it.
    since = float(os.environ["README_BLOCK_STARTED"]) - 0.05
    deadline = time.monotonic() + float(os.environ.get("README_FIND_WAIT", "1.0"))
    directory = _searched_dir(args)
    while not _has_new_entry(directory, since) and time.monotonic() < deadline:
        time.sleep(0.005)
    real = os.environ["README_REAL_FIND"]
    os.execv(real, [real, *args])  # noqa: S606  (the real find, same arguments, no shell)


if __name__ == "__main__":
    main()

"""Dirs and key prefixes in the store whose names are no valid model or release name.

A store's listing leaves them out: such a name never reaches a path, a Triton name or the
database. But leaving them out without a word hid a publisher's typo (a space, a ``<``) behind
a release that simply never appeared, so each listing says what it left out and why
(:class:`IgnoredName`), and the daemon logs it and shows it (``ignored_releases``,
``ignored_models``).

Not every entry that is no model is a mistake, and those are left out silently:

* names that start with ``.``: hidden on purpose (a publisher's staging dir, ``.snapshot``);
* ``_controlplane``: the fleet's records, which the daemon writes itself;
* ``lost+found``: a filesystem's own, at the root of a mounted volume.

The name is untrusted text as it came from the filesystem or S3, so what is shown is made
:func:`printable` first: bytes that are not UTF-8 (a local name holds them as surrogates, which
no JSON encoder accepts) and control characters are written as escapes (``\\xff``, ``\\n``), so a
name can neither break a log line nor a terminal. ``where`` is the path or key the listing
found the entry at, for the log: it is text, and nothing builds a path from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import RESERVED_PREFIX
from controlplane.domain.names import validate_model_name, validate_release_name

NOT_MODELS = frozenset({RESERVED_PREFIX, "lost+found"})  # store entries that are no model's


@dataclass(frozen=True, slots=True, order=True)
class IgnoredName:
    """An entry a store's listing left out: its name (printable), the rule it breaks, and
    where the listing found it (a path or an ``s3://`` key prefix, printable)."""

    name: str
    reason: str
    where: str


def ignored_model(name: str, where: str) -> IgnoredName | None:
    """None when ``name`` is a model's, or an entry the store holds besides models; else what
    to report about the dir (or prefix) at ``where``."""
    if name.startswith(".") or name in NOT_MODELS:
        return None
    try:
        validate_model_name(name)
    except InvalidName as exc:
        return IgnoredName(printable(name), exc.message, printable(where))
    return None


def release_name_problem(name: str) -> str | None:
    """Why ``name`` is no release's (the rule it breaks); None when it is one."""
    try:
        validate_release_name(name)
    except InvalidName as exc:
        return exc.message
    return None


def ignored_release(name: str, problem: str, where: str) -> IgnoredName | None:
    """What to report about a release dir (or prefix) whose name breaks a rule (``problem``,
    from :func:`release_name_problem`); None for a hidden one."""
    if name.startswith("."):
        return None
    return IgnoredName(printable(name), problem, printable(where))


def printable(text: str) -> str:
    """``text`` with bytes that are not UTF-8 and characters that are not printable escaped."""
    try:
        data = text.encode("utf-8", "surrogateescape")  # a local name's undecodable bytes
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")  # any other lone surrogate
    raw = data.decode("utf-8", "backslashreplace")
    if raw.isprintable():
        return raw
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in raw)

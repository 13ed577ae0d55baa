"""The fleet's desired state, as data: what every member should serve, per model.

It lives in the store the fleet already shares (``_controlplane/desired/<model>.json``), so
a member that missed an event, crashed, or joined late reads the same thing as the others and
converges the same way. The pod-local database is only a journal: losing it loses history,
never what should serve.

Invariants:

* Every change makes a new :class:`DesiredModel` with ``generation`` one higher, written
  compare-and-swap on the generation it replaces: two members racing cannot both win, and the
  loser is told who won (:class:`~controlplane.domain.errors.DesiredStateConflict`).
* What one member should serve is :meth:`DesiredModel.target_for`: the desired release, except
  during a canary rollout, where members that are not canaries keep the stable release.
* A member unloads a model only for a record that says so: ``release`` None *and*
  ``unloaded`` naming the release an unload left (what an unload through the API writes, or a
  canary rollout stopped with nothing stable to go back to). A null release without it is a
  record from before any release (a claim or a turn on a new model: ``previous`` None), which
  asks nothing of anyone; any other null release is refused as malformed where it is read
  (:func:`desired_from_storage`), so a hand edit of ``"release": null`` unloads nothing. A
  model with no record at all is not the fleet's to manage either (nothing is unloaded because
  a record is missing or unreadable).
* A release in ``degraded`` was rolled back from; nothing automatic promotes it again. A person
  deploying it by name clears it.

Pure: standard library only; :func:`desired_for_storage` and :func:`desired_from_storage` give
the JSON shape the adapters write, apart from the in-memory one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.domain.names import (
    validate_member_name,
    validate_model_name,
    validate_release_name,
)
from controlplane.domain.refusals import BadValue, RefusalReason
from controlplane.domain.stored import (
    choice,
    flag,
    json_object,
    listed,
    maybe_named,
    maybe_text,
    moment,
    named,
    seconds,
    text,
    whole,
)
from controlplane.domain.turns import Progress, Turn, turn_for_storage, turn_from_storage

RESERVED_PREFIX = "_controlplane"  # model names start with a letter or digit: no collision
SCHEMA = 1
# The longest keepalive a member's beat is believed for (fleet.keepalive_seconds' bound): a
# record that claims more cannot keep a member alive any longer than that.
MAX_KEEPALIVE = 300.0
# S3's timestamps (LastModified, the Date of an answer) are whole seconds: two of them, each
# up to a second short, may make a beat look that much older than it is.
STAMP_SLACK = 2.0


class RolloutPhase(StrEnum):
    COMPLETE = "complete"  # every member follows ``release``
    CANARY = "canary"  # the canaries move to ``release``; the others keep ``stable``
    BAKING = "baking"  # every canary serves it; it bakes before the others follow
    ROLLED_BACK = "rolled_back"  # a canary failed or breached: back to ``stable`` everywhere


@dataclass(frozen=True)
class Pause:
    """Who paused a rollout (``controlplane rollout pause``), when and why."""

    by: str  # who asked, and through which member ("cli through m1")
    at: datetime
    reason: str = ""


@dataclass(frozen=True)
class Rollout:
    phase: RolloutPhase = RolloutPhase.COMPLETE
    stable: str | None = None  # what the members that are not canaries keep meanwhile
    canaries: tuple[str, ...] = ()
    bake_seconds: float | None = 0.0  # None: the bake lasts until someone promotes it
    baking_since: datetime | None = None
    since_generation: int = 0  # the generation that started it: older member reports are stale
    note: str = ""  # how it ended, when it did not complete
    lost: tuple[str, ...] = ()  # canaries that went away and were replaced (never picked again)
    paused: Pause | None = None  # held where it stands until resumed

    @property
    def in_progress(self) -> bool:
        return self.phase in (RolloutPhase.CANARY, RolloutPhase.BAKING)

    @property
    def holds(self) -> bool:
        """Paused: no member starts towards a target it does not serve yet, none takes a
        rolling turn, and the rollout does not move on (a stopped one holds nothing)."""
        return self.paused is not None and self.phase is not RolloutPhase.ROLLED_BACK


@dataclass(frozen=True)
class Degraded:
    release: str
    at: datetime
    reason: str


@dataclass(frozen=True)
class Claim:
    """A new release one member's watcher took on to deploy first (``auto_deploy``)."""

    release: str
    revision: str | None
    member: str
    incarnation: str  # the claimer's process: a claimer that restarted let go of its claim
    at: datetime
    failed: str | None = None  # why it failed on the claimer: no other member tries it


@dataclass(frozen=True)
class DesiredModel:
    model: str
    generation: int
    release: str | None
    previous: str | None
    set_by: str
    set_at: datetime
    trigger: str
    reason: str
    degraded: tuple[Degraded, ...] = ()
    rollout: Rollout = field(default_factory=Rollout)
    claim: Claim | None = None
    turns: tuple[Turn, ...] = ()  # members out of rotation for a rolling update of it
    # With ``release`` None: the release an unload left (the record is an unload on purpose).
    unloaded: str | None = None

    def target_for(self, member: str) -> str | None:
        """What ``member`` should serve (None: nothing; :meth:`unloads` says whether that
        asks it to unload what it serves)."""
        if self.rollout.in_progress and member not in self.rollout.canaries:
            return self.rollout.stable
        return self.release

    def unloads(self, member: str) -> bool:
        """Whether ``member`` is asked to serve nothing: its target is None and the record
        is an unload on purpose. Any other None target (a record from before any release, a
        canary rollout's others when nothing was stable) asks nothing: the member keeps what
        it serves, as for a model with no record."""
        return self.target_for(member) is None and self.unloaded is not None

    def is_degraded(self, release: str | None) -> bool:
        return release is not None and any(d.release == release for d in self.degraded)

    def previous_for(self, active: str | None, own: str | None) -> str | None:
        """The one meaning of "previous" for a member that serves ``active`` and whose own
        journal says ``own``: the fleet's previous release while the member serves the fleet's
        release, its own otherwise. A member killed before it published, one that lost a race
        or lost its journal, went through releases the fleet never had (or forgot them); the
        model view, the rollback and the fallback must all name the same release. During a
        canary rollout, a canary's previous is the rollout's stable release (a release deployed
        over another canary's, not yet baked, must not go back to that one)."""
        if active is not None and active == self.release:
            if self.rollout.in_progress and self.rollout.stable:
                return self.rollout.stable
            if self.previous:
                return self.previous
        return own

    def changed(
        self, *, by: str, at: datetime, trigger: str, reason: str, **fields: Any
    ) -> DesiredModel:
        """The next generation, with ``fields`` changed and who, when and why recorded."""
        return replace(
            self,
            generation=self.generation + 1,
            set_by=by,
            set_at=at,
            trigger=trigger,
            reason=reason,
            **fields,
        )

    def latched(self, release: str, at: datetime, reason: str) -> tuple[Degraded, ...]:
        """``degraded`` with ``release`` latched (once)."""
        if self.is_degraded(release):
            return self.degraded
        return (*self.degraded, Degraded(release, at, reason))

    def unlatched(self, release: str | None) -> tuple[Degraded, ...]:
        return tuple(d for d in self.degraded if d.release != release)


def first_generation(
    model: str, *, by: str, at: datetime, trigger: str, reason: str
) -> DesiredModel:
    """The record before the first write: generation 0, nothing desired. Writing its
    :meth:`~DesiredModel.changed` creates the record (compare-and-swap on absence)."""
    return DesiredModel(model, 0, None, None, by, at, trigger, reason)


# --- members --------------------------------------------------------------------------------


class MemberState(StrEnum):
    """How one member stands with one model's target."""

    SERVING = "serving"  # it serves its target
    CONVERGING = "converging"  # an operation towards the target runs, or is about to
    FAILED = "failed"  # its last attempt at the target failed; it serves what it had
    # the target is latched degraded here (rollback.scope: member), or this member is held out
    # of rotation for the model (the GPU memory did not come back): no attempt until it changes
    HELD = "held"
    UNLOADED = "unloaded"  # the target is 'unloaded', and nothing serves here
    PAUSED = "paused"  # the rollout is paused: it holds what it serves until it is resumed


@dataclass(frozen=True)
class MemberModel:
    release: str | None  # what serves here
    state: MemberState
    target: str | None = None  # what it should serve (the desired state, for this member)
    generation: int = 0  # the desired generation this state is about
    error: str | None = None
    progress: Progress = field(default_factory=Progress)  # a rolling update's phases here


@dataclass(frozen=True)
class MemberBeat:
    """One member's heartbeat: who it is, what it serves, how its GPUs look."""

    member: str
    incarnation: str
    at: datetime
    interval: float  # its keepalive: seconds between beats while nothing changes
    version: str
    models: Mapping[str, MemberModel] = field(default_factory=dict)
    overload: str | None = None  # the overload verdict: healthy, breach, unknown; None: off
    stale: bool = False  # it could not read the desired state at its last try
    url: str | None = None  # where the other members can wake it (its API); None: they cannot
    name_conflict: str | None = None  # another daemon writes heartbeats under its name
    # Why its load balancer sends it nothing now (starting, draining a model); empty: in
    # rotation. Rolling updates count such members as out (rollout.max_unavailable).
    out_of_rotation: str | None = None
    # When it landed in the store, on the reader's clock: the store's own timestamp of the
    # record (S3's LastModified, the file's mtime) moved by how far the store's clock is from
    # the reader's. Not stored: the store gives it. None: not read from the store (this
    # member's own beat, as it is now), so ``at`` stands for it.
    landed: datetime | None = None

    @property
    def seen(self) -> datetime:
        """When the fleet last heard of this member, on the reader's clock."""
        return self.landed if self.landed is not None else self.at

    def alive(self, now: datetime) -> bool:
        """Heard of within three keepalives (and the store timestamps' resolution) as ``now``'s
        clock sees it. Judged from when the beat landed in the store, never from the time its
        writer put in it: a member whose clock runs ahead would stay alive after its death for
        as long as it is ahead (a beat dated 2099, for ever), and one whose clock runs behind
        would be taken for dead while it serves. A beat known only by its own date (this
        member's) and dated further ahead than the window is no sign of life either."""
        window = timedelta(seconds=3 * min(self.interval, MAX_KEEPALIVE))
        if self.landed is None:
            return -window <= now - self.at <= window
        return now - self.landed <= window + timedelta(seconds=STAMP_SLACK)

    def skew(self) -> float | None:
        """Seconds its writer's clock is ahead of the reader's (negative: behind), as far as
        one beat tells (its date against when it landed); None when it was not read from the
        store."""
        if self.landed is None:
            return None
        return (self.at - self.landed).total_seconds()

    def serves(self, model: str, release: str | None) -> bool:
        state = self.models.get(model)
        if state is None:
            return release is None
        return state.release == release and state.state in (
            MemberState.SERVING,
            MemberState.UNLOADED,
        )

    def failed(self, model: str, generation: int) -> str | None:
        """The error of this member's attempt at ``generation`` (or later), if it failed."""
        state = self.models.get(model)
        if state is None or state.state is not MemberState.FAILED:
            return None
        return state.error if state.generation >= generation else None


def converged(
    desired: DesiredModel,
    beats: Mapping[str, MemberBeat],
    now: datetime,
    *,
    alive: Callable[[MemberBeat], bool] | None = None,
) -> bool:
    """Every live member serves its target (and there is at least one). Live: beating as of
    ``now``, unless ``alive`` judges (a view that knows the store was away)."""
    living = alive or (lambda beat: beat.alive(now))
    alive_beats = [beat for beat in beats.values() if living(beat)]
    return bool(alive_beats) and all(
        beat.serves(desired.model, desired.target_for(beat.member)) for beat in alive_beats
    )


# --- the stored shape -----------------------------------------------------------------------


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def desired_for_storage(desired: DesiredModel) -> dict[str, Any]:
    rollout = desired.rollout
    claim = desired.claim
    return {
        "schema": SCHEMA,
        "model": desired.model,
        "generation": desired.generation,
        "release": desired.release,
        "previous": desired.previous,
        "set_by": desired.set_by,
        "set_at": _time(desired.set_at),
        "trigger": desired.trigger,
        "reason": desired.reason,
        "degraded": [
            {"release": d.release, "at": _time(d.at), "reason": d.reason} for d in desired.degraded
        ],
        "rollout": {
            "phase": rollout.phase.value,
            "stable": rollout.stable,
            "canaries": list(rollout.canaries),
            "bake_seconds": rollout.bake_seconds,
            "baking_since": _time(rollout.baking_since),
            "since_generation": rollout.since_generation,
            "note": rollout.note,
            "lost": list(rollout.lost),
            "paused": pause_for_storage(rollout.paused),
        },
        "claim": None
        if claim is None
        else {
            "release": claim.release,
            "revision": claim.revision,
            "member": claim.member,
            "incarnation": claim.incarnation,
            "at": _time(claim.at),
            "failed": claim.failed,
        },
        "turns": [turn_for_storage(turn) for turn in desired.turns],
        "unloaded": desired.unloaded,
    }


def pause_for_storage(pause: Pause | None) -> dict[str, Any] | None:
    """A pause as stored, and as the API shows it: who, when (ISO 8601) and why."""
    if pause is None:
        return None
    return {"by": pause.by, "at": _time(pause.at), "reason": pause.reason}


def _pause(value: object) -> Pause | None:
    if value is None:
        return None
    pause = json_object(value, "rollout.paused")
    return Pause(
        by=text(pause["by"], "rollout.paused.by"),
        at=moment(pause["at"], "rollout.paused.at"),
        reason=text(pause.get("reason") or "", "rollout.paused.reason"),
    )


def _bake(value: object) -> float | None:
    """A bake's length; null: until promoted (a record from before that had no key: 0)."""
    return None if value is None else seconds(value, "rollout.bake_seconds")


def _schema(data: Mapping[str, Any]) -> None:
    """A record of another schema (a newer daemon's) is not read as this one's."""
    written = data.get("schema", SCHEMA)
    if written != SCHEMA or isinstance(written, bool):
        raise BadValue(
            "schema",
            RefusalReason.UNKNOWN_VALUE,
            f"schema is {written!r:.60}, not {SCHEMA}: a record of another version of the daemon",
        )


def _release(value: object, what: str) -> str | None:
    return maybe_named(value, what, validate_release_name)


def _members(value: object, what: str) -> tuple[str, ...]:
    return tuple(
        named(name, f"{what}[{i}]", validate_member_name)
        for i, name in enumerate(listed(value, what))
    )


def desired_from_storage(data: Mapping[str, Any]) -> DesiredModel:
    """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a record that is not ours: a
    field missing, of the wrong type, or out of range (:mod:`.stored`), a name no daemon would
    write, a phase or schema this version does not know, so that no value read here can fail
    later where it is used; or a null release no writer of ours makes (:func:`check_release`)."""
    _schema(data)
    return check_release(_desired(data))


def check_release(desired: DesiredModel) -> DesiredModel:
    """``desired`` if its ``release`` and ``unloaded`` are as the daemon writes them, else
    ``ValueError`` saying why. A null release is accepted as an unload on purpose only beside
    ``unloaded`` (the release the unload left), or as a record from before any release:
    ``previous`` None, nothing degraded, and a claim or a turn, the only writes that make one.
    Anything else (``"release": null`` written by hand into a record) would unload the model on
    every member, so it is refused: listed as unreadable, and no member acts on it."""
    if desired.release is not None:
        if desired.unloaded is not None:
            raise ValueError(
                f"unloaded is {desired.unloaded!r} but release is {desired.release!r}: only "
                "an unloaded record (release null) names the release an unload left"
            )
        return desired
    if desired.unloaded is not None:
        return desired
    claimed = desired.claim is not None or bool(desired.turns)
    if desired.previous is None and not desired.degraded and claimed:
        return desired  # before any release: a claim or a turn on a new model
    raise ValueError(
        "release is null but the record is no unload: an unload through a member's API "
        "writes null with unloaded naming the release it unloaded, and members unload only "
        "for that (a null release written by hand unloads nothing, and members keep serving "
        "what they have). To unload the model, delete this record and unload it through any "
        f"member's API (POST /v1/models/{desired.model}/unload)"
    )


def _desired(data: Mapping[str, Any]) -> DesiredModel:
    rollout = json_object(data.get("rollout") or {}, "rollout")
    claim = json_object(data.get("claim") or {}, "claim")
    return DesiredModel(
        model=named(data["model"], "model", validate_model_name),
        generation=whole(data["generation"], "generation"),
        release=_release(data["release"], "release"),
        previous=_release(data.get("previous"), "previous"),
        set_by=text(data["set_by"], "set_by"),
        set_at=moment(data["set_at"], "set_at"),
        trigger=text(data["trigger"], "trigger"),
        reason=text(data.get("reason", ""), "reason"),
        degraded=tuple(
            _degraded(json_object(d, f"degraded[{i}]"), f"degraded[{i}]")
            for i, d in enumerate(listed(data.get("degraded") or [], "degraded"))
        ),
        rollout=Rollout(
            phase=choice(
                rollout.get("phase", RolloutPhase.COMPLETE.value), RolloutPhase, "rollout.phase"
            ),
            stable=_release(rollout.get("stable"), "rollout.stable"),
            canaries=_members(rollout.get("canaries") or [], "rollout.canaries"),
            bake_seconds=_bake(rollout.get("bake_seconds", 0.0)),
            baking_since=None
            if rollout.get("baking_since") is None
            else moment(rollout["baking_since"], "rollout.baking_since"),
            since_generation=whole(
                rollout.get("since_generation") or 0, "rollout.since_generation"
            ),
            note=text(rollout.get("note") or "", "rollout.note"),
            lost=_members(rollout.get("lost") or [], "rollout.lost"),
            paused=_pause(rollout.get("paused")),
        ),
        claim=None
        if not claim
        else Claim(
            release=named(claim["release"], "claim.release", validate_release_name),
            revision=maybe_text(claim.get("revision"), "claim.revision"),
            member=named(claim["member"], "claim.member", validate_member_name),
            incarnation=text(claim["incarnation"], "claim.incarnation"),
            at=moment(claim["at"], "claim.at"),
            failed=maybe_text(claim.get("failed"), "claim.failed"),
        ),
        turns=tuple(
            turn_from_storage(json_object(t, f"turns[{i}]"), f"turns[{i}]")
            for i, t in enumerate(listed(data.get("turns") or [], "turns"))
        ),
        unloaded=maybe_text(data.get("unloaded"), "unloaded"),
    )


def _degraded(d: Mapping[str, Any], what: str) -> Degraded:
    return Degraded(
        named(d["release"], f"{what}.release", validate_release_name),
        moment(d["at"], f"{what}.at"),
        text(d.get("reason", ""), f"{what}.reason"),
    )


def beat_for_storage(beat: MemberBeat) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "member": beat.member,
        "incarnation": beat.incarnation,
        "at": _time(beat.at),
        "interval": beat.interval,
        "version": beat.version,
        "overload": beat.overload,
        "stale": beat.stale,
        "url": beat.url,
        "name_conflict": beat.name_conflict,
        "out_of_rotation": beat.out_of_rotation,
        "models": {
            name: {
                "release": m.release,
                "state": m.state.value,
                "target": m.target,
                "generation": m.generation,
                "error": m.error,
                "phase": m.progress.phase,
                "took": [[step, seconds] for step, seconds in m.progress.took],
                "failed": m.progress.failed,
            }
            for name, m in sorted(beat.models.items())
        },
    }


def beat_from_storage(data: Mapping[str, Any]) -> MemberBeat:
    """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a record that is not ours (as
    :func:`desired_from_storage` does). What a newer daemon may say that this one does not know
    (a GPU verdict, a rolling phase) is read as written: it is shown and compared, never acted
    on as something else, and refusing it would hide every newer member while the fleet's
    daemons are upgraded one by one."""
    _schema(data)
    return MemberBeat(
        member=named(data["member"], "member", validate_member_name),
        incarnation=text(data["incarnation"], "incarnation"),
        at=moment(data["at"], "at"),
        interval=seconds(data["interval"], "interval"),
        version=text(data.get("version", ""), "version"),
        overload=maybe_text(data.get("overload"), "overload"),
        stale=flag(data.get("stale", False), "stale"),
        url=peer_url(data.get("url")),
        name_conflict=_text(data.get("name_conflict")),
        out_of_rotation=_text(data.get("out_of_rotation")),
        models={
            named(name, "models", validate_model_name): _member_model(
                json_object(m, f"models.{name}"), f"models.{name}"
            )
            for name, m in json_object(data.get("models") or {}, "models").items()
        },
    )


def peer_url(value: object) -> str | None:
    """A member's advertised API address, as another member may use it:
    ``http(s)://host:port`` (a name, an IPv4 address, or an IPv6 address in brackets; the port
    1 to 65535, or the scheme's own when left out) and nothing else: no credentials, path,
    query or fragment. Anything else is None: a member that cannot be woken is followed at its
    next poll, which is always safe."""
    if not isinstance(value, str) or len(value) > 300:
        return None
    scheme, sep, rest = value.partition("://")
    rest = rest.removesuffix("/")
    if not sep or scheme not in ("http", "https") or not rest:
        return None
    if rest.startswith("["):  # an IPv6 address
        address, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            return None
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return None
        host, has_port, port = f"[{address}]", bool(tail), tail[1:]
    else:
        host, colon, port = rest.partition(":")
        if not _HOST.fullmatch(host) or ".." in host:
            return None
        has_port = bool(colon)
    if has_port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return None
    return f"{scheme}://{host}" + (f":{int(port)}" if has_port else "")


_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def _text(value: object, limit: int = 1000) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _member_model(m: Mapping[str, Any], what: str) -> MemberModel:
    return MemberModel(
        release=_release(m.get("release"), f"{what}.release"),
        state=choice(m["state"], MemberState, f"{what}.state"),
        target=_release(m.get("target"), f"{what}.target"),
        generation=whole(m.get("generation", 0), f"{what}.generation"),
        error=maybe_text(m.get("error"), f"{what}.error"),
        progress=Progress(
            phase=maybe_text(m.get("phase"), f"{what}.phase"),
            took=tuple(
                _took(pair, f"{what}.took[{i}]")
                for i, pair in enumerate(listed(m.get("took") or [], f"{what}.took"))
            ),
            failed=maybe_text(m.get("failed"), f"{what}.failed"),
        ),
    )


def _took(value: object, what: str) -> tuple[str, float]:
    pair = listed(value, what)
    if len(pair) != 2:
        raise BadValue(
            what,
            RefusalReason.WRONG_TYPE,
            f"{what} has {len(pair)} items, not a step and its seconds",
        )
    return text(pair[0], f"{what}[0]"), seconds(pair[1], f"{what}[1]")

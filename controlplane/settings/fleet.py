"""The fleet: whether the desired state lives in the store, this member's name, its heartbeat
and the address where the other members wake it.

The member's name is checked with the domain's rule and the address with the one the members
read heartbeats with (:func:`~controlplane.domain.fleet.peer_url`), so what this member writes
is what the others can use.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import peer_url
from controlplane.domain.names import validate_member_name
from controlplane.settings.group import Group


class FleetSettings(Group):
    enabled: bool = Field(
        True,
        description="Keep the desired state in the store (under _controlplane/), shared by "
        "every daemon on that store, so that a deploy through any member reaches all of them. "
        "The store must then be writable. false: the desired state lives in this daemon's "
        "database alone, and the store may be read-only.",
    )
    member: str | None = Field(
        None,
        description="This member's name in the fleet. Default: the host name (in Kubernetes "
        "set it to the pod's name from the downward API).",
    )
    heartbeat_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="How often this member writes its heartbeat (what it serves, its GPU "
        "verdict) into the store; a member not seen for 3 beats is not alive.",
    )
    advertise_url: str | None = Field(
        None,
        description="Where the other members reach this member's API (http://host:port), "
        "written in its heartbeat: a member that changes the desired state wakes the others "
        "there, so they follow at once instead of at their next poll (a wake carries nothing "
        "and needs no token). Default: http://<api.host>:<api.port> when the API binds one "
        "address, none when it binds every address (in Kubernetes set it from the pod's IP). "
        "Without one this member follows at its polls.",
    )

    @field_validator("advertise_url")
    @classmethod
    def _advertise_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        taken = peer_url(url)
        if taken is None:
            raise ValueError(
                f"{url!r} is not a member's address: give http://host:port or "
                "https://host:port, with no path, query or credentials"
            )
        return taken

    @field_validator("member")
    @classmethod
    def _member_name(cls, member: str | None) -> str | None:
        if member is not None:
            try:
                validate_member_name(member)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        return member

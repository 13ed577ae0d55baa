"""The fleet: whether the desired state lives in the store, this member's name, its heartbeat's
keepalive and the address where the other members wake it.

The member's name is checked with the domain's rule and the address with the one the members
read heartbeats with (:func:`~controlplane.domain.fleet.peer_url`), so what this member writes
is what the others can use.
"""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import Field, field_validator, model_validator

from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import MAX_KEEPALIVE, peer_url
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
    keepalive_seconds: float = Field(
        60.0,
        gt=0,
        le=MAX_KEEPALIVE,
        description="How often this member writes its heartbeat into the store while nothing "
        "it says changes (it writes at once when what it serves, its GPU verdict or its "
        "rotation changes). A member whose heartbeat has not landed for 3 keepalives is not "
        "alive, judged by the store's timestamps, not the members' clocks: a member that "
        "dies is seen dead within 3 keepalives (its turn in a rolling update is then free), "
        "and each keepalive is one write per member.",
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

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """``heartbeat_seconds`` (before 0.2, beats every 5 s) is ``keepalive_seconds`` now."""
        if isinstance(data, dict) and "heartbeat_seconds" in data:
            data = dict(data)
            old = data.pop("heartbeat_seconds")
            if "keepalive_seconds" in data:
                raise ValueError(
                    "fleet.heartbeat_seconds is the old name of fleet.keepalive_seconds: "
                    "give only keepalive_seconds"
                )
            warnings.warn(
                "fleet.heartbeat_seconds (CONTROLPLANE_FLEET__HEARTBEAT_SECONDS) is now "
                "fleet.keepalive_seconds (CONTROLPLANE_FLEET__KEEPALIVE_SECONDS); the old name "
                "is read for now",
                FutureWarning,
                stacklevel=2,
            )
            data["keepalive_seconds"] = old
        return data

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

"""A fleet for tests: N members, each a real Triton of its own with a daemon beside it, all on
one shared store (a directory or an S3 bucket).

Members poll the desired state every second and beat every second, so that a test waits
seconds, not the defaults' tens of seconds; everything else is as a user runs it. Each member's
Triton comes from the session's pool (``pooled_tritons``: no fleet test kills one), so the
fleet's model has a name of its own (``Fleet.model``) that no other test of the session uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.polling import eventually
from tests.support.stopping import stop_all

POLL = 1.0
BEAT = 1.0


@dataclass
class Member:
    name: str
    triton: RunningTriton
    workdir: Path
    daemon: Daemon | None = None

    @property
    def api(self) -> Daemon:
        assert self.daemon is not None, f"{self.name} has no daemon running"
        return self.daemon

    def answer(self, model: str) -> float:
        return infer_once(self.triton.grpc_url, model)


@dataclass
class Fleet:
    store: Path
    # The member's Triton, given the repository dir made for it: a Triton started there, or
    # one lent from the session's pool (``pooled_tritons``), which has a repository of its own.
    tritons: Callable[[Path], RunningTriton]
    root: Path
    model: str  # the model the test deploys: a name no other test of the session uses
    store_uri: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    config: str | None = None
    members: list[Member] = field(default_factory=list)

    def add(self, name: str | None = None, *, wait_ready: bool = True, **kwargs: Any) -> Member:
        """A new member: a Triton (and its repository) of its own, and a daemon on the shared
        store."""
        name = name or f"m{len(self.members) + 1}"
        workdir = self.root / name
        if workdir.exists():  # a second daemon under one name (a mistake a test makes)
            workdir = self.root / f"{name}-{len(self.members) + 1}"
        (workdir / "repository").mkdir(parents=True)
        member = Member(name, self.tritons(workdir / "repository"), workdir)
        self.members.append(member)
        self.start(member, wait_ready=wait_ready, **kwargs)
        return member

    def start(self, member: Member, *, wait_ready: bool = True, **kwargs: Any) -> Daemon:
        """(Re)start ``member``'s daemon on its own database, as its pod's sidecar would."""
        extra = {
            "CONTROLPLANE_FLEET__MEMBER": member.name,
            "CONTROLPLANE_FLEET__KEEPALIVE_SECONDS": str(BEAT),
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": str(POLL),
            **self.env,
            **kwargs.pop("extra_env", {}),
        }
        member.daemon = start_daemon(
            triton=member.triton,
            store=self.store,
            store_uri=self.store_uri,
            workdir=member.workdir,
            extra_env=extra,
            config=kwargs.pop("config", self.config),
            log_name=f"daemon-{member.name}.log",
            wait_ready=wait_ready,
            **kwargs,
        )
        return member.daemon

    def fleet(self, via: Member | None = None) -> dict[str, Any]:
        response = (via or self.members[0]).api.get("/v1/fleet")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_serving(self, model: str, release: str, value: float, timeout: float = 60.0) -> None:
        """Every member answers ``value`` through ``model`` and says it serves ``release``."""
        for member in self.members:
            eventually(
                partial(_serving, member, model, release, value),
                timeout,
                f"{member.name} serves {model} {release}",
                every=0.2,
            )

    def stop(self) -> None:
        """Every member's daemon, all at once."""
        stop_all([m.daemon for m in self.members if m.daemon is not None], Daemon.stop)


def _serving(member: Member, model: str, release: str, value: float) -> bool:
    return _answers(member, model, value) and _serves(member.api, model, release)


def _answers(member: Member, model: str, value: float) -> bool:
    try:
        return member.answer(model) == value
    except Exception:
        return False


def _serves(daemon: Daemon, model: str, release: str) -> bool:
    response = daemon.get(f"/v1/models/{model}")
    return response.status_code == 200 and response.json().get("active_release") == release


@contextmanager
def running_fleet(
    tritons: Callable[[Path], RunningTriton], store: Path, root: Path, model: str, **kwargs: Any
) -> Iterator[Fleet]:
    fleet = Fleet(store=store, tritons=tritons, root=root, model=model, **kwargs)
    try:
        yield fleet
    finally:
        fleet.stop()

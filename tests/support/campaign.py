"""The fault campaign's machinery: one Triton and one daemon serving a blue-green and an inplace
model under load, and what "converged" means after each fault.

`Campaign` only observes from outside, as an operator would: the daemon's API and log, the
repository and staging on disk, Triton's answers. It kills real processes and starts them
again (the daemon on the same state, Triton on the same ports). What a fault does and what it
must leave behind is the test's (tests/integration/test_fault_campaign.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devtools.launcher import RunningTriton
from tests.conftest import TritonFactory
from tests.support.chaos import (
    LogWatch,
    TimedLoad,
    half_placed,
    kill_triton,
    release_of,
    step_reached,
)
from tests.support.daemon import Daemon, start_daemon
from tests.support.faults import Fault, Outcome
from tests.support.inference import infer_once

CONVERGE_TIMEOUT = 60.0
SETTLE_GRACE = 5.0  # two reconcile beats and a half


@dataclass(frozen=True)
class Cast:
    """The two models, their releases, and what each release answers for input 1.0."""

    blue_green: str
    inplace: str
    releases: tuple[str, ...]
    answer: Callable[[str, str], float]  # (model, release) -> OUTPUT0 for INPUT0 = 1.0
    retire_after: float

    @property
    def models(self) -> tuple[str, str]:
        return (self.blue_green, self.inplace)

    @property
    def dirs(self) -> set[str]:
        """All the repository may hold: the alias, both slots, the inplace model."""
        bg = self.blue_green
        return {bg, f"{bg}__blue", f"{bg}__green", self.inplace}

    @property
    def config(self) -> str:
        return (
            f"models:\n  {self.blue_green}:\n    strategy: blue-green\n"
            f"    retire_after_seconds: {self.retire_after}\n    drain_timeout_seconds: 2\n"
            f"  {self.inplace}:\n    strategy: inplace\n"
        )


class Campaign:
    """One Triton, one daemon (started again after each of its kills), two models, load."""

    def __init__(self, root: Path, store: Path, start_triton: TritonFactory, cast: Cast) -> None:
        self.cast = cast
        self.store = store
        self.repository = root / "repository"
        self.repository.mkdir(parents=True)
        self.state = root / "state"
        self.state.mkdir()
        self._start_triton = start_triton
        self.triton: RunningTriton = start_triton(self.repository)
        self.http = httpx.Client(timeout=10.0)  # to Triton (one client: each builds SSL state)
        self.daemons: list[Daemon] = []
        self.daemon = self.start_daemon()
        self.windows: dict[tuple[str, str], float] = {}
        self.load: TimedLoad | None = None
        self.ready_at: float | None = None  # when /readyz first answered 200 after a fault
        self.converged_at = 0.0  # when the last fault's convergence was seen

    # --- processes ------------------------------------------------------------------------

    def start_daemon(self, *, wait_ready: bool = True) -> Daemon:
        daemon = start_daemon(
            triton=self.triton,
            store=self.store,
            workdir=self.state,
            repository=self.repository,
            config=self.cast.config,
            log_name=f"daemon-{len(self.daemons)}.log",
            ready_timeout=CONVERGE_TIMEOUT,
            wait_ready=wait_ready,
        )
        self.daemons.append(daemon)
        return daemon

    def kill(self, victim: str, outcome: Outcome, *, last: bool) -> float:
        """SIGKILL the victim and start it again (the daemon: once /readyz says 200 if this
        is the fault's `last` kill); when the kill happened."""
        killed_at = time.monotonic()
        if victim == "daemon":
            self.daemon.kill()
            half = half_placed(
                self.repository, self.store, self.cast.models, alias_dirs=(self.cast.blue_green,)
            )
            if half:
                outcome.findings.append(f"half-placed dirs right after the kill: {half}")
            self.daemon = self.start_daemon(wait_ready=last)
            if last:
                outcome.ready = time.monotonic() - killed_at
        else:
            kill_triton(self.triton)
            self.triton = self._start_triton(self.repository, ports=self.triton.ports)
            outcome.down = time.monotonic() - killed_at
        return killed_at

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        for daemon in self.daemons:
            daemon.stop()
        self.http.close()

    # --- reading the daemon ---------------------------------------------------------------

    def model(self, name: str) -> dict[str, Any]:
        view: dict[str, Any] = self.daemon.get(f"/v1/models/{name}").json()
        return view

    def operation(self, operation_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.daemon.get(f"/v1/operations/{operation_id}").json()
        return dict(found["operation"])

    def running(self, views: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Operations that run, or that still hold their model's lock."""
        operations = self.daemon.get("/v1/operations?limit=100").json()["operations"]
        found = [f"{o['kind']} {o['id']}" for o in operations if o["status"] == "running"]
        views = views or {m: self.model(m) for m in self.cast.models}
        for model in self.cast.models:
            holder = views[model]["running_operation"]
            if holder is not None and not any(holder in f for f in found):
                found.append(f"{holder} holding {model}'s lock")
        return found

    def wait_cold(self, model: str, timeout: float = 30.0) -> None:
        """The model's old slot retired: a rollback must load."""
        deadline = time.monotonic() + timeout
        while (
            any(s["state"] not in ("ABSENT", "ACTIVE") for s in self.model(model)["slots"])
            or self.running()
        ):
            assert time.monotonic() < deadline, f"{model}'s old slot never retired"
            time.sleep(0.05)

    def wait_for_operation(
        self, watch: LogWatch, model: str, kinds: set[str], timeout: float
    ) -> dict[str, Any] | None:
        """The next operation of one of `kinds` on `model` the daemon starts (a retire its
        timer starts, a repair reconcile starts), once its first step has started; None if
        none started within `timeout`."""
        checked: set[str] = set()

        def matches(entry: dict[str, Any]) -> bool:
            operation_id = str(entry.get("operation_id") or "")
            if not operation_id or operation_id in checked or not step_reached(entry):
                return False
            checked.add(operation_id)
            try:
                operation = self.operation(operation_id)
            except httpx.HTTPError:
                checked.discard(operation_id)  # the API is not up yet: look again
                return False
            return bool(operation["kind"] in kinds and operation["model"] == model)

        entry = watch.wait_for(matches, timeout, every=0.01)
        return None if entry is None else self.operation(str(entry["operation_id"]))

    # --- acting ---------------------------------------------------------------------------

    def request(self, model: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST an operation, not waiting for it. Refused while another holds the model (a
        retire that just started, or one that reads succeeded but still holds the lock:
        finding F1 of the campaign's report), it is asked again, as a CI job would."""
        deadline = time.monotonic() + 30.0
        while True:
            response = self.daemon.post(f"/v1/models/{model}/{action}", {**body, "wait": False})
            if response.status_code == 202:
                return dict(response.json()["operation"])
            assert response.status_code == 409, response.text
            assert time.monotonic() < deadline, f"{action} of {model} refused: {response.text}"
            time.sleep(0.05)

    def deploy_and_wait(self, model: str, release: str) -> dict[str, Any]:
        operation = self.request(model, "deploy", {"release": release})
        done = self.daemon.wait_operation(operation["id"], timeout=60)
        assert done["status"] == "succeeded", done
        return done

    def other_release(self, model: str, pick: float) -> str:
        active = self.model(model)["active_release"]
        candidates = [r for r in self.cast.releases if r != active]
        return candidates[int(pick * len(candidates))]

    # --- convergence ----------------------------------------------------------------------

    def not_converged(self) -> str | None:
        """Why the daemon has not converged yet; None once it has: ready, nothing running,
        each model's serving dir a complete copy of its recorded release, which it answers,
        other slot dirs only warm previous releases, staging empty, no stray dirs."""
        try:
            ready = self.daemon.get("/readyz")
            if ready.status_code != 200:
                return f"/readyz {ready.status_code}: {ready.text[:400]}"
            if self.ready_at is None:
                self.ready_at = time.monotonic()
            views = {m: self.model(m) for m in self.cast.models}
            running = self.running(views)
            if running:
                return "running: " + ", ".join(running)
            for model in self.cast.models:
                why = self._model_not_converged(model, views[model])
                if why is not None:
                    return why
        except httpx.HTTPError as exc:
            return f"the daemon's API failed: {exc!r}"
        leftovers = self.daemon.staging_leftovers()
        if leftovers:
            return f"staging holds {leftovers}"
        stray = sorted(
            p.name
            for p in self.repository.iterdir()
            if p.name not in self.cast.dirs and p.is_dir()  # a file: the daemon's lock
        )
        if stray:
            return f"stray dirs in the repository: {stray}"
        return None

    def _model_not_converged(self, model: str, view: dict[str, Any]) -> str | None:
        active = view["active_release"]
        if active is None:
            return f"{model} has no active release"
        serving = view["alias_target"] if model == self.cast.blue_green else model
        if serving is None:
            return f"the alias {model} points nowhere"
        held = release_of(self.repository / serving, self.store, model)
        if held != active:
            return f"{serving} holds {held or 'no complete release'}; {active} should serve"
        slots = {s["name"]: s for s in view["slots"]}
        record = slots.get(serving)
        if record is None or (record["state"], record["release"]) != ("ACTIVE", active):
            return f"the record of {serving} is {record}, not ACTIVE {active}"
        for entry in sorted(self.repository.iterdir()):
            if entry.name in (model, serving) or not entry.name.startswith(model + "__"):
                continue
            other = slots.get(entry.name)
            warm = (
                other is not None
                and (other["state"], other["triton_state"]) == ("RETIRING", "READY")
                and release_of(entry, self.store, model) == other["release"]
            )
            if not warm:
                return f"{entry.name} is neither serving nor a warm previous release: {other}"
        try:
            answer = infer_once(self.triton.grpc_url, model)
        except Exception as exc:  # not answering yet is what this poll waits out
            return f"{model} does not answer: {str(exc)[:200]}"
        expected = self.cast.answer(model, active)
        if answer != expected:
            return f"{model} answers {answer}; {active} computes {expected}"
        return None

    def wait_converged(self, fault: Fault) -> float:
        """Poll until converged; when that was. Fails the campaign after the deadline."""
        self.ready_at = None
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        why = self.not_converged()
        while why is not None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{fault.describe()}: not converged in {CONVERGE_TIMEOUT:g} s: {why}\n"
                    f"repository: {sorted(p.name for p in self.repository.iterdir())}\n"
                    f"daemon log tail:\n{self.daemon.log()[-4000:]}"
                )
            time.sleep(0.05)
            why = self.not_converged()
        self.converged_at = time.monotonic()
        return self.converged_at

    def inconsistencies(self) -> list[str]:
        """What the daemon's records, the disk and Triton disagree on: a record that holds a
        release names a dir holding it, a record without one names no dir, no slot but the
        serving one and a warm previous one is loaded in Triton, and the previous release is
        not the active one."""
        found: list[str] = []
        bg = self.cast.blue_green
        for model in self.cast.models:
            view = self.model(model)
            if view["previous_release"] == view["active_release"]:
                found.append(f"{model}'s previous release is its active one")
            keep = {view["alias_target"] if model == bg else model}
            for slot in view["slots"]:
                name, state, release = slot["name"], slot["state"], slot["release"]
                placed = self.repository / name
                held = release_of(placed, self.store, model) if placed.is_dir() else None
                if state in ("ABSENT", "UNAVAILABLE") and placed.exists():
                    found.append(f"{name} is recorded {state}, its dir holds {held}")
                elif state not in ("ABSENT", "UNAVAILABLE") and held != release:
                    found.append(f"{name} is recorded {state} {release}, its dir holds {held}")
                if state == "RETIRING":
                    keep.add(name)
            for name in (f"{bg}__blue", f"{bg}__green") if model == bg else ():
                ready = self.http.get(f"{self.triton.http_url}/v2/models/{name}/ready")
                if name not in keep and ready.status_code == 200:
                    found.append(f"{name} is loaded in Triton, neither serving nor warm")
        return found

    def settle(self, out: Outcome) -> None:
        """Records, disk and Triton agree within a few reconcile beats of convergence."""
        deadline = time.monotonic() + SETTLE_GRACE
        found = self.inconsistencies()
        while found and time.monotonic() < deadline:
            time.sleep(0.05)
            found = self.inconsistencies()
        out.findings.extend(found)

    # --- set-up -----------------------------------------------------------------------------

    def calibrate(self) -> None:
        """Two deploys of each model at once (a first one, then a replacing one) and a retire:
        how long each step takes on this machine, which sets where in a step its kills fall."""
        bg = self.cast.blue_green
        for release in self.cast.releases[:2]:
            operations = [self.request(m, "deploy", {"release": release}) for m in self.cast.models]
            for operation in operations:
                done = self.daemon.wait_operation(operation["id"], timeout=60)
                assert done["status"] == "succeeded", done
                for step in done["steps"]:
                    self.windows[(done["model"], step["name"])] = step["duration_seconds"] or 0.0
        self.wait_cold(bg, timeout=self.cast.retire_after + 30)
        operations = self.daemon.get(f"/v1/operations?model={bg}&limit=5").json()["operations"]
        retire = next(op for op in operations if op["kind"] == "retire")
        for step in retire["steps"]:
            self.windows[(bg, step["name"])] = step["duration_seconds"] or 0.0
        self.windows[(bg, "free")] = self.windows[(bg, "unload")]

    def window(self, model: str, step: str) -> float:
        return max(self.windows.get((model, step), 0.0), 0.002)

"""The Triton driver: the only module that talks to Triton's gRPC API.

It speaks the daemon's intents (load, unload, abandon a load, point an alias, reload on CPU,
a checked inference, a stress load) and owns Triton's JSON for them (:mod:`.overrides`). The
calls are ``grpc.aio`` ones with Triton's own messages (:mod:`.protocol`), not tritonclient's
client, whose package init imports numpy. Every call has a timeout; transient failures
(UNAVAILABLE, DEADLINE_EXCEEDED) are retried with backoff by tenacity, a bounded number of
times; everything else is mapped to the project's own errors, most specific first, and never
retried. ``load`` returns only when the model is READY in the repository index, or raises with
Triton's reason; its timeout bounds the whole call, retries included, because it is what the
user waits for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from controlplane.adapters.triton import protocol
from controlplane.adapters.triton.load import closed_loop
from controlplane.adapters.triton.overrides import (
    alias_config,
    alias_target,
    cpu_only_config,
    signature_of,
)
from controlplane.adapters.triton.preflight import (
    check_outputs,
    decode_answer,
    generated_inputs,
    sample_inputs,
)
from controlplane.adapters.triton.protocol import TritonStub, request, status_of
from controlplane.adapters.triton.reachability import not_live, unreachable
from controlplane.adapters.triton.tensors import Array
from controlplane.domain.errors import (
    ControlPlaneError,
    PreflightFailed,
    TransientError,
    TritonError,
    TritonLoadFailed,
    TritonTimeout,
    TritonUnavailable,
)
from controlplane.domain.smoke import SmokeSample, check_answer
from controlplane.domain.stress import Load
from controlplane.domain.traffic import Signature
from controlplane.domain.triton import TritonState
from controlplane.ports import Clock, IndexEntry
from controlplane.timing import SystemClock, poll

log = logging.getLogger(__name__)
T = TypeVar("T")
_TRANSIENT = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
MAX_MESSAGE = 2**31 - 1  # what tritonclient allows by default
# tritonclient's keepalive defaults (its KeepAliveOptions), kept as they were: no pings unless
# asked for; a ping unanswered for 20 s drops the connection.
KEEPALIVE = (
    ("grpc.keepalive_time_ms", 2**31 - 1),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 2),
)
ABANDON_CALL = 1.0  # the unload asked for after a load timed out: sent, not waited on
# gRPC waits longer and longer between reconnects to a server that went away (up to 2 min by
# default), so a restarted Triton would be seen late; the daemon wants to know at once (a
# reconnect to a dead address is one refused connect: cheap).
RECONNECT_BACKOFF = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
# The connection :meth:`TritonDriver.connection_lost` watches carries no call: it must not be
# let go of for being idle (gRPC's default after 30 min), which would look like a lost one.
WATCH_CHANNEL = (*RECONNECT_BACKOFF, ("grpc.client_idle_timeout_ms", 2**31 - 1))
_READY = grpc.ChannelConnectivity.READY


class TritonDriver:
    def __init__(
        self,
        url: str,
        *,
        call_timeout: float = 10.0,
        load_timeout: float = 300.0,
        attempts: int = 3,
        poll_interval: float = 0.1,
        clock: Clock | None = None,
    ) -> None:
        self._url = url
        self._channel = grpc.aio.insecure_channel(url, options=_channel_args())
        self._stub = TritonStub(self._channel)
        self._watch: grpc.aio.Channel | None = None  # made by the first connection_lost()
        self._call_timeout = call_timeout
        self._load_timeout = load_timeout
        self._attempts = attempts
        self._poll_interval = poll_interval
        self._clock: Clock = clock or SystemClock()

    @property
    def url(self) -> str:
        return self._url

    async def is_live(self) -> bool:
        return await self.liveness() is None

    async def liveness(self) -> str | None:
        """None when Triton answers that it is live; else why not, with the URL and what to
        check (:mod:`.reachability`)."""
        try:
            answer = await self._stub.server_live(request("ServerLive"), timeout=self._call_timeout)
        except grpc.RpcError as exc:
            status, message = status_of(exc)
            return unreachable(self._url, status, message, timeout=self._call_timeout)
        return None if answer.live else not_live(self._url)

    async def connection_lost(self) -> None:
        """Return once a connection to Triton that was up goes down: Triton stopped or
        restarted, however quickly, seen by the kernel closing the socket, with no call made.

        A channel of its own, carrying no call, is watched: the channel the calls use would
        also change state when they fail. While no connection is up, it connects (and retries
        twice a second) first."""
        if self._watch is None:
            self._watch = grpc.aio.insecure_channel(self._url, options=list(WATCH_CHANNEL))
        channel = self._watch
        state = channel.get_state(try_to_connect=True)
        while state is not _READY:
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)
        await channel.wait_for_state_change(_READY)

    # --- model control --------------------------------------------------------------------

    async def load(self, model: str) -> None:
        await self._load(model, None)

    async def point_alias(self, alias: str, slot: str, signature: Signature) -> None:
        await self._load(alias, json.dumps(alias_config(alias, slot, signature)))

    async def reload_cpu_only(self, model: str) -> list[dict[str, object]]:
        config = cpu_only_config(await self.model_config(model))
        await self._load(model, json.dumps(config))
        groups: list[dict[str, object]] = config["instance_group"]
        return groups

    async def unload(self, model: str) -> None:
        async def call() -> None:
            await self._stub.unload(_unload_request(model), timeout=self._call_timeout)

        await self._retrying(call, what=f"unload of {model!r}")

    async def abandon(self, model: str, wait: float) -> bool:
        started = self._clock.monotonic()
        try:  # Triton answers only once the load it waits for has ended: do not wait for it
            await self._stub.unload(_unload_request(model), timeout=min(ABANDON_CALL, wait))
        except grpc.RpcError as exc:
            log.info("unload of %s after its load timed out: %s", model, status_of(exc)[1])

        async def left_loading() -> bool:
            entry = await self._entry(model)
            return entry is None or entry.state is not TritonState.LOADING

        left = max(0.0, wait - (self._clock.monotonic() - started))
        try:
            return await poll(self._clock, left_loading, every=self._poll_interval, timeout=left)
        except ControlPlaneError as exc:
            log.warning("cannot read Triton's index after abandoning %s: %s", model, exc)
            return False

    async def wait_unavailable(self, model: str, timeout: float) -> None:
        last: list[TritonState] = []

        async def gone() -> bool:
            entry = await self._entry(model)
            if entry is not None:
                last[:] = [entry.state]
            return entry is None or entry.state is TritonState.UNAVAILABLE

        if not await poll(self._clock, gone, every=self._poll_interval, timeout=timeout):
            state = last[0] if last else "held"
            raise TritonTimeout(f"{model!r} was still {state} {timeout:.0f} s after its unload")

    # --- reading ----------------------------------------------------------------------------

    async def index(self) -> list[IndexEntry]:
        # The message's own fields, not JSON of it: making JSON of it and parsing it back was
        # most of the cost of a call the reconcile loop makes several times a second. An empty
        # field is what the JSON left out.
        async def call() -> Any:
            return await self._stub.repository_index(
                request("RepositoryIndex"), timeout=self._call_timeout
            )

        raw = await self._retrying(call, what="repository index")
        return [
            IndexEntry(
                name=str(m.name),
                version=str(m.version),
                state=TritonState.parse(str(m.state)),
                reason=str(m.reason),
            )
            for m in raw.models
        ]

    async def signature(self, model: str) -> Signature:
        return signature_of(await self.model_config(model))

    async def alias_target(self, alias: str) -> str | None:
        try:
            return alias_target(await self.model_config(alias))
        except TritonError:  # not loaded (or never was): it points nowhere
            return None

    async def model_config(self, model: str) -> dict[str, Any]:
        """The config Triton is serving ``model`` with (after its own auto-completion)."""

        async def call() -> Any:
            return await self._stub.model_config(
                request("ModelConfig", name=model), timeout=self._call_timeout
            )

        raw = protocol.as_dict(await self._retrying(call, what=f"config of {model!r}"))
        config: dict[str, Any] = raw.get("config", raw)
        return config

    # --- inference ----------------------------------------------------------------------------

    async def infer(self, model: str, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """One inference (smoke checks): named inputs in, every output out."""
        message = _infer_request(model, inputs)

        async def call() -> Any:
            return await self._stub.model_infer(message, timeout=self._call_timeout)

        result = await self._retrying(call, what=f"inference on {model!r}")
        return decode_answer(model, result)

    async def smoke(self, model: str, sample: SmokeSample | None) -> dict[str, list[float]]:
        """One inference with the sample's inputs (or generated ones); the answer must hold
        every output the served config declares, none of them empty, and match the sample's
        expected values if it has any."""
        config = await self.model_config(model)
        inputs = sample_inputs(sample) if sample is not None else generated_inputs(config)
        try:
            outputs = await self.infer(model, inputs)
        except TransientError:
            raise  # Triton unreachable or slow: nothing is known about the release yet
        except PreflightFailed:
            raise  # an answer that cannot be decoded: already says which output and why
        except ControlPlaneError as exc:
            raise PreflightFailed(f"smoke inference on {model!r} failed: {exc.message}") from exc
        check_answer(
            signature_of(config).outputs, {name: array.shape for name, array in outputs.items()}
        )
        return check_outputs(outputs, sample)

    async def drive(
        self, model: str, sample: SmokeSample | None, *, concurrency: int, seconds: float
    ) -> Load:
        """The stress preflight's load (:mod:`.load`), with the smoke sample's inputs or
        inputs generated from the served config."""
        if sample is not None:
            inputs = sample_inputs(sample)
        else:
            inputs = generated_inputs(await self.model_config(model))
        message = _infer_request(model, inputs).SerializeToString()
        send, timeout = self._stub.model_infer_bytes, self._call_timeout

        async def one_request() -> None:
            await send(message, timeout=timeout)

        return await closed_loop(one_request, concurrency=concurrency, seconds=seconds)

    async def close(self) -> None:
        await self._channel.close()
        if self._watch is not None:
            await self._watch.close()

    # --- plumbing -----------------------------------------------------------------------------

    async def _entry(self, model: str) -> IndexEntry | None:
        # Triton lists one row per version; the model is READY when any version is.
        rows = [e for e in await self.index() if e.name == model]
        if not rows:
            return None
        ready = [e for e in rows if e.state is TritonState.READY]
        return ready[0] if ready else rows[0]

    async def _load(self, model: str, config_json: str | None) -> None:
        """One load (from files, or with a config override), bounded as a whole by the load
        timeout: an unreachable Triton is retried within it; a load that timed out is not
        (Triton may still be loading, and a second request would only queue behind it)."""
        deadline = self._clock.monotonic() + self._load_timeout
        limit = f"{self._load_timeout:g} s (triton.load_timeout_seconds)"

        async def call() -> None:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                raise TritonTimeout(f"load of {model!r} did not end within {limit}")
            message = request("RepositoryModelLoad", model_name=model)
            if config_json is not None:
                message.parameters["config"].string_param = config_json
            await self._stub.load(message, timeout=left)

        try:
            await self._retrying(call, what=f"load of {model!r}", load_of=model)
        except TritonTimeout as exc:
            if self._clock.monotonic() < deadline:
                raise
            raise TritonTimeout(f"load of {model!r} did not end within {limit}") from exc
        entry = await self._entry(model)
        if entry is None or entry.state is not TritonState.READY:
            state = entry.state if entry else "absent"
            reason = entry.reason if entry else ""
            raise TritonLoadFailed(
                f"Triton accepted the load of {model!r} but its index shows {state} {reason}"
            )

    async def _retrying(
        self, call: Callable[[], Awaitable[T]], *, what: str, load_of: str | None = None
    ) -> T:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception_type(
                TritonUnavailable if load_of is not None else TransientError
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                try:
                    return await call()
                except grpc.RpcError as exc:
                    raise _translate(exc, what=what, url=self._url, load_of=load_of) from exc
        raise AssertionError("unreachable: tenacity reraises the last error")


def _infer_request(model: str, inputs: Mapping[str, Array]) -> Any:
    """``ModelInferRequest`` as tritonclient built it: every input's data raw, no requested
    outputs (Triton answers with all of them)."""
    message = request("ModelInfer", model_name=model)
    for name, array in inputs.items():
        message.inputs.add(name=name, datatype=array.datatype, shape=array.shape)
        message.raw_input_contents.append(array.raw())
    return message


def _unload_request(model: str) -> Any:
    message = request("RepositoryModelUnload", model_name=model)
    message.parameters["unload_dependents"].bool_param = False  # as tritonclient asked
    return message


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's channel options (message sizes, keepalive), and quick reconnects."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        *KEEPALIVE,
        *RECONNECT_BACKOFF,
    ]


def _translate(exc: grpc.RpcError, *, what: str, url: str, load_of: str | None) -> Exception:
    status, message = status_of(exc)
    if status == "StatusCode.DEADLINE_EXCEEDED":
        return TritonTimeout(f"{what} timed out at Triton {url}: {message}")
    if status in _TRANSIENT:
        return TritonUnavailable(f"Triton at {url} is unreachable during {what}: {message}")
    if load_of is not None:
        return TritonLoadFailed(
            f"Triton failed to load {load_of!r}: {message.strip()}",
            details={"triton_status": status},
        )
    return TritonError(f"{what} failed at Triton {url}: {status} {message}")

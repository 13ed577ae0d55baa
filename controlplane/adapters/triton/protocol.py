"""Triton's gRPC protocol without tritonclient: its messages and the calls the driver makes.

The messages are built from Triton's own ``model_config.proto`` and ``grpc_service.proto``,
as tritonclient compiled them, which the build step (:mod:`.generate_protos`) wrote into
``_protos.py``; the calls are ``grpc.aio`` multicallables on one channel. tritonclient itself is
not imported at run time: any ``tritonclient.grpc`` submodule runs that package's init, which
imports numpy and ml_dtypes (21 MiB of an idle daemon). The schema is Triton's all the same, so
``config.pbtxt`` is still parsed as Triton parses it (:mod:`.model_config`).

The messages live in a pool of their own, not protobuf's default one, so that a process that
also imports tritonclient (a test, a bench) holds both without a clash.
"""

from __future__ import annotations

import base64
from typing import Any

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory

try:
    import controlplane.adapters.triton._protos as _protos
except ModuleNotFoundError as exc:  # a checkout that never ran the build step
    if exc.name != f"{__package__}._protos":
        raise
    raise ModuleNotFoundError(
        f"{__package__}._protos is missing: Triton's protocol is generated at build time from "
        "tritonclient's protos and not committed. Run `make install`, or "
        "`python -m controlplane.adapters.triton.generate_protos` in an environment with the "
        "build extra (pip install -e '.[protos]')",
        name=exc.name,
    ) from None

SERVICE = "inference.GRPCInferenceService"
TRITONCLIENT_VERSION: str = _protos.TRITONCLIENT_VERSION  # whose protos these are


def _pool() -> Any:
    pool = descriptor_pool.DescriptorPool()
    for _name, chunks in _protos.FILES:
        pool.AddSerializedFile(base64.b64decode("".join(chunks)))
    return pool


POOL = _pool()


def message(name: str) -> Any:
    """The class of Triton's message ``inference.<name>``."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"inference.{name}"))


ModelConfig = message("ModelConfig")  # config.pbtxt's schema
ModelInstanceGroup = message("ModelInstanceGroup")
ModelInferResponse = message("ModelInferResponse")
_REQUESTS = {  # each call's request message, by the call's name
    method.name: message_factory.GetMessageClass(method.input_type)
    for method in POOL.FindServiceByName(SERVICE).methods
}


def as_dict(response: Any) -> dict[str, Any]:
    """A message as the JSON tritonclient's ``as_json=True`` gave (proto field names; int64 as
    text; fields at their default left out)."""
    out: dict[str, Any] = json_format.MessageToDict(response, preserving_proto_field_name=True)
    return out


def status_of(exc: grpc.RpcError) -> tuple[str, str]:
    """A failed call's status (``StatusCode.UNAVAILABLE``...) and Triton's or gRPC's message
    (what tritonclient's ``InferenceServerException`` carried as status and message)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else None
    status = "" if code is None else str(code)
    return status, str(details or status or repr(exc))


def request(method: str, **fields: Any) -> Any:
    """The request message of ``method`` (``ServerLive``, ``ModelInfer``...), ``fields`` set."""
    return _REQUESTS[method](**fields)


class TritonStub:
    """One multicallable per call the driver makes, on ``channel``; each takes the request
    message and ``timeout=`` seconds, and raises :class:`grpc.RpcError` when it fails."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.server_live = _unary(channel, "ServerLive")
        self.model_config = _unary(channel, "ModelConfig")
        self.model_infer = _unary(channel, "ModelInfer")
        self.repository_index = _unary(channel, "RepositoryIndex")
        self.load = _unary(channel, "RepositoryModelLoad")
        self.unload = _unary(channel, "RepositoryModelUnload")
        # The stress preflight's call: a request serialized once, sent many times; the answer
        # is only waited for, never read, so it is not parsed either.
        self.model_infer_bytes = channel.unary_unary(f"/{SERVICE}/ModelInfer")


def _unary(channel: grpc.aio.Channel, method: str) -> Any:
    service = POOL.FindServiceByName(SERVICE)
    output = message_factory.GetMessageClass(service.FindMethodByName(method).output_type)
    return channel.unary_unary(
        f"/{SERVICE}/{method}",
        request_serializer=lambda request: request.SerializeToString(),
        response_deserializer=output.FromString,
    )

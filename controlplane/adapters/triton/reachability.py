"""Why Triton cannot be reached, said so that the reader knows what to check.

gRPC reports a wrong ``triton.grpc_url`` in its own words ("failed to connect to all addresses;
last error: UNKNOWN: ipv4:127.0.0.1:8001: Failed to connect to remote host: Connection
refused"). The daemon's answers (``/readyz``, a refused deploy, ``controlplane status``) and
its log say instead which address was tried, the setting that names it, the likely cause
(nothing listens there, the name does not resolve, something that is not gRPC answers, no
answer at all) and what to check. Only the wording is decided here: the driver makes the call.
"""

from __future__ import annotations

_SILENT = (
    "connections are accepted there but no gRPC answer comes (a proxy or a firewall that holds "
    "them, or a service that is not Triton)"
)
# (what gRPC's message contains, the cause in words), most specific first
_CAUSES = (
    ("Connection refused", "the connection was refused: nothing listens on that port"),
    ("Domain name not found", "the host name does not resolve"),
    ("errors resolving", "the host name does not resolve"),
    ("DNS resolution failed", "the host name does not resolve"),
    (
        "Failed parsing HTTP/2",
        "what answers there does not speak gRPC (Triton's HTTP port, 8000 by default, rather "
        "than its gRPC port?)",
    ),
    ("No route to host", "there is no route to that address"),
    ("Network is unreachable", "there is no route to that address"),
    ("before receiving SETTINGS frame", _SILENT),
    ("handshaker shutdown", _SILENT),
    ("timed out", "the connection timed out: a firewall drops it, or the address is wrong"),
)
CHECK = (
    "check that Triton runs and serves gRPC at that address (tritonserver --grpc-port, 8001 by "
    "default), or fix the setting (CONTROLPLANE_TRITON__GRPC_URL); the daemon keeps trying"
)


def unreachable(url: str, status: str, message: str, *, timeout: float) -> str:
    """The problem, for a liveness call to ``url`` that failed with gRPC ``status``."""
    if status == "StatusCode.DEADLINE_EXCEEDED":
        cause = (
            f"no answer within {timeout:g} s (triton.call_timeout_seconds): a firewall or a "
            "wrong address that drops the connection, or a Triton too busy to answer"
        )
    elif status == "StatusCode.UNAVAILABLE":
        cause = next((words for found, words in _CAUSES if found in message), message.strip())
    else:
        cause = (
            f"what answers there is not Triton's gRPC API ({status.removeprefix('StatusCode.')}: "
            f"{message.strip()[:200]})"
        )
    return f"Triton at {url} cannot be reached (triton.grpc_url): {cause}; {CHECK}"


def not_live(url: str) -> str:
    return (
        f"Triton at {url} answers but says it is not live (starting or shutting down); the "
        "daemon keeps trying"
    )

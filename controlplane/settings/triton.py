"""How the daemon reaches Triton, and how often it checks that Triton serves what it should.

``triton`` holds the gRPC endpoint (host:port: a URL there is refused with the host:port meant,
and so is a password, which would be logged with the address), the metrics endpoint, the
timeout of each kind of call and how many loads run at once; ``reconcile`` the beat of the loop
that repairs what a Triton restart or an unload behind the daemon's back changed.
"""

from __future__ import annotations

from urllib.parse import urlparse

from pydantic import Field, field_validator

from controlplane.settings.group import Group
from controlplane.settings.masking import mask_passwords


class TritonSettings(Group):
    grpc_url: str = Field(
        "localhost:8001", description="Triton's gRPC endpoint (host:port), in EXPLICIT mode."
    )
    metrics_url: str = Field(
        "http://localhost:8002/metrics", description="Triton's Prometheus metrics endpoint."
    )
    call_timeout_seconds: float = Field(
        10.0, gt=0, description="Timeout of each gRPC call other than a load."
    )
    load_timeout_seconds: float = Field(
        300.0, gt=0, description="Timeout of one model load (big models load slowly)."
    )
    unload_timeout_seconds: float = Field(
        120.0, gt=0, description="How long to wait for an unloaded model to become UNAVAILABLE."
    )
    retry_attempts: int = Field(
        3, ge=1, le=10, description="Attempts for calls that fail transiently (UNAVAILABLE)."
    )
    max_concurrent_loads: int = Field(
        4,
        ge=1,
        le=64,
        description="Loads the daemon asks of Triton at once, across models (repairs after a "
        "Triton restart included); match Triton's --model-load-thread-count (default 4): more "
        "would only queue inside Triton, where no one sees them wait.",
    )

    @field_validator("grpc_url")
    @classmethod
    def _host_port(cls, url: str) -> str:
        parsed = urlparse(url)
        if "://" in url and parsed.scheme in ("http", "https", "grpc", "grpcs"):
            raise ValueError(
                f"give host:port ({parsed.netloc.rpartition('@')[2] or 'localhost:8001'}), "
                f"not a URL: {mask_passwords(url)!r}"
            )
        if (masked := mask_passwords(url)) != url:  # it would be logged as the address
            raise ValueError(
                f"give host:port, with no user or password (Triton's gRPC endpoint takes none), "
                f"not {masked!r}"
            )
        return url


class ReconcileSettings(Group):
    interval_seconds: float = Field(
        2.0,
        gt=0,
        le=300,
        description="How often the reconcile loop compares what Triton serves with what should "
        "serve and repairs the difference (a Triton restart, a model unloaded behind the "
        "daemon's back); while Triton is down it checks every 0.1 s.",
    )

"""The REST API: the address it binds, its write and read tokens, the largest body.

Which combinations are allowed (a token off loopback, a read token only beside a write token,
the two different) is checked with the other rules that span fields, on the whole settings
(:mod:`controlplane.settings.root`).
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from controlplane.settings.group import Group


class ApiSettings(Group):
    host: str = Field(
        "127.0.0.1", description="Address the API binds; anything but loopback needs a token."
    )
    port: int = Field(8080, ge=1, le=65535, description="Port of the REST API.")
    token: SecretStr | None = Field(
        None,
        description="The write token: every mutating route needs it as a bearer token "
        "(constant-time compared, never logged); it also reads.",
    )
    read_token: SecretStr | None = Field(
        None,
        description="The read token: once set, every read (GET /v1/..., /metrics, /docs, the "
        "status page) needs it or the write token, as a bearer token or as the password of HTTP "
        "Basic (any user name); the probes /healthz and /readyz stay open. It cannot write "
        "(403). Needs api.token. Unset: reads are open.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond it)."
    )

"""The CLI's HTTP client: calls the daemon's API and turns answers into results or errors.

One command keeps one connection open for all its calls. Behind a Kubernetes Service with
several pods, each new connection may reach another pod, and an operation is known only to the
pod that runs it: a kept connection makes ``--wait``'s polls reach the pod that started it.

httpx is imported on the first call, not with the command: shell completion runs the command
at every Tab, and it never calls the daemon.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

CLIENT_HEADER = "X-Controlplane-Client"
API_VERSION = "v1"  # the paths this client calls: /v1/...


def api_path(*parts: str, **query: str | int | None) -> str:
    """A path of the API from fixed parts and names given by a user: each name is one segment
    (quoted, so '/' or '..' cannot reach another path) and the query is encoded."""
    from urllib.parse import urlencode

    path = "/" + "/".join(_segment(part) for part in parts)
    given = {key: value for key, value in query.items() if value is not None}
    return f"{path}?{urlencode(given)}" if given else path


def _segment(part: str) -> str:
    from urllib.parse import quote

    quoted = quote(part, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted  # not a dot segment


class ApiError(Exception):
    """The daemon answered with an error body."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class Unreachable(Exception):
    """The daemon could not be reached at all."""


@dataclass
class Client:
    url: str
    token: str | None
    timeout: float = 30.0
    _http: httpx.Client | None = field(default=None, repr=False)

    def _client(self) -> httpx.Client:
        import httpx

        if self._http is None:
            headers = {CLIENT_HEADER: "cli"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._http = httpx.Client(
                base_url=self.url,
                headers=headers,
                timeout=self.timeout,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            )
            atexit.register(self.close)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def get(self, path: str) -> dict[str, Any]:
        return self._call("GET", path, None)

    def post(
        self, path: str, body: dict[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """``timeout``: for an answer that may come late (a start that waits behind the
        daemon's own housekeeping); the client's own otherwise."""
        return self._call("POST", path, body, timeout)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None = None
    ) -> dict[str, Any]:
        import httpx

        waited = self.timeout if timeout is None else timeout
        try:
            response = self._client().request(method, path, json=body, timeout=waited)
        except httpx.TimeoutException as exc:
            raise Unreachable(
                f"the control plane at {self.url} did not answer within {waited:g} s ({exc}); "
                "what was asked may still go on: look with controlplane status"
            ) from exc
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach the control plane at {self.url}: {exc}") from exc
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            data = {}
        if response.status_code >= 400:
            error = data.get("error") or {}
            raise ApiError(
                response.status_code,
                str(error.get("code", "http_error")),
                str(error.get("message", response.text[:200])),
                data,
            )
        return data

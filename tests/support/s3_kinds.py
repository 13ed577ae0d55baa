"""What an idle member's request to S3 is for, as a counting proxy in front of moto sees it.

One classification for the idle-cost test (tests/integration/test_fleet_idle_cost.py) and the
idle bench (bench/fleet_idle.py), so that a kind means the same in both: each kind is one
cadence of the member (its keepalive, its poll, its full scan, its look for departed members).
SQS and SNS share the proxy (one endpoint serves every API on moto) and are no S3 requests:
they have no kind.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from tests.support.fault_proxy import SeenRequest

# The kinds an idle member makes, and the request S3 bills each as (a 304 is a GET).
BILLED_AS = {
    "beat PUT": "PUT",
    "name check GET": "GET",
    "index GET": "GET",
    "desired LIST": "LIST",
    "members LIST": "LIST",
    "releases LIST": "LIST",
}


def kind_of(request: SeenRequest, bucket: str) -> str | None:
    """What an S3 request is for (a key of :data:`BILLED_AS`, else ``"<METHOD> <key>"``);
    None for SQS and SNS."""
    if not request.path.startswith(f"/{bucket}"):
        return None
    if "list-type=2" in request.query:
        prefix = parse_qs(request.query).get("prefix", [""])[0]
        if "/_controlplane/desired/" in prefix:
            return "desired LIST"
        if "/_controlplane/members/" in prefix:
            return "members LIST"
        return "releases LIST"
    if request.method == "PUT" and "/_controlplane/members/" in request.path:
        return "beat PUT"
    if request.method == "GET" and request.path.endswith("/_controlplane/generations.json"):
        return "index GET"
    if request.method == "GET" and "/_controlplane/members/" in request.path:
        return "name check GET"  # its own beat, read before writing (every 6 keepalives)
    return f"{request.method} {request.path.removeprefix(f'/{bucket}')}"


def billed_as(kind: str) -> str:
    """The request S3 bills ``kind`` as: LIST, PUT, GET, HEAD, DELETE, ..."""
    return BILLED_AS.get(kind) or kind.split(" ", 1)[0]

"""docs/fleet.md's HAProxy config is the one the tests run: each of its directives, its
placeholders filled in, is a line of :func:`tests.support.haproxy.haproxy_config`."""

from __future__ import annotations

from pathlib import Path

from tests.support.haproxy import Member, haproxy_config
from tests.support.readme import read_blocks

DOC = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
SECTION = "HAProxy in front of the members (gRPC)"
SOCKET = Path("/tmp/haproxy-test/haproxy.sock")
PORT = 18001
MEMBERS = (Member("a", "127.0.0.1:8001", 8080), Member("b", "127.0.0.1:9001", 9080))


def _snippet() -> list[str]:
    [block] = [
        b
        for b in read_blocks(DOC.read_text(encoding="utf-8"), "docs/fleet.md")
        if b.section == SECTION
    ]
    return [line for line in block.lines if line.strip() and not line.strip().startswith("#")]


def _filled(line: str, member: Member) -> str:
    for placeholder, value in {
        "<admin socket>": str(SOCKET),
        "<listen address>": f"127.0.0.1:{PORT}",
        "<member name>": member.name,
        "<triton grpc address>": member.grpc_address,
        "<daemon api port>": str(member.health_port),
    }.items():
        line = line.replace(placeholder, value)
    return line


def test_every_directive_of_the_documented_config_is_in_the_config_the_tests_run() -> None:
    rendered = haproxy_config(MEMBERS, frontend_port=PORT, stats_socket=SOCKET).splitlines()
    snippet = _snippet()

    missing = [
        filled
        for line in snippet
        for filled in dict.fromkeys(_filled(line, member) for member in MEMBERS)
        if filled not in rendered
    ]

    assert missing == [], "\n".join(rendered)
    assert any(line.strip().startswith("server <member name>") for line in snippet)
    assert "<" not in "".join(_filled(line, MEMBERS[0]) for line in snippet)  # all filled in


def test_the_rendered_config_has_no_directive_the_documentation_leaves_out() -> None:
    documented = {_filled(line, member) for line in _snippet() for member in MEMBERS}
    rendered = haproxy_config(MEMBERS, frontend_port=PORT, stats_socket=SOCKET).splitlines()

    assert [line for line in rendered if line.strip() and line not in documented] == []

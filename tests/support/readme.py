"""The documentation's fenced code blocks as tests read them: language, section, marker,
commands. The documentation is README.md and the files under docs/, in the order of
:data:`DOCUMENTS`: command blocks run in that order, so a recipe that publishes a release comes
before one that deploys it.

A block is a fence (```` ```lang ````) and its lines. A block that tests cannot run says why in
an HTML comment on the last non-blank line before its fence::

    <!-- not run by tests: needs a Kubernetes cluster -->

Shell blocks (``sh``, ``bash``, ``shell``, ``console``) split into commands: backslash
continuations are joined and comment-only lines dropped, except ``# -> TEXT``, which says what
the command before it prints. In a ``console`` block the commands are the ``$ `` lines and the
lines after one are what it prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.settings import Settings
from tests.support.readme_servers import is_server

SHELL = ("sh", "bash", "shell", "console")
_FENCE = re.compile(r"^\s{0,3}```\s*(?P<lang>[\w+-]*)")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*not run by tests(?P<rest>.*?)-->\s*$")
_EXPECT = "# -> "

# Every document whose blocks the tests take, in the order they run; a file under docs/ that is
# not listed fails test_every_document_is_listed.
DOCUMENTS = (
    "README.md",
    "docs/store.md",
    "docs/signatures.md",
    "docs/notifications.md",
    "docs/deploys.md",
    "docs/preflight.md",
    "docs/rollback.md",
    "docs/fleet.md",
    "docs/kubernetes.md",
    "docs/helm.md",
    "docs/ci.md",
    "docs/configuration.md",
    "docs/api.md",
    "docs/cli.md",
    "docs/metrics.md",
    "docs/status-page.md",
    "docs/memory.md",
    "docs/troubleshooting.md",
    "docs/development.md",
)


@dataclass(frozen=True)
class Command:
    text: str  # one command, continuation lines joined with their backslashes
    line: int  # where it starts in its document
    expect: tuple[str, ...] = ()  # what its output must contain


@dataclass(frozen=True)
class Block:
    line: int  # the opening fence's line in its document, 1-based
    lang: str  # the fence's language, '' when it names none
    text: str
    section: str  # the heading the block sits under
    marker: str | None  # the marker's reason ('' when it gives none); None without a marker
    path: str = "README.md"  # the document, relative to the repository

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def where(self) -> str:
        return f"{self.id} ({self.lang or 'no language'}, in '{self.section}')"

    def at(self, line: int) -> str:
        """A line of this block's document, as a test names it."""
        return f"{self.path}:{line}"

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def commands(self) -> list[Command]:
        if self.lang == "console":
            return _console_commands(self)
        commands: list[Command] = []
        pending: list[str] = []
        start = 0
        for offset, raw in enumerate(self.lines, start=self.line + 1):
            stripped = raw.strip()
            if not pending:
                if stripped.startswith(_EXPECT) and commands:
                    last = commands[-1]
                    expect = (*last.expect, stripped.removeprefix(_EXPECT))
                    commands[-1] = Command(last.text, last.line, expect)
                    continue
                if not stripped or stripped.startswith("#"):
                    continue
                start = offset
            pending.append(raw)
            if not raw.rstrip().endswith("\\"):
                commands.append(Command("\n".join(pending), start))
                pending = []
        if pending:
            raise ValueError(f"{self.where}: the last command ends with a backslash")
        return commands


def _console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    for offset, raw in enumerate(block.lines, start=block.line + 1):
        if raw.startswith("$ "):
            commands.append(Command(raw[2:], offset))
        elif raw.strip() and commands:
            last = commands[-1]
            commands[-1] = Command(last.text, last.line, (*last.expect, raw.strip()))
    return commands


def read_documents(root: Path) -> list[Block]:
    """Every block of every document of :data:`DOCUMENTS` under ``root``, in running order."""
    return [
        block
        for path in DOCUMENTS
        for block in read_blocks((root / path).read_text(encoding="utf-8"), path)
    ]


def read_blocks(markdown: str, path: str = "README.md") -> list[Block]:
    """Every fenced block of the document ``path``, in order. Raises on a fence that is never
    closed."""
    blocks: list[Block] = []
    section = "(top)"
    previous = ""  # the last non-blank line outside a block
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence is None:
            heading = _HEADING.match(line)
            if heading:
                section = heading.group("title")
            if line.strip():
                previous = line
            index += 1
            continue
        start = index
        index += 1
        while index < len(lines) and not lines[index].lstrip().startswith("```"):
            index += 1
        if index == len(lines):
            raise ValueError(f"{path}:{start + 1}: this fence is never closed")
        marker = _MARKER.match(previous)
        blocks.append(
            Block(
                line=start + 1,
                lang=fence.group("lang").lower(),
                text="\n".join(lines[start + 1 : index]),
                section=section,
                marker=_reason(marker.group("rest")) if marker else None,
                path=path,
            )
        )
        previous = ""
        index += 1
    return blocks


def stray_markers(markdown: str) -> list[int]:
    """Lines of markers that no fence follows (they would mark nothing)."""
    lines = markdown.splitlines()
    stray = []
    for index, line in enumerate(lines):
        if not _MARKER.match(line):
            continue
        following = next((text for text in lines[index + 1 :] if text.strip()), "")
        if not _FENCE.match(following):
            stray.append(index + 1)
    return stray


def _reason(rest: str) -> str:
    """The text after 'not run by tests', without its colon: '' when there is none."""
    rest = rest.strip()
    return rest.removeprefix(":").strip() if rest.startswith(":") else ""


# --- which test takes a block --------------------------------------------------------------

# Kinds a test runs or checks; `kind_of` answers one of them, "text", or "unknown: <why>".
COMMANDS = "commands"  # shell, run in order against the README world
SERVERS = "servers"  # shell that starts a server: run with its section's other servers
CI_JOBS = ("github-actions", "gitlab-ci")  # their scripts run in order with the commands
CHECKED = ("settings", "alertmanager", "prometheus-rules", "kustomize-patch", "json")


def kind_of(block: Block) -> str:
    """Which test takes this block (markers aside): a kind above, 'text' or 'unknown: ...'."""
    if block.lang in SHELL:
        return SERVERS if any(is_server(c.text) for c in block.commands()) else COMMANDS
    if block.lang == "yaml":
        return _yaml_kind(yaml.safe_load(block.text))
    if block.lang in ("json", "text"):
        return block.lang
    return (
        f"unknown: the fence names no language a test knows ({block.lang!r}); "
        "use sh, yaml, json or text"
    )


def _yaml_kind(data: object) -> str:
    if isinstance(data, list) and data and all(isinstance(r, dict) and "alert" in r for r in data):
        return "prometheus-rules"
    if not isinstance(data, dict) or not data:
        return "unknown: YAML that is neither a mapping nor a list of alert rules"
    if "jobs" in data:
        return "github-actions"
    if "receivers" in data or "route" in data:
        return "alertmanager"
    if "$patch" in data:
        return "kustomize-patch"
    if all(isinstance(job, dict) and "script" in job for job in data.values()):
        return "gitlab-ci"
    if set(data) & set(Settings.model_fields):
        return "settings"
    return f"unknown: YAML with keys {sorted(data)} that no check knows"

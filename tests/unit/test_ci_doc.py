"""docs/ci.md: the URL a CI job calls, and the release names its examples deploy.

The page's table gives, for each way to install the fleet, the API Service's DNS name and the
URL to put in CONTROLPLANE_URL. Both come from the manifests here, so the page cannot drift
from them: the chart rendered with the release and namespace the table names (those of
docs/helm.md's `helm install`), and each kustomize overlay, must create a Service of that name,
in that namespace, with the API on the table's port. Every in-cluster URL elsewhere on the page
is one of the table's. Then the release names: each `RELEASE="..."` of the page, evaluated by
bash as a runner would for a sample commit, is a name the daemon accepts, and no example takes a
branch or tag name (which may hold a '/').
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import pytest

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_release_name
from tests.support.helm import NAMESPACE, RELEASE
from tests.unit.test_deploy_manifests import K8S, OVERLAYS, Obj, of_kind, render
from tests.unit.test_helm_chart import ROOT, chart

DOC = ROOT / "docs" / "ci.md"
SAMPLE_SHA = "0123456789abcdef0123456789abcdef01234567"
_URL = re.compile(r"https?://[A-Za-z0-9.-]+\.svc(?::\d+)?")
_RELEASE = re.compile(r'RELEASE="([^"]+)"')


@dataclass(frozen=True)
class Row:
    installed_with: str  # as written, backticks and all
    service: str  # name.namespace.svc
    url: str


def table() -> list[Row]:
    """The rows of the table whose last column is CONTROLPLANE_URL."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.startswith("|") and "CONTROLPLANE_URL" in line
    )
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        installed_with, service, url = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append(Row(installed_with, service.strip("`"), url.strip("`")))
    return rows


def row(words: str) -> Row:
    found = [r for r in table() if words in r.installed_with]
    assert len(found) == 1, f"docs/ci.md's table needs one row for {words}, has {len(found)}"
    return found[0]


def api_addresses(objects: list[Obj]) -> set[tuple[str, str]]:
    """(name.namespace.svc, http://name.namespace.svc:port) of each Service's api port."""
    return {
        (
            f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc",
            f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{port['port']}",
        )
        for svc in of_kind(objects, "Service")
        for port in svc["spec"]["ports"]
        if port["name"] == "api"
    }


def test_the_table_gives_the_charts_service() -> None:
    helm = row("Helm chart")
    # The release and namespace the table assumes are the ones the chart is rendered with here.
    assert f"release `{RELEASE}` in namespace `{NAMESPACE}`" in helm.installed_with
    assert api_addresses(chart()) == {(helm.service, helm.url)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_table_gives_each_overlays_service(overlay: str) -> None:
    kustomize = row("kustomize overlays")
    assert overlay in kustomize.installed_with
    assert api_addresses(render(K8S / "overlays" / overlay)) == {(kustomize.service, kustomize.url)}


def test_every_in_cluster_url_on_the_page_is_one_of_the_tables() -> None:
    urls = {r.url for r in table()}
    used = set(_URL.findall(DOC.read_text(encoding="utf-8")))
    assert used - urls == set(), "docs/ci.md calls a Service its table does not give"
    assert urls <= used


# --- release names -------------------------------------------------------------------------------


def evaluated(expression: str) -> str:
    """What a CI runner's bash makes of RELEASE="expression" for a commit SAMPLE_SHA."""
    done = subprocess.run(
        ["bash", "-c", f'RELEASE="{expression}"; printf %s "$RELEASE"'],
        env={"GITHUB_SHA": SAMPLE_SHA, "CI_COMMIT_SHA": SAMPLE_SHA, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return done.stdout


def test_every_release_name_of_the_examples_is_valid() -> None:
    expressions = set(_RELEASE.findall(DOC.read_text(encoding="utf-8")))
    # GitHub's and GitLab's, each in its job and in the text on publishing.
    assert len(expressions) >= 2
    for expression in sorted(expressions):
        name = evaluated(expression)
        assert name == f"r-{SAMPLE_SHA[:12]}", expression
        assert validate_release_name(name) == name


def test_no_example_takes_a_branch_or_tag_name_as_the_release() -> None:
    text = DOC.read_text(encoding="utf-8")
    for variable in ("github.ref_name", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "CI_COMMIT_TAG"):
        assert variable not in text
    # What the page says a branch name does.
    with pytest.raises(InvalidName):
        validate_release_name("feature/x")

"""deploy/k8s and the Dockerfile: what an operator relies on, read from the rendered manifests.

``make deploy-check`` (deploy/k8s/check.sh) lints the Dockerfile, validates every rendered
object against the Kubernetes schemas and runs promtool on the PrometheusRule. It cannot know
what the daemon needs, and kubernetes-validate has no schema for the Prometheus Operator's CRDs
(it only warns about them). So each overlay is rendered here with ``kubectl kustomize``, as
``kubectl apply -k`` would, and checked for what a wrong edit breaks quietly: a fleet that
rolls, drains and scales without ever losing its last serving pod, no pod state that a
replacement pod would miss, the shared volume that makes placement atomic, the process namespace
of the residue audit, secrets never written as literals, settings the daemon accepts, and
monitoring objects that point at real ports.

kubectl is the 1.32 that ``make install`` puts in the venv (tests/support/kubectl.py); without
it the tests fail, never skip. Rendering must print nothing on stderr: kustomize's deprecation
warnings are failures too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from controlplane.settings import ENV_PREFIX, Settings, load_settings
from tests.support.kubectl import K8S_VERSION, kubectl, kustomize

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
RULES = ROOT / "deploy" / "monitoring" / "rules.yml"
OVERLAYS = ("local-store", "s3")
# Kustomize Components an overlay may opt into, each rendered over every overlay.
COMPONENTS = ("hpa", "read-token")
NAMESPACE = "triton"

# Prometheus Operator kinds: no schema in kubernetes-validate, so their shape is checked here.
CRDS = {
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "AlertmanagerConfig": "monitoring.coreos.com/v1alpha1",
}
RBAC = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD")
READ_TOKEN = f"{ENV_PREFIX}API__READ_TOKEN"
# The client side of the CLI reads these; the daemon's settings do not.
CLI_ENV = {"CONTROLPLANE_URL", "CONTROLPLANE_TOKEN"}
# The fleet's settings group comes with issue 12's fleet branch. Until this branch's Settings has
# it, the pod's fleet variables are not checked against it (the daemon ignores them meanwhile);
# once it has, they are checked like every other.
FLEET_ENV_PREFIX = f"{ENV_PREFIX}FLEET__"


class _Loader(yaml.SafeLoader):
    """Go's YAML writes the string "=" bare; PyYAML would read it as its `value` tag."""


def _plain_string(loader: _Loader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:value", _plain_string)

Obj = dict[str, Any]


# --- rendering ---------------------------------------------------------------------------------


def render(directory: Path) -> list[Obj]:
    done = kustomize(directory)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    # A deprecated field, a patch that matches nothing: kustomize says so on stderr and renders.
    assert done.stderr == "", f"kubectl kustomize {directory} warns:\n{done.stderr}"
    return [doc for doc in yaml.load_all(done.stdout, Loader=_Loader) if doc]


def with_component(overlay: str, component: str, workdir: Path) -> Path:
    """A user's kustomization: the shipped overlay plus an opt-in component."""
    workdir.mkdir(parents=True, exist_ok=True)
    relative = {
        "resources": [os.path.relpath(K8S / "overlays" / overlay, workdir)],
        "components": [os.path.relpath(K8S / "components" / component, workdir)],
    }
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump({**kustomization, **relative}))
    return workdir


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    name: str = request.param
    return name, render(K8S / "overlays" / name)


@pytest.fixture(scope="module", params=[(o, c) for o in OVERLAYS for c in COMPONENTS])
def composed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[Obj]]:
    """An overlay with a component: (component, rendered objects)."""
    overlay_name, component = request.param
    workdir = tmp_path_factory.mktemp(f"{overlay_name}-{component}")
    return component, render(with_component(overlay_name, component, workdir))


@pytest.fixture(scope="module", params=OVERLAYS)
def autoscaled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[Obj]]:
    """An overlay with components/hpa: ("hpa", rendered objects)."""
    overlay_name: str = request.param
    workdir = tmp_path_factory.mktemp(f"{overlay_name}-hpa")
    return "hpa", render(with_component(overlay_name, "hpa", workdir))


@pytest.fixture(scope="module", params=OVERLAYS)
def read_tokened(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[Obj]:
    """An overlay with components/read-token."""
    overlay_name: str = request.param
    workdir = tmp_path_factory.mktemp(f"{overlay_name}-read-token")
    return render(with_component(overlay_name, "read-token", workdir))


@pytest.fixture(scope="module")
def objects(overlay: tuple[str, list[Obj]]) -> list[Obj]:
    return overlay[1]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[Obj], kind: str) -> Obj:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod(objects: list[Obj]) -> Obj:
    spec: Obj = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def pod_labels(objects: list[Obj]) -> dict[str, str]:
    labels: dict[str, str] = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def container(objects: list[Obj], name: str) -> Obj:
    found: list[Obj] = [c for c in pod(objects)["containers"] if c["name"] == name]
    assert len(found) == 1, f"expected one container {name}, found {len(found)}"
    return found[0]


def all_containers(objects: list[Obj]) -> Iterator[Obj]:
    spec = pod(objects)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env(c: Obj) -> dict[str, Obj]:
    return {var["name"]: var for var in c.get("env", [])}


def literal_env(c: Obj) -> dict[str, str]:
    return {name: var["value"] for name, var in env(c).items() if "value" in var}


def volume(objects: list[Obj], name: str) -> Obj:
    found: list[Obj] = [v for v in pod(objects)["volumes"] if v["name"] == name]
    assert len(found) == 1, f"expected one volume {name}, found {len(found)}"
    return found[0]


def mount_of(c: Obj, path: str) -> Obj | None:
    """The mount a path lives on in container `c`: the deepest mountPath above it."""
    candidates = [
        m
        for m in c.get("volumeMounts", [])
        if PurePosixPath(path).is_relative_to(PurePosixPath(m["mountPath"]))
    ]
    return max(candidates, key=lambda m: len(m["mountPath"]), default=None)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


# --- the pod -----------------------------------------------------------------------------------


def test_the_pod_runs_triton_and_the_controlplane_sidecar(objects: list[Obj]) -> None:
    # A set: kustomize's patches may reorder the containers.
    assert {c["name"] for c in pod(objects)["containers"]} == {"tritonserver", "controlplane"}
    assert len(pod(objects)["containers"]) == 2


# --- the fleet ---------------------------------------------------------------------------------


def test_the_fleet_runs_more_than_one_pod(objects: list[Obj]) -> None:
    # One pod would make every drain, eviction and crash an outage.
    assert one(objects, "Deployment")["spec"]["replicas"] > 1


def test_a_rollout_never_takes_a_serving_pod_away_before_its_replacement_serves(
    objects: list[Obj],
) -> None:
    spec = one(objects, "Deployment")["spec"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    rolling = spec["strategy"]["rollingUpdate"]
    # No old pod goes before a new one is available; a new one is added first.
    assert rolling["maxUnavailable"] in (0, "0%")
    assert rolling["maxSurge"] not in (0, "0%")
    # "Available" means ready for a while, so a pod that turns ready and falls over stops it.
    assert spec.get("minReadySeconds", 0) > 0
    # Ready means the sidecar says this pod serves the fleet's desired releases.
    probe = container(objects, "controlplane")["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    # Long enough for a new pod to pull Triton and load every release, or the rollout "fails".
    assert spec.get("progressDeadlineSeconds", 600) >= 600


def test_a_terminating_pod_finishes_its_requests(objects: list[Obj]) -> None:
    spec = pod(objects)
    triton = container(objects, "tritonserver")
    # Clients stop being sent to a terminating pod only after it is told to stop: Triton keeps
    # taking requests for a moment, then its exit timeout lets the in-flight ones finish.
    pause = triton["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    exit_timeout = next(
        int(a.split("=", 1)[1]) for a in triton["args"] if a.startswith("--exit-timeout-secs=")
    )
    assert spec["terminationGracePeriodSeconds"] > int(pause[1]) + exit_timeout


def test_each_pod_names_itself_in_the_fleet(objects: list[Obj]) -> None:
    member = env(container(objects, "controlplane"))["CONTROLPLANE_FLEET__MEMBER"]
    # The pod's own name: unique in the namespace, new for every replacement pod.
    assert member["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_each_pod_says_where_the_others_wake_it_and_lets_them(objects: list[Obj]) -> None:
    variables = env(container(objects, "controlplane"))
    assert variables["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    url = variables["CONTROLPLANE_FLEET__ADVERTISE_URL"]["value"]
    port = next(
        p["containerPort"]
        for p in container(objects, "controlplane")["ports"]
        if p["name"] == "api"
    )
    assert url == f"http://$(POD_IP):{port}"
    # Kubernetes expands $(POD_IP) only from a variable defined before it.
    names = [e["name"] for e in container(objects, "controlplane")["env"]]
    assert names.index("POD_IP") < names.index("CONTROLPLANE_FLEET__ADVERTISE_URL")
    api_rule = next(
        r
        for r in one(objects, "NetworkPolicy")["spec"]["ingress"]
        if {"port": port, "protocol": "TCP"} in r["ports"]
    )
    peers = [f["podSelector"]["matchLabels"] for f in api_rule["from"] if set(f) == {"podSelector"}]
    assert any(selects(labels, pod_labels(objects)) for labels in peers), peers


def claims_mounted(objects: list[Obj], c: Obj) -> dict[str, Obj]:
    """mountPath -> the PersistentVolumeClaim object behind it, in container `c`."""
    claims = {pvc["metadata"]["name"]: pvc for pvc in of_kind(objects, "PersistentVolumeClaim")}
    mounted = {}
    for mount in c.get("volumeMounts", []):
        source = volume(objects, mount["name"]).get("persistentVolumeClaim")
        if source is not None:
            assert source["claimName"] in claims, f"{source['claimName']} is no claim shipped"
            mounted[mount["mountPath"]] = claims[source["claimName"]]
    return mounted


def test_no_pod_keeps_state_on_a_claim_of_its_own(overlay: tuple[str, list[Obj]]) -> None:
    name, objects = overlay
    store = {"local-store": {"/store"}, "s3": set()}[name]
    for c in all_containers(objects):
        claims = claims_mounted(objects, c)
        # The one claim is the model store that the whole fleet shares; nothing per pod.
        assert claims.keys() <= store, f"{c['name']} mounts {sorted(claims)}"
        for path, claim in claims.items():
            assert claim["spec"]["accessModes"] == ["ReadWriteMany"], path
    assert len(of_kind(objects, "PersistentVolumeClaim")) == len(store)


def test_the_journal_lives_and_dies_with_the_pod(objects: list[Obj]) -> None:
    sidecar = container(objects, "controlplane")
    database = literal_env(sidecar)["CONTROLPLANE_DATABASE__PATH"]
    # SQLite's -wal and -shm files go beside the database, on the same volume.
    mount = mount_of(sidecar, str(PurePosixPath(database).parent))
    assert mount is not None, f"{database} is on the read-only root filesystem"
    assert not mount.get("readOnly")
    journal = volume(objects, mount["name"])
    assert "emptyDir" in journal, journal
    assert journal["emptyDir"].get("medium") != "Memory", "the journal would count as memory"
    assert journal["emptyDir"].get("sizeLimit"), "an unbounded journal could fill the node"
    # Not on the models volume either: that one is sized for releases.
    assert mount["name"] != "models"


def test_triton_runs_explicit_non_strict_on_the_shared_repository(objects: list[Obj]) -> None:
    triton = container(objects, "tritonserver")
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:2[45]\.\d\d-py3", triton["image"])
    args = triton.get("command", []) + triton["args"]
    for expected in (
        "--model-control-mode=explicit",
        "--strict-readiness=false",
        "--model-load-retry-count=0",
        "--exit-on-error=false",
        "--metrics-port=8002",
    ):
        assert expected in args, f"tritonserver is not started with {expected}"
    assert any(arg.startswith("--model-load-thread-count=") for arg in args)
    (repository,) = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
    mount = mount_of(triton, repository)
    assert mount is not None, f"{repository} is on no volume of tritonserver"
    assert mount["name"] == "models"
    assert "emptyDir" in volume(objects, "models")

    variables = literal_env(triton)
    assert "libtcmalloc" in variables["LD_PRELOAD"]
    assert float(variables["TCMALLOC_RELEASE_RATE"]) > 0
    assert int(triton["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def test_repository_and_staging_share_one_emptydir_in_both_containers(objects: list[Obj]) -> None:
    triton, sidecar = container(objects, "tritonserver"), container(objects, "controlplane")
    settings = literal_env(sidecar)
    repository = settings["CONTROLPLANE_REPOSITORY__PATH"]
    staging = settings["CONTROLPLANE_STAGING__PATH"]
    triton_repository = next(
        a.split("=", 1)[1] for a in triton["args"] if a.startswith("--model-repository=")
    )
    assert repository == triton_repository, "the sidecar places models where Triton looks"
    assert not PurePosixPath(staging).is_relative_to(PurePosixPath(repository))
    # rename(2) from staging into the repository is atomic only inside one filesystem.
    mounts = [
        mount_of(triton, repository),
        mount_of(sidecar, repository),
        mount_of(sidecar, staging),
    ]
    assert all(m is not None for m in mounts)
    assert {(m["name"], m["mountPath"]) for m in mounts if m} == {("models", "/models")}
    assert not any(m.get("readOnly") for m in mounts if m)
    assert "emptyDir" in volume(objects, "models")
    # Triton needs its repository dir at start; an init container creates both before either
    # container starts.
    (init,) = pod(objects)["initContainers"]
    assert {repository, staging} <= set(init["command"])
    assert mount_of(init, repository) == {"name": "models", "mountPath": "/models"}


def test_the_residue_audit_can_see_tritons_processes(objects: list[Obj]) -> None:
    spec = pod(objects)
    assert spec["shareProcessNamespace"] is True
    # Same non-root uid in both containers: /proc/<pid>/fd of Triton is readable without
    # CAP_SYS_PTRACE; and both see the same /dev/shm, where the Python backend's segments live.
    default_uid = spec["securityContext"].get("runAsUser")
    uids = {
        c["name"]: c.get("securityContext", {}).get("runAsUser", default_uid)
        for c in spec["containers"]
    }
    assert len(set(uids.values())) == 1, uids
    # Set explicitly: left to the images, Triton's would run as root.
    assert None not in uids.values(), uids
    assert 0 not in uids.values(), uids
    for c in spec["containers"]:
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]
        shm = mount_of(c, "/dev/shm")
        assert shm is not None, c["name"]
        assert shm["name"] == "dshm", c["name"]


def test_every_container_has_probes_and_resources(objects: list[Obj]) -> None:
    for c in pod(objects)["containers"]:
        ports = {p["name"] for p in c.get("ports", [])}
        for probe in ("livenessProbe", "readinessProbe"):
            assert probe in c, f"{c['name']} has no {probe}"
            port = c[probe]["httpGet"]["port"]
            assert port in ports or isinstance(port, int), f"{c['name']} {probe} port {port}"
    for c in all_containers(objects):
        resources = c.get("resources", {})
        assert {"cpu", "memory"} <= resources.get("requests", {}).keys(), c["name"]
        assert "memory" in resources.get("limits", {}), c["name"]

    def paths(name: str) -> tuple[str, str]:
        c = container(objects, name)
        return c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]

    assert paths("controlplane") == ("/healthz", "/readyz")
    assert paths("tritonserver") == ("/v2/health/live", "/v2/health/ready")


def test_no_secret_is_written_as_a_literal(objects: list[Obj]) -> None:
    assert not of_kind(objects, "Secret"), "Secrets are created with kubectl, never shipped"
    for c in all_containers(objects):
        for name, var in env(c).items():
            if any(word in name.upper() for word in SECRET_WORDS):
                assert "value" not in var, f"{c['name']}: {name} has a literal value"
                assert "secretKeyRef" in var.get("valueFrom", {}), f"{c['name']}: {name}"
        assert "envFrom" not in c or all("configMapRef" not in e for e in c["envFrom"])
    token = env(container(objects, "controlplane"))["CONTROLPLANE_API__TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "controlplane-api", "key": "token"}


def test_the_sidecar_is_locked_down_and_writes_only_to_volumes(objects: list[Obj]) -> None:
    spec = pod(objects)
    sidecar = container(objects, "controlplane")
    context = sidecar["securityContext"]
    assert context.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot")) is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]

    settings = literal_env(sidecar)
    database_dir = str(PurePosixPath(settings["CONTROLPLANE_DATABASE__PATH"]).parent)
    for path in (
        settings["CONTROLPLANE_REPOSITORY__PATH"],
        settings["CONTROLPLANE_STAGING__PATH"],
        database_dir,  # SQLite's -wal and -shm files go beside the database
        "/tmp",
    ):
        mount = mount_of(sidecar, path)
        assert mount is not None, f"{path} is on the read-only root filesystem"
        assert not mount.get("readOnly"), f"{path} is on a read-only mount"


FIELD_SAMPLES = {"metadata.name": "triton-7d9f8b6c4-x2k8p", "status.podIP": "10.42.0.17"}


def test_the_settings_the_pod_gives_are_ones_the_daemon_accepts(
    objects: list[Obj], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sidecar = container(objects, "controlplane")
    args = sidecar["args"]
    assert args[0] == "serve"
    config_path = PurePosixPath(args[args.index("--config") + 1])
    mount = mount_of(sidecar, str(config_path))
    assert mount is not None
    assert mount.get("readOnly") is True
    config_map_name = volume(objects, mount["name"])["configMap"]["name"]
    (config_map,) = [
        c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == config_map_name
    ]
    key = str(config_path.relative_to(mount["mountPath"]))
    config_file = tmp_path / "controlplane.yaml"
    config_file.write_text(config_map["data"][key])

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    given: dict[str, str] = {}  # as the kubelet sets them, $(NAME) expanded from earlier ones
    for name, var in env(sidecar).items():
        source = var.get("valueFrom", {})
        field_path = source.get("fieldRef", {}).get("fieldPath")
        secret = source.get("secretKeyRef")
        # One value per key of a Secret: the write and the read token differ, as they must.
        sample = (
            f"from-{secret['name']}-{secret['key']}"
            if secret
            else FIELD_SAMPLES.get(field_path, "from-a-secret")
        )
        given[name] = re.sub(
            r"\$\((\w+)\)", lambda m: given.get(m[1], m[0]), var.get("value", sample)
        )
        if not name.startswith(ENV_PREFIX) or name in CLI_ENV:
            continue
        if name.startswith(FLEET_ENV_PREFIX) and "fleet" not in Settings.model_fields:
            continue
        assert known_setting(name), f"{name} names no setting: the daemon would ignore it"
        monkeypatch.setenv(name, given[name])
    settings = load_settings(config_file)
    assert str(settings.repository.path) == "/models/repository"
    assert settings.api.host == "0.0.0.0"
    assert settings.api.token is not None
    assert (settings.api.read_token is not None) == (READ_TOKEN in given)
    assert settings.fleet_url == f"http://10.42.0.17:{settings.api.port}"  # the others wake it


def known_setting(variable: str) -> bool:
    group, _, field = variable.removeprefix(ENV_PREFIX).lower().partition("__")
    info = Settings.model_fields.get(group)
    if info is None or not isinstance(info.annotation, type):
        return False
    if not issubclass(info.annotation, BaseModel):
        return False
    return field in info.annotation.model_fields


def test_images_are_tagged_and_the_overlay_sets_the_sidecars(objects: list[Obj]) -> None:
    for c in all_containers(objects):
        image = c["image"]
        assert ":" in image.rsplit("/", 1)[-1], f"{image} has no tag"
        assert not image.endswith(":latest"), image
    sidecar = container(objects, "controlplane")["image"]
    assert re.fullmatch(r"ghcr\.io/[\w.-]+/controlplane:[\w.-]+", sidecar)
    assert {c["image"] for c in pod(objects)["initContainers"]} == {sidecar}


# --- around the pod ----------------------------------------------------------------------------


def test_the_service_account_has_no_token_and_no_permissions(objects: list[Obj]) -> None:
    account = one(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    spec = pod(objects)
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec.get("automountServiceAccountToken", False) is False
    assert not [obj["kind"] for obj in objects if obj["kind"] in RBAC]


def test_the_service_exposes_triton_and_the_api(objects: list[Obj]) -> None:
    service = one(objects, "Service")
    assert selects(service["spec"]["selector"], pod_labels(objects))
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {name: p["port"] for name, p in ports.items()} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "api": 8080,
    }
    container_ports = {
        p["name"]: p["containerPort"] for c in pod(objects)["containers"] for p in c["ports"]
    }
    for name, port in ports.items():
        assert container_ports[port["targetPort"]] == port["port"], name


def test_the_network_policy_opens_the_api_only_to_named_clients(objects: list[Obj]) -> None:
    policy = one(objects, "NetworkPolicy")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod_labels(objects))
    assert policy["policyTypes"] == ["Ingress"]
    open_ports: set[int] = set()
    api_peers: list[Obj] = []
    for rule in policy["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        assert ports, "a rule without ports opens every port"
        if not rule.get("from"):
            open_ports |= ports
        elif 8080 in ports:
            api_peers.extend(rule["from"])
    assert open_ports == {8000, 8001, 8002}, "Triton's ports are open to clients, 8080 is not"
    assert api_peers
    for peer in api_peers:
        # A pod label always, and a namespace label for another namespace: no peer admits a
        # whole namespace or the cluster. One without a namespace is this one's: only the
        # fleet's own pods (they wake each other).
        assert peer["podSelector"]["matchLabels"], peer
        assert "ipBlock" not in peer
        if "namespaceSelector" in peer:
            assert peer["namespaceSelector"]["matchLabels"], peer
        else:
            assert selects(peer["podSelector"]["matchLabels"], pod_labels(objects)), peer
    names = {peer["podSelector"]["matchLabels"].get("app.kubernetes.io/name") for peer in api_peers}
    assert {"alertmanager", "prometheus"} <= names
    assert any("controlplane-api-client" in p["podSelector"]["matchLabels"] for p in api_peers)


def test_drains_take_one_pod_at_a_time_and_are_never_blocked(objects: list[Obj]) -> None:
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert selects(budget["selector"]["matchLabels"], pod_labels(objects))
    # One eviction at a time, whatever the fleet's size; minAvailable equal to the replica
    # count (or maxUnavailable 0) would make every drain wait for a person.
    assert budget["maxUnavailable"] == 1
    assert "minAvailable" not in budget
    # A pod that is not ready serves nothing: evicting it never waits for the budget.
    assert budget.get("unhealthyPodEvictionPolicy") == "AlwaysAllow"


# --- monitoring --------------------------------------------------------------------------------


def test_the_operator_kinds_are_the_expected_versions(objects: list[Obj]) -> None:
    for kind, api_version in CRDS.items():
        assert one(objects, kind)["apiVersion"] == api_version


def test_the_service_monitor_scrapes_triton_and_the_daemon(objects: list[Obj]) -> None:
    monitor = one(objects, "ServiceMonitor")["spec"]
    service = one(objects, "Service")
    assert selects(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    endpoints = {e["port"]: e for e in monitor["endpoints"]}
    assert endpoints.keys() == {"metrics", "api"}
    assert all(e["path"] == "/metrics" for e in endpoints.values())
    # GpuOverload averages nv_gpu_utilization over 10 s: several samples must land in it.
    assert duration_seconds(endpoints["metrics"]["interval"]) <= 5
    # The daemon's target gets the job that ControlplaneDown and ControlplaneAbsent select.
    rules = {r.get("alert"): r["expr"] for group in rule_groups() for r in group["rules"]}
    job = {"action": "replace", "targetLabel": "job", "replacement": "controlplane"}
    assert job in endpoints["api"]["relabelings"]
    assert 'up{job="controlplane"}' in rules["ControlplaneDown"]
    assert 'up{job="controlplane"}' in rules["ControlplaneAbsent"]
    assert "relabelings" not in endpoints["metrics"]  # Triton's metrics keep their own job


def duration_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert match, text
    return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60}[match[2]]


def rule_groups() -> list[Obj]:
    groups: list[Obj] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def test_the_prometheus_rule_carries_deploy_monitoring_rules() -> None:
    resource = yaml.safe_load((K8S / "base" / "prometheusrule.yaml").read_text())
    assert resource["spec"]["groups"] == rule_groups(), (
        "deploy/k8s/base/prometheusrule.yaml differs from deploy/monitoring/rules.yml: "
        "run deploy/k8s/check.sh sync-rules"
    )


def squeezed(groups: list[Obj]) -> list[Obj]:
    """The groups with runs of whitespace in each expr made one space (PromQL ignores them)."""
    return [
        {
            **group,
            "rules": [{**rule, "expr": " ".join(rule["expr"].split())} for rule in group["rules"]],
        }
        for group in groups
    ]


def test_the_rendered_prometheus_rule_is_the_same_rules(objects: list[Obj]) -> None:
    # kustomize v5's YAML library (go-yaml v3) adds a blank line to a folded (>-) scalar whose
    # lines are more indented, as in the rollback and residue exprs; kustomize v2 does not.
    spec = one(objects, "PrometheusRule")["spec"]
    assert squeezed(spec["groups"]) == squeezed(rule_groups())


def test_alertmanager_calls_the_webhook_with_the_api_token(objects: list[Obj]) -> None:
    config = one(objects, "AlertmanagerConfig")["spec"]
    service = one(objects, "Service")["metadata"]
    namespace = service["namespace"]
    route = config["route"]
    (receiver,) = [r for r in config["receivers"] if r["name"] == route["receiver"]]
    (webhook,) = receiver["webhookConfigs"]
    assert webhook["url"] in {
        f"http://{service['name']}.{namespace}.svc:8080/v1/alerts",
        f"http://{service['name']}.{namespace}.svc.cluster.local:8080/v1/alerts",
    }
    authorization = webhook["httpConfig"]["authorization"]
    assert authorization.get("type", "Bearer") == "Bearer"
    api_token = env(container(objects, "controlplane"))["CONTROLPLANE_API__TOKEN"]
    assert authorization["credentials"] == api_token["valueFrom"]["secretKeyRef"]
    rules = one(objects, "PrometheusRule")["spec"]["groups"]
    alerts = {rule.get("alert") for group in rules for rule in group["rules"]}
    routed = {m["value"] for m in route["matchers"] if m["name"] == "alertname"}
    assert routed, "the route sends every alert of the namespace to the webhook"
    assert routed <= alerts, f"the route names alerts no rule raises: {routed - alerts}"


# --- the overlays ------------------------------------------------------------------------------


def test_every_object_lands_in_the_overlays_namespace(objects: list[Obj]) -> None:
    for obj in objects:
        assert obj["metadata"].get("namespace") == NAMESPACE, obj["kind"]


def test_the_overlay_sets_its_store(overlay: tuple[str, list[Obj]]) -> None:
    name, objects = overlay
    sidecar = container(objects, "controlplane")
    variables = env(sidecar)
    uri = variables["CONTROLPLANE_STORE__URI"]["value"]
    if name == "s3":
        assert re.fullmatch(r"s3://[a-z0-9.-]+(/[\w./-]*)?", uri), uri
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            ref = variables[key]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "controlplane-s3", key
            assert not ref.get("optional"), key
    else:
        assert uri == "file:///store"
        mount = mount_of(sidecar, "/store")
        assert mount is not None
        assert mount["mountPath"] == "/store"
        # The sidecar writes the fleet's records under /store/_controlplane/.
        assert not mount.get("readOnly"), "the store must be writable by the sidecar"
        source = volume(objects, mount["name"])["persistentVolumeClaim"]
        assert not source.get("readOnly")
        (claim,) = [
            pvc
            for pvc in of_kind(objects, "PersistentVolumeClaim")
            if pvc["metadata"]["name"] == source["claimName"]
        ]
        # Every pod, on any node, mounts it at once.
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


# --- rendering with the current kubectl --------------------------------------------------------


def test_the_kubectl_that_renders_is_1_32_with_kustomize_v5() -> None:
    done = subprocess.run(
        [kubectl(), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    version = json.loads(done.stdout)
    client = version["clientVersion"]
    assert f"{client['major']}.{client['minor']}" == K8S_VERSION.rsplit(".", 1)[0]
    assert version["kustomizeVersion"].startswith("v5.")


@pytest.mark.parametrize("target", [*OVERLAYS, *(f"{o}+{c}" for o in OVERLAYS for c in COMPONENTS)])
def test_rendering_prints_nothing_on_stderr(target: str, tmp_path: Path) -> None:
    overlay_name, _, component = target.partition("+")
    directory = (
        with_component(overlay_name, component, tmp_path)
        if component
        else K8S / "overlays" / overlay_name
    )

    done = kustomize(directory)

    assert done.returncode == 0, done.stderr
    assert done.stdout
    # Deprecated fields (bases, patchesStrategicMerge, commonLabels...) warn here first.
    assert done.stderr == ""


# --- the autoscaler (components/hpa) -----------------------------------------------------------


def test_overlays_do_not_autoscale_unless_asked(objects: list[Obj]) -> None:
    assert not of_kind(objects, "HorizontalPodAutoscaler")


def test_the_autoscaler_scales_the_fleet_on_tritons_queue(
    autoscaled: tuple[str, list[Obj]],
) -> None:
    _component, objects = autoscaled
    deployment = one(objects, "Deployment")
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    # Never down to the single pod a drain or a rollout would take away.
    assert spec["minReplicas"] >= 2
    assert spec["maxReplicas"] > spec["minReplicas"]
    # The autoscaler owns the count: `kubectl apply` must not reset it to the manifest's.
    assert "replicas" not in deployment["spec"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "Pods"
    # A Triton metric the ServiceMonitor scrapes, by the name Triton gives it.
    assert metric["pods"]["metric"]["name"].startswith("nv_inference_")
    assert metric["pods"]["target"]["type"] == "AverageValue"
    # New pods take minutes to serve: one at a time, and scaling down waits longer still.
    behavior = spec["behavior"]
    assert all(p["value"] == 1 for p in behavior["scaleUp"]["policies"] if p["type"] == "Pods")
    assert (
        behavior["scaleDown"]["stabilizationWindowSeconds"]
        > behavior["scaleUp"]["stabilizationWindowSeconds"]
    )
    # The rest of the fleet's promises hold with the component too.
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] in (0, "0%")


def test_each_component_validates_against_the_kubernetes_schemas(
    composed: tuple[str, list[Obj]],
) -> None:
    _component, objects = composed
    for obj in objects:
        if obj["kind"] in CRDS:
            continue  # no schema; the component's own tests check them
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")


# --- the read token (components/read-token) ------------------------------------------------------


def read_token_reference(objects: list[Obj]) -> Obj | None:
    """The Secret key the sidecar's read token comes from, None without one; every ServiceMonitor
    endpoint of the daemon's must send that same key, and only those endpoints."""
    variable = env(container(objects, "controlplane")).get(READ_TOKEN)
    endpoints = [e for m in of_kind(objects, "ServiceMonitor") for e in m["spec"]["endpoints"]]
    # Other ways Prometheus could authenticate: none is used, so none can drift.
    assert not [e for e in endpoints if {"basicAuth", "bearerTokenSecret", "oauth2"} & set(e)]
    if variable is None:
        assert [e for e in endpoints if "authorization" in e] == []
        return None
    assert "value" not in variable, f"{READ_TOKEN} has a literal value"
    reference: Obj = variable["valueFrom"]["secretKeyRef"]
    assert set(reference) == {"name", "key"}, "an optional read token could leave reads open"
    write = env(container(objects, "controlplane"))[f"{ENV_PREFIX}API__TOKEN"]
    assert reference != write["valueFrom"]["secretKeyRef"], "the daemon refuses equal tokens"
    for endpoint in endpoints:
        if endpoint["port"] == "api":
            # monitoring.coreos.com/v1 Endpoint.authorization: a type and a SecretKeySelector
            # in the ServiceMonitor's namespace, which the operator reads for the scrape.
            assert endpoint["authorization"] == {"type": "Bearer", "credentials": reference}
        else:
            # Triton's metrics port takes no token.
            assert "authorization" not in endpoint, endpoint["port"]
    return reference


def test_reads_need_no_token_unless_asked(objects: list[Obj]) -> None:
    assert read_token_reference(objects) is None


def test_the_read_token_component_gives_the_daemon_and_prometheus_the_read_token(
    read_tokened: list[Obj], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert read_token_reference(read_tokened) == {"name": "controlplane-api", "key": "read-token"}
    # Alertmanager and the CLI inside the pod write: they keep the write token.
    test_alertmanager_calls_the_webhook_with_the_api_token(read_tokened)
    cli = env(container(read_tokened, "controlplane"))["CONTROLPLANE_TOKEN"]
    assert cli["valueFrom"]["secretKeyRef"] == {"name": "controlplane-api", "key": "token"}
    test_the_service_monitor_scrapes_triton_and_the_daemon(read_tokened)
    test_the_settings_the_pod_gives_are_ones_the_daemon_accepts(read_tokened, tmp_path, monkeypatch)


# --- the image ---------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions per stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, arguments.strip()))
    return stages


def test_the_image_runs_as_a_non_root_user_with_a_healthcheck() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    final = stages[-1]
    users = [args for instruction, args in final if instruction == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit(), "a numeric USER, so runAsNonRoot can verify it"
    healthchecks = [args for instruction, args in final if instruction == "HEALTHCHECK"]
    assert healthchecks, "the final stage has no HEALTHCHECK"
    assert "/healthz" in healthchecks[-1]
    assert ("ENTRYPOINT", '["controlplane"]') in final
    assert ("CMD", '["serve"]') in final


def test_the_image_installs_no_triton() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [args for stage in dockerfile_stages() for _, args in stage]
    assert not any("pytriton" in args or "[triton" in args for args in instructions), text


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Everything is left out (.venv, .git, .state, caches, bench results...) unless named.
    assert patterns[0] == "*"
    included = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    copied = [
        source.rstrip("/")
        for stage in dockerfile_stages()
        for instruction, args in stage
        if instruction == "COPY" and "--from" not in args
        for source in shlex.split(args)[:-1]
    ]
    assert copied
    assert set(copied) <= included, f"copied but ignored: {set(copied) - included}"

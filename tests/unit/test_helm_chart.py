"""deploy/helm/controlplane: the chart deploys what the kustomize overlays deploy, and its values do
what values.yaml says.

Two ways to install one fleet must not drift apart: the chart's directory-store example is
compared with overlays/local-store, and its S3 example with overlays/s3, container by container
(image repository, command and args, env names and value sources, ports, probes, lifecycle,
security contexts, mounts, resources) and at the pod level, and the objects around the pod
(Service, NetworkPolicy, budget, ServiceMonitor, Alertmanager route, autoscaler) by their specs,
names and selectors aside. Then every promise that
tests/unit/test_deploy_manifests.py checks on an overlay is checked on each documented values
file, with the same functions. Last, each value that turns an object on or off, or that points
at something (a claim, a Secret, a role, an image), is rendered both ways.

`make deploy-check` (deploy/helm/check.sh, called by deploy/k8s/check.sh) lints the chart and
validates every rendering against the Kubernetes schemas; this file checks what they say. helm is
the one `make install` puts in the venv (tests/support/helm.py); without it the tests fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sysconfig
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.helm import CHART, NAMESPACE, helm_template
from tests.support.kubectl import K8S_VERSION
from tests.support.readme import read_blocks
from tests.unit import test_deploy_manifests as manifests
from tests.unit.test_deploy_manifests import (
    CRDS,
    K8S,
    RULES,
    Obj,
    container,
    env,
    of_kind,
    one,
    pod,
    pod_labels,
    render,
    selects,
    volume,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = CHART / "examples"
DOCS = ROOT / "docs" / "helm.md"
# What each documented values file renders; "default" is values.yaml alone.
RENDERS = ("default", "directory-store", "s3-keys", "s3-irsa", "gpu-hpa-monitoring")
# The overlay each example stands for.
COUNTERPARTS = {"local-store": "directory-store", "s3": "s3-keys"}
STORE_MOUNT = "/store"


def rendered_text(values: tuple[Path, ...] = (), **settings: str) -> str:
    done = helm_template(values, settings)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    # A deprecated API, a value that does not coalesce: helm says so on stderr and renders.
    assert done.stderr == "", f"helm template warns:\n{done.stderr}"
    return done.stdout


def parse(text: str) -> list[Obj]:
    return [doc for doc in yaml.load_all(text, Loader=manifests._Loader) if doc]


def values_files(name: str) -> tuple[Path, ...]:
    return () if name == "default" else (EXAMPLES / f"{name}.yaml",)


@cache
def _rendered(name: str, settings: tuple[tuple[str, str], ...] = ()) -> str:
    return rendered_text(values_files(name), **dict(settings))


def chart(name: str = "default", **settings: str) -> list[Obj]:
    """The chart rendered with a documented values file and --set overrides (parsed afresh)."""
    return parse(_rendered(name, tuple(sorted(settings.items()))))


@cache
def _overlay(name: str) -> str:
    return yaml.safe_dump_all(render(K8S / "overlays" / name))


def overlay(name: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(_overlay(name)) if doc]


def refused(*values: Path, **settings: str) -> str:
    """helm's error for values the chart must refuse."""
    done = helm_template(values, settings)
    assert done.returncode != 0, "the chart rendered values it must refuse"
    return done.stderr


# --- the chart and the overlays: the same pod -----------------------------------------------------


def image_repository(image: str) -> str:
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}"


def container_view(c: Obj) -> Obj:
    """What a container runs, in a form where the chart and an overlay must be equal."""
    return {
        "image repository": image_repository(c["image"]),
        "command": c.get("command"),
        "args": c.get("args"),
        # Names and value sources; the order kustomize's patches leave is theirs.
        "env": {
            var["name"]: {k: v for k, v in var.items() if k != "name"} for var in c.get("env", [])
        },
        "ports": sorted(c.get("ports", []), key=lambda p: p["name"]),
        **{probe: c.get(probe) for probe in ("startupProbe", "livenessProbe", "readinessProbe")},
        "lifecycle": c.get("lifecycle"),
        "securityContext": c.get("securityContext"),
        "volumeMounts": sorted(c.get("volumeMounts", []), key=lambda m: m["mountPath"]),
        "resources": c.get("resources"),
    }


def volume_view(objects: list[Obj], v: Obj) -> Obj:
    """A volume's source; a ConfigMap by its parsed content (kustomize hashes its name)."""
    source = {k: val for k, val in v.items() if k != "name"}
    if "configMap" in source:
        name = source["configMap"]["name"]
        (config_map,) = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == name]
        return {
            "configMap": {key: yaml.safe_load(text) for key, text in config_map["data"].items()}
        }
    return source


def pod_view(objects: list[Obj]) -> Obj:
    deployment = one(objects, "Deployment")["spec"]
    spec = pod(objects)
    spread = []
    for constraint in spec["topologySpreadConstraints"]:
        # Each installs its own labels; both must select their own pods.
        assert selects(constraint["labelSelector"]["matchLabels"], pod_labels(objects))
        spread.append({k: v for k, v in constraint.items() if k != "labelSelector"})
    return {
        "replicas": deployment.get("replicas"),
        **{
            key: deployment.get(key)
            for key in ("strategy", "minReadySeconds", "progressDeadlineSeconds")
        },
        **{
            key: spec.get(key)
            for key in (
                "securityContext",
                "shareProcessNamespace",
                "terminationGracePeriodSeconds",
                "automountServiceAccountToken",
            )
        },
        "topologySpreadConstraints": spread,
        "default container": one(objects, "Deployment")["spec"]["template"]["metadata"][
            "annotations"
        ]["kubectl.kubernetes.io/default-container"],
        "volumes": {v["name"]: volume_view(objects, v) for v in spec["volumes"]},
    }


@pytest.fixture(params=sorted(COUNTERPARTS.items()), ids=lambda p: f"{p[0]}-vs-{p[1]}")
def pair(request: pytest.FixtureRequest) -> tuple[list[Obj], list[Obj]]:
    overlay_name, example = request.param
    return overlay(overlay_name), chart(example)


@pytest.mark.parametrize("kind", ["initContainers", "containers"])
def test_the_chart_runs_the_overlays_containers(
    pair: tuple[list[Obj], list[Obj]], kind: str
) -> None:
    kustomized, charted = pair
    expected = {c["name"]: container_view(c) for c in pod(kustomized)[kind]}
    actual = {c["name"]: container_view(c) for c in pod(charted)[kind]}
    assert actual.keys() == expected.keys()
    for name, view in expected.items():
        for field, value in view.items():
            assert actual[name][field] == value, f"{kind} {name}: {field} differs from the overlay"


def test_the_chart_runs_the_overlays_pod(pair: tuple[list[Obj], list[Obj]]) -> None:
    kustomized, charted = pair
    expected, actual = pod_view(kustomized), pod_view(charted)
    for field, value in expected.items():
        assert actual[field] == value, f"the pod's {field} differs from the overlay"


def around_the_pod(objects: list[Obj]) -> Obj:
    """The objects around the pod, with what each installer names its own way made equal."""
    labels = pod_labels(objects)
    deployment = one(objects, "Deployment")["metadata"]["name"]
    service = one(objects, "Service")["metadata"]

    def fleet(selector: Obj) -> Obj | str:
        return "<the fleet's pods>" if selects(selector, labels) else selector

    policy = one(objects, "NetworkPolicy")["spec"]
    ingress = [
        {
            **rule,
            "from": [
                {**peer, "podSelector": fleet(peer["podSelector"]["matchLabels"])}
                if set(peer) == {"podSelector"}
                else peer
                for peer in rule["from"]
            ],
        }
        if "from" in rule
        else rule
        for rule in policy["ingress"]
    ]
    webhook_url = f"http://{service['name']}.{service['namespace']}.svc:8080/v1/alerts"
    config = one(objects, "AlertmanagerConfig")["spec"]
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment
    return {
        "Service": {k: v for k, v in one(objects, "Service")["spec"].items() if k != "selector"},
        "NetworkPolicy": {
            **policy,
            "podSelector": fleet(policy["podSelector"]["matchLabels"]),
            "ingress": ingress,
        },
        "PodDisruptionBudget": {
            **one(objects, "PodDisruptionBudget")["spec"],
            "selector": fleet(
                one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
            ),
        },
        "ServiceMonitor": one(objects, "ServiceMonitor")["spec"]["endpoints"],
        "AlertmanagerConfig": json.loads(json.dumps(config).replace(webhook_url, "<the webhook>")),
        "HorizontalPodAutoscaler": {**hpa, "scaleTargetRef": {**hpa["scaleTargetRef"], "name": ""}},
    }


def test_the_chart_renders_the_objects_around_the_pod_as_the_overlays_do(tmp_path: Path) -> None:
    kustomized = render(manifests.with_component("s3", "hpa", tmp_path))
    charted = chart(
        "s3-keys",
        **{
            "autoscaling.enabled": "true",
            "monitoring.serviceMonitor.enabled": "true",
            "monitoring.alertmanagerConfig.enabled": "true",
        },
    )
    expected, actual = around_the_pod(kustomized), around_the_pod(charted)
    for kind, spec in expected.items():
        assert actual[kind] == spec, f"the chart's {kind} differs from the overlay's"


def test_the_chart_and_the_overlays_run_one_image_at_one_version() -> None:
    chart_yaml = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart_yaml["apiVersion"] == "v2"
    # The chart, the image it runs and the package are released together.
    assert chart_yaml["version"] == chart_yaml["appVersion"] == package
    images = {
        source: {
            c["image"] for c in manifests.all_containers(objects) if c["name"] != "tritonserver"
        }
        for source, objects in [
            *((f"overlay {o}", overlay(o)) for o in COUNTERPARTS),
            *((f"chart {name}", chart(name)) for name in RENDERS),
        ]
    }
    assert set().union(*images.values()) == {
        f"ghcr.io/controlplane-project/controlplane:{package}"
    }, images


# --- every promise the overlays keep, on every documented values file -----------------------------

# test_deploy_manifests.py's checks that take the rendered objects and hold for any store.
PROMISES: list[Callable[[list[Obj]], None]] = [
    manifests.test_the_pod_runs_triton_and_the_controlplane_sidecar,
    manifests.test_a_rollout_never_takes_a_serving_pod_away_before_its_replacement_serves,
    manifests.test_a_terminating_pod_finishes_its_requests,
    manifests.test_each_pod_names_itself_in_the_fleet,
    manifests.test_each_pod_says_where_the_others_wake_it_and_lets_them,
    manifests.test_the_journal_lives_and_dies_with_the_pod,
    manifests.test_triton_runs_explicit_non_strict_on_the_shared_repository,
    manifests.test_repository_and_staging_share_one_emptydir_in_both_containers,
    manifests.test_the_residue_audit_can_see_tritons_processes,
    manifests.test_every_container_has_probes_and_resources,
    manifests.test_no_secret_is_written_as_a_literal,
    manifests.test_the_sidecar_is_locked_down_and_writes_only_to_volumes,
    manifests.test_images_are_tagged_and_the_overlay_sets_the_sidecars,
    manifests.test_the_service_account_has_no_token_and_no_permissions,
    manifests.test_the_service_exposes_triton_and_the_api,
    manifests.test_the_network_policy_opens_the_api_only_to_named_clients,
    manifests.test_drains_take_one_pod_at_a_time_and_are_never_blocked,
    manifests.test_every_object_lands_in_the_overlays_namespace,
]
MONITORING_PROMISES: list[Callable[[list[Obj]], None]] = [
    manifests.test_the_operator_kinds_are_the_expected_versions,
    manifests.test_the_service_monitor_scrapes_triton_and_the_daemon,
    manifests.test_the_rendered_prometheus_rule_is_the_same_rules,
    manifests.test_alertmanager_calls_the_webhook_with_the_api_token,
]


@pytest.mark.parametrize("promise", PROMISES, ids=lambda f: f.__name__.removeprefix("test_"))
@pytest.mark.parametrize("name", RENDERS)
def test_each_values_file_keeps_the_overlays_promises(
    name: str, promise: Callable[[list[Obj]], None]
) -> None:
    promise(chart(name))


@pytest.mark.parametrize("name", RENDERS)
def test_the_settings_the_chart_gives_are_ones_the_daemon_accepts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests.test_the_settings_the_pod_gives_are_ones_the_daemon_accepts(
        chart(name), tmp_path, monkeypatch
    )


@pytest.mark.parametrize("name", RENDERS)
def test_the_fleet_runs_more_than_one_pod(name: str) -> None:
    objects = chart(name)
    if of_kind(objects, "HorizontalPodAutoscaler"):
        manifests.test_the_autoscaler_scales_the_fleet_on_tritons_queue(("hpa", objects))
    else:
        manifests.test_the_fleet_runs_more_than_one_pod(objects)


@pytest.mark.parametrize("name", RENDERS)
def test_no_pod_keeps_state_on_a_claim_of_its_own(name: str) -> None:
    objects = chart(name)
    assert not of_kind(objects, "StatefulSet")
    s3 = literal_store_uri(objects).startswith("s3://")
    claims = {pvc["metadata"]["name"]: pvc for pvc in of_kind(objects, "PersistentVolumeClaim")}
    for c in manifests.all_containers(objects):
        for mount in c.get("volumeMounts", []):
            source = volume(objects, mount["name"]).get("persistentVolumeClaim")
            if source is None:
                continue
            # The one claim is the model store that the whole fleet shares; nothing per pod.
            assert not s3, f"{c['name']} mounts a claim at {mount['mountPath']} with an S3 store"
            assert (c["name"], mount["mountPath"]) == ("controlplane", STORE_MOUNT)
            if source["claimName"] in claims:
                assert claims[source["claimName"]]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert len(claims) <= 1


def literal_store_uri(objects: list[Obj]) -> str:
    uri: str = env(container(objects, "controlplane"))["CONTROLPLANE_STORE__URI"]["value"]
    return uri


# The overlay's own claim: the chart's default creates one as local-store does (an existing claim
# is test_an_existing_claim_is_mounted_and_none_created's).
@pytest.mark.parametrize(("overlay_name", "name"), [("local-store", "default"), ("s3", "s3-keys")])
def test_the_store_is_the_overlays(overlay_name: str, name: str) -> None:
    manifests.test_the_overlay_sets_its_store((overlay_name, chart(name)))


@pytest.mark.parametrize(
    "promise", MONITORING_PROMISES, ids=lambda f: f.__name__.removeprefix("test_")
)
def test_the_monitoring_example_keeps_the_overlays_monitoring_promises(
    promise: Callable[[list[Obj]], None],
) -> None:
    promise(chart("gpu-hpa-monitoring"))


@pytest.mark.parametrize("name", RENDERS)
def test_every_rendering_validates_against_the_kubernetes_schemas(name: str) -> None:
    for obj in chart(name):
        if obj["kind"] in CRDS:
            assert obj["apiVersion"] == CRDS[obj["kind"]]
            continue  # no schema; the monitoring promises check them
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {exc.message}")


def test_the_default_settings_file_is_the_overlays() -> None:
    (charted,) = of_kind(chart(), "ConfigMap")
    base = yaml.safe_load((K8S / "base" / "controlplane.yaml").read_text())
    assert yaml.safe_load(charted["data"]["controlplane.yaml"]) == base


def test_the_charts_rules_are_generated_from_deploy_monitoring_rules() -> None:
    copy = yaml.safe_load((CHART / "files" / "prometheus-rules.yml").read_text())
    assert copy == {"groups": manifests.rule_groups()}, (
        f"the chart's files/prometheus-rules.yml differs from {RULES.relative_to(ROOT)}: "
        "run deploy/k8s/check.sh sync-rules"
    )


# --- each toggle renders its object, or leaves it out ---------------------------------------------

TOGGLES = {
    "autoscaling.enabled": "HorizontalPodAutoscaler",
    "monitoring.serviceMonitor.enabled": "ServiceMonitor",
    "monitoring.prometheusRule.enabled": "PrometheusRule",
    "monitoring.alertmanagerConfig.enabled": "AlertmanagerConfig",
    "networkPolicy.enabled": "NetworkPolicy",
    "serviceAccount.create": "ServiceAccount",
}
DEFAULT_ON = {"networkPolicy.enabled", "serviceAccount.create"}


def kinds(objects: list[Obj]) -> list[str]:
    return sorted(obj["kind"] for obj in objects)


@pytest.mark.parametrize("toggle", TOGGLES)
def test_each_toggle_renders_its_object_or_omits_it(toggle: str) -> None:
    kind = TOGGLES[toggle]
    on, off = chart(**{toggle: "true"}), chart(**{toggle: "false"})
    assert len(of_kind(on, kind)) == 1
    assert of_kind(off, kind) == []
    # Nothing else comes or goes with it.
    assert sorted([*kinds(off), kind]) == kinds(on)
    default = kinds(chart())
    assert default == (kinds(on) if toggle in DEFAULT_ON else kinds(off))


def test_the_autoscaler_takes_the_replica_count_over() -> None:
    assert one(chart(replicas="3"), "Deployment")["spec"]["replicas"] == 3
    scaled = chart(**{"autoscaling.enabled": "true", "autoscaling.maxReplicas": "9"})
    # `helm upgrade` must not reset the autoscaler's count to a manifest's.
    assert "replicas" not in one(scaled, "Deployment")["spec"]
    spec = one(scaled, "HorizontalPodAutoscaler")["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 9)
    assert spec["scaleTargetRef"]["name"] == one(scaled, "Deployment")["metadata"]["name"]


def test_without_a_service_account_the_pods_use_the_one_named() -> None:
    objects = chart(**{"serviceAccount.create": "false", "serviceAccount.name": "inference"})
    assert pod(objects)["serviceAccountName"] == "inference"
    assert pod(objects)["automountServiceAccountToken"] is False


def test_a_monitoring_object_carries_the_labels_its_selector_wants() -> None:
    objects = chart("gpu-hpa-monitoring")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(objects, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    config = one(objects, "AlertmanagerConfig")["metadata"]["labels"]
    assert config["app.kubernetes.io/part-of"] == "controlplane"


# --- the store ------------------------------------------------------------------------------------


def store_claim(objects: list[Obj]) -> str:
    claim: str = volume(objects, "store")["persistentVolumeClaim"]["claimName"]
    return claim


def test_the_default_store_is_a_shared_claim_that_outlives_the_release() -> None:
    objects = chart(**{"store.directory.claim.storageClassName": "efs-sc"})
    claim = one(objects, "PersistentVolumeClaim")
    assert store_claim(objects) == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "efs-sc"
    # `helm uninstall` leaves the releases in the store alone.
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert literal_store_uri(objects) == "file:///store"
    # Bound to a pre-created volume only: storageClassName "" stops dynamic provisioning.
    static = chart(
        **{"store.directory.claim.storageClassName": "-", "store.directory.claim.volumeName": "nfs"}
    )
    spec = one(static, "PersistentVolumeClaim")["spec"]
    assert (spec["storageClassName"], spec["volumeName"]) == ("", "nfs")


def test_an_existing_claim_is_mounted_and_none_created() -> None:
    objects = chart("directory-store")
    assert of_kind(objects, "PersistentVolumeClaim") == []
    assert store_claim(objects) == "model-store"
    assert manifests.mount_of(container(objects, "controlplane"), STORE_MOUNT) == {
        "name": "store",
        "mountPath": STORE_MOUNT,
    }
    # Triton never reads the store: the sidecar places what Triton loads.
    assert manifests.mount_of(container(objects, "tritonserver"), STORE_MOUNT) is None


def test_an_s3_store_mounts_no_claim_and_names_the_bucket() -> None:
    objects = chart("s3-keys")
    assert of_kind(objects, "PersistentVolumeClaim") == []
    assert "store" not in {v["name"] for v in pod(objects)["volumes"]}
    assert literal_store_uri(objects) == "s3://example-models/prod"
    bare = chart("s3-keys", **{"store.s3.prefix": ""})
    assert literal_store_uri(bare) == "s3://example-models"


def test_s3_keys_come_from_the_secret_and_irsa_from_the_role() -> None:
    keys = chart("s3-keys")
    variables = env(container(keys, "controlplane"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert variables[name]["valueFrom"]["secretKeyRef"] == {
            "name": "controlplane-s3",
            "key": name,
        }
    assert "annotations" not in one(keys, "ServiceAccount")["metadata"]

    irsa = chart("s3-irsa")
    variables = env(container(irsa, "controlplane"))
    # No keys at all: boto3 would prefer them to the role.
    assert not {name for name in variables if name.startswith("AWS_")} - {"AWS_REGION"}
    assert variables["AWS_REGION"] == {"name": "AWS_REGION", "value": "eu-west-1"}
    account = one(irsa, "ServiceAccount")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/controlplane-model-store"
    }
    assert pod(irsa)["serviceAccountName"] == account["metadata"]["name"]
    # EKS's webhook mounts its own token: the account's stays off.
    assert account["automountServiceAccountToken"] is False


def test_an_s3_compatible_endpoint_is_given_as_a_value_or_by_the_secret() -> None:
    keyed = env(container(chart("s3-keys"), "controlplane"))["AWS_ENDPOINT_URL_S3"]
    assert keyed["valueFrom"]["secretKeyRef"]["optional"] is True
    given = chart("s3-keys", **{"store.s3.endpointUrl": "https://minio.example:9000"})
    variable = env(container(given, "controlplane"))["AWS_ENDPOINT_URL_S3"]
    assert variable == {"name": "AWS_ENDPOINT_URL_S3", "value": "https://minio.example:9000"}


# --- the token, GPUs, images, settings ------------------------------------------------------------


def test_the_token_is_only_ever_a_secret_reference() -> None:
    objects = chart(
        "gpu-hpa-monitoring", **{"apiToken.existingSecret": "ci-token", "apiToken.key": "api"}
    )
    reference = {"name": "ci-token", "key": "api"}
    variables = env(container(objects, "controlplane"))
    for name in ("CONTROLPLANE_API__TOKEN", "CONTROLPLANE_TOKEN"):
        assert variables[name] == {"name": name, "valueFrom": {"secretKeyRef": reference}}
    (receiver,) = one(objects, "AlertmanagerConfig")["spec"]["receivers"]
    (webhook,) = receiver["webhookConfigs"]
    assert webhook["httpConfig"]["authorization"]["credentials"] == reference
    for name in RENDERS:
        assert of_kind(chart(name), "Secret") == [], f"{name} renders a Secret"
    # values.yaml has no place for a token, only for where one is.
    assert set(yaml.safe_load((CHART / "values.yaml").read_text())["apiToken"]) == {
        "existingSecret",
        "key",
    }


def test_gpus_and_gpu_nodes_come_from_the_values() -> None:
    objects = chart("gpu-hpa-monitoring", **{"gpu.count": "2"})
    triton = container(objects, "tritonserver")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert triton["resources"]["limits"]["memory"] == "16Gi"
    spec = pod(objects)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    cpu_only = container(chart(**{"gpu.count": "0"}), "tritonserver")["resources"]["limits"]
    assert cpu_only == {"memory": "16Gi"}
    other = chart(**{"gpu.resourceName": "amd.com/gpu"})
    assert container(other, "tritonserver")["resources"]["limits"]["amd.com/gpu"] == 1


def test_both_images_can_be_overridden() -> None:
    default = chart()
    assert container(default, "controlplane")["image"].endswith(":0.1.0")
    tagged = chart(**{"image.repository": "registry.example/ml/controlplane", "image.tag": "dev1"})
    assert {
        c["image"] for c in manifests.all_containers(tagged) if c["name"] != "tritonserver"
    } == {"registry.example/ml/controlplane:dev1"}
    digest = "sha256:" + "ab" * 32
    pinned = chart(**{"image.digest": digest, "triton.image.tag": "25.01-py3"})
    assert container(pinned, "controlplane")["image"] == (
        f"ghcr.io/controlplane-project/controlplane@{digest}"
    )
    assert container(pinned, "tritonserver")["image"] == "nvcr.io/nvidia/tritonserver:25.01-py3"
    private = chart(**{"imagePullSecrets[0].name": "registry"})
    assert pod(private)["imagePullSecrets"] == [{"name": "registry"}]


def test_a_settings_change_rolls_the_pods() -> None:
    def checksum(objects: list[Obj]) -> str:
        annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        value: str = annotations["checksum/config"]
        return value

    changed = chart(**{"config.log.level": "DEBUG"})
    (config_map,) = of_kind(changed, "ConfigMap")
    assert yaml.safe_load(config_map["data"]["controlplane.yaml"])["log"]["level"] == "DEBUG"
    assert re.fullmatch(r"[0-9a-f]{64}", checksum(chart()))
    assert checksum(changed) != checksum(chart())
    # A value outside the settings file rolls nothing by this annotation.
    assert checksum(chart(**{"service.type": "NodePort"})) == checksum(chart())


def test_a_chart_upgrade_alone_rolls_no_pod() -> None:
    labels = one(chart(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not {"helm.sh/chart", "app.kubernetes.io/version"} & labels.keys()


# --- values the chart refuses, with what to set ---------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("apiToken: {existingSecret: ''}", "apiToken.existingSecret is empty"),
        ("store: {type: nfs}", 'store.type must be one of the following: "directory", "s3"'),
        ("store: {type: s3}", "store.s3.bucket is empty"),
        (
            "store: {type: s3, s3: {bucket: b, credentials: {existingSecret: keys},"
            " irsaRoleArn: 'arn:aws:iam::111122223333:role/r'}}",
            "both set",
        ),
        (
            "store: {type: s3, s3: {bucket: b, irsaRoleArn: 'arn:aws:iam::111122223333:role/r'}}\n"
            "serviceAccount: {create: false}",
            "annotate it with eks.amazonaws.com/role-arn yourself",
        ),
        # Without pod labels, a client would let its whole namespace in.
        ("networkPolicy: {apiClients: [{namespace: ci}]}", "apiClients.0: podLabels is required"),
        # values.schema.json: a misspelt value fails instead of being ignored...
        ("store: {s3: {bucekt: models}}", "Additional property bucekt is not allowed"),
        # ... and there is no place for a token.
        ("apiToken: {token: s3cr3t}", "Additional property token is not allowed"),
        (
            "autoscaling: {enabled: true, maxReplicas: 1}",
            "autoscaling.maxReplicas (1) is below autoscaling.minReplicas (2)",
        ),
    ],
)
def test_values_that_cannot_work_are_refused_with_what_to_set(
    values: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    assert message in refused(path)


def schema_paths(schema: Obj, prefix: str = "") -> set[str]:
    """Every value the schema names, down to the open objects (resources, config...)."""
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add(prefix + key)
        if sub.get("additionalProperties") is False:
            paths |= schema_paths(sub, f"{prefix}{key}.")
    return paths


def value_paths(values: Obj, schema: Obj, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in values.items():
        paths.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= value_paths(value, sub, f"{prefix}{key}.")
    return paths


def test_the_schema_knows_every_value_and_no_other() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # "global" is Helm's, for charts used as subcharts.
    assert value_paths(values, schema) == schema_paths(schema) - {"global"}


# --- values.yaml, NOTES.txt, docs/helm.md ---------------------------------------------------------

_KEY = re.compile(r"^(?P<indent>\s*)(?:- )?(?P<key>[\w./-]+):")


def test_every_value_has_a_comment() -> None:
    # A key needs a comment right above it, unless it is inside a value documented as a whole
    # ("# -- ..." opening the comment above a key covers the key and everything below it).
    problems = []
    documented_at: int | None = None  # indentation of the key whose "# --" covers this line
    comment: str | None = None  # the first line of the comment right above, if any
    lines = (CHART / "values.yaml").read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            comment = None
            continue
        if stripped.startswith("#"):
            comment = comment or stripped
            continue
        indent = len(line) - len(line.lstrip())
        if documented_at is not None and indent <= documented_at:
            documented_at = None
        if _KEY.match(line) and documented_at is None:
            if comment is None:
                problems.append(f"values.yaml:{number}: {stripped}")
            elif comment.startswith("# --"):
                documented_at = indent
        comment = None
    assert not problems, "values without a comment:\n" + "\n".join(problems)


def notes(values: tuple[Path, ...], tmp_path: Path, **settings: str) -> str:
    """NOTES.txt as `helm install` prints it, rendered offline through the chart's own engine."""
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "NOTES.txt").rename(copy / "notes.txt")
    (copy / "templates" / "notes-as-configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}}\n'
    )
    done = helm_template(
        values, settings, chart=copy, show_only="templates/notes-as-configmap.yaml"
    )
    assert done.returncode == 0, done.stderr
    text: str = yaml.safe_load(done.stdout)["data"]["notes"]
    return text


def test_the_notes_name_the_store_the_secret_and_the_next_commands(tmp_path: Path) -> None:
    irsa = notes(values_files("s3-irsa"), tmp_path / "irsa")
    assert "s3://example-models/prod" in irsa
    assert "arn:aws:iam::111122223333:role/controlplane-model-store" in irsa
    assert "kubectl -n triton create secret generic controlplane-api" in irsa
    assert "kubectl -n triton rollout status deploy/controlplane" in irsa
    assert "kubectl -n triton exec deploy/controlplane -- controlplane status" in irsa
    assert "Monitoring objects are off" in irsa

    keys = notes(values_files("s3-keys"), tmp_path / "keys")
    assert "create secret generic controlplane-s3" in keys

    default = notes((), tmp_path / "default")
    assert "file:///store on the claim controlplane-store" in default
    assert "`helm uninstall` keeps it" in default

    monitored = notes(values_files("gpu-hpa-monitoring"), tmp_path / "monitored")
    assert "ServiceMonitor, PrometheusRule, AlertmanagerConfig" in monitored
    assert "2 to 8 pods (autoscaled)" in monitored


def test_the_docs_helm_template_blocks_run() -> None:
    text = DOCS.read_text()
    blocks = [b for b in read_blocks(text) if b.marker is None and b.lang in ("sh", "bash")]
    assert blocks, f"{DOCS.name} has no block that runs"
    path = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
    for block in blocks:
        for command in block.commands():
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command.text],
                cwd=ROOT,
                env={**os.environ, "PATH": path},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            where = f"docs/helm.md:{command.line}"
            assert done.returncode == 0, f"{where}: {command.text}\n{done.stderr}"
            assert done.stderr == "", f"{where} warns:\n{done.stderr}"
            for expected in command.expect:
                assert expected in done.stdout, f"{where}: no {expected!r} in\n{done.stdout}"
    assert NAMESPACE in text

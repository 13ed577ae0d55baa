"""deploy/helm/controlplane: the chart deploys what the kustomize overlays deploy.

Two ways to install one fleet must not drift apart: the chart's directory-store example is
compared with overlays/local-store, and its S3 example with overlays/s3, container by container
(image repository, command and args, env names and value sources, ports, probes, lifecycle,
security contexts, mounts, resources) and at the pod level, and the objects around the pod
(Service, NetworkPolicy, budget, ServiceMonitor, Alertmanager route, autoscaler) by their specs,
names and selectors aside; the same again with the read-only token on (apiReadToken against
components/read-token). Then every promise that
tests/unit/test_deploy_manifests.py checks on an overlay is checked on each documented values
file, with the same functions. Last, each toggle is rendered on and off, and the API tokens are
never anything but Secret references. test_helm_values.py checks what the other values do.

`make deploy-check` (deploy/helm/check.sh, called by deploy/k8s/check.sh) lints the chart and
validates every rendering against the Kubernetes schemas; this file checks what they say. helm is
the one `make install` puts in the venv (tests/support/helm.py); without it the tests fail.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from controlplane.settings.policy import RolloutSettings
from tests.support.helm import CHART, helm_template
from tests.support.kubectl import K8S_VERSION
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
# What each documented values file renders; "default" is values.yaml alone.
RENDERS = ("default", "directory-store", "s3-keys", "s3-irsa", "gpu-hpa-monitoring", "pod-extras")
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


def test_the_read_token_renders_as_the_overlays_component_does(tmp_path: Path) -> None:
    kustomized = render(manifests.with_component("s3", "read-token", tmp_path))
    charted = chart(
        "s3-keys",
        **{
            "apiReadToken.existingSecret": "controlplane-api",
            "monitoring.serviceMonitor.enabled": "true",
        },
    )
    reference = {"name": "controlplane-api", "key": "read-token"}
    assert manifests.read_token_reference(kustomized) == reference
    assert manifests.read_token_reference(charted) == reference
    for kind in ("initContainers", "containers"):
        expected = {c["name"]: container_view(c) for c in pod(kustomized)[kind]}
        assert {c["name"]: container_view(c) for c in pod(charted)[kind]} == expected, kind
    assert (
        one(charted, "ServiceMonitor")["spec"]["endpoints"]
        == (one(kustomized, "ServiceMonitor")["spec"]["endpoints"])
    )


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


# --- the token -----------------------------------------------------------------------------------


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
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for tokens in ("apiToken", "apiReadToken"):
        assert set(values[tokens]) == {"existingSecret", "key"}, tokens


# --- the readiness probe and rolling updates --------------------------------------------------


def _readiness_and_unready(objects: list[Obj]) -> tuple[float, float]:
    """(seconds until the kubelet marks the pod NotReady, the shortest unready_seconds of any
    model in the rendered settings, the daemon's default where they give none)."""
    (deployment,) = of_kind(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (sidecar,) = [c for c in containers if c["readinessProbe"]["httpGet"]["path"] == "/readyz"]
    probe = sidecar["readinessProbe"]
    (config_map,) = of_kind(objects, "ConfigMap")
    settings = yaml.safe_load(config_map["data"]["controlplane.yaml"])
    default = RolloutSettings().unready_seconds
    defaults = settings.get("model_defaults", {}).get("rollout", {}).get("unready_seconds", default)
    per_model = [
        policy.get("rollout", {}).get("unready_seconds", defaults)
        for policy in (settings.get("models") or {}).values()
    ]
    return probe["periodSeconds"] * probe["failureThreshold"], min([defaults, *per_model])


@pytest.mark.parametrize("name", [*RENDERS, *(f"overlay:{o}" for o in sorted(COUNTERPARTS))])
def test_the_pod_leaves_the_endpoints_before_a_draining_member_unloads(name: str) -> None:
    objects = overlay(name.removeprefix("overlay:")) if name.startswith("overlay:") else chart(name)
    not_ready_after, unready = _readiness_and_unready(objects)
    assert not_ready_after < unready, name


def test_the_chart_refuses_a_readiness_probe_too_slow_for_rolling_updates() -> None:
    error = refused(**{"controlplane.readinessProbe.periodSeconds": "3"})
    assert "periodSeconds x failureThreshold is 3 x 2 = 6 s" in error
    assert "not below config.model_defaults.rollout.unready_seconds (5 s)" in error
    assert "Lower controlplane.readinessProbe.periodSeconds" in error


def test_the_chart_weighs_the_probe_against_each_models_unready_seconds() -> None:
    error = refused(**{"config.models.big.rollout.unready_seconds": "1.5"})
    assert "config.models.big.rollout.unready_seconds (1.5 s)" in error
    longer = chart(**{"config.model_defaults.rollout.unready_seconds": "10"})
    assert _readiness_and_unready(longer) == (2, 10)

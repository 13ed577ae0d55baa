"""deploy/helm/controlplane: the values a cluster needs beyond the chart's own settings.

Priority and runtime classes, extra spread rules, pod volumes and each container's mounts and
environment, and the PodDisruptionBudget's toggle: each, when set, lands where values.yaml says
(the pod spec, after the chart's own entries, or one container and not the other) and, when
empty, renders nothing. The schema types them and still refuses a misspelt key, so a typo fails
the install with the schema's error instead of being dropped. The rendering with every one of
them set passes the same Kubernetes schema validation as the documented examples.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.kubectl import K8S_VERSION
from tests.unit.test_deploy_manifests import Obj, container, env, of_kind, one, pod
from tests.unit.test_helm_chart import chart, parse, refused, rendered_text

CA_VOLUME: Obj = {"name": "internal-ca", "configMap": {"name": "internal-ca"}}
CA_MOUNT: Obj = {"name": "internal-ca", "mountPath": "/etc/internal-ca", "readOnly": True}
ZONES: Obj = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "controlplane"}},
}
TOLERATION: Obj = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
EVERY_EXTRA: Obj = {
    "priorityClassName": "inference-critical",
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [ZONES],
    "tolerations": [TOLERATION],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                ]
            }
        }
    },
    "podAnnotations": {"example.com/team": "inference"},
    "extraVolumes": [CA_VOLUME],
    "podDisruptionBudget": {"enabled": False},
    "triton": {
        "extraEnv": [{"name": "SSL_CERT_FILE", "value": "/etc/internal-ca/ca.crt"}],
        "extraVolumeMounts": [CA_MOUNT],
    },
    "controlplane": {
        "extraEnv": [
            {"name": "AWS_CA_BUNDLE", "value": "/etc/internal-ca/ca.crt"},
            {
                "name": "LICENCE",
                "valueFrom": {"secretKeyRef": {"name": "licence", "key": "key"}},
            },
        ],
        "extraVolumeMounts": [{**CA_MOUNT, "mountPath": "/etc/ca"}],
    },
}


@pytest.fixture(scope="module")
def extras(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    path = tmp_path_factory.mktemp("pod-extras") / "values.yaml"
    path.write_text(yaml.safe_dump(EVERY_EXTRA))
    return parse(rendered_text((path,)))


def test_the_pod_spec_takes_classes_spread_volumes_and_scheduling(extras: list[Obj]) -> None:
    spec = pod(extras)
    assert spec["priorityClassName"] == "inference-critical"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["tolerations"] == [TOLERATION]
    assert spec["affinity"] == EVERY_EXTRA["affinity"]
    # The chart's spread over nodes stays first; the user's rules follow it.
    spread = spec["topologySpreadConstraints"]
    assert [rule["topologyKey"] for rule in spread] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    assert spread[1] == ZONES
    assert spec["volumes"][-1] == CA_VOLUME
    assert "models" in [v["name"] for v in spec["volumes"]]
    template = one(extras, "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/team"] == "inference"


def test_each_container_takes_its_own_environment_and_mounts(extras: list[Obj]) -> None:
    triton = container(extras, "tritonserver")
    sidecar = container(extras, "controlplane")

    assert env(triton)["SSL_CERT_FILE"] == {
        "name": "SSL_CERT_FILE",
        "value": "/etc/internal-ca/ca.crt",
    }
    assert "LD_PRELOAD" in env(triton)  # the chart's own variables stay
    assert "AWS_CA_BUNDLE" not in env(triton)
    assert triton["volumeMounts"][-1] == CA_MOUNT

    assert env(sidecar)["AWS_CA_BUNDLE"]["value"] == "/etc/internal-ca/ca.crt"
    assert env(sidecar)["LICENCE"]["valueFrom"] == {
        "secretKeyRef": {"name": "licence", "key": "key"}
    }
    assert "CONTROLPLANE_STORE__URI" in env(sidecar)
    assert "SSL_CERT_FILE" not in env(sidecar)
    assert sidecar["volumeMounts"][-1] == {**CA_MOUNT, "mountPath": "/etc/ca"}


def test_the_budget_can_be_turned_off(extras: list[Obj]) -> None:
    assert of_kind(extras, "PodDisruptionBudget") == []
    assert len(of_kind(chart(), "PodDisruptionBudget")) == 1  # on by default


def test_empty_extras_render_nothing() -> None:
    spec = pod(chart())
    for key in ("priorityClassName", "runtimeClassName", "tolerations", "affinity"):
        assert key not in spec, key
    assert [rule["topologyKey"] for rule in spec["topologySpreadConstraints"]] == [
        "kubernetes.io/hostname"
    ]
    assert [v["name"] for v in spec["volumes"]] == [
        "models",
        "journal",
        "config",
        "dshm",
        "tmp",
        "store",
    ]
    assert [m["name"] for m in container(chart(), "tritonserver")["volumeMounts"]] == [
        "models",
        "dshm",
    ]


def test_the_rendering_with_every_extra_passes_the_kubernetes_schemas(extras: list[Obj]) -> None:
    for obj in extras:
        if obj["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # Misspelt known keys, at the top and inside the containers' sections.
        ("priorityClass: high", "Additional property priorityClass is not allowed"),
        ("tolerattions: []", "Additional property tolerattions is not allowed"),
        ("topologySpreadConstraint: []", "Additional property topologySpreadConstraint is not"),
        ("triton: {extraVolumeMount: []}", "Additional property extraVolumeMount is not allowed"),
        ("controlplane: {extraENV: []}", "Additional property extraENV is not allowed"),
        ("podDisruptionBudget: {enable: false}", "Additional property enable is not allowed"),
        # Wrong shapes: a map where a list goes, an env var without a name or with a typo.
        ("extraVolumes: {ca: {configMap: {name: ca}}}", "extraVolumes: Invalid type"),
        ("triton: {extraEnv: [{value: x}]}", "name is required"),
        ("controlplane: {extraEnv: [{name: A, vaule: x}]}", "Additional property vaule"),
        ("controlplane: {extraVolumeMounts: [{name: ca}]}", "mountPath is required"),
        ("runtimeClassName: [nvidia]", "runtimeClassName: Invalid type"),
    ],
)
def test_the_schema_refuses_typos_and_wrong_shapes(
    values: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values)
    assert message in refused(path)

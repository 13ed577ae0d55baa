"""deploy/helm/controlplane: each value does what values.yaml says, and the chart refuses values
that cannot work, saying what to set.

The store (a claim the chart creates and keeps, an existing claim, a bucket with keys or with an
IRSA role), GPUs and GPU nodes, both images, the settings file's rollout, the optional read-only
token (the sidecar's and the ServiceMonitor's, from one Secret key), and the checks on the
values themselves: values.schema.json knows every value and no other, every value has a
comment, and NOTES.txt names what was installed and what to run next (docs/helm.md's blocks
run with every other page's, in tests/integration/test_readme.py).
test_helm_chart.py compares the chart with the kustomize overlays.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.helm import CHART, helm_template
from tests.unit import test_deploy_manifests as manifests
from tests.unit.test_deploy_manifests import (
    READ_TOKEN,
    Obj,
    container,
    env,
    of_kind,
    one,
    pod,
    read_token_reference,
    volume,
)
from tests.unit.test_helm_chart import (
    ROOT,
    STORE_MOUNT,
    chart,
    literal_store_uri,
    refused,
    rendered_text,
    values_files,
)

DOCS = ROOT / "docs" / "helm.md"


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


def test_a_keyring_configmap_is_mounted_as_the_keyring_and_the_queue_is_given() -> None:
    plain = container(chart("s3-keys"), "controlplane")
    assert "CONTROLPLANE_STORE__KEYRING" not in env(plain)
    assert "CONTROLPLANE_STORE__NOTIFICATIONS__SQS_QUEUE_URL" not in env(plain)

    queue = "https://sqs.eu-west-1.amazonaws.com/111122223333/controlplane-releases"
    objects = chart(
        "s3-keys", **{"store.keyring.configMap": "publisher-keys", "store.s3.sqsQueueUrl": queue}
    )
    daemon = container(objects, "controlplane")
    variables = env(daemon)
    assert variables["CONTROLPLANE_STORE__KEYRING"]["value"] == "/etc/controlplane-keyring"
    assert variables["CONTROLPLANE_STORE__NOTIFICATIONS__SQS_QUEUE_URL"]["value"] == queue
    assert volume(objects, "keyring") == {
        "name": "keyring",
        "configMap": {"name": "publisher-keys"},
    }
    [mount] = [m for m in daemon["volumeMounts"] if m["name"] == "keyring"]
    assert mount == {"name": "keyring", "mountPath": "/etc/controlplane-keyring", "readOnly": True}
    assert "keyring" not in {m["name"] for m in container(objects, "tritonserver")["volumeMounts"]}


def test_with_an_sns_topic_each_pod_subscribes_a_queue_named_after_itself() -> None:
    topic = "arn:aws:sns:eu-west-1:111122223333:model-events"
    daemon = container(chart("s3-irsa", **{"store.s3.snsTopicArn": topic}), "controlplane")
    variables = env(daemon)
    assert variables["CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN"]["value"] == topic
    assert "CONTROLPLANE_STORE__NOTIFICATIONS__SQS_QUEUE_URL" not in variables
    # No queue name: the daemon names it controlplane-<member>, and the member is the pod.
    assert "CONTROLPLANE_STORE__NOTIFICATIONS__QUEUE_NAME" not in variables
    assert variables["CONTROLPLANE_FLEET__MEMBER"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    plain = env(container(chart("s3-irsa"), "controlplane"))
    assert "CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN" not in plain


# --- GPUs, images, settings ---------------------------------------------------------------------


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


def test_a_new_chart_version_alone_rolls_no_pod(tmp_path: Path) -> None:
    # A chart release that changes nothing in the pod (same image, same settings) must leave the
    # pod template as it was, or every `helm upgrade` would restart the whole fleet.
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    chart_yaml = copy / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"(?m)^version: .*$", "version: 9.9.9", chart_yaml.read_text()))
    done = helm_template(chart=copy)
    assert done.returncode == 0, done.stderr
    upgraded = [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def template(objects: list[Obj]) -> Obj:
        spec: Obj = one(objects, "Deployment")["spec"]["template"]
        return spec

    assert one(upgraded, "Deployment")["metadata"]["labels"]["helm.sh/chart"].endswith("9.9.9")
    assert template(upgraded) == template(chart())


# --- the read token ------------------------------------------------------------------------------

MONITORED = {
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.alertmanagerConfig.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
}


def test_without_a_read_token_nothing_about_it_renders() -> None:
    text = rendered_text((), **MONITORED)
    for word in (READ_TOKEN, "read-token", "read token"):
        assert word not in text
    objects = chart(**MONITORED)
    assert read_token_reference(objects) is None
    # The ServiceMonitor scrapes the daemon as before, with no credentials at all.
    (api,) = [e for e in one(objects, "ServiceMonitor")["spec"]["endpoints"] if e["port"] == "api"]
    assert set(api) == {"port", "path", "interval", "scrapeTimeout", "relabelings"}


def test_a_read_token_comes_from_its_secret_and_prometheus_scrapes_with_it() -> None:
    example = chart("gpu-hpa-monitoring")
    # The example keeps both tokens in one Secret, under two keys.
    assert read_token_reference(example) == {"name": "controlplane-api", "key": "read-token"}
    variables = env(container(example, "controlplane"))
    assert variables[READ_TOKEN] == {
        "name": READ_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": "controlplane-api", "key": "read-token"}},
    }
    (api,) = [e for e in one(example, "ServiceMonitor")["spec"]["endpoints"] if e["port"] == "api"]
    assert api["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "controlplane-api", "key": "read-token"},
    }

    apart = chart(
        "gpu-hpa-monitoring",
        **{"apiReadToken.existingSecret": "prometheus-reader", "apiReadToken.key": "bearer"},
    )
    assert read_token_reference(apart) == {"name": "prometheus-reader", "key": "bearer"}
    # The writers keep the write token: the CLI in the pod, and Alertmanager's webhook.
    write = {"name": "controlplane-api", "key": "token"}
    assert env(container(apart, "controlplane"))["CONTROLPLANE_TOKEN"]["valueFrom"] == {
        "secretKeyRef": write
    }
    (receiver,) = one(apart, "AlertmanagerConfig")["spec"]["receivers"]
    assert receiver["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"] == write
    # Nothing else about the pod changes with it.
    without = chart("gpu-hpa-monitoring", **{"apiReadToken.existingSecret": ""})
    assert read_token_reference(without) is None
    assert {k: v for k, v in variables.items() if k != READ_TOKEN} == env(
        container(without, "controlplane")
    )


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
        (
            "store: {type: s3, s3: {bucket: b, snsTopicArn: 'arn:aws:sns:eu-west-1:111122223333:t',"
            " sqsQueueUrl: 'https://sqs.eu-west-1.amazonaws.com/111122223333/q'}}",
            "store.s3.sqsQueueUrl and store.s3.snsTopicArn are both set",
        ),
        (
            "store: {type: s3, s3: {bucket: b, snsTopicArn: model-events}}",
            "store.s3.snsTopicArn: Does not match pattern",
        ),
        # Without pod labels, a client would let its whole namespace in.
        ("networkPolicy: {apiClients: [{namespace: ci}]}", "apiClients.0: podLabels is required"),
        # values.schema.json: a misspelt value fails instead of being ignored...
        ("store: {s3: {bucekt: models}}", "Additional property bucekt is not allowed"),
        # ... and there is no place for a token.
        ("apiToken: {token: s3cr3t}", "Additional property token is not allowed"),
        ("apiReadToken: {token: s3cr3t}", "Additional property token is not allowed"),
        ("apiReadToken: s3cr3t", "apiReadToken: Invalid type. Expected: object, given: string"),
        (
            "apiReadToken: {existingSecret: controlplane-api, key: token}",
            "the read token needs a value of its own",
        ),
        ("apiReadToken: {existingSecret: readers, key: ''}", "apiReadToken.key is empty"),
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


# --- values.yaml, NOTES.txt ----------------------------------------------------------------------

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


def lines_for(text: str, client: str) -> str:
    (line,) = [line for line in text.splitlines() if line.strip().startswith(client)]
    return line


def test_the_notes_say_which_token_prometheus_alertmanager_and_ci_need(tmp_path: Path) -> None:
    open_reads = notes((), tmp_path / "default")
    assert "the write token, key token of the Secret controlplane-api" in lines_for(
        open_reads, "CI"
    )
    assert "the write token" in lines_for(open_reads, "Alertmanager")
    assert "none, reads are open" in lines_for(open_reads, "Prometheus")

    both = notes(values_files("gpu-hpa-monitoring"), tmp_path / "both")
    assert "the write token, key token of the Secret controlplane-api" in lines_for(both, "CI")
    assert "the write token, which the AlertmanagerConfig sends" in lines_for(both, "Alertmanager")
    assert (
        "the read token, key read-token of the Secret controlplane-api, which the ServiceMonitor"
        in lines_for(both, "Prometheus")
    )
    # One Secret, both keys, each a value of its own.
    assert (
        'create secret generic controlplane-api --from-literal=token="$(openssl rand -hex 32)" \\\n'
        '    --from-literal=read-token="$(openssl rand -hex 32)"' in both
    )

    apart = notes(
        values_files("gpu-hpa-monitoring"),
        tmp_path / "apart",
        **{"apiReadToken.existingSecret": "prometheus-reader"},
    )
    assert "key read-token of the Secret prometheus-reader" in lines_for(apart, "Prometheus")
    assert (
        "create secret generic prometheus-reader "
        '--from-literal=read-token="$(openssl rand -hex 32)"' in apart
    )

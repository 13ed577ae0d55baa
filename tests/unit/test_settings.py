"""Settings: environment over YAML over defaults, and errors that name the setting to fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from controlplane.settings import Settings, SettingsError, load_settings, render_defaults

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CONTROLPLANE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The two required settings through the environment; returns the repository path."""
    repository = tmp_path / "root" / "repository"
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", str(repository))
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", (tmp_path / "store").as_uri())
    return repository


def write_yaml(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "controlplane.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def settings_error(config: Path | None = None) -> str:
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    return str(caught.value)


# --- sources ------------------------------------------------------------------------------


def test_defaults(required: Path, tmp_path: Path) -> None:
    settings = load_settings()
    assert settings.triton.grpc_url == "localhost:8001"
    assert settings.api.host == "127.0.0.1"
    assert settings.api.port == 8080
    assert settings.api.token is None
    assert settings.store.require_checksums is True
    assert settings.log.level == "INFO"
    assert settings.repository.path == required
    assert settings.staging.path is None
    assert settings.staging_path == tmp_path / "root" / "staging"
    assert settings.database_path == tmp_path / "root" / "controlplane.db"
    assert settings.store.local_path == tmp_path / "store"


def test_environment_with_nesting(
    required: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONTROLPLANE_TRITON__GRPC_URL", "triton:9001")
    monkeypatch.setenv("CONTROLPLANE_TRITON__RETRY_ATTEMPTS", "5")
    monkeypatch.setenv("CONTROLPLANE_API__PORT", "9090")
    monkeypatch.setenv("CONTROLPLANE_STAGING__PATH", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("CONTROLPLANE_DATABASE__PATH", str(tmp_path / "state.db"))
    monkeypatch.setenv("CONTROLPLANE_STORE__REQUIRE_CHECKSUMS", "false")
    monkeypatch.setenv("CONTROLPLANE_LOG__LEVEL", "DEBUG")

    settings = load_settings()

    assert settings.triton.grpc_url == "triton:9001"
    assert settings.triton.retry_attempts == 5
    assert settings.api.port == 9090
    assert settings.staging_path == tmp_path / "elsewhere"
    assert settings.database_path == tmp_path / "state.db"
    assert settings.store.require_checksums is False
    assert settings.log.level == "DEBUG"


def test_yaml_file_values(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path,
        {
            "repository": {"path": "/srv/models/repository"},
            "store": {"uri": "file:///srv/store"},
            "triton": {"grpc_url": "gpu-node:8001", "load_timeout_seconds": 600},
            "api": {"port": 9000},
        },
    )
    settings = load_settings(config)
    assert settings.repository.path == Path("/srv/models/repository")
    assert settings.store.uri == "file:///srv/store"
    assert settings.triton.grpc_url == "gpu-node:8001"
    assert settings.triton.load_timeout_seconds == 600.0
    assert settings.triton.call_timeout_seconds == 10.0  # default kept inside a given group
    assert settings.api.port == 9000
    assert settings.staging_path == Path("/srv/models/staging")


def test_environment_overrides_yaml_field_by_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_yaml(
        tmp_path,
        {
            "repository": {"path": "/srv/repository"},
            "store": {"uri": "file:///srv/store"},
            "api": {"port": 9000, "max_body_bytes": 4096},
        },
    )
    monkeypatch.setenv("CONTROLPLANE_API__PORT", "9100")
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", "file:///mnt/store")

    settings = load_settings(config)

    assert settings.api.port == 9100
    assert settings.api.max_body_bytes == 4096  # the YAML value beside it survives
    assert settings.store.uri == "file:///mnt/store"
    assert settings.repository.path == Path("/srv/repository")


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    message = settings_error(tmp_path / "nope.yaml")
    assert "nope.yaml does not exist" in message


def test_a_directory_given_as_config_file_is_named_as_such(tmp_path: Path) -> None:
    assert f"config file {tmp_path} is a directory, not a file" in settings_error(tmp_path)


@pytest.mark.parametrize(("text", "kind"), [("just a string\n", "str"), ("[]\n", "list")])
def test_a_yaml_file_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "controlplane.yaml"
    path.write_text(text, encoding="utf-8")
    assert f"{path} holds a YAML {kind}, not a mapping of settings" in settings_error(path)


def test_a_yaml_syntax_error_is_a_settings_error(tmp_path: Path) -> None:
    path = tmp_path / "controlplane.yaml"
    path.write_text("repository: [\n", encoding="utf-8")
    assert str(path) in settings_error(path)


# --- refusals -----------------------------------------------------------------------------


def test_missing_required_settings_are_named() -> None:
    message = settings_error()
    assert message.startswith("invalid settings:")
    assert "repository" in message
    assert "store" in message
    assert "Field required" in message


def test_missing_required_settings_name_the_field_and_its_variable() -> None:
    message = settings_error()
    assert "store.uri" in message
    assert "CONTROLPLANE_STORE__URI" in message
    assert "repository.path" in message
    assert "CONTROLPLANE_REPOSITORY__PATH" in message


def test_a_missing_field_inside_a_given_group_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", "/srv/repository")
    monkeypatch.setenv("CONTROLPLANE_STORE__REQUIRE_CHECKSUMS", "true")
    message = settings_error()
    assert "store.uri (CONTROLPLANE_STORE__URI): Field required" in message
    assert "repository" not in message


@pytest.mark.parametrize(
    ("port", "problem"),
    [("0", "greater than or equal to 1"), ("abc", "valid integer"), ("65536", "less than")],
)
def test_an_invalid_port_is_refused(
    required: Path, monkeypatch: pytest.MonkeyPatch, port: str, problem: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__PORT", port)
    message = settings_error()
    assert "api.port (CONTROLPLANE_API__PORT)" in message
    assert problem in message


def test_an_unknown_key_in_yaml_is_refused(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path,
        {
            "repository": {"path": "/srv/repository"},
            "store": {"uri": "file:///srv/store"},
            "api": {"prot": 9000},
        },
    )
    message = settings_error(config)
    assert f"api.prot (in {config}): there is no such setting; did you mean 'port'?" in message


def test_an_unknown_group_in_yaml_is_refused(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path,
        {
            "repository": {"path": "/srv/repository"},
            "store": {"uri": "file:///srv/store"},
            "rolback": {"enabled": True},
        },
    )
    assert "rolback (in" in settings_error(config)
    assert "did you mean 'rollback'?" in settings_error(config)


def test_an_unknown_nested_env_var_is_refused(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__PROT", "9000")
    assert (
        "CONTROLPLANE_API__PROT: there is no setting api.prot; "
        "did you mean 'port' (CONTROLPLANE_API__PORT)?"
    ) in settings_error()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            {"store": {"poll_interval_secnds": 3}},
            "store.poll_interval_secnds (in {config}): there is no such setting; "
            "did you mean 'poll_interval_seconds'?",
        ),
        (
            {"model_defaults": {"rollout": {"bake_secnds": 3}}},
            "model_defaults.rollout.bake_secnds (in {config}): there is no such setting; "
            "did you mean 'bake_seconds'?",
        ),
        (
            {"models": {"resnet": {"auto_deploi": True}}},
            "models.resnet.auto_deploi (in {config}): there is no such setting; "
            "did you mean 'auto_deploy'?",
        ),
        (
            {"models": {"resnet": {"rollout": {"canary_member": 1}}}},
            "models.resnet.rollout.canary_member (in {config}): there is no such setting; "
            "did you mean 'canary_members'?",
        ),
        (
            {"triton": {"zzz": 1}},
            "triton.zzz (in {config}): there is no such setting; triton has: grpc_url, "
            "metrics_url,",
        ),
    ],
    ids=["group", "nested-group", "model-policy", "model-rollout", "no-near-key"],
)
def test_a_typo_in_the_yaml_file_names_the_key_meant(
    tmp_path: Path, data: dict[str, Any], says: str
) -> None:
    base: dict[str, Any] = {"repository": {"path": "/srv/r"}, "store": {"uri": "file:///srv/s"}}
    for group, fields in data.items():
        base[group] = {**base.get(group, {}), **fields}
    config = write_yaml(tmp_path, base)
    assert says.format(config=config) in settings_error(config)


@pytest.mark.parametrize(
    ("variable", "says"),
    [
        (
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECNDS",
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECNDS: there is no setting "
            "store.poll_interval_secnds; did you mean 'poll_interval_seconds' "
            "(CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS)?",
        ),
        (
            "CONTROLPLANE_MODELS__RESNET__AUTO_DEPLOI",
            "CONTROLPLANE_MODELS__RESNET__AUTO_DEPLOI: there is no setting "
            "models.resnet.auto_deploi; did you mean 'auto_deploy' "
            "(CONTROLPLANE_MODELS__RESNET__AUTO_DEPLOY)?",
        ),
        # The loader reads only the groups it knows: an unknown one used to be ignored.
        (
            "CONTROLPLANE_ROLBACK__THRESHOLD",
            "CONTROLPLANE_ROLBACK__THRESHOLD: there is no settings group 'rolback'; "
            "did you mean 'rollback' (CONTROLPLANE_ROLLBACK__THRESHOLD)?",
        ),
        (
            "CONTROLPLANE_XYZZY__THRESHOLD",
            "CONTROLPLANE_XYZZY__THRESHOLD: there is no settings group 'xyzzy'; the groups "
            "are: triton, reconcile,",
        ),
    ],
)
def test_a_typo_in_an_environment_variable_names_the_variable_meant(
    required: Path, monkeypatch: pytest.MonkeyPatch, variable: str, says: str
) -> None:
    monkeypatch.setenv(variable, "1")
    assert says in settings_error()


@pytest.mark.parametrize(
    "variable",
    [
        "CONTROLPLANE_URL",  # the CLI's
        "CONTROLPLANE_TOKEN",
        "CONTROLPLANE_SERVICE_HOST",  # Kubernetes' links to a Service named controlplane
        "CONTROLPLANE_PORT_8080_TCP_ADDR",
        # A known group, then nothing close to one of its settings: someone else's variable.
        "CONTROLPLANE_API_KEY",
        "CONTROLPLANE_LOG_DIR",
        "CONTROLPLANE_LOG_PORT",  # 0.6 from 'format' by difflib: not close enough
    ],
)
def test_variables_that_are_not_settings_are_left_alone(
    required: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "10.0.0.1")
    assert load_settings().api.port == 8080


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("CONTROLPLANE_TRITON_GRPC_URL", "'triton.grpc_url' (CONTROLPLANE_TRITON__GRPC_URL)"),
        ("CONTROLPLANE_REPOSITORY_PATH", "'repository.path' (CONTROLPLANE_REPOSITORY__PATH)"),
        ("CONTROLPLANE_LOG_LEVEL", "'log.level' (CONTROLPLANE_LOG__LEVEL)"),
        (  # close to a field: a typo on top of the lost '_'
            "CONTROLPLANE_STORE_POLL_INTERVAL_SECS",
            "'store.poll_interval_seconds' (CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS)",
        ),
        (  # a group whose name holds a '_'
            "CONTROLPLANE_MODEL_DEFAULTS_STRATEGY",
            "'model_defaults.strategy' (CONTROLPLANE_MODEL_DEFAULTS__STRATEGY)",
        ),
        (  # a nested group
            "CONTROLPLANE_MODEL_DEFAULTS_ROLLOUT_BAKE_SECONDS",
            "'model_defaults.rollout.bake_seconds' "
            "(CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__BAKE_SECONDS)",
        ),
        (  # one of the two '__' lost
            "CONTROLPLANE_MODEL_DEFAULTS_ROLLOUT__BAKE_SECONDS",
            "'model_defaults.rollout.bake_seconds' "
            "(CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__BAKE_SECONDS)",
        ),
        (
            "CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT_BAKE_SECONDS",
            "'model_defaults.rollout.bake_seconds' "
            "(CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__BAKE_SECONDS)",
        ),
        (  # a model's own policy
            "CONTROLPLANE_MODELS_RESNET_ROLLOUT_CANARY_MEMBERS",
            "'models.resnet.rollout.canary_members' "
            "(CONTROLPLANE_MODELS__RESNET__ROLLOUT__CANARY_MEMBERS)",
        ),
        # The shape of a Kubernetes service link (Service controlplane-api), but not its value.
        ("CONTROLPLANE_API_PORT", "'api.port' (CONTROLPLANE_API__PORT)"),
    ],
)
def test_one_underscore_where_two_belong_is_refused_with_the_variable_meant(
    required: Path, monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    """The loader would ignore such a variable, and the daemon run with the default."""
    monkeypatch.setenv(variable, "1")
    message = settings_error()
    assert f"  {variable}: " in message
    assert f"did you mean {meant}?" in message


def test_a_lost_underscore_is_named_before_the_setting_it_leaves_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY_PATH", str(tmp_path / "repository"))
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", (tmp_path / "store").as_uri())
    lines = settings_error().splitlines()
    assert lines[1].startswith("  CONTROLPLANE_REPOSITORY_PATH: no setting is read from this")
    assert "did you mean 'repository.path' (CONTROLPLANE_REPOSITORY__PATH)?" in lines[1]
    assert "  repository.path (CONTROLPLANE_REPOSITORY__PATH): Field required" in lines


def service_links(service: str, address: str, ports: dict[str, tuple[int, str]]) -> dict[str, str]:
    """The variables Kubernetes sets in every pod of the namespace for a Service
    (enableServiceLinks, on by default): ``ports`` maps each port's name to (port, protocol),
    the first one being the Service's main port."""
    name = service.upper().replace("-", "_")
    first, first_protocol = next(iter(ports.values()))
    links = {
        f"{name}_SERVICE_HOST": address,
        f"{name}_SERVICE_PORT": str(first),
        f"{name}_PORT": f"{first_protocol.lower()}://{address}:{first}",
    }
    for port_name, (port, protocol) in ports.items():
        links[f"{name}_SERVICE_PORT_{port_name.upper().replace('-', '_')}"] = str(port)
        link = f"{name}_PORT_{port}_{protocol}"
        links[link] = f"{protocol.lower()}://{address}:{port}"
        links[f"{link}_PROTO"] = protocol.lower()
        links[f"{link}_PORT"] = str(port)
        links[f"{link}_ADDR"] = address
    return links


def test_a_daemon_loads_its_settings_beside_kubernetes_service_links(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Services named after the daemon and its groups (controlplane-api, controlplane-store,
    ...) put CONTROLPLANE_API_PORT and the like into every pod of the namespace: a daemon that
    took them for misspelt settings would crash at start."""
    links: dict[str, str] = {}
    services = ["controlplane", "controlplane-api", "controlplane-store", "controlplane-triton"]
    services += [f"controlplane-{group.replace('_', '-')}" for group in Settings.model_fields]
    for number, service in enumerate(services):
        address = f"10.96.0.{number + 10}"
        ports = {"http": (8080, "TCP"), "grpc-port": (8001, "TCP"), "metrics": (8002, "UDP")}
        links.update(service_links(service, address, ports))
    assert "CONTROLPLANE_API_PORT_8080_TCP_PROTO" in links  # as the task describes them
    assert "CONTROLPLANE_STORE_SERVICE_PORT_GRPC_PORT" in links
    for variable, value in links.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("CONTROLPLANE_URL", "http://controlplane-api:8080")  # the CLI's
    monkeypatch.setenv("CONTROLPLANE_TOKEN", "s3cret")

    settings = load_settings()

    assert settings.api.port == 8080
    assert settings.triton.grpc_url == "localhost:8001"


# --- where a refused value came from ------------------------------------------------------


def test_a_bad_value_in_the_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path,
        {
            "repository": {"path": "/srv/r"},
            "store": {"uri": "file:///srv/s"},
            "api": {"port": "eighty"},
        },
    )
    message = settings_error(config)
    assert f"  api.port (in {config}): Input should be a valid integer" in message
    assert "CONTROLPLANE_API__PORT" not in message


def test_a_bad_value_in_a_variable_is_blamed_on_the_variable_even_beside_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_yaml(
        tmp_path,
        {"repository": {"path": "/srv/r"}, "store": {"uri": "file:///srv/s"}, "api": {"port": 80}},
    )
    monkeypatch.setenv("CONTROLPLANE_API__PORT", "eighty")
    message = settings_error(config)
    assert "  api.port (CONTROLPLANE_API__PORT): Input should be a valid integer" in message
    assert f"in {config}" not in message


def test_a_setting_missing_from_both_names_both_places(tmp_path: Path) -> None:
    config = write_yaml(tmp_path, {"repository": {"path": "/srv/r"}})
    message = settings_error(config)
    assert f"  store.uri (CONTROLPLANE_STORE__URI or in {config}): Field required" in message


@pytest.mark.parametrize(
    ("in_file", "in_env", "where"),
    [
        ({"source": "prometheus"}, {}, "in {config}"),
        ({}, {"CONTROLPLANE_ROLLBACK__SOURCE": "prometheus"}, "CONTROLPLANE_ROLLBACK__*"),
        (
            {"query": "up"},
            {"CONTROLPLANE_ROLLBACK__SOURCE": "prometheus"},
            "CONTROLPLANE_ROLLBACK__* and in {config}",
        ),
    ],
    ids=["file", "variable", "both"],
)
def test_a_rule_across_a_group_names_where_its_fields_came_from(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_file: dict[str, str],
    in_env: dict[str, str],
    where: str,
) -> None:
    base: dict[str, Any] = {"repository": {"path": "/srv/r"}, "store": {"uri": "file:///srv/s"}}
    config = write_yaml(tmp_path, {**base, "rollback": in_file})
    for variable, value in in_env.items():
        monkeypatch.setenv(variable, value)
    message = settings_error(config)
    assert f"  rollback ({where.format(config=config)}): rollback.source is prometheus" in message


# --- passwords in URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CONTROLPLANE_STORE__URI", "file://admin:hunter2@nas/srv/store"),
        ("CONTROLPLANE_TRITON__GRPC_URL", "http://admin:hunter2@triton:8001"),
        ("CONTROLPLANE_TRITON__GRPC_URL", "dns://admin:hunter2@10.0.0.2/triton:8001"),
        ("CONTROLPLANE_FLEET__ADVERTISE_URL", "http://admin:hunter2@10.0.0.7:8080"),
    ],
)
def test_a_refused_url_is_quoted_without_its_password(
    required: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    message = settings_error()
    assert "hunter2" not in message
    assert "admin:********@" in message or "admin" not in message


@pytest.mark.parametrize(
    "uri", ["s3://AKIAEXAMPLE:hunter2@bucket/prefix", "s3://AKIAEXAMPLE:hunt/er2@bucket"]
)
def test_credentials_in_an_s3_uri_are_refused_without_being_repeated(
    required: Path, monkeypatch: pytest.MonkeyPatch, uri: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", uri)
    message = settings_error()
    assert "store.uri (CONTROLPLANE_STORE__URI): an S3 URI names the bucket only" in message
    assert "AWS chain" in message
    assert "hunter2" not in message
    assert "hunt" not in message
    assert "AKIAEXAMPLE" not in message


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("s3:///prefix", "name the bucket"),
        ("file://relative/path", "use file:///absolute/path"),
        ("file:relative/path", "use file:///absolute/path"),
        ("/srv/store", "unsupported store URI"),
        ("https://example.com/store", "unsupported store URI"),
    ],
)
def test_unusable_store_uris_are_refused(
    monkeypatch: pytest.MonkeyPatch, uri: str, problem: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", "/srv/repository")
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", uri)
    message = settings_error()
    assert problem in message
    assert "store" in message


@pytest.mark.parametrize("uri", ["file:///srv/store", "file://localhost/srv/store"])
def test_absolute_file_uris_are_accepted(monkeypatch: pytest.MonkeyPatch, uri: str) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", "/srv/repository")
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", uri)
    assert load_settings().store.local_path == Path("/srv/store")


@pytest.mark.parametrize("uri", ["s3://bucket/prefix", "s3://bucket"])
def test_s3_uris_are_accepted(monkeypatch: pytest.MonkeyPatch, uri: str) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", "/srv/repository")
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", uri)
    assert load_settings().store.scheme == "s3"


def test_per_model_policy_and_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "controlplane.yaml"
    config.write_text(
        "repository: {path: /srv/repository}\n"
        "store: {uri: 'file:///srv/store'}\n"
        "models:\n  resnet: {auto_deploy: true}\n",
        encoding="utf-8",
    )
    settings = load_settings(config)
    assert settings.policy("resnet").auto_deploy is True
    assert settings.policy("bert").auto_deploy is False
    config.write_text(
        "repository: {path: /srv/repository}\nstore: {uri: 'file:///srv/store'}\n"
        "models:\n  '../x': {auto_deploy: true}\n",
        encoding="utf-8",
    )
    with pytest.raises(SettingsError, match="not allowed"):
        load_settings(config)


def test_a_floor_set_for_every_model_or_one_and_a_fallback_below_it_refused(
    tmp_path: Path,
) -> None:
    config = tmp_path / "controlplane.yaml"
    base = "repository: {path: /srv/repository}\nstore: {uri: 'file:///srv/store'}\n"
    config.write_text(
        base + "model_defaults: {min_release: r10}\nmodels:\n  resnet: {min_release: r12}\n",
        encoding="utf-8",
    )
    settings = load_settings(config)
    assert (settings.min_release("resnet"), settings.min_release("bert")) == ("r12", "r10")
    config.write_text(
        base + "models:\n  resnet: {min_release: r10, fallback_release: r9}\n", encoding="utf-8"
    )
    with pytest.raises(SettingsError, match="fallback_release r9 sorts before min_release r10"):
        load_settings(config)
    config.write_text(base + "models:\n  resnet: {min_release: '../r1'}\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="not allowed"):
        load_settings(config)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "triton-sidecar"])
def test_a_public_host_without_token_is_refused(
    required: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__HOST", host)
    message = settings_error()
    assert "api.token" in message
    assert repr(host) in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_token(
    required: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__HOST", host)
    assert load_settings().api.host == host


def test_a_public_host_with_a_token_is_accepted_and_the_token_hidden(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "s3cr3t-t0ken-value"
    monkeypatch.setenv("CONTROLPLANE_API__HOST", "0.0.0.0")
    monkeypatch.setenv("CONTROLPLANE_API__TOKEN", token)

    settings = load_settings()

    assert settings.api.host == "0.0.0.0"
    assert isinstance(settings.api.token, SecretStr)
    assert settings.api.token.get_secret_value() == token
    assert token not in repr(settings.api.token)
    assert token not in str(settings.api.token)
    assert token not in repr(settings)
    assert token not in settings.model_dump_json()


def test_a_blank_token_is_refused(required: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__TOKEN", "   ")
    assert "api.token is empty" in settings_error()


def test_a_read_token_is_a_secret_beside_the_write_token(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_API__TOKEN", "write-t0ken")
    monkeypatch.setenv("CONTROLPLANE_API__READ_TOKEN", "read-t0ken")

    settings = load_settings()

    assert isinstance(settings.api.read_token, SecretStr)
    assert settings.api.read_token.get_secret_value() == "read-t0ken"
    assert "read-t0ken" not in repr(settings)
    assert "read-t0ken" not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CONTROLPLANE_API__READ_TOKEN": "r"}, "api.read_token is set but api.token is not"),
        (
            {"CONTROLPLANE_API__TOKEN": "same", "CONTROLPLANE_API__READ_TOKEN": "same"},
            "api.read_token is the same as api.token",
        ),
        (
            {"CONTROLPLANE_API__TOKEN": "w", "CONTROLPLANE_API__READ_TOKEN": " "},
            "api.read_token is empty",
        ),
    ],
    ids=["without-write-token", "same-as-write-token", "blank"],
)
def test_a_read_token_that_would_guard_nothing_is_refused(
    required: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert says in settings_error()


@pytest.mark.parametrize("url", ["http://triton:8001", "grpc://triton:8001"])
def test_a_grpc_url_given_as_a_url_is_refused_with_the_host_port_meant(
    required: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_TRITON__GRPC_URL", url)
    message = settings_error()
    assert "triton.grpc_url (CONTROLPLANE_TRITON__GRPC_URL)" in message
    assert "give host:port (triton:8001), not a URL" in message


@pytest.mark.parametrize("log_format", ["auto", "json", "text"])
def test_the_log_format_is_a_setting(
    required: Path, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_LOG__FORMAT", log_format)
    assert load_settings().log.format == log_format


def test_an_unknown_log_format_is_refused(required: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_LOG__FORMAT", "pretty")
    assert "log.format (CONTROLPLANE_LOG__FORMAT)" in settings_error()


def test_settings_are_frozen(required: Path) -> None:
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.api.port = 1  # type: ignore[misc]


# --- render_defaults ----------------------------------------------------------------------


def test_render_defaults_is_yaml_that_mentions_every_field() -> None:
    text = render_defaults()
    data = yaml.safe_load(text)

    assert set(data) == set(Settings.model_fields)
    assert data["models"] == {}
    for group_name, group_field in Settings.model_fields.items():
        group_type = group_field.annotation
        if group_name == "models":  # a mapping of per-model policies, documented by example
            continue
        assert isinstance(group_type, type)
        assert issubclass(group_type, BaseModel)
        assert set(data[group_name]) == set(group_type.model_fields), group_name
        for name, field in group_type.model_fields.items():
            env = f"CONTROLPLANE_{group_name.upper()}__{name.upper()}"
            assert env in text
            assert field.description, f"{group_name}.{name} has no description"
            assert field.description in text
            if field.is_required():
                assert data[group_name][name] is None
            else:
                default = field.get_default(call_default_factory=True)
                if isinstance(default, tuple):
                    default = list(default)
                elif isinstance(default, BaseModel):
                    default = default.model_dump()
                assert data[group_name][name] == default, f"{group_name}.{name}"


def test_render_defaults_with_the_required_values_loads(tmp_path: Path) -> None:
    data = yaml.safe_load(render_defaults())
    data["repository"]["path"] = "/srv/repository"
    data["store"]["uri"] = "file:///srv/store"
    settings = load_settings(write_yaml(tmp_path, data))
    assert settings.triton.grpc_url == "localhost:8001"


def test_the_shipped_config_file_is_up_to_date() -> None:
    shipped = REPO_ROOT / "config" / "controlplane.yaml"
    assert shipped.read_text(encoding="utf-8") == render_defaults(), (
        "regenerate it: controlplane config --defaults > config/controlplane.yaml"
    )


def test_a_model_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", "/srv/repository")
    monkeypatch.setenv("CONTROLPLANE_STORE__URI", "s3://models/prod")
    monkeypatch.setenv("CONTROLPLANE_MODELS__RESNET__AUTO_DEPLOY", "true")
    settings = load_settings()
    assert settings.policy("resnet").auto_deploy is True
    assert settings.policy("other").auto_deploy is False


# --- automatic rollback -------------------------------------------------------------------


def test_a_percent_threshold_for_a_ratio_metric_is_refused(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__THRESHOLD", "95")
    message = settings_error()
    assert "CONTROLPLANE_ROLLBACK__THRESHOLD" not in message or "rollback" in message
    assert "looks like a percentage: use 0.95" in message


def test_a_percent_source_takes_percent_thresholds(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__SOURCE", "prometheus")
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__PROMETHEUS_URL", "http://prometheus:9090")
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__UNIT", "percent")
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__THRESHOLD", "95")
    assert load_settings().rollback.threshold_ratio == pytest.approx(0.95)
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__THRESHOLD", "0.95")
    assert "unit is percent; for 95 % use 95" in settings_error()


def test_triton_exports_a_ratio_so_percent_is_refused_for_it(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__UNIT", "percent")
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__THRESHOLD", "95")
    assert "Triton exports nv_gpu_utilization as a ratio" in settings_error()


def test_the_prometheus_source_needs_its_url(
    required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_ROLLBACK__SOURCE", "prometheus")
    assert "CONTROLPLANE_ROLLBACK__PROMETHEUS_URL" in settings_error()


def test_rollback_defaults_follow_the_grey_release_rule(required: Path) -> None:
    rollback = load_settings().rollback
    assert (rollback.source, rollback.threshold, rollback.window_seconds) == ("triton", 0.95, 10)
    assert (rollback.fallback_budget_seconds, rollback.cpu_budget_seconds) == (3.0, 2.0)
    assert rollback.cooldown_seconds == 300


def test_a_mixed_case_model_name_in_an_environment_variable_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loader reads variable names without case: ``Dec``'s policy went to ``dec``."""
    monkeypatch.setenv("CONTROLPLANE_MODELS__Dec__STRATEGY", "inplace")
    message = settings_error(None)
    assert "model name(s) Dec in CONTROLPLANE_MODELS__<NAME>__... variables" in message
    assert "in the config file (models: ...) instead" in message


# --- fleet: where the other members wake this one -------------------------------------------


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8080"),
        (
            {
                "CONTROLPLANE_API__HOST": "10.1.2.3",
                "CONTROLPLANE_API__PORT": "9000",
                "CONTROLPLANE_API__TOKEN": "t",
            },
            "http://10.1.2.3:9000",
        ),
        ({"CONTROLPLANE_API__HOST": "::1"}, "http://[::1]:8080"),
        ({"CONTROLPLANE_API__HOST": "0.0.0.0", "CONTROLPLANE_API__TOKEN": "t"}, None),
        ({"CONTROLPLANE_API__HOST": "::", "CONTROLPLANE_API__TOKEN": "t"}, None),
        (
            {
                "CONTROLPLANE_API__HOST": "0.0.0.0",
                "CONTROLPLANE_API__TOKEN": "t",
                "CONTROLPLANE_FLEET__ADVERTISE_URL": "http://10.0.0.7:8080/",
            },
            "http://10.0.0.7:8080",
        ),
    ],
)
def test_a_member_advertises_the_address_it_binds_unless_told_another(
    required: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert load_settings().fleet_url == url


@pytest.mark.parametrize(
    "bad",
    [
        "10.0.0.7:8080",
        "ftp://host:21",
        "http://user:pw@host:8080",
        "http://host:8080/api",
        "http://",
        "http://fd00::7:8080",  # IPv6 needs brackets
    ],
)
def test_an_advertised_address_that_is_not_one_is_refused_with_the_form_it_needs(
    required: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("CONTROLPLANE_FLEET__ADVERTISE_URL", bad)
    message = settings_error()
    assert "fleet.advertise_url" in message or "advertise_url" in message
    assert "http://host:port" in message


def test_a_models_entry_overrides_only_the_fields_it_names(
    required: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found from outside: naming a model to set its fallback gave it the built-in blue-green,
    30 s retire and signature rule instead of model_defaults'."""
    config = write_yaml(
        tmp_path,
        {
            "model_defaults": {
                "strategy": "inplace",
                "retire_after_seconds": 2,
                "require_signature": False,
                "rollout": {"canary_members": 1, "bake_seconds": 5},
            },
            "models": {"m": {"fallback_release": "r1", "rollout": {"bake_seconds": 9}}},
        },
    )
    monkeypatch.setenv("CONTROLPLANE_MODELS__E__AUTO_DEPLOY", "true")

    settings = load_settings(config)

    for model in ("m", "e", "unnamed"):
        assert settings.policy(model).strategy == "inplace", model
        assert settings.policy(model).retire_after_seconds == 2.0, model
        assert settings.require_signature(model) is False, model
        assert settings.policy(model).rollout.canary_members == 1, model
    assert settings.policy("m").fallback_release == "r1"
    assert settings.policy("m").rollout.bake_seconds == 9.0
    assert settings.policy("e").rollout.bake_seconds == 5.0
    assert settings.policy("e").auto_deploy is True
    assert settings.policy("unnamed").fallback_release is None


def test_a_models_entry_that_breaks_a_rule_with_model_defaults_names_the_model(
    required: Path, tmp_path: Path
) -> None:
    config = write_yaml(
        tmp_path,
        {
            "model_defaults": {"preflight": {"stress": {"enabled": True}}},
            "models": {"m": {"strategy": "inplace"}},
        },
    )

    message = settings_error(config)

    assert "models.m" in message
    assert "preflight.stress.enabled needs strategy blue-green" in message
    bad_defaults = {"model_defaults": {"retire_after_seconds": -1}, "models": {"m": {}}}
    message = settings_error(write_yaml(tmp_path, bad_defaults))
    assert "model_defaults.retire_after_seconds" in message
    assert "models.m" not in message  # told once, where it is written


def test_allow_downtime_on_a_model_that_never_rolls_is_refused_with_what_to_do(
    required: Path, tmp_path: Path
) -> None:
    config = write_yaml(
        tmp_path, {"models": {"m": {"strategy": "blue-green", "allow_downtime": True}}}
    )

    message = settings_error(config)

    assert "models.m" in message
    assert "allow_downtime is for strategy rolling or auto" in message
    assert "Remove allow_downtime, or set strategy: auto" in message


def test_a_rolling_wait_that_is_not_a_number_says_so(required: Path, tmp_path: Path) -> None:
    config = write_yaml(tmp_path, {"model_defaults": {"rollout": {"unready_seconds": "nan"}}})

    message = settings_error(config)

    assert "model_defaults.rollout.unready_seconds" in message
    assert "finite number" in message


# --- signatures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"store": {"require_signature": True}}, "store.require_signature"),
        ({"models": {"resnet": {"require_signature": True}}}, "models.resnet.require_signature"),
    ],
)
def test_a_required_signature_without_a_keyring_is_refused_naming_the_setting(
    required: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data: dict[str, Any],
    named: str,
) -> None:
    message = settings_error(write_yaml(tmp_path, data))
    assert f"{named} is true but store.keyring is not set" in message


def test_the_keyring_is_a_path_or_a_list_from_yaml_and_the_environment(
    required: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_STORE__KEYRING", "/etc/keys")
    assert load_settings().store.keyring == [Path("/etc/keys")]
    monkeypatch.setenv("CONTROLPLANE_STORE__KEYRING", '["/a.pem", "/b.pem"]')
    assert load_settings().store.keyring == [Path("/a.pem"), Path("/b.pem")]
    monkeypatch.delenv("CONTROLPLANE_STORE__KEYRING")
    config = write_yaml(tmp_path, {"store": {"keyring": "/k", "require_signature": True}})
    settings = load_settings(config)
    assert settings.store.keyring == [Path("/k")]
    assert settings.require_signature("any")


def test_the_old_heartbeat_seconds_is_read_as_the_keepalive_and_said_to_be_renamed(
    required: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_settings().fleet.keepalive_seconds == 60.0
    monkeypatch.setenv("CONTROLPLANE_FLEET__HEARTBEAT_SECONDS", "7")

    with pytest.warns(FutureWarning, match="now fleet.keepalive_seconds"):
        assert load_settings().fleet.keepalive_seconds == 7.0

    monkeypatch.setenv("CONTROLPLANE_FLEET__KEEPALIVE_SECONDS", "8")
    assert "give only keepalive_seconds" in settings_error()

"""Settings, built once at start-up and passed down; nothing else reads the environment.

Sources, highest priority first: environment variables (``CONTROLPLANE_`` prefix, ``__``
between group and field, e.g. ``CONTROLPLANE_TRITON__GRPC_URL``), then the YAML file given to
``controlplane serve --config``, then the defaults below. Every field has a description: it is
what ``--help`` and ``config/controlplane.yaml`` (``controlplane config --defaults``) show.
Unknown keys are refused, so a typo is an error rather than a silently ignored setting, and the
refusal names the key meant (:mod:`controlplane.setting_names`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from controlplane.domain.errors import InvalidName
from controlplane.domain.evaluator import check_threshold
from controlplane.domain.fleet import peer_url
from controlplane.domain.names import (
    validate_member_name,
    validate_model_name,
    validate_release_name,
    validate_slot_suffix,
)
from controlplane.domain.rollout import RolloutPolicy
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.setting_names import nearest, suggestion, unknown_env_groups

ENV_PREFIX = "CONTROLPLANE_"


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TritonSettings(_Group):
    grpc_url: str = Field(
        "localhost:8001", description="Triton's gRPC endpoint (host:port), in EXPLICIT mode."
    )
    metrics_url: str = Field(
        "http://localhost:8002/metrics", description="Triton's Prometheus metrics endpoint."
    )
    call_timeout_seconds: float = Field(
        10.0, gt=0, description="Timeout of each gRPC call other than a load."
    )
    load_timeout_seconds: float = Field(
        300.0, gt=0, description="Timeout of one model load (big models load slowly)."
    )
    unload_timeout_seconds: float = Field(
        120.0, gt=0, description="How long to wait for an unloaded model to become UNAVAILABLE."
    )
    retry_attempts: int = Field(
        3, ge=1, le=10, description="Attempts for calls that fail transiently (UNAVAILABLE)."
    )
    max_concurrent_loads: int = Field(
        4,
        ge=1,
        le=64,
        description="Loads the daemon asks of Triton at once, across models (repairs after a "
        "Triton restart included); match Triton's --model-load-thread-count (default 4): more "
        "would only queue inside Triton, where no one sees them wait.",
    )

    @field_validator("grpc_url")
    @classmethod
    def _host_port(cls, url: str) -> str:
        parsed = urlparse(url)
        if "://" in url and parsed.scheme in ("http", "https", "grpc", "grpcs"):
            raise ValueError(
                f"give host:port ({parsed.netloc or 'localhost:8001'}), not a URL: {url!r}"
            )
        return url


class ReconcileSettings(_Group):
    interval_seconds: float = Field(
        2.0,
        gt=0,
        le=300,
        description="How often the reconcile loop compares what Triton serves with what should "
        "serve and repairs the difference (a Triton restart, a model unloaded behind the "
        "daemon's back); while Triton is down it checks every 0.1 s.",
    )


class RepositorySettings(_Group):
    path: Path = Field(
        description="Triton's --model-repository; the daemon places model dirs here.",
    )


class StagingSettings(_Group):
    path: Path | None = Field(
        None,
        description="Temp dirs for downloads; must share the repository's filesystem. "
        "Default: 'staging' beside the repository.",
    )
    cache_max_bytes: int = Field(
        10 * 1024**3,
        ge=0,
        description="Bound of the content cache of verified files (staging/cas); files no "
        "placed release uses are evicted beyond it. 0 disables the cache.",
    )
    refuse_python_syntax_errors: bool = Field(
        True,
        description="Refuse a release whose Python sources do not compile (invalid_release, "
        "naming the file and line) before anything is placed. They are compiled with the "
        "daemon's Python: set false if Triton's Python backend runs a newer Python whose "
        "syntax the daemon's does not know (a warning is logged instead).",
    )


class StoreSettings(_Group):
    uri: str = Field(
        description="Where releases come from: file:///abs/path or s3://bucket/prefix, with "
        "<model>/<release>/ below it. S3 uses the standard AWS chain (AWS_ENDPOINT_URL_S3, ...).",
    )
    require_checksums: bool = Field(
        True, description="Refuse releases without SHA256SUMS (the publisher's commit marker)."
    )
    poll_interval_seconds: float = Field(
        10.0, gt=0, description="How often the watcher lists the store for new releases."
    )
    full_scan_seconds: float = Field(
        300.0,
        gt=0,
        description="Local store: how often the watcher lists every model even though "
        "filesystem events name the ones that changed (between these, a beat lists only those). "
        "The safety net for events the kernel drops (an inotify queue overflow): a release "
        "whose event was missed is seen at the next full scan at the latest, never lost. Where "
        "events cannot be trusted (a network or FUSE filesystem such as NFS, EFS or SMB, where "
        "a release published from another host raises no event; inotify unavailable) and for "
        "S3, every beat is a full scan.",
    )
    max_concurrency: int = Field(
        8, ge=1, le=64, description="Parallel downloads (objects and ranged parts) from S3."
    )
    multipart_threshold_bytes: int = Field(
        64 * 1024**2,
        ge=0,
        description="S3 objects at least this large are fetched in ranged parts, in parallel.",
    )
    part_size_bytes: int = Field(
        16 * 1024**2, ge=64 * 1024, description="Size of each ranged part of a large S3 object."
    )
    retry_seconds: float = Field(
        120.0,
        gt=0,
        description="How long one S3 request may keep failing transiently (SlowDown, 5xx, "
        "dropped connections, bytes corrupted on the way) before the deploy fails with "
        "store_unavailable; retries back off exponentially with jitter, at most 5 s apart. "
        "120 s outlasts a SlowDown storm or a MinIO pod restart, so a short outage delays a "
        "deploy instead of failing it; a store that is really down is reported that much "
        "later. Scans for new releases retry for at most 5 s (they run again anyway).",
    )
    max_release_bytes: int | None = Field(
        None,
        ge=1,
        description="Largest release (the sum of the sizes the store lists) a deploy accepts; "
        "a larger one is refused with release_too_large before anything is fetched. Default "
        "none: models range from kilobytes to hundreds of gigabytes, so no bound fits all, "
        "and free space in staging is checked before every fetch anyway; set it to catch a "
        "publisher's mistake before it costs a download.",
    )

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
                raise ValueError(f"use file:///absolute/path, not {uri!r}")
        elif parsed.scheme == "s3":
            if not parsed.netloc:
                raise ValueError(f"name the bucket: s3://bucket/prefix, not {uri!r}")
        else:
            raise ValueError(
                f"unsupported store URI {uri!r}; use file:///absolute/path or s3://bucket/prefix"
            )
        return uri

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme

    @property
    def local_path(self) -> Path:
        return Path(urlparse(self.uri).path)


class DatabaseSettings(_Group):
    path: Path | None = Field(
        None,
        description="SQLite file with releases, desired state and operations. "
        "Default: 'controlplane.db' beside the repository.",
    )


class ApiSettings(_Group):
    host: str = Field(
        "127.0.0.1", description="Address the API binds; anything but loopback needs a token."
    )
    port: int = Field(8080, ge=1, le=65535, description="Port of the REST API.")
    token: SecretStr | None = Field(
        None,
        description="The write token: every mutating route needs it as a bearer token "
        "(constant-time compared, never logged); it also reads.",
    )
    read_token: SecretStr | None = Field(
        None,
        description="The read token: once set, every read (GET /v1/..., /metrics, /docs, the "
        "status page) needs it or the write token, as a bearer token or as the password of HTTP "
        "Basic (any user name); the probes /healthz and /readyz stay open. It cannot write "
        "(403). Needs api.token. Unset: reads are open.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest request body accepted (413 beyond it)."
    )


class RolloutSettings(_Group):
    canary_members: int = Field(
        0,
        ge=0,
        le=1000,
        description="Fleet rollout: members that serve a new release first (the one that "
        "received the deploy counts) while the others keep the stable release; 0: every "
        "member at once.",
    )
    bake_seconds: float = Field(
        0.0,
        ge=0,
        description="Fleet rollout: how long the canaries serve the release, with healthy GPU "
        "verdicts and no failed deploy, before every member follows.",
    )


class ModelPolicy(_Group):
    auto_deploy: bool = Field(
        False,
        description="Deploy a new complete release as soon as the watcher sees it (the newest "
        "by natural sort of release names).",
    )
    strategy: Literal["blue-green", "inplace"] = Field(
        "blue-green",
        description="blue-green: load beside the serving release, switch an ensemble alias; "
        "inplace: replace the model dir and reload (decoupled or sequence models need it).",
    )
    retire_after_seconds: float = Field(
        30.0, ge=0, description="blue-green: how long the old slot stays warm for rollback."
    )
    drain_timeout_seconds: float = Field(
        60.0, ge=0, description="blue-green: longest wait for the old slot's pending requests."
    )
    slot_suffixes: tuple[str, str] = Field(
        ("__blue", "__green"),
        description="blue-green: names of the two slots, after the model's; each starts with "
        "'__', which model names may not contain.",
    )
    keep_fallback_warm: bool = Field(
        False,
        description="blue-green: never retire the previous release's slot, so a rollback (or "
        "an automatic one) is always a re-point of a few ms; it keeps two releases loaded, so "
        "turn it on where GPU memory holds both.",
    )
    fallback_release: str | None = Field(
        None, description="Release to go back to on trouble; default: the previous good one."
    )
    auto_rollback: bool = Field(
        True,
        description="Roll back by itself on GPU overload (watcher or alert); the runbook route "
        "POST /api/v1/model/reload acts either way.",
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings,
        description="How a new release spreads across the fleet: canary_members first, for "
        "bake_seconds, then the rest.",
    )

    @field_validator("slot_suffixes")
    @classmethod
    def _suffixes(cls, suffixes: tuple[str, str]) -> tuple[str, str]:
        for suffix in suffixes:
            try:
                validate_slot_suffix(suffix)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        if suffixes[0] == suffixes[1] or any(
            a.startswith(b + "-") or b.startswith(a + "-") for a, b in [suffixes, suffixes[::-1]]
        ):
            raise ValueError(f"the two slot suffixes must differ: {list(suffixes)}")
        return suffixes

    @field_validator("fallback_release")
    @classmethod
    def _release_name(cls, release: str | None) -> str | None:
        if release is not None:
            try:
                validate_release_name(release)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        return release


class RollbackSettings(_Group):
    source: Literal["triton", "prometheus", "none"] = Field(
        "triton",
        description="Where the overload watcher reads GPU utilisation: triton (its /metrics, "
        "no Prometheus needed), prometheus (an instant query) or none (alerts only).",
    )
    metrics_url: str | None = Field(
        None, description="source triton: the /metrics to scrape. Default: triton.metrics_url."
    )
    prometheus_url: str | None = Field(
        None, description="source prometheus: base URL of Prometheus, e.g. http://prometheus:9090."
    )
    query: str = Field(
        "nv_gpu_utilization",
        description="source prometheus: PromQL giving GPU utilisation, one series per GPU.",
    )
    unit: Literal["ratio", "percent"] = Field(
        "ratio",
        description="Unit of the samples and of the threshold: ratio in [0, 1] (Triton's "
        "nv_gpu_utilization) or percent (e.g. DCGM_FI_DEV_GPU_UTIL).",
    )
    threshold: float = Field(
        0.95, gt=0, description="Overload: every sample in the window above this (in unit)."
    )
    window_seconds: float = Field(
        10.0, gt=0, description="How long utilisation must stay above the threshold."
    )
    interval_seconds: float = Field(
        1.0, gt=0, description="How often the watcher samples; gaps over 2x this hold (unknown)."
    )
    aggregate: Literal["any", "all", "mean"] = Field(
        "any",
        description="Several GPUs: any (the hottest breaches), all (every one must), or mean.",
    )
    cooldown_seconds: float = Field(
        300.0,
        ge=0,
        description="After an automatic rollback, further triggers on that model "
        "are counted, not acted on, for this long.",
    )
    fallback_budget_seconds: float = Field(
        3.0,
        gt=0,
        description="Time for a warm fallback (its slot still loaded: a re-point) to serve "
        "before the CPU step.",
    )
    cold_fallback_budget_seconds: float = Field(
        120.0,
        gt=0,
        description="Time for a cold fallback (its slot retired: a load) to serve before the "
        "CPU step; size it to the model's load time. keep_fallback_warm avoids the load.",
    )
    cpu_budget_seconds: float = Field(
        2.0, gt=0, description="Time for the CPU-only reload before the rollback is failed."
    )
    scope: Literal["fleet", "member"] = Field(
        "fleet",
        description="What an automatic rollback changes: fleet (this member rolls back, then "
        "the fleet's desired state moves to the fallback and the release is latched degraded "
        "for every member) or member (only the member that saw the overload).",
    )
    alert_label: str = Field(
        "model",
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="Alert label naming the model to roll back; alerts without it act on every "
        "model that has a fallback.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RollbackSettings:
        try:
            check_threshold(self.threshold, unit=self.unit)
        except ValueError as exc:
            raise ValueError(f"rollback.threshold: {exc}") from None
        if self.source == "triton" and self.unit != "ratio":
            raise ValueError(
                "rollback.unit is percent, but Triton exports nv_gpu_utilization as a ratio in "
                "[0, 1]: use unit ratio (threshold 0.95 for 95 %), or source prometheus"
            )
        if self.source == "prometheus" and not self.prometheus_url:
            raise ValueError(
                "rollback.source is prometheus but rollback.prometheus_url is not set "
                "(CONTROLPLANE_ROLLBACK__PROMETHEUS_URL, e.g. http://prometheus:9090)"
            )
        return self

    @property
    def threshold_ratio(self) -> float:
        return self.threshold / 100 if self.unit == "percent" else self.threshold


class MemorySettings(_Group):
    headroom_check: bool = Field(
        True,
        description="Before a load, compare the release's estimated need with free GPU and "
        "host memory; refuse with insufficient_memory unless the deploy says force.",
    )
    load_factor: float = Field(
        1.5,
        gt=0,
        description="Estimated need = release size on disk x this, unless the release's "
        "config.pbtxt gives parameters 'controlplane.memory_hint_bytes'.",
    )
    gpu_metrics_url: str | None = Field(
        None,
        description="Where GPU memory figures (nv_gpu_memory_*) are read. "
        "Default: triton.metrics_url.",
    )
    audit: bool = Field(
        True,
        description="Audit each unloaded slot for residue (open files, shm, GPU memory) and "
        "sample Triton's memory after each swap; needs Triton's processes visible (same host, "
        "or shareProcessNamespace: true in the pod).",
    )
    triton_pid: int | None = Field(
        None,
        ge=1,
        description="Triton's pid, if finding it by its --model-repository is not enough.",
    )
    leak_window_swaps: int = Field(
        10, ge=2, description="Swaps over which Triton's memory growth is measured."
    )
    leak_threshold_bytes: int = Field(
        1024**3,
        ge=0,
        description="Growth over the window above this is logged as a suspected leak.",
    )


class FleetSettings(_Group):
    enabled: bool = Field(
        True,
        description="Keep the desired state in the store (under _controlplane/), shared by "
        "every daemon on that store, so that a deploy through any member reaches all of them. "
        "The store must then be writable. false: the desired state lives in this daemon's "
        "database alone, and the store may be read-only.",
    )
    member: str | None = Field(
        None,
        description="This member's name in the fleet. Default: the host name (in Kubernetes "
        "set it to the pod's name from the downward API).",
    )
    heartbeat_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="How often this member writes its heartbeat (what it serves, its GPU "
        "verdict) into the store; a member not seen for 3 beats is not alive.",
    )
    advertise_url: str | None = Field(
        None,
        description="Where the other members reach this member's API (http://host:port), "
        "written in its heartbeat: a member that changes the desired state wakes the others "
        "there, so they follow at once instead of at their next poll (a wake carries nothing "
        "and needs no token). Default: http://<api.host>:<api.port> when the API binds one "
        "address, none when it binds every address (in Kubernetes set it from the pod's IP). "
        "Without one this member follows at its polls.",
    )

    @field_validator("advertise_url")
    @classmethod
    def _advertise_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        taken = peer_url(url)
        if taken is None:
            raise ValueError(
                f"{url!r} is not a member's address: give http://host:port or "
                "https://host:port, with no path, query or credentials"
            )
        return taken

    @field_validator("member")
    @classmethod
    def _member_name(cls, member: str | None) -> str | None:
        if member is not None:
            try:
                validate_member_name(member)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        return member


class LogSettings(_Group):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="json: one JSON object per line (for log collectors); text: one short "
        "line (time, level, message, operation id) for people; auto: text when stderr is a "
        "terminal, json otherwise.",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    triton: TritonSettings = Field(default_factory=TritonSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    repository: RepositorySettings
    staging: StagingSettings = Field(default_factory=StagingSettings)
    store: StoreSettings
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    rollback: RollbackSettings = Field(default_factory=RollbackSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    model_defaults: ModelPolicy = Field(default_factory=ModelPolicy)
    models: dict[str, ModelPolicy] = Field(
        default_factory=dict,
        description="Per-model policy, by model name; models not named get model_defaults.",
    )

    @model_validator(mode="after")
    def _loopback_without_token(self) -> Settings:
        if self.api.token is None and not _is_loopback(self.api.host):
            raise ValueError(
                f"api.host is {self.api.host!r} but api.token is not set: without a token the "
                "API binds only to loopback (127.0.0.1, ::1). Set CONTROLPLANE_API__TOKEN"
            )
        if self.api.token is not None and not self.api.token.get_secret_value().strip():
            raise ValueError("api.token is empty; unset it or give it a value")
        read = self.api.read_token
        if read is not None:
            if not read.get_secret_value().strip():
                raise ValueError("api.read_token is empty; unset it or give it a value")
            if self.api.token is None:
                raise ValueError(
                    "api.read_token is set but api.token is not: without a write token "
                    "anyone may write, so a read token would guard nothing. Set "
                    "CONTROLPLANE_API__TOKEN too, or unset the read token"
                )
            if read.get_secret_value() == self.api.token.get_secret_value():
                raise ValueError(
                    "api.read_token is the same as api.token: give the read token a value of "
                    "its own, or it writes as well"
                )
        return self

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: dict[str, ModelPolicy]) -> dict[str, ModelPolicy]:
        for name in models:
            try:
                validate_model_name(name)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        return models

    def policy(self, model: str) -> ModelPolicy:
        return self.models.get(model, self.model_defaults)

    def traffic(self, model: str) -> TrafficPolicy:
        policy = self.policy(model)
        return TrafficPolicy(
            strategy=Strategy(policy.strategy),
            retire_after=policy.retire_after_seconds,
            drain_timeout=policy.drain_timeout_seconds,
            blue_suffix=policy.slot_suffixes[0],
            green_suffix=policy.slot_suffixes[1],
            keep_warm=policy.keep_fallback_warm,
        )

    def rollout(self, model: str) -> RolloutPolicy:
        rollout = self.policy(model).rollout
        return RolloutPolicy(rollout.canary_members, rollout.bake_seconds)

    @property
    def member_name(self) -> str:
        return self.fleet.member or _host_name()

    @property
    def fleet_url(self) -> str | None:
        """Where other members wake this one: ``fleet.advertise_url``, or the API's address
        when it binds one (not a wildcard)."""
        if self.fleet.advertise_url is not None:
            return self.fleet.advertise_url
        host = self.api.host
        try:
            if ipaddress.ip_address(host).is_unspecified:
                return None
        except ValueError:
            pass  # a name
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.api.port}"

    @property
    def staging_path(self) -> Path:
        return self.staging.path or self.repository.path.parent / "staging"

    @property
    def database_path(self) -> Path:
        return self.database.path or self.repository.path.parent / "controlplane.db"


def _host_name() -> str:
    """The host name as a member name (a pod's name in Kubernetes)."""
    name = socket.gethostname().split(".")[0] or "member"
    try:
        return validate_member_name(name)
    except InvalidName:
        return "member"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SettingsError(Exception):
    """Invalid settings: the message names each setting, its variable and the problem."""


def _env_model_names_in_capitals(environ: Mapping[str, str]) -> list[str]:
    """Mixed-case model names in ``CONTROLPLANE_MODELS__<NAME>__...`` variables: the settings
    loader reads variable names without case, so ``Dec`` would become ``dec`` and the policy
    would silently apply to another model. All capitals is the usual way to write a variable
    (``RESNET`` for ``resnet``), and is read as lowercase, as documented."""
    prefix = f"{ENV_PREFIX}MODELS__"
    return sorted(
        {
            name
            for key in environ
            if key.upper().startswith(prefix)
            and (name := key[len(prefix) :].split("__", 1)[0]) not in (name.lower(), name.upper())
        }
    )


def load_settings(config_file: Path | None = None) -> Settings:
    if capitals := _env_model_names_in_capitals(os.environ):
        raise SettingsError(
            f"model name(s) {', '.join(capitals)} in CONTROLPLANE_MODELS__<NAME>__... "
            "variables: environment variable names are read without case, so the policy "
            "would apply to the lowercase name. Set per-model policy for names with capitals "
            "in the config file (models: ...) instead; all-capital names mean the lowercase one"
        )
    if config_file is not None and not config_file.is_file():
        what = "is a directory, not a file" if config_file.is_dir() else "does not exist"
        raise SettingsError(f"config file {config_file} {what}")
    if config_file is not None:
        _require_mapping(config_file)

    class _WithFile(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if config_file is not None:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
            return tuple(sources)

    unknown_groups = _unknown_env_groups(os.environ)
    try:
        settings = _WithFile()
    except ValidationError as exc:
        raise SettingsError(_describe(exc, config_file, unknown_groups)) from None
    except (ValueError, yaml.YAMLError) as exc:  # YAML syntax, not a mapping, and similar
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if unknown_groups:
        raise SettingsError("\n".join(["invalid settings:", *unknown_groups]))
    return settings


def _unknown_env_groups(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``CONTROLPLANE_<GROUP>__...`` variable of a group that does not exist
    (the loader would ignore it), with the group meant when one is near."""
    lines = []
    for variable, group in unknown_env_groups(Settings, environ, ENV_PREFIX):
        meant = nearest(group, Settings.model_fields)
        line = f"  {variable}: there is no settings group {group!r}"
        if meant is not None:
            rest = variable[len(ENV_PREFIX) :].split("__", 1)[1]
            line += f"; did you mean {meant!r} ({ENV_PREFIX}{meant.upper()}__{rest.upper()})?"
        else:
            line += f"; the groups are: {', '.join(name for name, _ in _groups())}, models"
        lines.append(line)
    return lines


def _require_mapping(config_file: Path) -> None:
    """A config file holds a YAML mapping (or nothing); a list or a scalar would otherwise
    surface as a 'Field required' error far from the cause."""
    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise SettingsError(
            f"{config_file} holds a YAML {type(data).__name__}, not a mapping of settings "
            "(for example 'triton:' and 'store:' at the top level); see config/ for examples"
        )


def env_name(*path: str) -> str:
    """The environment variable of a setting: ``CONTROLPLANE_TRITON__GRPC_URL``."""
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def _describe(
    exc: ValidationError, config_file: Path | None = None, more: Sequence[str] = ()
) -> str:
    lines = ["invalid settings:", *more]
    variables = {name.upper() for name in os.environ}
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and loc:
            lines.append(_unknown_key(loc, config_file, variables))
            continue
        group = dict(_groups()).get(loc[0]) if len(loc) == 1 else None
        if error["type"] == "missing" and group is not None:
            # A whole group is missing: name the fields in it that have no default.
            for name, field in group.model_fields.items():
                if field.is_required():
                    lines.append(f"  {loc[0]}.{name} ({env_name(loc[0], name)}): {message}")
            continue
        if loc:
            dotted = ".".join(loc)
            lines.append(f"  {dotted} ({env_name(*loc)}): {message}")
        else:
            lines.append(f"  {message}")
    return "\n".join(lines)


def _unknown_key(loc: Sequence[str], config_file: Path | None, variables: set[str]) -> str:
    """The line for a key no group has: where it was set, and the key meant when one is near
    (else every key of its group)."""
    meant, known = suggestion(Settings, loc)
    dotted = ".".join(loc)
    variable = env_name(*loc)
    if variable in variables:
        line = f"  {variable}: there is no setting {dotted}"
        if meant is not None:
            return line + f"; did you mean {meant!r} ({env_name(*loc[:-1], meant)})?"
    else:
        where = f" (in {config_file})" if config_file is not None else ""
        line = f"  {dotted}{where}: there is no such setting"
        if meant is not None:
            return line + f"; did you mean {meant!r}?"
    if known:
        return line + f"; {'.'.join(loc[:-1]) or 'the top level'} has: {', '.join(known)}"
    return line


def render_defaults() -> str:
    """``config/controlplane.yaml``: every setting, its default and what it does."""
    out = [
        "# controlplane settings: every setting, its default and what it does.",
        "# Generated by `controlplane config --defaults`; environment variables override it",
        f"# ({ENV_PREFIX}<GROUP>__<FIELD>, e.g. {ENV_PREFIX}TRITON__GRPC_URL).",
    ]
    for group_name, group_type in _groups():
        out.append("")
        out.append(f"{group_name}:")
        for name, field in group_type.model_fields.items():
            out.append(f"  # {field.description} [{env_name(group_name, name)}]")
            if field.is_required():
                out.append(f"  {name}:  # required")
            else:
                out.append(f"  {name}: {_yaml_value(field.get_default(call_default_factory=True))}")
    out += [
        "",
        f"# {Settings.model_fields['models'].description}",
        f"# [{ENV_PREFIX}MODELS__<NAME>__<FIELD>], fields as in model_defaults. For example:",
        "#   models:",
        "#     resnet:",
        "#       auto_deploy: true",
        "models: {}",
    ]
    return "\n".join(out) + "\n"


def _groups() -> list[tuple[str, type[BaseModel]]]:
    """The settings groups (``triton``, ``store``, ...), in declaration order."""
    return [
        (name, field.annotation)
        for name, field in Settings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    ]


def settings_help() -> str:
    """One line per setting, for ``controlplane serve --help``."""
    lines = ["Settings (YAML keys group.field; environment variables override the file):", ""]
    lines += [
        f"{ENV_PREFIX}MODELS__<NAME>__<FIELD>: per-model policy (fields as model_defaults).",
        "",
    ]
    for group_name, group_type in _groups():
        for name, field in group_type.model_fields.items():
            default = (
                "required"
                if field.is_required()
                else f"default {_yaml_value(field.get_default(call_default_factory=True))}"
            )
            lines.append(f"{env_name(group_name, name)}: {field.description} ({default})")
            lines.append("")
    return "\n".join(lines)


def _yaml_value(value: object) -> str:
    if isinstance(value, BaseModel):
        fields = value.model_dump()
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in fields.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml_value(item) for item in value) + "]"
    return f'"{value}"'

"""The whole settings tree, and the rules and values that span its groups.

:class:`Settings` puts each group under its key (``triton``, ``store``, ...), in the order
``config/controlplane.yaml`` and ``--help`` show them, with ``model_defaults`` and the
per-model ``models`` last. Rules that need two fields are checked here, once every group is
valid: a token whenever the API binds beyond loopback, a read token only beside a write token
and different from it, model names the domain allows. Values derived from several groups
(staging and the database beside the repository, this member's name and address, a model's
traffic and rollout policy) are properties, so the rest of the daemon reads them one way.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_member_name, validate_model_name
from controlplane.domain.notifications import member_queue_name
from controlplane.domain.rollout import RolloutPolicy
from controlplane.domain.stress import StressPolicy
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.domain.turns import RollingPolicy
from controlplane.settings.api import ApiSettings
from controlplane.settings.fleet import FleetSettings
from controlplane.settings.log import LogSettings
from controlplane.settings.memory import MemorySettings
from controlplane.settings.names import ENV_PREFIX
from controlplane.settings.places import (
    DatabaseSettings,
    RepositorySettings,
    StagingSettings,
    StoreSettings,
)
from controlplane.settings.policy import ModelPolicy
from controlplane.settings.rollback import RollbackSettings
from controlplane.settings.triton import ReconcileSettings, TritonSettings


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
        description="Per-model policy, by model name: each field set here overrides the same "
        "field of model_defaults, the others are model_defaults'; models not named get "
        "model_defaults.",
    )

    @model_validator(mode="before")
    @classmethod
    def _models_over_defaults(cls, data: object) -> object:
        """Each model's entry is model_defaults with the fields it names replaced (a group such
        as rollout field by field too), so naming a model to set one field keeps the others."""
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            return data
        base = _given(data.get("model_defaults"))
        if not isinstance(base, dict) or not base or not _valid(base):
            return data  # model_defaults' own errors are told once, under model_defaults
        models = {
            name: _overlay(base, own) if isinstance(own := _given(entry), dict) else entry
            for name, entry in data["models"].items()
        }
        return {**data, "models": models}

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

    @model_validator(mode="after")
    def _keyring_where_required(self) -> Settings:
        if self.store.keyring is not None:
            return self
        if self.store.require_signature:
            raise ValueError(
                "store.require_signature is true but store.keyring is not set: name the dir "
                "(or PEM files) of the publisher keys that may sign releases "
                "(CONTROLPLANE_STORE__KEYRING), or do not require signatures"
            )
        where = ["model_defaults"] if self.model_defaults.require_signature else []
        where += [f"models.{name}" for name, p in self.models.items() if p.require_signature]
        if where:
            raise ValueError(
                f"{where[0]}.require_signature is true but store.keyring is not set: name the "
                "dir (or PEM files) of the publisher keys that may sign releases "
                "(CONTROLPLANE_STORE__KEYRING), or do not require signatures"
            )
        return self

    def require_signature(self, model: str) -> bool:
        """Whether a release of ``model`` must carry a valid signature."""
        own = self.policy(model).require_signature
        return self.store.require_signature if own is None else own

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

    def stress(self, model: str) -> StressPolicy:
        stress = self.policy(model).preflight.stress
        return StressPolicy(
            enabled=stress.enabled,
            seconds=stress.seconds,
            concurrency=stress.concurrency,
            max_p99_ratio=stress.max_p99_ratio,
            min_p99_gap_ms=stress.min_p99_gap_ms,
            max_memory_growth=stress.max_memory_growth_bytes,
        )

    def fallback_release(self, model: str) -> str | None:
        return self.policy(model).fallback_release

    def min_release(self, model: str) -> str | None:
        """The oldest release of ``model`` that may serve (None: no floor)."""
        return self.policy(model).min_release

    def auto_rollback(self, model: str) -> bool:
        return self.policy(model).auto_rollback

    def auto_deploy(self, model: str) -> bool:
        return self.policy(model).auto_deploy

    def rolling(self, model: str) -> RollingPolicy:
        policy = self.policy(model)
        return RollingPolicy(
            max_unavailable=policy.rollout.max_unavailable,
            unready_seconds=policy.rollout.unready_seconds,
            drain_timeout=policy.drain_timeout_seconds,
            return_seconds=self.memory.return_seconds,
            allow_downtime=policy.allow_downtime,
            restart_triton=self.memory.on_not_returned == "restart-triton",
            restart_seconds=self.memory.restart_seconds,
        )

    @property
    def longest_unready_seconds(self) -> float:
        """The longest ``rollout.unready_seconds`` of any model: how long a member that
        returns to rotation still tells the fleet it is out (the balancer's time to notice)."""
        policies = [self.model_defaults, *self.models.values()]
        return max(policy.rollout.unready_seconds for policy in policies)

    def may_roll(self, model: str) -> RollingPolicy | None:
        """The rolling policy of a model whose updates may roll (strategy rolling or auto);
        None for blue-green and inplace."""
        return self.rolling(model) if Strategy(self.policy(model).strategy).may_roll else None

    def rollout(self, model: str) -> RolloutPolicy:
        rollout = self.policy(model).rollout
        return RolloutPolicy(rollout.canary_members, rollout.bake_seconds)

    @property
    def member_name(self) -> str:
        return self.fleet.member or _host_name()

    @property
    def member_queue_name(self) -> str:
        """The SQS queue this member makes on the fleet's SNS topic
        (``store.notifications.sns_topic_arn``): ``store.notifications.queue_name``, or one
        named after the member."""
        return self.store.notifications.queue_name or member_queue_name(self.member_name)

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


def groups() -> list[tuple[str, type[BaseModel]]]:
    """The settings groups (``triton``, ``store``, ...), in declaration order."""
    return [
        (name, field.annotation)
        for name, field in Settings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    ]


def _given(value: object) -> object:
    """A policy as the fields it was given: a dict as it is, a model built in code by its set
    fields (so a default it did not name does not hide model_defaults' value)."""
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value


def _valid(policy: dict[str, object]) -> bool:
    try:
        ModelPolicy.model_validate(policy)
    except ValidationError:
        return False
    return True


def _overlay(base: dict[str, object], own: dict[str, object]) -> dict[str, object]:
    merged = dict(base)
    for key, value in own.items():
        under = merged.get(key)
        if isinstance(under, dict) and isinstance(value, dict):  # a group: field by field
            value = _overlay(under, value)
        merged[key] = value
    return merged

"""Per-model policy: how a model deploys, how long its old slot stays warm, what it falls back
to, and how a new release of it spreads across the fleet.

One :class:`ModelPolicy` is ``model_defaults``; ``models`` maps a model's name to its own.
Slot suffixes and the fallback release are checked with the domain's own name rules, so a
name the daemon would refuse later is refused at start-up instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_release_name, validate_slot_suffix
from controlplane.settings.group import Group


class RolloutSettings(Group):
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


class ModelPolicy(Group):
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
    require_signature: bool | None = Field(
        None,
        description="Refuse releases of this model without a valid SHA256SUMS.sig (true), or "
        "deploy unsigned ones (false); default: store.require_signature. A signature that is "
        "there is verified either way when store.keyring is set.",
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

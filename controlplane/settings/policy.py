"""Per-model policy: how a model deploys, how long its old slot stays warm, what it falls back
to, and how a new release of it spreads across the fleet.

One :class:`ModelPolicy` is ``model_defaults``; ``models`` maps a model's name to its own.
Slot suffixes and the fallback release are checked with the domain's own name rules, so a
name the daemon would refuse later is refused at start-up instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_release_name, validate_slot_suffix
from controlplane.domain.releases import below_floor
from controlplane.domain.traffic import Strategy
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
    bake_seconds: float | None = Field(
        0.0,
        ge=0,
        description="Fleet rollout: how long the canaries serve the release, with healthy GPU "
        "verdicts and no failed deploy, before every member follows; null: until someone "
        "promotes it (controlplane rollout promote MODEL). Time paused does not count.",
    )
    max_unavailable: int = Field(
        1,
        ge=1,
        le=1000,
        description="rolling: at most this many members out of rotation for the model at once, "
        "across the fleet (each takes a turn in the desired state).",
    )
    unready_seconds: float = Field(
        5.0,
        ge=0,
        allow_inf_nan=False,
        le=600,
        description="rolling: after /readyz turns 503 (draining), how long a member waits "
        "before it unloads, so that the load balancer stops sending it requests, and how long "
        "it keeps its turn once back, so that the balancer sends it requests again before the "
        "next member leaves; the readiness probe's period x failure threshold must be below "
        "it. 0 leaves the balancer no time: calls fail (a warning at start).",
    )


class StressSettings(Group):
    enabled: bool = Field(
        False,
        description="blue-green: before the switch, drive the new slot and the serving one with "
        "the smoke sample (smoke.json, or generated inputs) in alternating phases of one window, "
        "and refuse the release (preflight_failed) on any failed request, a p99 latency above "
        "max_p99_ratio x the serving slot's (and min_p99_gap_ms slower), or memory growth above "
        "max_memory_growth_bytes. Needs strategy blue-green.",
    )
    seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Length of the stress window, both slots together (about 0.5 s phases, "
        "alternating); the deploy takes this much longer. 10 s gives each slot a few thousand "
        "requests for a fast model; give a slow model (100 ms and more) 30 s or more so its "
        "p99 rests on enough requests.",
    )
    concurrency: int = Field(
        4,
        ge=1,
        le=256,
        description="Requests in flight at once on each slot: about the concurrency the model "
        "sees in production per Triton, so queueing behind too few instances shows up.",
    )
    max_p99_ratio: float = Field(
        2.0,
        gt=1,
        description="Refuse when the new slot's p99 latency is above this times the serving "
        "slot's (measured in the same window). 2.0 catches a release twice as slow under load; "
        "raise it for sub-millisecond models, whose p99 is mostly machine noise.",
    )
    min_p99_gap_ms: float = Field(
        5.0,
        ge=0,
        description="A new p99 above max_p99_ratio x the serving one is refused only when it is "
        "also slower by more than this: on a busy host a fast model's p99 moves by a few ms on "
        "noise alone. Lower it for models that must answer in a few ms; 0 compares the ratio "
        "only.",
    )
    max_memory_growth_bytes: int = Field(
        64 * 1024**2,
        ge=0,
        description="Refuse when /dev/shm (used bytes) or GPU memory (Triton's metrics, when it "
        "has GPUs) grew by more than this over the window, measured after the new slot loaded, "
        "so its steady allocation is not counted: growth under load is a leak per request.",
    )


class PreflightSettings(Group):
    stress: StressSettings = Field(
        default_factory=StressSettings,
        description="A load test of the new slot against the serving one before the switch.",
    )


class ModelPolicy(Group):
    auto_deploy: bool = Field(
        False,
        description="Deploy a new complete release as soon as the watcher sees it (the newest "
        "by natural sort of release names).",
    )
    strategy: Literal["auto", "blue-green", "rolling", "inplace"] = Field(
        "auto",
        description="blue-green: load beside the serving release, switch an ensemble alias; "
        "rolling (models that fit once in GPU memory): leave rotation, drain, unload, wait for "
        "the memory to come back, load, return, one member at a time; auto: blue-green when "
        "the headroom check says the new release fits beside the serving one, else rolling; "
        "inplace: replace the model dir and reload (decoupled or sequence models need it).",
    )
    allow_downtime: bool = Field(
        False,
        description="rolling in a fleet of one: allow the update anyway (it drains, unloads "
        "and loads; the model does not serve meanwhile, and the operation records how long). "
        "Without it such an update is refused.",
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
        description="Refuse releases of this model without a valid SHA256SUMS.sig or model.sig "
        "(true), or "
        "deploy unsigned ones (false); default: store.require_signature. A signature that is "
        "there is verified either way when store.keyring is set.",
    )
    min_release: str | None = Field(
        None,
        description="The oldest release of this model that may serve: a deploy, a rollback "
        "(automatic ones too) or a fleet's desired state naming a release that sorts before it "
        "(natural order of release names, as the watcher orders them: r2 before r10) is "
        "refused with release_below_floor, and what serves keeps serving. Raise it when a "
        "release must never serve again: anyone who can write to the store can otherwise move "
        "the fleet back to an older signed release. Unset: no floor. See docs/signatures.md.",
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings,
        description="How a new release spreads across the fleet: canary_members first, for "
        "bake_seconds, then the rest.",
    )

    preflight: PreflightSettings = Field(
        default_factory=PreflightSettings,
        description="Checks of the new release before it takes traffic, beyond the smoke "
        "inference.",
    )

    @model_validator(mode="after")
    def _stress_needs_two_slots(self) -> ModelPolicy:
        if self.strategy == "inplace" and self.preflight.stress.enabled:
            raise ValueError(
                "preflight.stress.enabled needs strategy blue-green: under inplace the new "
                "release replaces the serving one as it loads, so there is no moment to load-test "
                "it before it takes traffic. Set strategy: blue-green, or turn stress off"
            )
        return self

    @model_validator(mode="after")
    def _downtime_is_rolling(self) -> ModelPolicy:
        if self.allow_downtime and not Strategy(self.strategy).may_roll:
            raise ValueError(
                "allow_downtime is for strategy rolling or auto (a model that fits once in GPU "
                f"memory, unloaded before the new release loads); strategy {self.strategy} "
                "loads the new release beside the old one and never stops serving. Remove "
                "allow_downtime, or set strategy: auto"
            )
        return self

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

    @model_validator(mode="after")
    def _fallback_above_floor(self) -> ModelPolicy:
        floor, fallback = self.min_release, self.fallback_release
        if floor is not None and fallback is not None and below_floor(fallback, floor):
            raise ValueError(
                f"fallback_release {fallback} sorts before min_release {floor}: a rollback to "
                "it would be refused. Name a fallback at or above the floor, or lower the floor"
            )
        return self

    @field_validator("fallback_release", "min_release")
    @classmethod
    def _release_name(cls, release: str | None) -> str | None:
        if release is not None:
            try:
                validate_release_name(release)
            except InvalidName as exc:
                raise ValueError(exc.message) from None
        return release

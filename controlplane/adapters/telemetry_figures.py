"""The present as series: one :class:`~controlplane.domain.figures.Figures`, built for a
scrape, turned into Prometheus metric families.

Every family is yielded at every scrape, with no sample where there is nothing to say (no
model, no fleet view, no model out of rotation), so ``# HELP`` and ``# TYPE`` always document
it. Gauges that are a yes/no are 1 or 0; a per-model fact exists for every model the member
manages or the fleet wants, so an alert on ``== 0`` sees a model that stopped being served
rather than a series that vanished. Being out of rotation is the exception: a sample (1, its
``reason`` a label) exists only while it is so, as ``/readyz`` says it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.domain.figures import Figures, MemberStanding


def _flag(value: bool) -> int:
    return 1 if value else 0


class FiguresCollector(Collector):
    """Yields the series of the figures handed to it for this scrape."""

    def __init__(self) -> None:
        self.figures = Figures(models=(), triton_up=False, jobs={}, not_serving=0)

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        yield from self._serving(figures)
        yield from self._health(figures)
        yield from self._fleet(figures)

    def _serving(self, figures: Figures) -> Iterator[Metric]:
        active = InfoMetricFamily(
            "controlplane_active_release",
            "The release each model serves here (its desired state in this member's database).",
            labels=["model"],
        )
        slots = GaugeMetricFamily(
            "controlplane_slot_state",
            "Each slot's state (ABSENT, LOADING, READY, ACTIVE, RETIRING, ...): 1 on the "
            "current one.",
            labels=["model", "slot", "state"],
        )
        desired = GaugeMetricFamily(
            "controlplane_model_serving_desired_release",
            "1 while this member serves what it should of the model (in a fleet the fleet's "
            "target for this member, else its own desired release) and Triton serves it, as "
            "of the last reconcile and fleet passes; 0 while it does not (converging, failed, "
            "held, or Triton lost it).",
            labels=["model"],
        )
        cpu = GaugeMetricFamily(
            "controlplane_model_cpu_only",
            "1 while the model serves on CPU-only instances, as the rollback chain's last step "
            "left it (until it is next loaded from its files: a deploy, a rollback that loads), "
            "else 0.",
            labels=["model"],
        )
        degraded = GaugeMetricFamily(
            "controlplane_release_degraded",
            "1 for each release latched degraded here (rolled back from; never re-promoted "
            "automatically; deploying it by name clears it).",
            labels=["model", "release"],
        )
        out = GaugeMetricFamily(
            "controlplane_model_out_of_rotation",
            "1 for each model that keeps this member out of rotation (/readyz answers 503), "
            "by reason: draining (a rolling update drains, unloads and loads it here; back "
            "when it ends) or memory_not_returned (held: the old release's GPU memory did not "
            "come back, so nothing was loaded; until a deploy of the model succeeds). No "
            "sample otherwise.",
            labels=["model", "reason"],
        )
        for model in figures.models:
            if model.out_of_rotation is not None:
                out.add_metric([model.name, model.out_of_rotation.value], 1)
            if model.active_release is not None:
                active.add_metric([model.name], {"release": model.active_release})
            for slot in model.slots:
                slots.add_metric([model.name, slot.name, slot.state.value], 1)
            desired.add_metric([model.name], _flag(model.serving_desired))
            cpu.add_metric([model.name], _flag(model.cpu_only))
            for release in model.degraded:
                degraded.add_metric([model.name, release], 1)
        yield from (active, slots, desired, cpu, degraded, out)

    def _health(self, figures: Figures) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "controlplane_triton_up",
            "1 when Triton answered a liveness check during this scrape.",
            value=_flag(figures.triton_up),
        )
        jobs = GaugeMetricFamily(
            "controlplane_job_up",
            "1 while a background job runs, 0 while it backs off after a failure, by job name.",
            labels=["name"],
        )
        for job, up in sorted(figures.jobs.items()):
            jobs.add_metric([job], _flag(up))
        yield jobs
        yield GaugeMetricFamily(
            "controlplane_models_not_serving",
            "Managed models whose desired release Triton does not serve, as of the last "
            "reconcile pass (readiness fails while this is above 0).",
            value=figures.not_serving,
        )
        notifications = GaugeMetricFamily(
            "controlplane_store_notifications_up",
            "1 while the store's event notifications (store.notifications.sqs_queue_url) are "
            "received, 0 while the queue cannot be reached or before it first answered (new "
            "releases are then seen at the next poll). No sample without a queue.",
        )
        if figures.notifications is not None:
            notifications.add_metric([], _flag(figures.notifications.up))
        yield notifications

    def _fleet(self, figures: Figures) -> Iterator[Metric]:
        fleet = figures.fleet
        yield GaugeMetricFamily(
            "controlplane_fleet_stale",
            "1 while this member cannot read the fleet's desired state from the store (it "
            "keeps serving what it has), else 0 (also when fleet.enabled is false).",
            value=_flag(fleet is not None and fleet.stale),
        )
        yield GaugeMetricFamily(
            "controlplane_fleet_member_name_conflict",
            "1 while another daemon writes heartbeats under this member's name (give each its "
            "own CONTROLPLANE_FLEET__MEMBER), else 0.",
            value=_flag(fleet is not None and fleet.name_conflict),
        )
        last_read = fleet.last_read if fleet is not None else None
        yield GaugeMetricFamily(
            "controlplane_fleet_last_read_timestamp_seconds",
            "When this member last read the fleet's desired state (Unix time; 0: never, or "
            "fleet.enabled is false).",
            value=last_read.timestamp() if last_read is not None else 0,
        )
        generation = GaugeMetricFamily(
            "controlplane_fleet_model_generation",
            "The generation of each model's desired state, as this member last read it (one "
            "higher at every change).",
            labels=["model"],
        )
        paused = GaugeMetricFamily(
            "controlplane_fleet_rollout_paused",
            "1 while the model's rollout is paused (controlplane rollout pause: it holds where "
            "it stands until resumed), else 0, as this member last read the desired state.",
            labels=["model"],
        )
        converged = GaugeMetricFamily(
            "controlplane_fleet_model_converged",
            "1 when every live member serves its target of the model, 0 when one does not, as "
            "this member last read the heartbeats (no sample while it cannot read them).",
            labels=["model"],
        )
        members = GaugeMetricFamily(
            "controlplane_fleet_members",
            "Members by standing, from their heartbeats as this member last read them: alive, "
            "stale (alive, cannot read the store), down (no heartbeat for 3 beats; forgotten "
            "after an hour). No sample while this member cannot read them.",
            labels=["state"],
        )
        refused = GaugeMetricFamily(
            "controlplane_fleet_records_refused",
            "Records of the fleet (under _controlplane/ in the store) this member refuses now, "
            "by kind (desired: a model's desired state, its turns and latches inside it; "
            "member: a heartbeat) and reason (not_json, missing_field, wrong_type, "
            "out_of_range, not_a_time, time_without_zone, unknown_value, invalid_name, "
            "misnamed, generation_went_back, release_not_found, signature_missing, "
            "signature_invalid, unknown_signer). A refused desired state is not "
            "acted on (its model keeps what serves), a refused heartbeat hides its member; "
            "GET /v1/fleet says which and why. No sample when none is.",
            labels=["kind", "reason"],
        )
        if fleet is not None:
            for (kind, reason), number in sorted(fleet.refused.items()):
                refused.add_metric([kind.value, reason.value], number)
            for model, number in sorted(fleet.generations.items()):
                generation.add_metric([model], number)
                paused.add_metric([model], _flag(model in fleet.paused))
            if fleet.view is not None:
                for model, done in sorted(fleet.view.converged.items()):
                    converged.add_metric([model], _flag(done))
                for state in MemberStanding:
                    members.add_metric([state.value], fleet.view.members.get(state, 0))
        yield from (generation, paused, converged, members, refused)

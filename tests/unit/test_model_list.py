"""GET /v1/models answers from what was seen last, and says when: a list is built again when
what it shows changed, Triton's index is reused for at most a second unless an operation ran,
and each model's JSON is that of the view built for the call."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import datetime, timedelta
from pathlib import Path

from controlplane.api.model_pages import ModelPages
from controlplane.api.schemas.model import as_of_json, ignored_json, model_json, overload_json
from controlplane.domain.evaluator import Evaluation, Verdict
from controlplane.domain.operations import Trigger
from controlplane.domain.rollback import RollbackOutcome, RollbackRecord, cooldown_until
from controlplane.services.catalog import StoreCatalog
from controlplane.services.deploy import DeployService
from controlplane.services.overload import OverloadView
from controlplane.services.status import INDEX_REUSE_SECONDS, StatusService
from controlplane.services.views import ModelPage
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fakes import Parts, deploy_service, release_watcher, started, status_service
from tests.support.models import write_scale_release

COOLDOWN = 60.0


def _status(service: DeployService, parts: Parts, catalog: StoreCatalog) -> StatusService:
    def cooldown(last: RollbackRecord | None) -> datetime | None:
        until = cooldown_until(last, COOLDOWN)
        return until if until is not None and until > parts.clock.now() else None

    return status_service(service, parts, cooldown_until=cooldown, catalog=catalog)


async def _scanned(service: DeployService, parts: Parts) -> ReleaseWatcher:
    watcher = release_watcher(service, parts)
    await watcher.scan()
    return watcher


async def _only(status: StatusService) -> ModelPage:
    page = await status.list_models()
    assert [view.name for view in page.models] == ["m"]
    return page


def test_an_operation_shows_in_the_next_list_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            status = _status(service, parts, (await _scanned(service, parts)).catalog)
            before = (await _only(status)).models[0]

            operation = await started(service, "m", "r1")
            await service.wait(operation.id)  # no time passes on the fake clock
            after = (await _only(status)).models[0]

            assert (before.active_release, before.triton_state) == (None, "UNAVAILABLE")
            assert (after.active_release, after.triton_state) == ("r1", "READY")
            assert after.last_operation is not None
            assert after.last_operation.id == operation.id

    asyncio.run(scenario())


def test_triton_s_states_are_reused_for_a_second_and_the_list_says_when_it_read_them(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            operation = await started(service, "m", "r1")
            await service.wait(operation.id)
            watcher = await _scanned(service, parts)
            status = _status(service, parts, watcher.catalog)
            first = await _only(status)
            read_at = parts.clock.now()
            reads = parts.triton.called("index", "")

            await parts.triton.unload("m")  # through Triton's own API: no operation of ours
            parts.clock.advance(INDEX_REUSE_SECONDS / 2)
            soon = await _only(status)
            parts.clock.advance(INDEX_REUSE_SECONDS / 2)
            later = await _only(status)

            assert first.models[0].triton_state == soon.models[0].triton_state == "READY"
            assert soon.as_of is not None
            assert soon.as_of.triton == read_at  # the age of what it shows
            assert parts.triton.called("index", "") == reads + 1  # only the later list read it
            assert later.models[0].triton_state == "UNAVAILABLE"
            assert later.as_of is not None
            assert later.as_of.triton == parts.clock.now()
            assert later.as_of.store == later.as_of.store_full_scan == read_at

    asyncio.run(scenario())


def test_a_release_published_shows_once_the_watcher_has_seen_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            watcher = await _scanned(service, parts)
            status = _status(service, parts, watcher.catalog)
            await _only(status)

            write_scale_release(parts.store_path, "m", "r2", k=2.0)
            unseen = await _only(status)
            await watcher.scan()
            seen = await _only(status)

            assert [r.name for r in unseen.models[0].releases] == ["r1"]
            assert [r.name for r in seen.models[0].releases] == ["r1", "r2"]

    asyncio.run(scenario())


def test_a_cooldown_that_ended_is_no_longer_shown(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            status = _status(service, parts, (await _scanned(service, parts)).catalog)
            rollback = RollbackRecord(
                id="rb1",
                model="m",
                at=parts.clock.now(),
                trigger=Trigger.WATCHER,
                reason="GPU overload",
                from_release="r2",
                to_release="r1",
                outcome=RollbackOutcome.FALLBACK,
            )
            await parts.repos.rollbacks.save(rollback)

            during = (await _only(status)).models[0]
            parts.clock.advance(COOLDOWN)
            over = (await _only(status)).models[0]

            assert during.cooldown_until == rollback.at + timedelta(seconds=COOLDOWN)
            assert over.cooldown_until is None

    asyncio.run(scenario())


def test_each_model_s_json_is_that_of_the_view_built_for_the_call(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for model in ("a", "b"):
                write_scale_release(parts.store_path, model, "r1", k=1.0)
            status = _status(service, parts, (await _scanned(service, parts)).catalog)
            pages = ModelPages()
            page = await status.list_models()
            verdict = Evaluation(
                Verdict.HEALTHY, "under the threshold", covered_from=0.0, covered_to=30.0
            )
            overload = OverloadView("triton", verdict, parts.clock.now(), 0.5, "")
            changed = dataclasses.replace(page.models[1], active_release="r1")

            first = json.loads(pages.render(page))
            again = json.loads(pages.render(dataclasses.replace(page, overload=overload)))
            third = json.loads(
                pages.render(dataclasses.replace(page, models=[page.models[0], changed]))
            )

            def expected(candidate: ModelPage) -> dict[str, object]:
                return {
                    "models": [
                        {**model_json(view), "overload": overload_json(candidate.overload)}
                        for view in candidate.models
                    ],
                    "next": candidate.next_after,
                    "as_of": as_of_json(candidate.as_of),
                    "store_error": candidate.store_error,
                    "ignored_models": ignored_json(candidate.ignored_models),
                }

            assert first == expected(page)
            assert again == expected(dataclasses.replace(page, overload=overload))
            assert again["models"][0]["overload"]["verdict"] == "healthy"
            assert third["models"][1]["active_release"] == "r1"
            assert third == expected(dataclasses.replace(page, models=[page.models[0], changed]))

    asyncio.run(scenario())


def test_a_page_for_people_puts_what_this_member_manages_before_store_only_models(
    tmp_path: Path,
) -> None:
    """The status page shows a limited number of models: the one that serves must not hide
    behind models that only have releases in the store."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for name in ("a1", "a2", "a3", "z9"):
                write_scale_release(parts.store_path, name, "r1", k=1.0)
            operation = await started(service, "z9", "r1")
            await service.wait(operation.id)
            status = _status(service, parts, (await _scanned(service, parts)).catalog)

            natural = await status.list_models(limit=2)
            for_people = await status.list_models(limit=2, managed_first=True)
            everything = await status.list_models(managed_first=True)

            assert [v.name for v in natural.models] == ["a1", "a2"]
            assert [v.name for v in for_people.models] == ["z9", "a1"]
            assert for_people.next_after is not None  # there are more
            assert [v.name for v in everything.models] == ["z9", "a1", "a2", "a3"]

    asyncio.run(scenario())

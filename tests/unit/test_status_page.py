"""The status page's HTML as a browser would parse it: what comes from outside is text, never
markup; the GPU plot draws the samples, their gaps, the threshold and the rollbacks, and says
so when it has no sample."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html.parser import HTMLParser

from controlplane.api.page.plot import NO_SAMPLES, gpu_plot
from controlplane.api.page.render import content, page
from controlplane.domain.evaluator import Evaluation, Verdict
from controlplane.domain.fleet import Pause
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.operations import (
    Operation,
    OperationError,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
)
from controlplane.domain.rollback import RollbackOutcome, RollbackRecord
from controlplane.domain.rotation import OutOfRotation, OutReason
from controlplane.domain.slots import Slot, SlotState
from controlplane.services.overload import GpuPoint, OverloadView
from controlplane.services.overview import (
    GpuHistory,
    Latch,
    MemberServing,
    ModelOverview,
    Overview,
)
from controlplane.services.views import ModelView
from tests.support.fakes import START

NOW = START + timedelta(minutes=10)
SINCE = NOW - timedelta(minutes=5)
EVIL = "<script>alert('x')</script>&\""


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)


class Tree(HTMLParser):
    """Every element and its text, as a browser's parser sees the markup."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if self._open:
            self._open[-1].children.append(element)
        if tag not in ("meta", "link", "br", "img", "circle", "line", "rect", "polyline"):
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if self._open:
            self._open[-1].children.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text += data

    def all(self, tag: str, **attrs: str) -> list[Element]:
        return [
            e
            for e in self.elements
            if e.tag == tag and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def having(self, attribute: str) -> list[Element]:
        return [e for e in self.elements if attribute in e.attrs]


def _view(**changes: object) -> ModelView:
    values: dict[str, object] = {
        "name": "resnet",
        "active_release": "r2",
        "previous_release": "r1",
        "slots": (
            Slot("resnet__blue", SlotState.ACTIVE, "r2", Trigger.API, "serving r2", START),
            Slot("resnet__green", SlotState.RETIRING, "r1", Trigger.API, EVIL, START),
        ),
        "triton_state": "READY",
        "triton_reason": "",
        "releases": (),
        "store_error": None,
        "running_operation": None,
        "last_operation": None,
        "strategy": "blue-green",
        "alias_target": "resnet__blue",
        "slot_triton_states": {"resnet__blue": "READY", "resnet__green": "READY"},
    }
    values.update(changes)
    return ModelView(**values)  # type: ignore[arg-type]


def _operation() -> Operation:
    return Operation(
        id="op1",
        kind=OperationKind.DEPLOY,
        model="resnet",
        release="r3",
        trigger=Trigger.API,
        status=OperationStatus.FAILED,
        created_at=NOW - timedelta(seconds=30),
        from_release="r2",
        finished_at=NOW - timedelta(seconds=28),
        steps=(
            Step(
                "fetch",
                StepStatus.SUCCEEDED,
                NOW - timedelta(seconds=30),
                NOW - timedelta(seconds=29, milliseconds=500),
            ),
            Step(
                "load", StepStatus.FAILED, NOW - timedelta(seconds=29), NOW - timedelta(seconds=28)
            ),
        ),
        error=OperationError("triton_load_failed", EVIL),
    )


def _rollback(at: datetime, reason: str = "GPU utilisation above 0.95 for 10 s") -> RollbackRecord:
    return RollbackRecord(
        id=f"rb-{at:%H%M%S}",
        model="resnet",
        at=at,
        trigger=Trigger.WATCHER,
        reason=reason,
        from_release="r2",
        to_release="r1",
        outcome=RollbackOutcome.FALLBACK,
    )


def _history(*values: float | None, threshold: float | None = 0.95, note: str = "") -> GpuHistory:
    step = timedelta(seconds=10)
    points = tuple(GpuPoint(NOW - step * (len(values) - i), v) for i, v in enumerate(values))
    source = "none" if threshold is None else "triton"
    return GpuHistory(source, threshold, SINCE, NOW, points, note)


def _overview(model: ModelOverview, gpu: GpuHistory | None = None) -> Overview:
    evaluation = Evaluation(Verdict.HEALTHY, "a sample at 0.300 <= 0.95")
    return Overview(
        at=NOW,
        member=EVIL,
        fleet_problem=None,
        models=(model,),
        more=False,
        gpu=gpu or _history(0.3, 0.4),
        overload=OverloadView("triton", evaluation, NOW, 0.4, ""),
    )


def _model(**changes: object) -> ModelOverview:
    values: dict[str, object] = {
        "view": _view(),
        "desired": "r2",
        "desired_by": "fleet",
        "members": (
            MemberServing("pod-a", True, "r2", "serving", "r2", None, True),
            MemberServing(EVIL, False, "r1", "failed", "r2", EVIL, False),
        ),
        "phase": "complete",
        "converged": False,
        "rollout_note": None,
        "canaries": (),
        "latches": (Latch("r0", START, EVIL, "fleet"),),
        "operations": (_operation(),),
        "rollbacks": (),
    }
    values.update(changes)
    return ModelOverview(**values)  # type: ignore[arg-type]


def test_what_comes_from_outside_is_text_never_markup() -> None:
    markup = page(_overview(_model()), version="1.0")
    tree = Tree(markup)

    assert len(tree.all("script")) == 1  # the page's own, by address, with nothing inside
    assert tree.all("script")[0].attrs == {"src": "ui/refresh.js"}
    assert tree.all("script")[0].text == ""
    assert "<script>alert" not in markup
    body = tree.all("main")[0].text
    assert body.count(EVIL) >= 4  # a slot's reason, a member, its error, the latch, the error
    assert [m.attrs["data-member"] for m in tree.having("data-member")] == ["pod-a", EVIL]
    assert EVIL in tree.all("header")[0].text  # the member's name
    assert not any(
        attr.startswith("on") for element in tree.elements for attr in element.attrs
    )  # no event handler attribute anywhere


def test_the_model_shows_its_releases_members_slots_latch_and_operations() -> None:
    tree = Tree(content(_overview(_model())))

    [section] = tree.all("section", data_model="resnet")
    fields = {e.attrs["data-field"]: e.text for e in tree.having("data-field")}
    assert fields["desired"].startswith("r2 (the fleet's)")
    assert fields["serving"] == "r2"
    assert fields["phase"] == "complete"
    assert "r0" in fields["degraded"]
    assert "converging" in section.text
    slots = [e.attrs["data-slot"] for e in tree.having("data-slot")]
    assert slots == ["resnet__blue", "resnet__green"]
    [operation] = tree.having("data-operation")
    assert "r2 → r3" in operation.text
    assert "fetch 500 ms" in operation.text
    assert "load 1.0 s" in operation.text
    assert "triton_load_failed" in operation.text


def test_housekeeping_has_its_own_section_and_never_counts_as_a_last_operation() -> None:
    retire = dataclasses.replace(
        _operation(),
        id="op2",
        kind=OperationKind.RETIRE,
        release="r2",
        trigger=Trigger.SCHEDULE,
        status=OperationStatus.SUCCEEDED,
        created_at=NOW - timedelta(seconds=5),
        steps=(),
        error=None,
    )
    tree = Tree(content(_overview(_model(view=_view(last_housekeeping=retire)))))

    [operations] = tree.all("ol", data_field="operations")
    [housekeeping] = tree.all("ol", data_field="housekeeping")
    assert [e.attrs["data-operation"] for e in operations.children] == ["op1"]
    assert [e.attrs["data-operation"] for e in housekeeping.children] == ["op2"]
    assert housekeeping.text.startswith("retire r2")
    assert "Housekeeping" in [h.text for h in tree.all("h3")]

    quiet = Tree(content(_overview(_model(view=_view()))))
    [none] = quiet.all("p", data_field="housekeeping")
    assert none.text == "no retire or repair yet"


def test_without_a_fleet_the_daemons_own_record_is_the_desired_release() -> None:
    alone = _model(
        desired_by="member",
        phase=None,
        converged=None,
        members=(MemberServing("this daemon", True, "r2", "READY", "r2", None, True),),
        latches=(),
    )
    tree = Tree(content(_overview(alone)))

    fields = {e.attrs["data-field"]: e.text for e in tree.having("data-field")}
    assert fields["desired"] == "r2 (this daemon's record)"
    assert fields["phase"] == "no fleet"
    assert fields["degraded"] == "none"
    assert fields["signer"] == "no signature"


def test_the_key_that_signed_the_serving_release_is_shown() -> None:
    tree = Tree(content(_overview(_model(view=_view(signer="ci-2026")))))

    fields = {e.attrs["data-field"]: e.text for e in tree.having("data-field")}
    assert fields["signer"] == "ci-2026"


def test_a_paused_rollout_says_who_paused_it_when_and_why_as_text() -> None:
    paused = Pause(f"cli through {EVIL}", START, f"looking at {EVIL}")
    tree = Tree(content(_overview(_model(phase="baking", canaries=("pod-a",), paused=paused))))

    fields = {e.attrs["data-field"]: e.text for e in tree.having("data-field")}
    assert fields["paused"] == (
        f"PAUSED by cli through {EVIL} at {START.isoformat(timespec='seconds')}: looking at {EVIL}"
    )
    assert fields["phase"].startswith("baking (canaries: pod-a)")
    assert "<script>alert" not in content(_overview(_model(paused=paused)))


def test_the_status_page_tags_a_model_that_keeps_the_member_out_with_why() -> None:
    held = "memory_not_returned: the GPU memory r1 held did not come back"
    out = OutOfRotation(OutReason.MEMORY_NOT_RETURNED, held)
    tree = Tree(content(_overview(_model(view=_view(out_of_rotation=out)))))
    quiet = Tree(content(_overview(_model())))

    [tag] = [e for e in tree.all("span") if e.text == "out of rotation"]
    assert tag.attrs["title"] == held
    assert not [e for e in quiet.all("span") if e.text == "out of rotation"]


def test_the_plot_draws_samples_with_their_gaps_and_the_threshold() -> None:
    tree = Tree(gpu_plot(_history(0.2, 0.5, None, 0.9, 0.97, 0.99), (), "resnet"))

    [svg] = tree.all("svg")
    assert svg.attrs["data-samples"] == "5"
    lines = tree.all("polyline")
    assert [len(line.attrs["points"].split()) for line in lines] == [2, 3]  # broken at the gap
    [threshold] = tree.all("line")
    assert threshold.attrs["class"] == "threshold"
    # 0.95 of a 118-pixel-high plot from y=10: 5.9 pixels below its top
    assert threshold.attrs["y1"] == "15.9"
    assert NO_SAMPLES not in svg.text
    assert "threshold 95%" in svg.text


def test_a_lone_sample_is_a_dot_and_values_above_one_stay_inside_the_plot() -> None:
    tree = Tree(gpu_plot(_history(None, 1.7, None), (), "resnet"))

    [dot] = tree.all("circle")
    assert dot.attrs["cy"] == "10.0"  # the top of the plot, not above it
    assert tree.all("polyline") == []


def test_without_samples_the_plot_says_so_and_why() -> None:
    tree = Tree(gpu_plot(_history(None, None, note="the source reports no GPU"), (), "resnet"))

    [svg] = tree.all("svg")
    assert svg.attrs["data-samples"] == "0"
    assert NO_SAMPLES in svg.text
    assert "the source reports no GPU" in svg.text
    assert tree.all("line", **{"class": "threshold"})  # the line it would be compared with


def test_with_the_watcher_off_the_plot_has_no_threshold_and_no_samples() -> None:
    off = GpuHistory("none", None, SINCE, NOW, (), "the overload watcher is off")
    tree = Tree(gpu_plot(off, (), "resnet"))

    assert NO_SAMPLES in tree.all("svg")[0].text
    assert tree.all("line", **{"class": "threshold"}) == []


def test_rollbacks_in_the_span_are_marked_with_what_they_did() -> None:
    inside = _rollback(NOW - timedelta(minutes=2), reason=EVIL)
    late = _rollback(NOW - timedelta(seconds=1))
    before = _rollback(SINCE - timedelta(seconds=1))
    tree = Tree(gpu_plot(_history(0.99, 0.99), (before, inside, late), "resnet"))

    marks = [e for e in tree.all("g") if e.attrs.get("class") == "rollback-mark"]
    assert [m.attrs["data-at"] for m in marks] == [inside.at.isoformat(), late.at.isoformat()]
    assert tree.all("svg")[0].attrs["data-rollbacks"] == "2"
    title = marks[0].children[0]
    assert title.tag == "title"
    assert f"r2 -> r1 (fallback; watcher: {EVIL})" in title.text
    mark_x = float(marks[0].children[1].attrs["x1"])
    assert mark_x == 40 + 470 * 3 / 5  # three fifths of the way from -5 min to now
    label = marks[1].children[2]
    assert label.attrs.get("text-anchor") == "end"  # near the right edge: left of its line


def test_an_empty_daemon_says_what_to_do_and_a_long_list_says_where_the_rest_is() -> None:
    empty = Overview(NOW, None, None, (), False, _history(), None)
    assert "No model is managed here" in content(empty)
    many = Overview(NOW, None, "the store could not be read", (_model(),), True, _history(), None)
    text = content(many)
    assert "GET /v1/models lists them all" in text
    assert "the store could not be read" in text


def test_store_entries_ignored_for_their_names_are_shown_as_text() -> None:
    img = "<img src=x onerror=alert(7)>"
    reason = f"release name {img!r} is not allowed"
    ignored = (IgnoredName(img, reason, f"/store/resnet/{img}"),)
    overview = dataclasses.replace(
        _overview(_model(view=_view(ignored_releases=ignored))),
        ignored_models=(IgnoredName('evil<b>x"', "model name is not allowed", "/store/x"),),
    )
    markup = content(overview)
    tree = Tree(markup)

    fields = {e.attrs["data-field"]: e for e in tree.having("data-field")}
    assert fields["ignored-releases"].text == img
    assert fields["ignored-releases"].children[0].attrs["title"] == reason
    assert fields["ignored-models"].text == 'evil<b>x"'
    assert not tree.all("img")
    assert [c.tag for c in fields["ignored-models"].children] == ["code"]
    assert not fields["ignored-models"].children[0].children  # no <b> made of the name
    assert "/store/" not in markup  # where it is stays in the log

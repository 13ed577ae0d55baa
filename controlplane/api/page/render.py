"""The status page's HTML: the whole page for ``GET /``, its content alone for the refresh.

:func:`content` is what the script swaps in every couple of seconds; :func:`page` wraps it in
the document (head, style, header, script). Both are plain strings built from an
:class:`Overview`; every value that comes from outside goes through ``esc``. Elements the
tests and people look for carry ``data-model``, ``data-field`` and ``data-member``.
"""

from __future__ import annotations

from controlplane.api.page.markup import clock, esc, seconds, text_or
from controlplane.api.page.plot import gpu_plot
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.operations import Operation
from controlplane.services.overview import ModelOverview, Overview

REFRESH_MS = 2000
CONTENT_PATH = "ui/status"  # relative: the page works behind a path prefix too
SCRIPT_PATH = "ui/refresh.js"

STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
  margin: 0; color: #222; background: #eef0f3; }
header { display: flex; gap: 1em; align-items: baseline; padding: 0.6em 1.2em;
  background: #263238; color: #eceff1; }
header h1 { font-size: 1.2em; margin: 0; }
header a { color: #b3e5fc; margin-left: auto; }
#refresh-note.bad { color: #ffab91; font-weight: bold; }
main { padding: 0.8em 1.2em; }
.summary { margin: 0 0 0.8em; color: #444; }
.problem { background: #fff3e0; border-left: 4px solid #ef6c00; padding: 0.4em 0.8em; }
section.model { background: #fff; border-radius: 6px; padding: 0.6em 1em 1em;
  margin-bottom: 1em; box-shadow: 0 1px 2px rgba(0,0,0,0.15); }
section.model h2 { font-size: 1.15em; margin: 0.2em 0 0.5em; }
h3 { font-size: 0.95em; margin: 0.9em 0 0.3em; color: #37474f; }
.columns { display: flex; flex-wrap: wrap; gap: 1.5em; }
.columns > div { flex: 1 1 420px; min-width: 0; }
dl.releases { display: grid; grid-template-columns: max-content 1fr; gap: 0.15em 1em;
  margin: 0; }
dl.releases dt { color: #555; }
dl.releases dd { margin: 0; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 0.15em 0.6em 0.15em 0; border-bottom: 1px solid #eee;
  vertical-align: top; }
th { color: #555; font-weight: normal; }
.tag { font-size: 0.75em; font-weight: normal; background: #eceff1; border-radius: 3px;
  padding: 0.1em 0.4em; margin-left: 0.4em; }
.tag.bad { background: #ffcdd2; color: #b71c1c; }
.tag.warn { background: #ffe0b2; color: #e65100; }
.tag.ok { background: #c8e6c9; color: #1b5e20; }
.none { color: #999; font-weight: normal; }
ol.operations { padding-left: 1.2em; margin: 0; }
ol.operations > li { margin-bottom: 0.4em; }
.steps { color: #555; font-size: 0.9em; }
.step-failed { color: #b71c1c; }
.error { color: #b71c1c; }
.status-failed, .status-interrupted { color: #b71c1c; }
.status-succeeded { color: #1b5e20; }
""".strip()


def page(overview: Overview, *, version: str) -> str:
    who = f"member {esc(overview.member)}" if overview.member else "not in a fleet"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<title>controlplane status</title><link rel="icon" href="data:,">'
        f"<style>{STYLE}</style></head><body>"
        f"<header><h1>controlplane</h1><span>{who} &middot; version {esc(version)}</span>"
        f'<span id="refresh-note">refreshes every {REFRESH_MS // 1000} s</span>'
        '<a href="docs">API docs</a></header>'
        f'<main id="content" data-src="{CONTENT_PATH}" data-every-ms="{REFRESH_MS}" '
        f'aria-live="polite">{content(overview)}</main>'
        f'<script src="{SCRIPT_PATH}"></script></body></html>\n'
    )


def content(overview: Overview) -> str:
    parts = [_summary(overview)]
    if overview.fleet_problem:
        parts.append(f'<p class="problem">{esc(overview.fleet_problem)}</p>')
    if overview.notifications_problem:
        parts.append(
            '<p class="problem" data-field="notifications">'
            f"{esc(overview.notifications_problem)}</p>"
        )
    if overview.ignored_models:
        parts.append(
            '<p class="problem">Ignored in the store, names that are no model\'s (rename '
            f'them): <span data-field="ignored-models">{_ignored(overview.ignored_models)}'
            "</span></p>"
        )
    if not overview.models:
        parts.append(
            '<p class="problem">No model is managed here or in the store yet: publish a '
            "release to the store and deploy it (see /docs).</p>"
        )
    parts.extend(_model(model, overview) for model in overview.models)
    if overview.more:
        parts.append(
            f'<p class="problem">More models than this page shows (the first '
            f"{len(overview.models)}): GET /v1/models lists them all.</p>"
        )
    return "".join(parts)


def _summary(overview: Overview) -> str:
    verdict = overview.overload.evaluation.verdict.value if overview.overload else "off"
    reason = overview.overload.evaluation.reason if overview.overload else overview.gpu.note
    return (
        f'<p class="summary">As of {clock(overview.at, overview.at)} UTC &middot; '
        f"{len(overview.models)} model(s) &middot; GPU overload watcher "
        f'(<span data-field="gpu-source">{esc(overview.gpu.source)}</span>): '
        f'<span data-field="verdict">{esc(verdict)}</span> ({esc(reason)})</p>'
    )


def _model(model: ModelOverview, overview: Overview) -> str:
    view = model.view
    tags = [f'<span class="tag">{esc(view.strategy)}</span>']
    if model.latches:
        tags.append('<span class="tag bad">degraded release latched</span>')
    if view.running_operation:
        tags.append('<span class="tag warn">operation running</span>')
    if view.drift:
        tags.append(f'<span class="tag warn" title="{esc(view.drift)}">drift</span>')
    if view.out_of_rotation:
        why = esc(view.out_of_rotation.reason)
        tags.append(f'<span class="tag bad" title="{why}">out of rotation</span>')
    if model.converged is True:
        tags.append('<span class="tag ok">converged</span>')
    elif model.converged is False:
        tags.append('<span class="tag warn">converging</span>')
    left = [
        _releases(model),
        "<h3>Members</h3>",
        _members(model),
        "<h3>Slots</h3>",
        _slots(model),
        "<h3>Degraded latch</h3>",
        _latches(model, overview),
    ]
    right = [
        f"<h3>GPU utilisation, last {_span_minutes(overview)} min</h3>",
        gpu_plot(overview.gpu, model.rollbacks, view.name),
        "<h3>Last operations</h3>",
        _operations(model.operations, overview, "operations", "no operation yet"),
        "<h3>Housekeeping</h3>",
        _operations(
            () if view.last_housekeeping is None else (view.last_housekeeping,),
            overview,
            "housekeeping",
            "no retire or repair yet",
        ),
    ]
    return (
        f'<section class="model" data-model="{esc(view.name)}">'
        f"<h2>{esc(view.name)}{''.join(tags)}</h2>"
        f'<div class="columns"><div>{"".join(left)}</div><div>{"".join(right)}</div></div>'
        "</section>"
    )


def _span_minutes(overview: Overview) -> str:
    return f"{(overview.gpu.until - overview.gpu.since).total_seconds() / 60:.0f}"


def _releases(model: ModelOverview) -> str:
    view = model.view
    desired_by = "the fleet's" if model.desired_by == "fleet" else "this daemon's record"
    phase = text_or(model.phase, "no fleet")
    if model.canaries:
        phase += f" (canaries: {esc(', '.join(model.canaries))})"
    if model.rollout_note:
        phase += f" &middot; {esc(model.rollout_note)}"
    if model.paused is not None:
        paused = model.paused
        why = f": {esc(paused.reason)}" if paused.reason else ""
        phase += (
            f' &middot; <span class="error" data-field="paused">PAUSED by {esc(paused.by)} at '
            f"{esc(paused.at.isoformat(timespec='seconds'))}{why}</span>"
        )
    triton = esc(view.triton_state)
    if view.triton_reason:
        triton += f' <span class="none">{esc(view.triton_reason)}</span>'
    rows = [
        (
            "desired",
            f'{text_or(model.desired, "nothing")} <span class="none">({esc(desired_by)})</span>',
            "desired",
        ),
        ("serving here", text_or(view.active_release, "nothing"), "serving"),
        ("signed by", text_or(view.signer, "no signature"), "signer"),
        ("previous", text_or(view.previous_release), "previous"),
        ("fallback", text_or(view.fallback, "none"), "fallback"),
        ("rollout phase", phase, "phase"),
        ("Triton", triton, "triton"),
    ]
    if view.store_error:
        rows.append(("store", f'<span class="error">{esc(view.store_error)}</span>', "store"))
    if view.ignored_releases:
        rows.append(("ignored", _ignored(view.ignored_releases), "ignored-releases"))
    body = "".join(
        f'<dt>{label}</dt><dd data-field="{field}">{value}</dd>' for label, value, field in rows
    )
    return f'<dl class="releases">{body}</dl>'


def _ignored(ignored: tuple[IgnoredName, ...]) -> str:
    """Store entries left out for their names (untrusted text), each with its rule on hover."""
    return ", ".join(
        f'<code title="{esc(entry.reason)}">{esc(entry.name)}</code>' for entry in ignored
    )


def _members(model: ModelOverview) -> str:
    rows = []
    for member in model.members:
        name = esc(member.member) + (
            ' <span class="none">(this one)</span>'
            if member.this_member and model.desired_by == "fleet"
            else ""
        )
        alive = "yes" if member.alive else '<span class="error">no</span>'
        error = f'<span class="error">{esc(member.error)}</span>' if member.error else ""
        rolling = f'<span data-field="member-rolling">{esc(member.rolling)}</span>'
        rows.append(
            f'<tr data-member="{esc(member.member)}"><td>{name}</td><td>{alive}</td>'
            f'<td data-field="member-serving">{text_or(member.release, "nothing")}</td>'
            f"<td>{text_or(member.state)}</td><td>{text_or(member.target)}</td>"
            f"<td>{rolling if member.rolling else ''}{error}</td></tr>"
        )
    if not rows:
        return '<p class="none">no member reports this model</p>'
    return (
        "<table><tr><th>member</th><th>alive</th><th>serves</th><th>state</th>"
        f"<th>should serve</th><th></th></tr>{''.join(rows)}</table>"
    )


def _slots(model: ModelOverview) -> str:
    view = model.view
    if not view.slots:
        return '<p class="none">no slot</p>'
    rows = []
    for slot in view.slots:
        seen = view.slot_triton_states.get(slot.name, "unknown")
        alias = " &larr; alias" if view.alias_target == slot.name else ""
        why = f"{slot.trigger}: {slot.reason}" if slot.reason else slot.trigger
        rows.append(
            f'<tr data-slot="{esc(slot.name)}"><td>{esc(slot.name)}{alias}</td>'
            f"<td>{text_or(slot.release)}</td><td>{esc(slot.state.value)}</td>"
            f'<td data-field="triton-state">{esc(seen)}</td>'
            f"<td>{esc(why)}</td></tr>"
        )
    return (
        "<table><tr><th>slot</th><th>release</th><th>state</th><th>Triton</th><th>why</th>"
        f"</tr>{''.join(rows)}</table>"
    )


def _latches(model: ModelOverview, overview: Overview) -> str:
    if not model.latches:
        return '<p class="none" data-field="degraded">none</p>'
    items = "".join(
        f"<li><b>{esc(latch.release)}</b> since {clock(latch.at, overview.at)} "
        f'<span class="none">({esc(latch.scope)})</span>: {esc(latch.reason)}</li>'
        for latch in model.latches
    )
    return f'<ul data-field="degraded">{items}</ul>'


def _operations(
    operations: tuple[Operation, ...], overview: Overview, field: str, none: str
) -> str:
    """``field``: "operations" (deploys, rollbacks, unloads, CPU fallbacks) or "housekeeping"
    (the daemon's retires and repairs, kept apart so they never push a deploy out of view)."""
    if not operations:
        return f'<p class="none" data-field="{field}">{none}</p>'
    items = []
    for op in operations:
        release = esc(op.release or "-")
        if op.from_release and op.from_release != op.release:
            release = f"{esc(op.from_release)} &rarr; {release}"
        steps = ", ".join(
            f'<span class="step-{esc(step.status.value)}">{esc(step.name)} '
            f"{esc(seconds(step.duration_seconds))}</span>"
            for step in op.steps
        )
        error = (
            f'<div class="error">{esc(op.error.code)}: {esc(op.error.message)}</div>'
            if op.error
            else ""
        )
        items.append(
            f'<li data-operation="{esc(op.id)}"><b>{esc(op.kind.value)}</b> {release} &middot; '
            f'{esc(op.trigger.value)} &middot; <span class="status-{esc(op.status.value)}">'
            f"{esc(op.status.value)}</span> &middot; {clock(op.created_at, overview.at)} "
            f"&middot; {esc(seconds(op.duration_seconds))}"
            f'<div class="steps">{steps}</div>{error}</li>'
        )
    return f'<ol class="operations" data-field="{field}">{"".join(items)}</ol>'

"""The body of ``GET /v1/models``: each model rendered once while its view is unchanged.

A page of 100 models was rendered and encoded again on every call: 100 views, 2,000 release
entries, about 140 KB of JSON, most of a call's time on a small machine, for an answer that
changes when a release is published or an operation runs. Here each model's JSON is kept with
the view it was made from and reused while the view is equal to it, so the bytes answered are
always those of the views built for this call. The overload verdict, the same for every model
and new every second, is encoded once per call and put in each model's place.

Bytes are encoded as FastAPI's ``JSONResponse`` encodes them (UTF-8, compact, no NaN).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from controlplane.api.schemas.model import as_of_json, ignored_json, model_json, overload_json
from controlplane.services.views import ModelPage, ModelView

KEPT = 5000  # models whose JSON is kept (least recently answered dropped first)
_SPLIT_AT = "overload"


@dataclass(frozen=True)
class _Rendered:
    view: ModelView
    head: bytes  # the model's JSON up to its overload's value
    tail: bytes  # and after it


class ModelPages:
    """Renders pages; keeps each model's JSON between calls. Used from the event loop only."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept: OrderedDict[str, _Rendered] = OrderedDict()
        self._limit = kept

    def render(self, page: ModelPage) -> bytes:
        overload = encode(overload_json(page.overload))
        models = b",".join(self._model(view, overload) for view in page.models)
        rest = encode(
            {
                "next": page.next_after,
                "as_of": as_of_json(page.as_of),
                "store_error": page.store_error,
                "ignored_models": ignored_json(page.ignored_models),
            }
        )
        return b'{"models":[' + models + b"]," + rest[1:]

    def _model(self, view: ModelView, overload: bytes) -> bytes:
        kept = self._kept.get(view.name)
        if kept is not None and (kept.view is view or kept.view == view):
            self._kept.move_to_end(view.name)
        else:
            kept = _Rendered(view, *_split(model_json(view)))
            self._kept[view.name] = kept
            self._kept.move_to_end(view.name)
            if len(self._kept) > self._limit:
                self._kept.popitem(last=False)
        return kept.head + overload + kept.tail


def encode(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _split(body: dict[str, Any]) -> tuple[bytes, bytes]:
    """``body`` encoded in two halves around the value of its overload key."""
    keys = list(body)
    cut = keys.index(_SPLIT_AT)
    before = encode({key: body[key] for key in keys[:cut]})[1:-1]
    after = encode({key: body[key] for key in keys[cut + 1 :]})[1:-1]
    head = b"{" + (before + b"," if before else b"") + encode(_SPLIT_AT) + b":"
    return head, (b"," + after if after else b"") + b"}"

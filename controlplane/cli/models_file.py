"""The file ``controlplane apply -f`` and ``diff -f`` read: the release each model should serve.

It is meant to live in git beside the rest of what a team declares::

    # models.yaml
    models:
      resnet: 2026-11-29.1
      bert: r7

Only the models listed are looked at; a model left out is not touched (as ``kubectl apply``
without ``--prune``). Every scalar is read as text (YAML would make ``2026-11-29`` a date and
``1.10`` the number 1.1), a model listed twice is refused rather than the last one winning, and
each name is checked by the daemon's own rule. An error names the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_model_name, validate_release_name

MAX_BYTES = 1024 * 1024  # a file of releases, not a model: a megabyte is thousands of models
TOP_KEYS = ("models",)


class ModelsFileError(ValueError):
    """The file cannot be read as a file of releases: the message says where and why."""


@dataclass(frozen=True)
class WantedRelease:
    model: str
    release: str
    line: int  # 1-based, where the file names the model


def read_models_file(path: Path | None, text: str | None = None) -> list[WantedRelease]:
    """The models and releases ``path`` lists, in its order (``text`` when given instead of
    reading ``path``: standard input)."""
    where = "<stdin>" if path is None else str(path)
    if text is None:
        if path is None:
            raise ModelsFileError("no file given: use -f FILE, or -f - for standard input")
        try:
            if path.stat().st_size > MAX_BYTES:
                raise ModelsFileError(f"{where}: larger than {MAX_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelsFileError(f"{where}: cannot read it: {exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        raise ModelsFileError(f"{where}: not YAML: {exc}") from None
    return _releases(where, root)


def _releases(where: str, root: yaml.Node | None) -> list[WantedRelease]:
    example = "a mapping 'models:' of model names to releases (e.g. 'models: {resnet: r7}')"
    if root is None:
        raise ModelsFileError(f"{where}: the file is empty: expected {example}")
    if not isinstance(root, yaml.MappingNode):
        raise ModelsFileError(f"{where}: expected {example}")
    models: yaml.Node | None = None
    for key, value in _pairs(where, root):
        if key.value not in TOP_KEYS:
            raise ModelsFileError(
                f"{where}:{_line(key)}: unknown key {key.value!r}: the file holds only {example}"
            )
        models = value
    if not isinstance(models, yaml.MappingNode) or not models.value:
        line = _line(models if models is not None else root)
        raise ModelsFileError(f"{where}:{line}: expected {example}, with at least one model")
    wanted = []
    for key, value in _pairs(where, models):
        if not isinstance(value, yaml.ScalarNode):
            raise ModelsFileError(
                f"{where}:{_line(value)}: model {key.value!r}: the release must be a name "
                f"(e.g. '{key.value}: r7'), not {_kind(value)}"
            )
        try:
            model = validate_model_name(key.value)
            release = validate_release_name(value.value)
        except InvalidName as exc:
            raise ModelsFileError(f"{where}:{_line(key)}: {exc}") from None
        wanted.append(WantedRelease(model, release, _line(key)))
    return wanted


def _pairs(where: str, node: yaml.MappingNode) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
    """The mapping's entries, keys as text; a key that is no name, or said twice, refused."""
    seen: dict[str, int] = {}
    pairs = []
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise ModelsFileError(f"{where}:{_line(key)}: a key must be a name, not {_kind(key)}")
        if key.value in seen:
            raise ModelsFileError(
                f"{where}:{_line(key)}: {key.value!r} is listed twice (first on line "
                f"{seen[key.value]}): keep one"
            )
        seen[key.value] = _line(key)
        pairs.append((key, value))
    return pairs


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _kind(node: yaml.Node) -> str:
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"

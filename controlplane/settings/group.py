"""The base of every settings group: frozen, and refusing keys it does not know.

Refusing unknown keys is what turns a typo in the YAML file or in a ``CONTROLPLANE_*`` variable
into an error that names the key meant (:mod:`controlplane.settings.loading`) rather than a
setting silently left at its default. Frozen, because settings are built once at start-up and
passed down; nothing changes them afterwards.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

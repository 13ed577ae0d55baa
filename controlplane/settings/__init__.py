"""Settings, built once at start-up and passed down; nothing else reads the environment.

Sources, highest priority first: environment variables (``CONTROLPLANE_`` prefix, ``__``
between group and field, e.g. ``CONTROLPLANE_TRITON__GRPC_URL``), then the YAML file given to
``controlplane serve --config``, then the defaults. Every field has a description: it is
what ``--help`` and ``config/controlplane.yaml`` (``controlplane config --defaults``) show.
Unknown keys are refused, so a typo is an error rather than a silently ignored setting, and the
refusal names the key meant; so is a ``CONTROLPLANE_*`` variable the loader would ignore though
it names a setting (an unknown group, or ``_`` for ``__``).

One module per thing the package owns, each importing only those below it (``.importlinter``
checks it)::

    loading, rendering,      load_settings and its messages; the config file and --help text;
    shown                    the settings as shown outside (secrets masked: config, /v1/config)
    root                     Settings: the groups under their keys, rules across groups
    triton, places, api,     one module per group or family of groups (places: repository,
    log, policy, rollback,   staging, store, database; policy: a model's policy and its
    memory, fleet            rollout)
    group, names, masking    the groups' base; setting names, variables and typo suggestions;
                             passwords in URLs masked wherever settings are shown

Everything the rest of the project uses is imported from here.
"""

from __future__ import annotations

from controlplane.settings.api import ApiSettings
from controlplane.settings.fleet import FleetSettings
from controlplane.settings.loading import SettingsError, load_settings
from controlplane.settings.log import LogSettings
from controlplane.settings.masking import MASK, mask_passwords
from controlplane.settings.memory import MemorySettings
from controlplane.settings.names import ENV_PREFIX, env_name
from controlplane.settings.places import (
    DatabaseSettings,
    RepositorySettings,
    StagingSettings,
    StoreSettings,
)
from controlplane.settings.policy import ModelPolicy, RolloutSettings
from controlplane.settings.rendering import render_defaults, settings_help
from controlplane.settings.rollback import RollbackSettings
from controlplane.settings.root import Settings
from controlplane.settings.shown import derived, shown
from controlplane.settings.triton import ReconcileSettings, TritonSettings

__all__ = [
    "ENV_PREFIX",
    "MASK",
    "ApiSettings",
    "DatabaseSettings",
    "FleetSettings",
    "LogSettings",
    "MemorySettings",
    "ModelPolicy",
    "ReconcileSettings",
    "RepositorySettings",
    "RollbackSettings",
    "RolloutSettings",
    "Settings",
    "SettingsError",
    "StagingSettings",
    "StoreSettings",
    "TritonSettings",
    "derived",
    "env_name",
    "load_settings",
    "mask_passwords",
    "render_defaults",
    "settings_help",
    "shown",
]

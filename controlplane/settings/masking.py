"""Settings as they may be shown: secrets masked, wherever a value reaches people.

A token is a ``SecretStr`` and never shown; a password can also hide in any URL-valued setting
(``http://admin:hunter2@prometheus:9090``), where nothing types it as a secret. Whatever prints
or logs settings (``config --effective``, the start-up line, a refusal that quotes the value it
refuses) passes the text through :func:`mask_passwords`, which keeps the scheme, the user and
the host, so the output still says which account and which server, and can be pasted into an
issue. A query parameter named as a secret (``?token=...``, ``&api_key=...``) is masked too.
"""

from __future__ import annotations

import re

MASK = "********"

# scheme://user:password@ -- the password is everything up to the last '@' before the path, as
# urllib.parse splits a netloc, so a password holding a raw '@' is masked whole.
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*:)(?P<password>[^\s/?#'\"]+)@"
)

# ?token=... : a query parameter whose name says it holds a secret (token, key, secret,
# password, signature, auth, credential; X-Amz-Signature, api_key, access_token alike).
_SECRET_PARAMETER = re.compile(
    r"(?P<head>[?&][^=&#\s'\"]*?(?:token|secret|passw(?:or)?d|pwd|key|sig|auth|credential)"
    r"[^=&#\s'\"]*=)(?P<value>[^&#\s'\"]+)",
    re.IGNORECASE,
)


def mask_passwords(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@`` in it masked, and the
    value of each query parameter named as a secret (``?token=...``)."""
    masked = _USERINFO.sub(lambda found: f"{found['head']}{MASK}@", text)
    return _SECRET_PARAMETER.sub(lambda found: f"{found['head']}{MASK}", masked)

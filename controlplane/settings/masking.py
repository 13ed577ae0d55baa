"""Settings as they may be shown: secrets masked, wherever a value reaches people.

A token is a ``SecretStr`` and never shown; a password can also hide in any URL-valued setting
(``http://admin:hunter2@prometheus:9090``), where nothing types it as a secret. Whatever prints
or logs settings (``config --effective``, the start-up line, a refusal that quotes the value it
refuses) passes the text through :func:`mask_passwords`, which keeps the scheme, the user and
the host, so the output still says which account and which server, and can be pasted into an
issue.
"""

from __future__ import annotations

import re

MASK = "********"

# scheme://user:password@ -- the password is everything up to the last '@' before the path, as
# urllib.parse splits a netloc, so a password holding a raw '@' is masked whole.
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*:)(?P<password>[^\s/?#'\"]+)@"
)


def mask_passwords(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@`` in it masked."""
    return _USERINFO.sub(lambda found: f"{found['head']}{MASK}@", text)

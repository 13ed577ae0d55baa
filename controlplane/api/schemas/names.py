"""The rule for model and release names, as the OpenAPI document states it.

domain/names.py's rule written without a lookahead, so that client generators and fuzzers
can use it: a letter or digit, then letters, digits, '.', '_' and '-', never two dots in a
row. Documented, not enforced here: the domain check answers 400 invalid_name with the rule
that was broken. A unit test keeps the two equal.
"""

from __future__ import annotations

from typing import Any

from controlplane.domain.names import MAX_NAME_LENGTH

NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
NAME_SCHEMA: dict[str, Any] = {"pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}
# A model name is a release name without '__', which the daemon's slot names reserve.
MODEL_NAME_PATTERN = r"^(?!.*__)[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
MODEL_NAME_SCHEMA: dict[str, Any] = {"pattern": MODEL_NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}

"""What the store and every later statement accept: each limit stated once (issue 34).

A definition (a release, a policy revision, an alias) is checked against these at publication,
so one accepted can be submitted against: a value beyond them would be refused later by a column
(``integer``), a statement (``pg_notify``'s 8000-byte payload, an ``interval``'s range) or a
URL (a path separator in an id). The HTTP models (``schemas.api``), the outside commands'
builders (``edge.commands``) and the columns (``store.tables``: the check constraints and the
integer columns, tested against the migrated database) take their bounds from here. Pure.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from .errors import ValidationFailed

INT4_MAX = 2**31 - 1  # an ``integer`` column
INT8_MAX = 2**63 - 1  # a ``bigint`` column: a version, a sequence number, a feed position
MAX_DEPTH = 32  # how deep a JSON document may nest
MAX_NAME = 200  # an id or a name: an alias, a step, an agent, a skill, a signal, a subject
# A workflow's id: its release ids are ``{workflowId}@{16 hex digits}`` and must be names too.
RELEASE_SUFFIX = 17
MAX_WORKFLOW_ID = MAX_NAME - RELEASE_SUFFIX
MAX_REASON = 2000  # a reason, a description
MAX_STEPS = 10_000  # a release's steps (each is a row, and a dispatch scans them)
MAX_ATTEMPTS = INT4_MAX  # a step's maxAttempts: ``steps.max_attempts``, ``attempts.number``
MAX_APPROVALS = 20  # a policy's requiredApprovals (``approval_requests.required_approvals``)
MAX_ASSIGNEES = 100
MAX_RE_REQUESTS = 100
MAX_EXPIRY_HOURS = 24 * 365  # an approval's expiry: keeps ``expires_at`` a timestamp
MAX_MINUTES = 10 * 366 * 24 * 60  # a run's limit: keeps deadlines and the int4 column in range
MAX_COST_USD = 1e12
# A rate limit's terms: every interval the buckets derive (``units / perSecond`` and
# ``burst / perSecond``, migration 0018) is at most ``MAX_RATE_WINDOW_S``, far inside an
# ``interval`` and a ``timestamptz``; a burst counts whole dispatches.
MAX_PER_SECOND = 1_000_000.0
MAX_BURST = 1_000_000_000
MAX_RATE_WINDOW_S = 366 * 86400.0
# The characters of an id or a name (a workflow's id, an alias, a step, an agent, a signal, a
# subject): Unicode's letters, marks, numbers, punctuation, symbols and spaces, in any script
# (general categories L*, M*, N*, P*, S* and Zs: ``名前`` and ``café`` are ids), neither first
# nor last a space. Never a control (``\t``, ``\n``), format (U+202E, U+FEFF), surrogate,
# private-use or unassigned character, nor a line or paragraph separator. An id that stands as
# a URL's path segment (a workflow's, an alias, a signal's) holds no path separator either and
# is not ``.`` or ``..``. Where an id travels in an HTTP header (``Location``) it is
# percent-encoded (``runcontrol.api.context.location``).
ID_CATEGORIES = frozenset("LMNPS")  # the first letter of an allowed general category
ID_SPACE = "Zs"
PATH_SEPARATORS = frozenset("/\\")


def _id_character(c: str) -> bool:
    category = unicodedata.category(c)
    return category[0] in ID_CATEGORIES or category == ID_SPACE


def name(value: Any, where: str, *, limit: int = MAX_NAME, segment: bool = False) -> str:
    """``value`` if it is an id or a name of the character set above, 1 to ``limit``
    characters (``segment``: a path segment); else ``ValidationFailed`` naming ``where``.
    Never converts: ``123`` is refused."""
    if not isinstance(value, str):
        raise ValidationFailed(f"{where} must be a string", field=where)
    if not 1 <= len(value) <= limit:
        raise ValidationFailed(f"{where} must be 1 to {limit} characters", field=where)
    if value != value.strip():
        raise ValidationFailed(f"{where} must not start or end with whitespace", field=where)
    bad = next((c for c in value if not _id_character(c)), None)
    if bad is not None:
        raise ValidationFailed(
            f"{where} must hold letters, marks, numbers, punctuation, symbols and spaces only, "
            f"not a control, format, private-use or unassigned character (U+{ord(bad):04X})",
            field=where,
        )
    if segment and (value in (".", "..") or PATH_SEPARATORS & set(value)):
        raise ValidationFailed(f"{where} must not contain / or \\ nor be . or ..", field=where)
    return value


def integer(value: Any, where: str, low: int, high: int) -> int:
    """``value`` if it is a JSON integer from ``low`` to ``high`` (``true`` and ``2.0`` are
    not); else ``ValidationFailed``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValidationFailed(f"{where} must be an integer from {low} to {high}", field=where)
    return value


def number(value: Any, where: str, low: float, high: float, *, above: bool = False) -> float:
    """``value`` if it is a finite JSON number from ``low`` (excluded when ``above``) to
    ``high``; else ``ValidationFailed``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))
    if not ok or not (low < value if above else low <= value) or value > high:
        bound = "above" if above else "from"
        raise ValidationFailed(f"{where} must be a number {bound} {low:g} to {high:g}", field=where)
    return float(value)

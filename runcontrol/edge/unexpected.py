"""An unexpected error at either door (issue 34): never a bare 500.

A failure no typed error describes (a bug, a database error nobody mapped) is logged by the
replica at ERROR with its traceback and a correlation id, and answered with that id: an
``application/problem+json`` 500 ``internal-error`` over HTTP (``api.problems``), ``INTERNAL``
over gRPC (``rpc.service``). The operator finds the line from the id the client reports (in a
Serve replica, its log: ``actors.ingress.log_in_replica``).
"""

from __future__ import annotations

import logging
import re
import uuid

from ..domain.errors import InternalError

log = logging.getLogger(__name__)

# A client's X-Correlation-Id is kept when it is a plain token; anything else gets our own.
_TOKEN = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")


def unexpected(exc: BaseException, door: str, correlation_id: str | None = None) -> InternalError:
    """Log ``exc`` (with its traceback) and answer the error the client gets instead."""
    if correlation_id is None or not _TOKEN.match(correlation_id):
        correlation_id = uuid.uuid4().hex
    log.error("unexpected error at %s (correlation id %s)", door, correlation_id, exc_info=exc)
    return InternalError(
        f"an unexpected error occurred (correlation id {correlation_id})",
        correlation_id=correlation_id,
    )

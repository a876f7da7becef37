"""Who holds a lease: an authenticated worker, never a string the caller makes up.

A worker is its token's subject, bound to its token's tenant, plus an instance id it picks per
process (so two processes of one worker account hold distinct leases). The lease holder is
``subject/instance``: an instance id never holds ``/``, so a holder names exactly one pair.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import errors

_INSTANCE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    tenant_id: str
    subject: str
    instance_id: str

    def __post_init__(self) -> None:
        if not self.tenant_id or not self.subject:
            raise errors.ValidationFailed("a worker needs a tenant and a subject")
        if not _INSTANCE_ID.fullmatch(self.instance_id):
            raise errors.ValidationFailed(
                "worker_instance_id must be 1-64 characters of A-Z a-z 0-9 . _ : -",
                field="worker_instance_id",
            )

    @property
    def holder(self) -> str:
        """The lease holder this worker is: its subject and instance."""
        return f"{self.subject}/{self.instance_id}"

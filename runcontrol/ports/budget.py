"""Budget (BC-05): a run's cost limit reserved against its tenant's budget at acceptance.

Reservations are rows of the run's own database (``budget_reservations``), made by the same
``runcontrol_apply`` statement that accepts or starts the run (migration 0007) and released by
the one that makes it terminal (0004): acceptance, reservation and first dispatch are one
transaction, and no crash can leave a reservation without its run or a terminal run holding one.
The port is therefore only the tenant's terms; a budget kept in another service would make it a
call again (and give up that atomicity).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Budget:
    """The terms every tenant's reservations are checked against."""

    # The most a tenant's open reservations may add up to (None: unlimited, and no check).
    tenant_limit_usd: float | None = None

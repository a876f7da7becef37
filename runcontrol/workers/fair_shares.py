"""Weighted fair shares across tenants (issue 21, item 4): which tenant a worker slot that
serves every tenant takes its next attempt from.

Pure: no I/O, no clock. Start-time fair queuing (Goyal et al., SFQ) over grants: each tenant
has a virtual time, its *tag*, that each grant to it advances by ``1 / weight``; a slot serves
the tenant with the least tag among those with an attempt it accepts, ties by the oldest head
(so with equal tags the order is the old oldest-first). The system's virtual time ``now`` is
the tag of the latest grant (with every tenant backlogged, the least tag among them), and no
tenant's tag is ever behind it: a tenant that was idle, or new, starts at ``now``, so idleness
banks no credit and a returning tenant gets its share, not a burst. Two tenants of weights 2
and 1, both backlogged, are granted 2:1.

One ``FairShare`` per run host (the credit book's grants and the host's unary claims share
it): each host's grants are fair; hosts keep no common virtual time (a tenant served on one
host is not charged on another). Only the grants of a slot that could have served another
tenant are charged (a credit bound to one tenant, a worker of that tenant's own, takes none
of the shared capacity). Costs: a tag is one dict read; a grant one dict write.
"""

from __future__ import annotations

from collections.abc import Mapping

# Tags at or behind ``now`` say nothing (the tenant starts at ``now`` anyway): past this many
# tenants remembered, those are forgotten, so the map stays the size of the active tenants.
_PRUNE_AT = 1024


class FairShare:
    def __init__(self, weights: Mapping[str, float] | None = None, default: float = 1.0) -> None:
        if default <= 0 or any(w <= 0 for w in (weights or {}).values()):
            raise ValueError("tenant weights must be positive")
        self._step = {tenant: 1.0 / w for tenant, w in (weights or {}).items()}
        self._default_step = 1.0 / default
        self._tags: dict[str, float] = {}
        self.now = 0.0

    def tag(self, tenant_id: str) -> float:
        """The tenant's virtual time: where its next grant starts."""
        tag = self._tags.get(tenant_id, self.now)
        return tag if tag > self.now else self.now

    def weight(self, tenant_id: str) -> float:
        return 1.0 / self._step.get(tenant_id, self._default_step)

    def charge(self, tenant_id: str) -> None:
        """One grant to the tenant, from a slot that could have served another."""
        start = self.tag(tenant_id)
        self.now = start
        self._tags[tenant_id] = start + self._step.get(tenant_id, self._default_step)
        if len(self._tags) > _PRUNE_AT:
            self._tags = {t: v for t, v in self._tags.items() if v > self.now}

    def key(self, tenant_id: str, head: object) -> tuple[float, object]:
        """The order of candidate tenants: least tag, then the oldest head."""
        return (self.tag(tenant_id), head)

"""What a submission pins (a tenant's current policy, a release alias), cached per process.

An entry is trusted only while the process's listener proves nothing changed: it is stored with
the ``runcontrol_config`` generation of its tenant (migration 0007 NOTIFYs the tenant when a
policy revision is published or an alias moves), read before the fetch, and dropped when the
generation moved or the listener lost its connection. Without a listening connection nothing
is cached. Immutable things (a release by id, a policy revision) are kept by ``Immutable``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from ..store.commit import CONFIG_CHANNEL
from ..store.notify import Listener

V = TypeVar("V")
_SIZE = 4096


class Immutable(Generic[V]):
    """A bounded map of values that never change once published."""

    def __init__(self, size: int = _SIZE) -> None:
        self._size = size
        self._values: OrderedDict[Hashable, V] = OrderedDict()

    async def get(self, key: Hashable, fetch: Callable[[], Awaitable[V]]) -> V:
        found = self._values.get(key)
        if found is None:
            found = await fetch()
            self._values[key] = found
            if len(self._values) > self._size:
                self._values.popitem(last=False)
        return found


class TenantConfig(Generic[V]):
    """Values per (tenant, key) that a configuration change of the tenant invalidates."""

    def __init__(self, listener: Listener | None, size: int = _SIZE) -> None:
        self._listener = listener
        self._size = size
        self._values: OrderedDict[tuple[str, Hashable], tuple[int, Any]] = OrderedDict()

    def _generation(self, tenant_id: str) -> int | None:
        listener = self._listener
        if listener is None or not listener.listening:
            return None
        return listener.generation(CONFIG_CHANNEL, (tenant_id,))

    async def get(self, tenant_id: str, key: Hashable, fetch: Callable[[], Awaitable[V]]) -> V:
        generation = self._generation(tenant_id)
        entry = self._values.get((tenant_id, key))
        if generation is not None and entry is not None and entry[0] == generation:
            value: V = entry[1]
            return value
        value = await fetch()
        if generation is not None:
            self._values[(tenant_id, key)] = (generation, value)
            if len(self._values) > self._size:
                self._values.popitem(last=False)
        return value

    def forget(self, tenant_id: str) -> None:
        """Drop the tenant's entries (this process changed its configuration)."""
        for k in [k for k in self._values if k[0] == tenant_id]:
            del self._values[k]

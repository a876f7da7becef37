"""The protocol's frozen dataclasses pickled without ``dataclasses.fields`` per object
(``actors.placement._quick_state``, issue 42): the same pickle, byte for byte, as Python's
own state gives, read back equal, by either side."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime
from uuid import UUID

from actors import placement
from runcontrol.domain.run.values import LeaseGrant
from runcontrol.domain.states import SideEffectClass
from runcontrol.workers.protocol import Answer, Credit, Grant, SessionDown, SessionUp


def _python_pickle(value: object) -> bytes:
    """``value`` pickled with dataclasses' own ``__getstate__`` on every class it holds."""
    classes = (SessionDown, SessionUp, Answer, Grant, Credit, LeaseGrant)
    quick = {cls: cls.__getstate__ for cls in classes}
    try:
        for cls in classes:
            cls.__getstate__ = dataclasses._dataclass_getstate  # type: ignore[attr-defined]
        return pickle.dumps(value, protocol=5)
    finally:
        for cls, getstate in quick.items():
            cls.__getstate__ = getstate  # type: ignore[method-assign]


def test_a_session_exchange_pickles_as_python_does_without_fields_per_object() -> None:
    lease = LeaseGrant(
        run_id=UUID(int=1),
        step_id=UUID(int=2),
        attempt_id=UUID(int=3),
        lease_id=UUID(int=4),
        fencing_token=5,
        holder="w",
        expires_at=datetime(2026, 12, 6, tzinfo=UTC),
        agent_id="a",
        skill_id="s",
        attempt_number=1,
        side_effect_class=SideEffectClass.READ,
    )
    grant = Grant(claim_id="c", tenant_id="t", lease=lease, input={"x": [1, 2]})
    down = SessionDown(answers=[Answer("k", True, lease)], grants=[grant], backlog={"a": 1})
    up = SessionUp(session_id="s", credits=[Credit(claim_id="c", holder="w", agent_ids=("a",))])
    for value in (down, up):
        assert type(value).__getstate__ is not dataclasses._dataclass_getstate  # type: ignore[attr-defined]
        quick = placement.pack(value)
        assert quick == _python_pickle(value)
        assert placement.unpack(quick) == value

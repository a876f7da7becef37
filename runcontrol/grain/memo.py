"""The exactly-once memo: a committed command's answer answers its resends.

The answer is stored with the command's effect, in the same statement (``command_answers``);
this activation also keeps the answers it committed, and the ids of every command the store
held answers for when it loaded the run, so a resend costs a read only when one is due. A
command id reused for another command (a different fingerprint) is refused.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from ..commands import Command, fingerprint
from ..domain import errors
from ..store.commit import Store, StoredAnswer

# A long-lived activation forgets what left the window once it remembers more than this.
MEMO_SIZE = 1024


class AnswerMemo:
    def __init__(self, store: Store, tenant_id: str, run_id: UUID, retention_s: float) -> None:
        self._store = store
        self._tenant_id = tenant_id
        self._run_id = run_id
        self._retention = timedelta(seconds=retention_s)
        # Answers this activation committed (id -> (when, answer, fingerprint)), and the ids
        # of every command the store held answers for when the run was loaded.
        self._answers: dict[str, tuple[datetime, Any, str]] = {}
        self._answered: set[str] = set()

    def window_start(self, now: datetime) -> datetime:
        return now - self._retention

    def loaded(self, answered: set[str]) -> None:
        """The run was (re)loaded: ``answered`` are the ids the store holds answers for."""
        self._answered = answered
        self._answers.clear()

    async def recall(
        self, command: Command[Any], now: datetime, *, look_up: bool = False
    ) -> tuple[bool, Any]:
        """``(True, answer)`` when the command already committed inside the window (``look_up``:
        ask the store even if the run was not loaded). A command id committed for a different
        command is refused (``IdempotencyConflict``)."""
        since = self.window_start(now)
        memo = self._answers.get(command.command_id)
        stored: tuple[Any, str | None] | None = None
        if memo is not None:
            at, value, memo_print = memo
            if at < since:
                return False, None
            stored = copy.copy(value), memo_print
        elif look_up or command.command_id in self._answered:
            stored = await self._store.stored_answer(
                self._tenant_id, self._run_id, command.command_id, since
            )
        if stored is None:
            return False, None
        value, printed = stored
        if printed is not None and printed != fingerprint(command):
            raise errors.IdempotencyConflict(
                "this command id (Idempotency-Key) was already used for a different command"
            )
        return True, value

    def remember(self, answer: StoredAnswer) -> None:
        self._answers[answer.command_id] = (answer.at, answer.value, answer.fingerprint)
        if len(self._answers) > MEMO_SIZE:
            since = self.window_start(answer.at)
            self._answers = {k: v for k, v in self._answers.items() if v[0] >= since}

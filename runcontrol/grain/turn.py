"""Several commands of one run in one turn: decided one after another, committed as one document.

A worker's exchange (and a host's command batch) may carry several commands of one run: the
reports of parallel steps, a renewal beside a report, an approval request and a journaled call.
Alone, each holds the run's mailbox through its own commit (a round trip of the group commit)
while the next waits for it; in one turn they are decided in order on the cached run and
committed as one document with every answer (``decision.commit_turn``): one load at most, one
document, one round trip, one notice. Each command is still answered as if sent alone. A turn
that cannot go on (a refusal inside it, which may have changed the cached run before it
raised; a lost race or a refused slot at its commit) commits nothing, and its commands are
decided again alone, one after another, as without turns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any
from uuid import UUID

from ..commands import Command
from .bus import HANDLERS
from .decision import commit_turn
from .env import Turn
from .grain import RunGrain
from .handlers import UNSERIALISED, handle

Outcome = tuple[bool, Any]  # (True, the answer) or (False, the error), as a command alone


def together(commands: Sequence[Command[Any]]) -> list[list[int]]:
    """The positions in ``commands``, grouped: each group one turn (several of a run, each
    decided by its declared rule, ``handlers.handle``) or one command alone; in the order of
    their first. A run with another kind among its commands (a submission, the reminder, a
    dispatch) keeps each alone; streamed output is written beside the mailbox, as always."""
    by_run: dict[tuple[str, UUID], list[int]] = {}
    for position, command in enumerate(commands):
        if type(command) not in UNSERIALISED:
            by_run.setdefault((command.tenant_id, command.run_id), []).append(position)
    turns = [
        positions
        for positions in by_run.values()
        if len(positions) > 1
        and all(HANDLERS.get(type(commands[p])) is handle for p in positions)
        and len({commands[p].command_id for p in positions}) == len(positions)
    ]
    in_turns = {p for positions in turns for p in positions}
    alone = [[p] for p in range(len(commands)) if p not in in_turns]
    return sorted([*turns, *alone], key=lambda positions: positions[0])


async def outcome(answer: Awaitable[Any]) -> Outcome:
    """``(True, the answer)``, or ``(False, the error)`` it raised."""
    try:
        return True, await answer
    except Exception as exc:  # noqa: BLE001 - answered to its caller
        return False, exc


async def turn(grain: RunGrain, commands: Sequence[Command[Any]]) -> list[Outcome]:
    """``commands`` (of ``grain``'s run, as ``together`` chose them) in one turn: each one's
    outcome, as if sent alone in this order. The caller holds the run's mailbox."""
    began = grain.turn = Turn()
    grain.flow_denied = {}
    outcomes: list[Outcome] = []
    try:
        for command in commands:
            try:
                outcomes.append((True, await grain.execute(command)))
            except Exception as exc:  # noqa: BLE001 - the command's own refusal, or the turn's end
                if began.broken:
                    break
                outcomes.append((False, exc))
        grain.turn = None
        if not began.broken:
            await commit_turn(grain, began)
    except BaseException as exc:
        grain.turn = None
        _forget(grain)
        if not isinstance(exc, Exception):
            raise
        # the commit failed (a lost connection: unknown whether it committed, as alone)
        decided = {command.command_id for command, _ in began.decided}
        return [
            (False, exc) if command.command_id in decided else outcome
            for command, outcome in zip(commands, outcomes, strict=True)
        ]
    if began.broken:
        _forget(grain)
        return [await outcome(grain.execute(command)) for command in commands]
    return outcomes


def _forget(grain: RunGrain) -> None:
    """The cached run holds what the turn decided and did not commit: read it again."""
    grain.agg = None
    grain.fused_dropped()

"""A command's decision: decide it on the run, commit it with its answer in one statement,
publish the commit (``bus.Committed``); decide again on a lost race.

A lost race (the version guard, or a deadlock between two activations) decides again once, on
fresh rows, before answering ``ConcurrencyConflict``; a commit a moved shard's fence refused
(``ShardMoved``) decides again once on the rows where a fresh directory routes the run; a
refusal decided on the cache decides again on fresh rows only if the run changed since; a
dispatch refused a concurrency slot (or one of the tenant's cap) decides again holding the step
(docs/flow-control.md).

Inside a turn (``RunGrain.turn``, several commands of one run: ``turn.turn``) a command is
decided on the run as the one before it left it and not committed: ``commit_turn`` commits
every decision of the turn as one document, with every answer.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from ..commands import Command, fingerprint
from ..domain import AuditRecord, CommandContext, errors
from ..domain.rates import RatesNeeded
from ..store.commit import (
    PendingCommit,
    Reservation,
    StoredAnswer,
    audits_document,
    conclude,
    prepare,
)
from .bus import Committed, publish
from .env import Plan, Turn
from .grain import RunGrain

T = TypeVar("T")


async def decide(
    grain: RunGrain, plan: Plan[T], command: Command[Any], *, reserve: Reservation | None = None
) -> T:
    """Decide ``plan`` on the run and commit it with its answer. ``reserve``: the budget
    reservation the plan records, made by the same statement."""
    if grain.turn is not None:
        return await _decide_in_turn(grain, grain.turn, plan, command, reserve)
    grain.flow_denied = {}
    try:
        return await _decide(grain, plan, command, reserve)
    finally:
        grain.fused_dropped()  # a fused grant not committed gives its credit back


async def _decide(
    grain: RunGrain, plan: Plan[T], command: Command[Any], reserve: Reservation | None
) -> T:
    env = grain.env
    retries = 1
    while True:
        grain.fused_dropped()  # deciding again: the last try's fused grants did not commit
        ctx = env.context(plan.actor, command.command_id, grain.run_id)
        cached = grain.agg is not None
        agg = grain.agg if grain.agg is not None else await grain.load(ctx.now)
        grain.agg = None  # trusted again only once this command has answered
        found, stored = await grain.memo.recall(command, ctx.now)
        if found:
            grain.agg = agg
            return stored  # type: ignore[no-any-return]
        try:
            result = plan.decide(agg, ctx)
        except RatesNeeded as needed:
            # A rate-limited step meets its dispatch: reserve, then decide again on fresh rows
            # (the plan changed these before it stopped).
            await grain.reserve_rates(needed.wanted, ctx.now)
            continue
        except errors.RunControlError:
            # Only a refusal decided on the cache may be stale: decide again on fresh rows
            # (which also finds this command's answer if another activation committed
            # it). A refusal decided on rows just loaded is the answer (re-checking those
            # would loop whenever another activation keeps committing).
            if cached and retries and await grain.version() != agg.run.version:
                retries -= 1
                continue
            await commit_audits(grain, agg.take_audits())
            raise
        answer = stored_answer(command, result, ctx)
        reserved = reserve if reserve is not None and grain.records(agg, reserve) else None
        pending = prepare(
            grain.tenant_id,
            agg,
            env.options,
            release_budget_at=grain.release_at(agg, ctx),
            answer=answer,
            also_answers=grain.fused_answers(),
            reserve=reserved,
        )
        if pending is not None:
            routed = env.store.for_run(grain.run_id)
            try:
                await commit(grain, pending)
            except errors.ConcurrencyConflict:
                if retries:
                    retries -= 1
                    continue
                raise
            except errors.ShardMoved:
                # The run's virtual shard moved: decided again on its new database's rows if
                # a fresh directory routes it there; else (the move not flipped yet) the
                # retryable refusal, sent again by the caller.
                if retries and await env.store.rerouted(grain.run_id, routed):
                    retries -= 1
                    continue
                raise
            except errors.FlowDenied as denied:
                grain.refused_flow(denied)  # decide again holding what needs the key
                continue
            grain.agg = agg
            await publish(grain, Committed(command, agg, pending.changes, answer))
        grain.agg = agg
        return result


class TurnBroken(Exception):
    """A command of a turn that cannot be decided in it: the turn's commands go alone."""


async def _decide_in_turn(
    grain: RunGrain, turn: Turn, plan: Plan[T], command: Command[Any], reserve: Reservation | None
) -> T:
    """Decide ``plan`` on the run as the turn's commands before it left it; committed with
    them (``commit_turn``). Whatever stops a decision (a refusal, which may have changed the
    run before it raised; rates to reserve; a budget reservation) breaks the turn: nothing of
    it is committed, and its commands are decided again alone."""
    if turn.broken or reserve is not None:
        turn.broken = True
        raise TurnBroken(type(command).__name__)
    ctx = grain.env.context(plan.actor, command.command_id, grain.run_id)
    try:
        agg = grain.agg if grain.agg is not None else await grain.load(ctx.now)
        grain.agg = agg  # the next command of the turn decides on what this one leaves
        found, stored = await grain.memo.recall(command, ctx.now)
        if found:
            return stored  # type: ignore[no-any-return]
        result = plan.decide(agg, ctx)
    except BaseException:
        turn.broken = True
        raise
    answer = stored_answer(command, result, ctx)
    turn.decided.append((command, answer))
    turn.last = ctx
    return result


async def commit_turn(grain: RunGrain, turn: Turn) -> None:
    """Commit what the turn's commands decided, as one document with each one's answer (and
    the fused grants' answers), and publish it: one notice for the turn (``Committed.earlier``
    names the commands before the last). A lost race or a refused slot breaks the turn
    (``turn.broken``: decide each again alone); another error is every decided command's."""
    agg = grain.agg
    if not turn.decided or agg is None:
        return
    assert turn.last is not None
    answers = [answer for _, answer in turn.decided]
    pending = prepare(
        grain.tenant_id,
        agg,
        grain.env.options,
        release_budget_at=grain.release_at(agg, turn.last),
        answer=answers[-1],
        also_answers=[*answers[:-1], *grain.fused_answers()],
    )
    if pending is None:
        return
    try:
        await commit(grain, pending)
    except (errors.ConcurrencyConflict, errors.FlowDenied, errors.PreApprovalUsedUp):
        turn.broken = True  # a template's use taken meanwhile too: decided again alone
        return
    command, answer = turn.decided[-1]
    notice = Committed(command, agg, pending.changes, answer, tuple(turn.decided[:-1]))
    await publish(grain, notice)


def stored_answer(command: Command[Any], result: Any, ctx: CommandContext) -> StoredAnswer:
    """The command's answer as its statement stores it (its resends get it)."""
    return StoredAnswer(
        command.command_id,
        type(command).__name__,
        _as_stored(result),
        ctx.now,
        fingerprint(command),
    )


def _as_stored(result: Any) -> Any:
    """The answer as the memo keeps it: a shallow copy, as the run's own objects (an attempt)
    change with later commands; a frozen dataclass (a lease grant) is its own copy."""
    params = getattr(type(result), "__dataclass_params__", None)
    return result if params is not None and params.frozen else copy.copy(result)


async def commit(grain: RunGrain, pending: PendingCommit) -> None:
    conclude(pending, await grain.env.commits.commit(pending.doc, pending.key))


async def commit_audits(grain: RunGrain, audits: list[AuditRecord]) -> None:
    """Commit a refused command's audit records (the refusal itself changes nothing)."""
    if audits:
        answer = await grain.env.commits.commit(
            audits_document(grain.tenant_id, audits), str(grain.run_id)
        )
        if answer is not None:
            raise errors.Unavailable(f"the refusal's audit was not stored: {answer[1]}")

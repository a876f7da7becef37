"""The gRPC status table and its typed detail, both ways (no network)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from runcontrol.domain import errors
from runcontrol.edge.errors import STATUS, Unauthorized, http_status
from runcontrol.rpc.status import DETAILS_KEY, RpcFailed, error_from_rpc, rich_status, status_for


@dataclass
class FailedCall:
    """What a client holds of a failed call (``grpc.RpcError``'s accessors)."""

    status: grpc.StatusCode
    message: str
    trailers: list[tuple[str, Any]] = field(default_factory=list)

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self.message

    def trailing_metadata(self) -> list[tuple[str, Any]]:
        return self.trailers


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.RunNotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.AttemptNotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.StaleFencingToken("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.LeaseNotHeld("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.LeaseExpired("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.LeaseRejected("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.IllegalTransition("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.OutcomeAlreadyRecorded("x"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.ValidationFailed("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.Forbidden("x"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.ConcurrencyConflict("x"), grpc.StatusCode.ABORTED),
        (errors.Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.RunControlError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_each_error_has_its_status_and_comes_back_as_itself(
    error: errors.RunControlError, status: grpc.StatusCode
) -> None:
    assert status_for(error) == status
    code, message, detail = rich_status(error)
    back = error_from_rpc(FailedCall(code, message, [(DETAILS_KEY, detail)]))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.retryable == error.retryable


def test_details_travel_as_strings_beside_retryable() -> None:
    error = errors.StaleFencingToken("stale", attempt_id="a-1")
    code, message, detail = rich_status(error)
    back = error_from_rpc(FailedCall(code, message, [(DETAILS_KEY, detail)]))
    assert back.details == {"attempt_id": "a-1"}


def test_a_status_without_detail_is_unknown_outcome_or_a_plain_failure() -> None:
    for status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        back = error_from_rpc(FailedCall(status, "connection lost"))
        assert isinstance(back, errors.Unavailable) and back.retryable
    back = error_from_rpc(FailedCall(grpc.StatusCode.UNAUTHENTICATED, "no token"))
    assert isinstance(back, RpcFailed) and back.details["status"] == "UNAUTHENTICATED"
    assert not back.retryable


# ---------------------------------------------------------------------- the edges' one table


def _inherited(cls: type[errors.RunControlError], protocol: str) -> int | str | None:
    """What ``cls`` would get without its own row."""
    for parent in cls.__mro__[1:]:
        row = STATUS.get(parent)
        value = None if row is None else getattr(row, protocol)
        if value is not None:
            found: int | str = value
            return found
    return None


@pytest.mark.parametrize("cls", list(STATUS), ids=lambda c: c.__name__)
def test_a_row_only_says_what_differs_from_its_family(cls: type[errors.RunControlError]) -> None:
    row = STATUS[cls]
    for protocol in ("http", "grpc"):
        value = getattr(row, protocol)
        if value is not None:
            assert value != _inherited(cls, protocol), f"{cls.__name__}.{protocol} repeats"
    assert row.grpc is None or row.grpc in grpc.StatusCode.__members__


def test_both_edges_read_the_one_table() -> None:
    error = errors.OutcomeAlreadyRecorded("again")
    assert (http_status(error), status_for(error)) == (409, grpc.StatusCode.ALREADY_EXISTS)
    gap = errors.ProgressGap("gap", acked_seq=3)
    assert (http_status(gap), status_for(gap)) == (409, grpc.StatusCode.DATA_LOSS)
    assert (http_status(Unauthorized()), status_for(Unauthorized())) == (
        401,
        grpc.StatusCode.UNAUTHENTICATED,
    )

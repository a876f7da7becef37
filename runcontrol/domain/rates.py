"""Rate limits (issue 21 item 2): token buckets per tenant, per agent id and by name.

The terms live in the policy revision (``PolicyDocument.rate_limits``, pinned by every run) and
a release's step names the named limits it draws on (``StepSpec.rate_limits``). At acceptance a
step gets its *draws*: which buckets its dispatch takes units from, at which rate and burst
(``draws``); a step without any draws nothing and costs nothing. The buckets themselves are
rows shared by every host (``rate_buckets``, migration 0018), reserved by the generic cell rate
algorithm (``docs/flow-control.md``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import limits
from .errors import ValidationFailed

TENANT_BUCKET = "tenant"
RATE_LIMIT = "rate-limit"  # a step's ``held["kind"]`` while a rate limit holds it


def agent_bucket(agent_id: str) -> str:
    return f"agent:{agent_id}"


def named_bucket(name: str) -> str:
    return f"named:{name}"


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's terms: ``per_second`` units refill each second, up to ``burst``."""

    per_second: float
    burst: float

    def to_dict(self) -> dict[str, float]:
        return {"perSecond": self.per_second, "burst": self.burst}


@dataclass(frozen=True, slots=True)
class RateLimits:
    """A policy revision's rate limits (``rateLimits``): the tenant's, per agent id, named."""

    tenant: Rate | None = None
    agents: Mapping[str, Rate] = field(default_factory=dict)
    named: Mapping[str, Rate] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tenant is not None:
            out["tenant"] = self.tenant.to_dict()
        if self.agents:
            out["agents"] = {k: v.to_dict() for k, v in sorted(self.agents.items())}
        if self.named:
            out["named"] = {k: v.to_dict() for k, v in sorted(self.named.items())}
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RateLimits:
        """``rateLimits`` of a policy document; anything malformed is ``ValidationFailed``
        naming the place (422 at publish)."""
        if not isinstance(data, dict):
            raise ValidationFailed("rateLimits must be an object")
        unknown = sorted(set(data) - {"tenant", "agents", "named"})
        if unknown:
            raise ValidationFailed(
                f"rateLimits: unknown keys {', '.join(unknown)} (known: agents, named, tenant)"
            )
        tenant = data.get("tenant")
        return cls(
            tenant=None if tenant is None else _rate("rateLimits.tenant", tenant),
            agents=_rates("rateLimits.agents", data.get("agents")),
            named=_rates("rateLimits.named", data.get("named")),
        )


def _rates(where: str, data: Any) -> dict[str, Rate]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValidationFailed(f"{where} must be an object of name -> {{perSecond, burst}}")
    out: dict[str, Rate] = {}
    for name, terms in data.items():
        limits.name(name, f"{where}: a name")
        out[name] = _rate(f"{where}.{name}", terms)
    return out


def _rate(where: str, data: Any) -> Rate:
    """Terms whose every derived interval fits (``limits.MAX_RATE_WINDOW_S``): a burst of
    whole dispatches that a full refill takes at most that long to restore."""
    if not isinstance(data, dict) or set(data) - {"perSecond", "burst"}:
        raise ValidationFailed(f"{where} must be {{perSecond, burst}}")
    per_second = limits.number(
        data.get("perSecond"), f"{where}.perSecond", 0, limits.MAX_PER_SECOND, above=True
    )
    burst = limits.number(data.get("burst", 1), f"{where}.burst", 1, limits.MAX_BURST)
    if not burst.is_integer():
        raise ValidationFailed(f"{where}.burst must be a whole number of dispatches")
    if burst / per_second > limits.MAX_RATE_WINDOW_S:
        raise ValidationFailed(
            f"{where}: a full burst must refill within {limits.MAX_RATE_WINDOW_S:g} s "
            f"(perSecond at least burst / {limits.MAX_RATE_WINDOW_S:g})"
        )
    return Rate(per_second, burst)


def step_limits(i: int, raw: Any) -> tuple[tuple[str, float], ...] | None:
    """A release step's ``rateLimits``: ``[{"name": "model-tokens", "units": 1}]`` (units
    taken at dispatch, default 1); None when the key is absent."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise ValidationFailed(
            f"steps[{i}]: rateLimits must be a non-empty list of {{name, units}}"
        )
    out: list[tuple[str, float]] = []
    for entry in raw:
        if not isinstance(entry, dict) or set(entry) - {"name", "units"}:
            raise ValidationFailed(f"steps[{i}]: a rateLimits entry is {{name, units}}")
        name = limits.name(entry.get("name"), f"steps[{i}]: rateLimits name")
        units = limits.number(
            entry.get("units", 1), f"steps[{i}]: rateLimits units", 0, limits.MAX_BURST, above=True
        )
        if name in (n for n, _ in out):
            raise ValidationFailed(f"steps[{i}]: rateLimits names {name!r} twice")
        out.append((name, units))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Draw:
    """What a step's dispatch takes from one bucket."""

    bucket: str
    per_second: float
    burst: float
    units: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "perSecond": self.per_second,
            "burst": self.burst,
            "units": self.units,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Draw:
        return cls(str(d["bucket"]), float(d["perSecond"]), float(d["burst"]), float(d["units"]))


def draws(
    limits: RateLimits | None, agent_id: str, named: Sequence[tuple[str, float]] | None
) -> list[Draw]:
    """The buckets a step of ``agent_id`` drawing on ``named`` takes from at dispatch, under a
    revision's ``limits``: one unit from the tenant's and its agent's (when configured), its
    units from each named limit. A named limit the revision does not define is refused (the
    submission is 422): fail closed rather than run unlimited."""
    out: list[Draw] = []
    if limits is not None and limits.tenant is not None:
        out.append(Draw(TENANT_BUCKET, limits.tenant.per_second, limits.tenant.burst, 1.0))
    agent = limits.agents.get(agent_id) if limits is not None else None
    if agent is not None:
        out.append(Draw(agent_bucket(agent_id), agent.per_second, agent.burst, 1.0))
    for name, units in named or ():
        rate = limits.named.get(name) if limits is not None else None
        if rate is None:
            raise ValidationFailed(
                f"the release draws on rate limit {name!r}, which the tenant's policy "
                "revision does not define (rateLimits.named)",
                limit=name,
            )
        if units > rate.burst:
            raise ValidationFailed(
                f"a dispatch takes {units:g} units of {name!r}, more than its burst "
                f"{rate.burst:g}: it could never be admitted",
                limit=name,
            )
        out.append(Draw(named_bucket(name), rate.per_second, rate.burst, units))
    return out


class RatesNeeded(Exception):  # noqa: N818 - a signal to the grain, not a failure
    """Raised by a dispatch that meets a rate-limited step with no reservation yet: the grain
    reserves (one short transaction on the buckets) and decides the command again. Not a
    ``RunControlError``: no caller ever sees it."""

    def __init__(self, wanted: Sequence[tuple[str, int, Sequence[Draw]]]) -> None:
        super().__init__(f"{len(wanted)} rate reservations needed")
        self.wanted = list(wanted)  # (step name, attempt number, its draws)


@dataclass(frozen=True, slots=True)
class Admission:
    """A reservation's answer: when the dispatch is admitted, and the bucket that said so
    (the one that held it longest; None when admitted at once)."""

    at: datetime
    bucket: str | None


def held(bucket: str | None, until: datetime, attempt: int) -> dict[str, Any]:
    """A step's visible hold (``Step.held``) while a reservation admits it only later: the
    reservation itself is recorded here (``attempt``: the number it was made for), so the
    dispatch at ``until`` takes nothing again."""
    return {"kind": RATE_LIMIT, "bucket": bucket, "until": until.isoformat(), "attempt": attempt}


def rate_reservation(hold: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The rate-limit reservation a step's hold records: the hold itself (a rate limit held
    it), or the one a concurrency hold keeps (a key held it after its instant came)."""
    if hold is None:
        return None
    if hold.get("kind") == RATE_LIMIT:
        return hold
    kept = hold.get("reservation")
    return kept if isinstance(kept, Mapping) else None


def reserved(hold: Mapping[str, Any] | None, number: int) -> bool:
    """Whether a step's hold records the reservation of its attempt ``number`` (a rate limit
    held it; at ``until`` its dispatch takes nothing again)."""
    found = rate_reservation(hold)
    return found is not None and found.get("attempt") == number

"""Settings: every RunControl option of the spec, with its default, overridable by environment.

The spec's ``RunControl:Leases:DurationSeconds`` is ``RUNCONTROL_LEASES__DURATION_SECONDS`` here
(section and key joined by a double underscore), and so on for every option.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .domain import Options


class LeaseOptions(BaseModel):
    duration_seconds: float = Field(120, gt=0)
    renewal_grace_seconds: float = Field(30, ge=0)


class RetryOptions(BaseModel):
    default_max_attempts: int = Field(3, ge=1)
    base_delay_seconds: float = Field(1.0, ge=0)
    max_delay_seconds: float = Field(300.0, ge=0)


class ApprovalOptions(BaseModel):
    default_expiry_hours: float = Field(72, gt=0)
    required_approvals: int = Field(1, ge=1)


class JournalOptions(BaseModel):
    retention_days: int = Field(365, ge=1)


class CommandOptions(BaseModel):
    answer_retention_hours: float = Field(
        24,
        gt=0,
        description="How long a committed command's answer is kept: a resend of its command id "
        "within this window gets the stored answer instead of a second effect.",
    )


class GrainOptions(BaseModel):
    idle_seconds: float = Field(60, gt=0)
    host_count: int = Field(2, ge=1)
    placement: str = Field("hosted", pattern="^(hosted|dedicated)$")
    threads: int = Field(
        32, ge=0, description="Threads per host running grain commands (store I/O is sync)."
    )


class BudgetOptions(BaseModel):
    tenant_limit_usd: float | None = Field(None, ge=0, description="None: no limit")


class CapacityOptions(BaseModel):
    max_open_attempts_per_tenant: int | None = Field(None, ge=1, description="None: no limit")


class SchedulerOptions(BaseModel):
    """How often each job runs (seconds). The spec schedules lease expiry every minute and
    approval expiry every five; the dispatcher sweep backs up LISTEN/NOTIFY."""

    lease_expiry_interval: float = Field(60, gt=0)
    approval_expiry_interval: float = Field(300, gt=0)
    dispatch_sweep_interval: float = Field(5, gt=0)
    outbox_relay_interval: float = Field(1, gt=0)
    retention_interval: float = Field(86400, gt=0)


class OutboxOptions(BaseModel):
    retention_days: int = Field(7, ge=1)
    jsonl_path: str | None = Field(None, description="Also publish events to this JSONL file.")


class AuthOptions(BaseModel):
    """Bearer-token verification at the HTTP edge: HS256 with a shared secret (local dev) and/or
    RS256 against a JWKS (file or URL). Issuer and audience are checked when set."""

    hs256_secret: SecretStr | None = Field(
        SecretStr("runcontrol-dev-secret-change-me-0123456789"),
        description="Shared HS256 secret; the default is for local development only.",
    )
    jwks_url: str | None = Field(None, description="JWKS endpoint for RS256 tokens.")
    jwks_file: str | None = Field(None, description="JWKS file for RS256 tokens.")
    issuer: str | None = Field(None, description="Required `iss`; unset: not checked.")
    audience: str | None = Field(None, description="Required `aud`; unset: not checked.")
    leeway_seconds: float = Field(30, ge=0)


class ApiOptions(BaseModel):
    sse_heartbeat_seconds: float = Field(15, gt=0, description="Comment line on an idle stream.")
    sse_max_streams: int = Field(
        4000,
        ge=1,
        description="Live event streams per replica, of any runs; more are refused with 429. "
        "Streams share the replica's one LISTEN connection and cost a read per event; each "
        "holds an HTTP connection (HAProxy's default maxconn is 4096 per node) and one of "
        "the deployment's max_ongoing_requests.",
    )
    readiness_timeout_seconds: float = Field(2, gt=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RUNCONTROL_", env_nested_delimiter="__", extra="ignore"
    )

    database_url: str | None = Field(
        None,
        description="Owner/admin URL of an existing PostgreSQL; unset: start an embedded one.",
    )
    app_database_url: str | None = Field(
        None, description="URL for the app role; derived from database_url when unset."
    )
    system_database_url: str | None = Field(
        None, description="URL for the system (all-tenant sweep) role; derived when unset."
    )
    app_role_password: str | None = None
    data_dir: str | None = Field(None, description="Embedded PostgreSQL data directory.")
    pool_size: int = Field(10, ge=1)

    leases: LeaseOptions = LeaseOptions()
    retries: RetryOptions = RetryOptions()
    approvals: ApprovalOptions = ApprovalOptions()
    journal: JournalOptions = JournalOptions()
    commands: CommandOptions = CommandOptions()
    grains: GrainOptions = GrainOptions()
    budget: BudgetOptions = BudgetOptions()
    capacity: CapacityOptions = CapacityOptions()
    scheduler: SchedulerOptions = SchedulerOptions()
    outbox: OutboxOptions = OutboxOptions()
    auth: AuthOptions = AuthOptions()
    api: ApiOptions = ApiOptions()

    def options(self) -> Options:
        return Options(
            lease_seconds=self.leases.duration_seconds,
            renewal_grace_seconds=self.leases.renewal_grace_seconds,
            default_max_attempts=self.retries.default_max_attempts,
            approval_expiry_hours=self.approvals.default_expiry_hours,
            retry_base_seconds=self.retries.base_delay_seconds,
            retry_cap_seconds=self.retries.max_delay_seconds,
            answer_retention_seconds=self.commands.answer_retention_hours * 3600,
        )

"""Settings: every RunControl option of the spec, with its default, overridable by environment.

The spec's ``RunControl:Leases:DurationSeconds`` is ``RUNCONTROL_LEASES__DURATION_SECONDS`` here
(section and key joined by a double underscore), and so on for every option.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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


class CancelOptions(BaseModel):
    stop_timeout_seconds: float = Field(
        120,
        gt=0,
        description="How long the lease holders of a cancelled run have to stop and report; "
        "then the reminder settles their attempts Uncertain and the run ends Cancelled.",
    )
    grace_seconds: float = Field(
        30,
        ge=0,
        description="cancelGrace: the stop timeout of a run the control plane cancels itself "
        "(wall-clock budget or lifetime exceeded).",
    )


class RunOptions(BaseModel):
    max_lifetime_hours: float = Field(
        24,
        gt=0,
        description="Every run is cancelled (lifetime-exceeded) this long after it was accepted.",
    )
    child_check_seconds: float = Field(
        10,
        gt=0,
        description="How often a run step whose child run is open submits it again and asks "
        "it for its end (idempotent): what a host killed between two runs' commits loses "
        "comes back within this.",
    )


class ToolCallOptions(BaseModel):
    claim_timeout_seconds: float = Field(
        300,
        gt=0,
        description="A claimed tool call without a result this long is closed with an error by "
        "the run's reminder and never executed.",
    )


class ResultOptions(BaseModel):
    max_inline_bytes: int = Field(
        256 * 1024,
        ge=1,
        le=3 * 1024 * 1024,  # under gRPC's default 4 MiB message limit, with room for the rest
        description="Results:MaxInlineBytes: the largest result an outcome may carry inline, "
        "as canonical JSON bytes; a larger one is refused (result-too-large, nothing stored, "
        "the attempt still open) and is reported as a reference {uri, sha256, bytes}. Results "
        "are kept as long as the event history (outbox.retention_days).",
    )


class CallOptions(BaseModel):
    """Journaled calls (``step.run``, docs/workers.md): each value is capped like a result
    (``results.max_inline_bytes``); these bound a step's calls."""

    max_per_step: int = Field(
        1000,
        ge=1,
        description="Calls:MaxPerStep: the most journaled calls one step may record; one more "
        "is refused (call-limit-reached) and the step's function gets the error.",
    )
    max_bytes_per_step: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Calls:MaxBytesPerStep: the most canonical JSON bytes a step's journaled "
        "calls may hold in all; a record past it is refused (call-limit-reached).",
    )
    grant_max_bytes: int = Field(
        1024 * 1024,
        ge=0,
        le=3 * 1024 * 1024,  # under gRPC's default 4 MiB message limit, with room for the rest
        description="Calls:GrantMaxBytes: how many bytes of its step's journaled values a "
        "grant carries (a replay then costs no round trip); the calls past it come with their "
        "hash and size only, and the worker reads each with one call when it gets there.",
    )


class GrainOptions(BaseModel):
    idle_seconds: float = Field(60, gt=0)
    host_count: int = Field(2, ge=1)
    placement: str = Field("hosted", pattern="^(hosted|dedicated)$")
    exchange_port: int | None = Field(
        0,
        ge=0,
        le=65535,
        description="Grains:ExchangePort: each run host serves the workers' gRPC Exchange "
        "itself on this port plus its index (0: a free port; None: only through the API's "
        "gRPC ingress, relayed by a replica). Workers learn the hosts' targets from the "
        "ingress's Exchange replies (docs/sessions.md).",
    )
    exchange_target: str = Field(
        "{node_ip}:{port}",
        description="Grains:ExchangeTarget: how workers reach a host's Exchange, formatted "
        "with node_ip, port and index: an ingress route to the host's port, when workers "
        "cannot reach the nodes.",
    )


class BudgetOptions(BaseModel):
    tenant_limit_usd: float | None = Field(None, ge=0, description="None: no limit")


class CapacityOptions(BaseModel):
    max_open_attempts_per_tenant: int | None = Field(None, ge=1, description="None: no limit")


class FlowOptions(BaseModel):
    """Flow control across tenants (issue 21): weighted fair shares of the worker slots that
    serve every tenant (``runcontrol.workers.fair_shares``)."""

    tenant_weights: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="Flow:TenantWeights: a tenant's share of the worker slots that serve every "
        "tenant (untenanted workers), relative to the others' while they all have attempts "
        "waiting: a tenant of weight 2 is granted twice as many as one of weight 1. Each run "
        "host's grants are fair (its credit book and its unary claims); a tenant idle for a "
        "while starts again at the others' virtual time, never with a burst.",
    )
    default_tenant_weight: float = Field(
        1.0, gt=0, description="The weight of a tenant not in tenant_weights."
    )


class SchedulerOptions(BaseModel):
    """How often each job runs (seconds). The spec schedules lease expiry every minute and
    approval expiry every five; the dispatcher sweep backs up LISTEN/NOTIFY."""

    lease_expiry_interval: float = Field(60, gt=0)
    approval_expiry_interval: float = Field(300, gt=0)
    dispatch_sweep_interval: float = Field(5, gt=0)
    outbox_relay_interval: float = Field(1, gt=0)
    retention_interval: float = Field(86400, gt=0)
    webhook_delivery_interval: float = Field(1, gt=0)
    schedule_sweep_interval: float = Field(
        1,
        gt=0,
        description="How often due schedules are fired (docs/schedules.md): a fire time is "
        "submitted at most this late (plus its jitter).",
    )
    metrics_sample_interval: float = Field(
        15,
        gt=0,
        description="How often the gauges read from the database (runs active, oldest pending "
        "approval, oldest unpublished event) are sampled.",
    )


class OutboxOptions(BaseModel):
    retention_days: int = Field(
        90,
        ge=1,
        description="Event history: published events (the per-run history and SSE replay, "
        "the tenant feed, webhook redelivery) are kept this long after publication.",
    )
    jsonl_path: str | None = Field(None, description="Also publish events to this JSONL file.")


class WebhookOptions(BaseModel):
    """Delivery of events to the tenants' webhook subscriptions (``runcontrol/webhooks.py``)."""

    max_attempts: int = Field(
        12,
        ge=1,
        le=100,
        description="Attempts per event before it is dead-lettered, for a subscription that "
        "does not set its own.",
    )
    base_delay_seconds: float = Field(1.0, gt=0)
    max_delay_seconds: float = Field(
        3600.0, gt=0, description="Cap of the exponential backoff (full jitter) between attempts."
    )
    timeout_seconds: float = Field(10.0, gt=0, description="Per delivery request.")
    max_parallel: int = Field(8, ge=1, description="Runs delivered at once by the scheduler.")
    allow_private_addresses: bool = Field(
        False,
        description="Allow receivers on loopback, private and link-local addresses. Off: a "
        "tenant cannot make the control plane call into its own network.",
    )


class TelemetryOptions(BaseModel):
    """Traces over OTLP and Ray's Prometheus endpoint (``runcontrol/telemetry.py``)."""

    otlp_endpoint: str | None = Field(
        None,
        description="Base URL of an OTLP/HTTP receiver (spans go to <url>/v1/traces). Unset: "
        "OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT if set, else no "
        "spans are exported.",
    )
    service_name: str | None = Field(
        None, description="The resource's service.name; unset: OTEL_SERVICE_NAME or runcontrol."
    )
    metrics_export_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Port of the Prometheus endpoint of a Ray runtime `runcontrol up` starts "
        "(ray.init's metrics export port); unset: Ray picks one. A cluster started with `ray "
        "start` takes --metrics-export-port instead.",
    )


MIN_SECRET_BYTES = 32  # RFC 7518 3.2: an HS256 key of at least the hash's size


class AuthNotConfigured(RuntimeError):
    """The HTTP edge has no way to verify a token: it refuses to start rather than guess."""


class AuthOptions(BaseModel):
    """Bearer-token verification at the HTTP edge: RS256 against a JWKS (file or URL) and/or
    HS256 with a shared secret. There is no built-in secret: a server with neither refuses to
    start (``runcontrol up --dev`` makes a random secret per data dir for local use).

    Issuer and audience are checked when set; with a JWKS both must be set."""

    hs256_secret: SecretStr | None = Field(
        None, description=f"Shared HS256 secret (at least {MIN_SECRET_BYTES} bytes)."
    )
    hs256_secret_file: str | None = Field(
        None, description="A file holding the shared HS256 secret (instead of hs256_secret)."
    )
    hs256_with_jwks: bool = Field(
        False,
        description="Also accept HS256 tokens when a JWKS is configured. Off: a shared secret "
        "left in the environment of an RS256 deployment cannot mint tokens it accepts.",
    )
    jwks_url: str | None = Field(None, description="JWKS endpoint for RS256 tokens.")
    jwks_file: str | None = Field(None, description="JWKS file for RS256 tokens.")
    issuer: str | None = Field(None, description="Required `iss`; needed with a JWKS.")
    audience: str | None = Field(None, description="Required `aud`; needed with a JWKS.")
    leeway_seconds: float = Field(30, ge=0, description="Clock skew allowed on exp/nbf/iat.")

    @property
    def uses_jwks(self) -> bool:
        return bool(self.jwks_url or self.jwks_file)

    def shared_secret(self) -> str | None:
        """The configured HS256 secret (read from its file if so configured), or None.

        Raises ``AuthNotConfigured`` when it is configured but unusable (unreadable, short)."""
        if self.hs256_secret is not None and self.hs256_secret_file:
            raise AuthNotConfigured("set hs256_secret or hs256_secret_file, not both")
        if self.hs256_secret is not None:
            secret = self.hs256_secret.get_secret_value()
            where = "RUNCONTROL_AUTH__HS256_SECRET"
        elif self.hs256_secret_file:
            where = self.hs256_secret_file
            try:
                with open(self.hs256_secret_file, encoding="utf-8") as fh:
                    secret = fh.read().strip()
            except OSError as exc:
                raise AuthNotConfigured(f"cannot read the HS256 secret file: {exc}") from None
        else:
            return None
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise AuthNotConfigured(
                f"the HS256 secret ({where}) is shorter than {MIN_SECRET_BYTES} bytes"
            )
        return secret

    def hs256_key(self) -> str | None:
        """The secret HS256 tokens are verified with; None when HS256 is not accepted."""
        secret = self.shared_secret()
        if secret is not None and self.uses_jwks and not self.hs256_with_jwks:
            return None
        return secret

    def check(self) -> None:
        """Raise ``AuthNotConfigured`` unless tokens can be verified, and verified safely."""
        if self.uses_jwks:
            if not (self.issuer and self.audience):
                raise AuthNotConfigured(
                    "with a JWKS, set RUNCONTROL_AUTH__ISSUER and RUNCONTROL_AUTH__AUDIENCE too: "
                    "otherwise any token the identity provider signs, for any application, "
                    "would be accepted"
                )
            self.shared_secret()  # a configured but unusable secret is an error even if unused
            return
        if self.shared_secret() is None:
            raise AuthNotConfigured(
                "no token verification key is configured, and there is no built-in one: set "
                "RUNCONTROL_AUTH__JWKS_URL (or _JWKS_FILE) with RUNCONTROL_AUTH__ISSUER and "
                "RUNCONTROL_AUTH__AUDIENCE, or RUNCONTROL_AUTH__HS256_SECRET (or "
                "_HS256_SECRET_FILE); for local development, `runcontrol up --dev` (`make run`) "
                "makes a random secret of its own"
            )


class RateLimit(BaseModel):
    """A token bucket: ``per_second`` tokens refill, up to ``burst``."""

    per_second: float = Field(gt=0)
    burst: int = Field(ge=1)


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
    max_commands_in_flight: int = Field(
        1024,
        ge=1,
        description="Commands (submissions, cancels, decisions) a replica waits on at once; "
        "more are shed with 503 overloaded and Retry-After instead of queueing until the "
        "client times out.",
    )
    dispatch_stall_seconds: float | None = Field(
        120,
        gt=0,
        description="An agent's dispatched attempts that have waited longer than this while "
        "no attempt of that tenant's agent was claimed are stalled (no worker takes them): "
        "shown by GET /health/workers and the runcontrol_dispatch_stalled_attempts metric, "
        "never by readiness. None: not checked.",
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Larger request bodies are refused with 413."
    )
    prefer_wait_max_seconds: float = Field(
        30,
        ge=0,
        description="The longest a submission with `Prefer: wait=N` holds its request for the "
        "run to end (longer waits are cut to this); 0: never waits. Each wait holds one of the "
        "deployment's max_ongoing_requests.",
    )
    command_rate: RateLimit | None = Field(
        None,
        description="Per tenant and replica, shared by the HTTP and gRPC doors: submissions, "
        "cancels, decisions and signals beyond this token bucket get 429 with Retry-After "
        "(gRPC: RESOURCE_EXHAUSTED). None: no limit.",
    )
    tenant_command_rates: dict[str, RateLimit] = Field(
        default_factory=dict, description="Per-tenant overrides of command_rate."
    )
    a2a_public_agent: str | None = Field(
        None,
        pattern=r"^[^/\s]+/[^/\s]+$",
        description="`tenant/workflowId` of the A2A agent whose card `GET "
        "/.well-known/agent-card.json` answers without a token (discovery by anonymous A2A "
        "clients, docs/a2a.md); every call to it still needs a token. `runcontrol up --dev` "
        "sets the demo's. None: the root card needs a token.",
    )
    a2a_grpc_address: str | None = Field(
        None,
        pattern=r"^[^/\s]+:[0-9]+$",
        description="`host:port` where clients reach the A2A gRPC binding (Serve's gRPC "
        "ingress), named in every agent card's gRPC interface (docs/a2a.md). None: the cards "
        "name no gRPC interface (the binding still answers). `runcontrol up` sets its own.",
    )


class ShardOptions(BaseModel):
    """Tenant shards (issue 41; docs/sharding.md): the databases every process serves
    (``store/shards.Shards``), each virtual shard on the one the directory says."""

    databases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Shards:Databases: the owner URLs of the shard databases, comma-separated "
        "(or a JSON list), the first holding the directory; a database is its position, so the "
        "list only grows. Empty: the one database of RUNCONTROL_DATABASE_URL.",
    )

    @field_validator("databases", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [url.strip() for url in text.split(",") if url.strip()]
        return value

    @field_validator("databases")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            scheme, _, rest = url.partition("://")
            if not (scheme.startswith("postgresql") and rest):
                shown = f"{scheme}://...@{rest.rsplit('@', 1)[-1]}"  # never a password
                raise ValueError(
                    f"RUNCONTROL_SHARDS__DATABASES: {shown} is not a postgresql:// URL"
                )
        if len(set(urls)) != len(urls):
            raise ValueError("RUNCONTROL_SHARDS__DATABASES names a database twice")
        return urls


class DrainOptions(BaseModel):
    """Graceful drain (SIGTERM to ``runcontrol up``, a run host or an API replica replaced):
    new submissions and claims are refused with 503 ``draining``, commands in flight finish."""

    grace_seconds: float = Field(
        30,
        ge=0,
        description="Drain:GraceSeconds: how long commands and attempts in flight may take to "
        "finish once a drain starts; then the process stops anyway (a lease not reported by "
        "then is settled by its expiry, as after a crash).",
    )
    retry_after_seconds: int = Field(
        5, ge=1, description="The Retry-After of a refusal by a draining process."
    )


class ConsoleOptions(BaseModel):
    """The web console (``/console``). With ``oauth_authorize_url``, ``oauth_token_url`` and
    ``oauth_client_id`` set, it signs in with the authorization-code flow and PKCE (a public
    client: no secret); otherwise only with a pasted token. The provider must issue tokens the
    ``auth`` section verifies and allow the console's origin on its token endpoint (CORS)."""

    oauth_authorize_url: str | None = Field(None, description="The provider's authorize URL.")
    oauth_token_url: str | None = Field(None, description="The provider's token URL.")
    oauth_client_id: str | None = Field(None, description="The console's client id there.")
    oauth_scope: str = Field(
        "openid factory.runs.read factory.runs.write factory.runs.operate "
        "factory.approvals.read factory.approvals.decide",
        description="Scopes the console asks for (the token's roles still bound them).",
    )
    oauth_audience: str | None = Field(
        None, description="Sent as `audience` when the provider needs it (e.g. Auth0)."
    )

    @property
    def oauth_configured(self) -> bool:
        return bool(self.oauth_authorize_url and self.oauth_token_url and self.oauth_client_id)


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
    cancel: CancelOptions = CancelOptions()
    runs: RunOptions = RunOptions()
    tool_calls: ToolCallOptions = ToolCallOptions()
    results: ResultOptions = ResultOptions()
    calls: CallOptions = CallOptions()
    grains: GrainOptions = GrainOptions()
    budget: BudgetOptions = BudgetOptions()
    capacity: CapacityOptions = CapacityOptions()
    flow: FlowOptions = FlowOptions()
    scheduler: SchedulerOptions = SchedulerOptions()
    outbox: OutboxOptions = OutboxOptions()
    webhooks: WebhookOptions = WebhookOptions()
    auth: AuthOptions = AuthOptions()
    api: ApiOptions = ApiOptions()
    telemetry: TelemetryOptions = TelemetryOptions()
    drain: DrainOptions = DrainOptions()
    console: ConsoleOptions = ConsoleOptions()
    shards: ShardOptions = ShardOptions()

    @model_validator(mode="after")
    def _first_shard(self) -> Settings:
        listed = self.shards.databases
        if listed and self.database_url is not None and listed[0] != self.database_url:
            raise ValueError(
                "RUNCONTROL_SHARDS__DATABASES must list RUNCONTROL_DATABASE_URL first (the first "
                "database holds the directory and every run stored before shards)"
            )
        return self

    def shard_databases(self) -> tuple[str, ...]:
        """The shard databases' owner URLs, the first holding the directory: the listed ones,
        else ``database_url`` alone (empty: the embedded database, the one there is)."""
        if self.shards.databases:
            return tuple(self.shards.databases)
        return () if self.database_url is None else (self.database_url,)

    def options(self) -> Options:
        return Options(
            lease_seconds=self.leases.duration_seconds,
            renewal_grace_seconds=self.leases.renewal_grace_seconds,
            default_max_attempts=self.retries.default_max_attempts,
            approval_expiry_hours=self.approvals.default_expiry_hours,
            retry_base_seconds=self.retries.base_delay_seconds,
            retry_cap_seconds=self.retries.max_delay_seconds,
            answer_retention_seconds=self.commands.answer_retention_hours * 3600,
            cancel_stop_timeout_seconds=self.cancel.stop_timeout_seconds,
            cancel_grace_seconds=self.cancel.grace_seconds,
            max_run_lifetime_seconds=self.runs.max_lifetime_hours * 3600,
            tool_call_claim_timeout_seconds=self.tool_calls.claim_timeout_seconds,
            result_max_bytes=self.results.max_inline_bytes,
            calls_max_per_step=self.calls.max_per_step,
            calls_max_bytes_per_step=self.calls.max_bytes_per_step,
            calls_grant_max_bytes=self.calls.grant_max_bytes,
            child_check_seconds=self.runs.child_check_seconds,
        )

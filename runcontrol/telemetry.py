"""OpenTelemetry traces: OTLP export when configured, the HTTP and gRPC edge spans, and the
W3C trace context a command carries from an edge to the run host that executes it.

Off unless an OTLP endpoint is configured (``RUNCONTROL_TELEMETRY__OTLP_ENDPOINT`` or the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and then
free: nothing of the SDK is imported, the edges make no spans, and commands carry no
context (``configure`` answers False and ``tracing()`` stays False). On, every process that
makes spans (Serve replicas, run hosts, the scheduler, workers) calls ``configure`` once at
start: a ``TracerProvider`` with a ``BatchSpanProcessor`` and an OTLP/HTTP (protobuf)
exporter, so a span costs an append to an in-memory queue and export happens on the
processor's thread. The SDK's own variables apply (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_SCHEDULE_DELAY``, ...).

Attributes carry ids only (tenant, run, step, attempt, approval, command, route templates,
RPC method names, status codes): never a prompt, an input, a proposal or a token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .config import TelemetryOptions

Carrier = dict[str, str]

_tracer = trace.get_tracer("runcontrol")
_state: dict[str, bool] = {"on": False}


def endpoint_configured(options: TelemetryOptions) -> bool:
    """Whether traces are to be exported: an endpoint is set (ours or the SDK's variables)
    and the SDK is not switched off (``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER=none``)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        options.otlp_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(options: TelemetryOptions, role: str) -> bool:
    """Install the exporting tracer provider in this process once, if configured; ``role``
    (api, host, scheduler, worker) becomes the resource attribute ``runcontrol.role``.
    Answers whether this process now exports spans."""
    if _state["on"]:
        return True
    if not endpoint_configured(options):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = options.service_name or os.environ.get("OTEL_SERVICE_NAME") or "runcontrol"
    resource = Resource.create({"service.name": service, "runcontrol.role": role})
    if options.otlp_endpoint:
        exporter = OTLPSpanExporter(endpoint=options.otlp_endpoint.rstrip("/") + "/v1/traces")
    else:
        exporter = OTLPSpanExporter()  # the OTEL_EXPORTER_OTLP_* variables
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=resource)
        trace.set_tracer_provider(provider)
    # else Ray Serve's own tracing (RAY_SERVE_TRACING_*) installed one first: a process has
    # one provider, so our spans join it and our exporter is added beside its processors.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _state["on"] = True  # the provider flushes its queue at exit (the SDK's atexit hook)
    return True


def tracing() -> bool:
    """Whether this process exports spans (``configure`` installed the provider)."""
    return _state["on"]


# ---------------------------------------------------------------------- context carriers


def current_carrier() -> Carrier | None:
    """The current span's W3C trace context (``traceparent``) to send along with a command,
    or None when tracing is off or no span is current (then nothing travels)."""
    if not _state["on"] or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: Carrier = {}
    propagate.inject(carrier)
    return carrier or None


def parent_context(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context a carrier names (the parent of the span started with it), or None."""
    if not carrier:
        return None
    return propagate.extract(dict(carrier))


def annotate(**attributes: str) -> None:
    """Add ids to the current span (the edge span: the tenant once the token is verified);
    a no-op when nothing records."""
    span = trace.get_current_span()
    if span.is_recording():
        for name, value in attributes.items():
            span.set_attribute(name.replace("_", "."), value)


# ---------------------------------------------------------------------- the HTTP edge

# The HTTP edge's span is FastAPI's own (FastAPI >= 0.165 traces natively once a tracer
# provider is installed: ``api/app.py`` passes this): one SERVER span per request named after
# the route template (``POST /factory/runs/{runId}/cancel``), with method, route, status and
# the client's ``traceparent`` as parent; ``annotate`` adds the tenant. Its per-operation
# spans (dependencies, serialisation), HTTP metrics and logs stay off: one span per request
# is what we want, and its logs would carry validation errors with their input values.
# A middleware of our own did the same in 40 lines; FastAPI's then made a second server span.


# ---------------------------------------------------------------------- the gRPC edge


@contextmanager
def rpc_span(service: str, method: str, context: Any, *, stream: bool = False) -> Iterator[Any]:
    """One SERVER span per RPC, child of the caller's ``traceparent`` metadata if it sent
    one; the status code is read from the context when the RPC returns. A stream's span is
    not made current: its generator may be resumed (or closed) from another context."""
    if not _state["on"]:
        yield None
        return
    carrier: Carrier = {}
    for key, value in context.invocation_metadata() or ():
        if key in ("traceparent", "tracestate"):
            carrier[key] = value.decode() if isinstance(value, bytes) else str(value)
    span = _tracer.start_span(
        f"{service}/{method}",
        context=propagate.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
    )
    try:
        if stream:
            yield span
        else:
            with trace.use_span(span, record_exception=True, set_status_on_exception=True):
                yield span
    finally:
        code = _status_code(context)
        span.set_attribute("rpc.grpc.status_code", code)
        if code != 0:
            span.set_status(Status(StatusCode.ERROR))
        span.end()


def _status_code(context: Any) -> int:
    """The numeric gRPC status the RPC set on its context (0, OK, when it set none)."""
    getter = getattr(context, "code", None)
    code = getter() if callable(getter) else None
    if code is None:
        return 0
    value = getattr(code, "value", code)
    return int(value[0] if isinstance(value, tuple) else value)

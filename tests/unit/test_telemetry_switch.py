"""Tracing is off unless an OTLP endpoint is configured, and off means nothing travels."""

from __future__ import annotations

import pytest

from runcontrol import telemetry
from runcontrol.config import Settings, TelemetryOptions

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "RUNCONTROL_TELEMETRY__OTLP_ENDPOINT",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_without_an_endpoint_nothing_is_installed_and_no_context_travels() -> None:
    options = Settings().telemetry
    assert not telemetry.endpoint_configured(options)
    assert telemetry.configure(options, "api") is False
    assert not telemetry.tracing()
    assert telemetry.current_carrier() is None
    assert telemetry.parent_context(None) is None


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_the_sdks_endpoint_variables_switch_it_on(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "http://collector:4318")
    assert telemetry.endpoint_configured(TelemetryOptions())


def test_our_setting_switches_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCONTROL_TELEMETRY__OTLP_ENDPOINT", "http://collector:4318")
    options = Settings().telemetry
    assert options.otlp_endpoint == "http://collector:4318"
    assert telemetry.endpoint_configured(options)


@pytest.mark.parametrize(
    ("variable", "value"), [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")]
)
def test_the_sdks_off_switches_win(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert not telemetry.endpoint_configured(TelemetryOptions(otlp_endpoint="http://c:4318"))

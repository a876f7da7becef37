"""The peer's table is read as ``restate_bench.py`` prints it, and a changed table is an error
that shows it, never a figure silently missing beside ours."""

from __future__ import annotations

import pytest

from bench import peers

PRINTED = """restate-server 1.7.12, restate-sdk (python), 2 CPUs, n=300, c=32

| metric | value |
|---|---:|
| completed 3-step runs/s | 1,140.6 |
| latency p50 / p95 / p99 (ms) | 170.4 / 542.2 / 601.0 |
| CPU per run: server / service / load generator (ms) | 4.47 / 2.70 / 5.23 |
| CPU per run: server + service / all three (ms) | 7.17 / 12.40 |
| CPU busy (cores of 2) | 1.74 |
"""


def test_the_peer_s_figures_are_read_from_its_table() -> None:
    peer = peers.parse(PRINTED)
    assert peer.completed_runs_per_s == 1140.6
    assert (peer.p50_ms, peer.p95_ms) == (170.4, 542.2)
    assert (peer.server_ms, peer.service_ms, peer.load_generator_ms) == (4.47, 2.70, 5.23)
    assert peer.server_side_ms == pytest.approx(7.17)
    assert peer.all_ms == pytest.approx(12.40)


def test_a_table_without_a_row_names_the_row() -> None:
    with pytest.raises(ValueError, match="no cpu row"):
        peers.parse(PRINTED.replace("CPU per run: server / service", "CPU: server / service"))


def test_without_restate_dir_there_is_no_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESTATE_DIR", raising=False)
    assert peers.restate_setup() is None

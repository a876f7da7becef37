"""A local cluster's Serve listeners take ports of their own (``actors.ingress``): two clusters
on one machine that shared Serve's fixed ports (the fallback proxy's 8500/9500) or its default
replica ranges would bind the same ports (SO_REUSEPORT) and answer each other's requests."""

from __future__ import annotations

import os
import random
import socket

import pytest

from actors.ingress import (
    _LOCAL_REPLICA_PORTS,
    PORT_VARIABLES,
    REPLICA_PORT_BLOCK,
    free_port_block,
    local_replica_ports,
    use_fast_ingress,
)

SERVE_DEFAULT_HTTP = range(30000, 31001)
SERVE_DEFAULT_GRPC = range(40000, 41001)


def ranges(ports: dict[str, str]) -> tuple[range, range]:
    http = range(
        int(ports["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
        int(ports["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) + 1,
    )
    grpc = range(
        int(ports["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"]),
        int(ports["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]) + 1,
    )
    return http, grpc


def test_replica_ports_are_a_block_of_their_own_outside_serves_defaults() -> None:
    http, grpc = ranges(local_replica_ports())
    assert len(http) == len(grpc) == REPLICA_PORT_BLOCK
    assert not set(http) & set(grpc)
    for block in (http, grpc):
        assert not set(block) & set(SERVE_DEFAULT_HTTP)
        assert not set(block) & set(SERVE_DEFAULT_GRPC)
        assert not set(block) & set(range(10002, 20000))  # Ray's worker ports


def test_a_block_with_a_port_in_use_is_never_chosen() -> None:
    """Nine blocks in ten have a port in use: every choice must be one of the free tenth. (One
    busy block among a hundred was missed by 50 random choices 60 % of the time with the
    check removed; here 20 choices all miss the busy ones with odds of 1 in 10^20.)"""
    low, high = _LOCAL_REPLICA_PORTS
    blocks = list(range(low, high - REPLICA_PORT_BLOCK, REPLICA_PORT_BLOCK))
    free = set(random.sample(blocks, len(blocks) // 10))
    held: list[socket.socket] = []
    try:
        for first in blocks:
            if first in free:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", first + 7))
            except OSError:
                sock.close()  # in use by someone else already: busy all the same
                continue
            held.append(sock)
        for _ in range(20):
            chosen = free_port_block(REPLICA_PORT_BLOCK)
            assert chosen in free, (chosen, sorted(free))
    finally:
        for sock in held:
            sock.close()


def test_clusters_started_one_after_another_get_different_ranges() -> None:
    starts = {ranges(local_replica_ports())[0].start for _ in range(5)}
    assert len(starts) > 1


def test_a_local_cluster_moves_every_fixed_port_off_serves_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    monkeypatch.setattr(os, "environ", environ)
    chosen = use_fast_ingress(local_ports=True)
    fixed = {"8404", "9101", "8500", "9500"}
    for name in (*PORT_VARIABLES, "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"):
        assert chosen[name] == environ[name]
        assert chosen[name] not in fixed
    assert "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT" in PORT_VARIABLES
    assert "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT" in PORT_VARIABLES

"""A local cluster's Serve listeners take ports of their own (``actors.ingress``): two clusters
on one machine that shared Serve's fixed ports (the fallback proxy's 8500/9500) or its default
replica ranges would bind the same ports (SO_REUSEPORT) and answer each other's requests."""

from __future__ import annotations

import os
import random
import socket

import pytest

from actors import ingress
from actors.ingress import (
    _LOCAL_INTERNAL_PORTS,
    _LOCAL_LISTEN_PORTS,
    _LOCAL_REPLICA_PORTS,
    PORT_VARIABLES,
    REPLICA_PORT_BLOCK,
    _free,
    _handed_out,
    free_port,
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
    """Nine free blocks in ten are made busy (a port of each held): every choice must be one of
    the free tenth, and it is found although so few are left (every block is tried before the
    answer is "none"). Blocks busy already (another cluster's replicas; ports in TIME_WAIT after
    earlier tests' clusters) are never counted as free: CI's run of this test once counted
    them and then found its free tenth "all taken"."""
    low, high = _LOCAL_REPLICA_PORTS
    blocks = list(range(low, high - REPLICA_PORT_BLOCK + 1, REPLICA_PORT_BLOCK))
    free_now = [
        first for first in blocks if all(_free(p) for p in range(first, first + REPLICA_PORT_BLOCK))
    ]
    assert len(free_now) >= 10, f"only {len(free_now)} free blocks on this machine"
    free = set(random.sample(free_now, len(free_now) // 10))
    held: list[socket.socket] = []
    try:
        for first in set(free_now) - free:
            sock = socket.socket()
            sock.bind(("127.0.0.1", first + 7))  # free a moment ago; ours now
            held.append(sock)
        for _ in range(20):
            chosen = free_port_block(REPLICA_PORT_BLOCK)
            assert chosen in free, (chosen, sorted(free))
    finally:
        for sock in held:
            sock.close()


def test_listening_ports_are_outside_the_ephemeral_range_and_never_repeat() -> None:
    """A listening port is never one an outgoing connection could take before its listener
    binds it (the kernel's ephemeral range), nor one of Serve's default replica ranges, and one
    process is never handed the same port twice (the first may not be bound yet)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
        ephemeral = range(int(ports.read().split()[0]), 65536)
    chosen = [free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    for port in chosen:
        assert port not in ephemeral
        assert port not in SERVE_DEFAULT_HTTP
        assert port not in SERVE_DEFAULT_GRPC
        assert _free(port)


def test_haproxys_own_ports_never_take_one_a_parent_picked_for_its_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test picks a service's HTTP and gRPC ports (not bound until the child starts); the
    child, starting Ray, picks HAProxy's listeners from the other half of the range, so it
    cannot take them, whatever it draws."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    monkeypatch.setattr(os, "environ", environ)
    picked_for_a_child = {free_port() for _ in range(50)}
    assert all(_LOCAL_LISTEN_PORTS[0] <= p < _LOCAL_LISTEN_PORTS[1] for p in picked_for_a_child)
    chosen = use_fast_ingress(local_ports=True)
    for name in PORT_VARIABLES:
        port = int(chosen[name])
        assert _LOCAL_INTERNAL_PORTS[0] <= port < _LOCAL_INTERNAL_PORTS[1], (name, port)
        assert port not in picked_for_a_child


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every port of the range but a handful held by someone: the ones handed out are those."""
    monkeypatch.delenv(ingress.SHARD_VARIABLE, raising=False)  # the whole range (no slice)
    low, high = _LOCAL_LISTEN_PORTS
    held: list[socket.socket] = []
    spare: list[int] = []
    try:
        for port in range(low, high):
            if port in _handed_out or not _free(port):
                continue
            if len(spare) < 5 and port % 97 == 0:
                spare.append(port)
                continue
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            held.append(sock)
        assert len(spare) == 5
        assert sorted(free_port() for _ in range(5)) == spare
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


def test_sharded_processes_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes started together (pytest-xdist workers) with shards 0/2 and 1/2 never
    pick the same port: each takes its own half of every local range."""
    picked: dict[str, set[int]] = {}
    for shard in ("0/2", "1/2"):
        monkeypatch.setenv(ingress.SHARD_VARIABLE, shard)
        ports = {ingress.free_port() for _ in range(20)}
        ports |= {ingress.free_port(ingress._LOCAL_INTERNAL_PORTS) for _ in range(20)}
        ports |= {ingress.free_port_block(ingress.REPLICA_PORT_BLOCK)}
        picked[shard] = ports
    assert not picked["0/2"] & picked["1/2"]
    low, high = ingress._LOCAL_LISTEN_PORTS
    assert all(p < low + (high - low) // 2 for p in picked["0/2"] if low <= p < high)
    monkeypatch.setenv(ingress.SHARD_VARIABLE, "2/2")
    with pytest.raises(ValueError):
        ingress.free_port()

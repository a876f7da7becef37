"""`make bench`: every figure beside its ceiling measured in the same run.

Usage: python -m bench [--runs N] [--concurrency C]
       [--only transitions,http,reads,e2e,sse,fairness,journal]
       [--only transitions,http,reads,e2e,shards,sse,fairness,output]
       [--short] (small N everywhere: a few minutes in all)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import ray

from actors.ingress import use_fast_ingress

from . import (
    common,
    e2e,
    fairness,
    inprocess,
    journal,
    output,
    peers,
    reads,
    shards,
    sse,
    transitions,
)

PARTS = ("transitions", "reads", "http", "e2e", "shards", "sse", "fairness", "journal", "output")


def _parts(value: str) -> set[str]:
    parts = {p.strip() for p in value.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown parts {sorted(unknown)}; known: {PARTS}")
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dedicated-runs", type=int, default=6)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--only",
        type=_parts,
        default=None,
        help=f"comma-separated, of {','.join(PARTS)} (default: all)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--http-seconds", type=int, default=15, help="wrk's duration per route")
    parser.add_argument("--e2e-runs", type=int, default=2000)
    parser.add_argument("--e2e-workers", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--e2e-transport",
        default=e2e.DEFAULT_TRANSPORTS,
        help="the e2e workers, one measurement each: claim (the old claim path), session (the "
        "hosts' session alone, in the cluster), sdk (runcontrol worker --transport ray), grpc "
        "(runcontrol worker --transport grpc, outside the cluster), grpc-relay (the same, every "
        "exchange relayed by the API replica: --via-ingress), grpc-session (the hosts' "
        "session over gRPC, no SDK)",
    )
    parser.add_argument("--e2e-worker-concurrency", type=int, default=32)
    parser.add_argument(
        "--e2e-paced",
        type=float,
        default=0.5,
        help="then submit a quarter as many runs at this fraction of the peak rate measured, "
        "for submit->completed p50/p99 away from saturation (0: skip)",
    )
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="skip Restate's run beside e2e (run when RESTATE_DIR holds it: bench/peers.py)",
    )
    parser.add_argument(
        "--e2e-in-flight", type=int, default=64, help="submitted runs not yet ended, at most"
    )
    parser.add_argument(
        "--shards-transport",
        default="sdk",
        choices=e2e.TRANSPORTS,
        help="the workers of the 1-versus-2-database end to end (shards)",
    )
    parser.add_argument(
        "--shards-order",
        default="1,2",
        choices=("1,2", "2,1"),
        help="which layout of the end to end on 1 and 2 databases runs first",
    )
    parser.add_argument("--sse-streams", type=int, default=1000)
    parser.add_argument("--sse-runs", type=int, default=100)
    parser.add_argument("--sse-seconds", type=float, default=20.0)
    parser.add_argument("--sse-rate", type=float, default=50.0, help="progress events/s")
    parser.add_argument(
        "--fairness-a-runs", type=int, default=5000, help="tenant A's runs, submitted at once"
    )
    parser.add_argument(
        "--fairness-b-every", type=float, default=2.0, help="tenant B submits one run every N s"
    )
    parser.add_argument(
        "--fairness-b-unloaded", type=int, default=10, help="B's runs submitted with A idle"
    )
    parser.add_argument("--fairness-worker-concurrency", type=int, default=32)
    parser.add_argument(
        "--fairness-work-seconds", type=float, default=1.0, help="the workers' time per attempt"
    )
    parser.add_argument("--journal-runs", type=int, default=500)
    parser.add_argument(
        "--journal-calls", type=int, default=20, help="commands of each kind per run"
    )
    parser.add_argument(
        "--journal-bytes", type=int, default=512, help="the text each command carries"
    )
    parser.add_argument("--output-attempts", type=int, default=100, help="streaming at once")
    parser.add_argument("--output-rate", type=float, default=100.0, help="chunks/s each")
    parser.add_argument("--output-seconds", type=float, default=10.0)
    parser.add_argument(
        "--short", action="store_true", help="small N everywhere (a few minutes in all)"
    )
    args = parser.parse_args()
    if args.short:
        args.runs, args.dedicated_runs, args.pgbench_seconds = 300, 2, 5
        args.http_seconds, args.e2e_runs = 5, 200
        args.sse_streams, args.sse_runs, args.sse_seconds = 200, 20, 5.0
        args.fairness_a_runs, args.fairness_b_unloaded = 500, 5
        args.journal_runs = 200
        args.output_attempts, args.output_seconds = 20, 5.0
    sse.raise_fd_limit()  # before ray.init: Ray's processes inherit it

    results: dict[str, object] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_at_start": os.getloadavg(),
    }
    os.environ.setdefault("RAY_worker_maximum_startup_concurrency", "4")
    # The same Serve ingress as `make run`: it must be in the environment before ray.init.
    results["serve_ingress"] = use_fast_ingress(local_ports=True)
    with common.private_database() as url:
        common.local_ray()
        try:
            if args.only is None or "transitions" in args.only:
                print("pgbench (UPDATE run + INSERT outbox, 8 clients) ...", flush=True)
                ceiling = common.pgbench_tps(url, seconds=args.pgbench_seconds)
                print(
                    f"hosted placement: {args.runs} runs x {transitions.STEPS} steps, "
                    f"{args.concurrency} concurrent drivers ...",
                    flush=True,
                )
                hosted = transitions.run(url, runs=args.runs, concurrency=args.concurrency)
                doubled = 2 * args.concurrency
                print(f"hosted placement again, {doubled} concurrent drivers ...", flush=True)
                hosted_more = transitions.run(url, runs=args.runs, concurrency=doubled)
                print("grain commands in-process, without Ray ...", flush=True)
                local = inprocess.run(url)
                print("Ray no-op actor calls (the actor runtime's own ceiling) ...", flush=True)
                noop = transitions.ray_noop_calls(args.concurrency)
                print(f"dedicated placement: {args.dedicated_runs} runs ...", flush=True)
                dedicated = transitions.dedicated(url, runs=args.dedicated_runs)
                results["transitions"] = {
                    "pgbench_tps": ceiling,
                    "ray_noop_calls_per_s": noop,
                    "in_process": local,
                    "hosted": hosted.__dict__,
                    f"hosted_{doubled}_drivers": hosted_more.__dict__,
                    "dedicated": dedicated,
                }
                print()
                print(f"{'figure':<44}{'value':>14}{'ceiling':>14}{'ratio':>8}")
                for label, figures in (
                    (f"hosted, {args.concurrency} drivers", hosted),
                    (f"hosted, {doubled} drivers", hosted_more),
                ):
                    for name, rate in (
                        (f"state transitions/s ({label})", figures.transitions_per_s),
                        ("  commands/s", figures.commands_per_s),
                    ):
                        print(f"{name:<44}{rate:>14.0f}{ceiling:>14.0f}{rate / ceiling:>8.2f}")
                    print(
                        f"{'  commands per actor call / per commit':<44}"
                        f"{figures.commands_per_actor_call:>7.1f} / "
                        f"{figures.commands_per_commit:<6.1f}"
                    )
                    rate = figures.submissions_per_s
                    name = "  submissions/s through hosts (no HTTP)"
                    print(
                        f"{name:<44}{rate:>14.0f}{ceiling:>14.0f}{rate / ceiling:>8.2f}"
                        f"   {rate / figures.commands_per_s:.2f}x commands/s"
                    )
                    print(
                        f"{'  submission p50 / p95 ms':<44}"
                        f"{figures.submission_p50_ms:>7.1f} / {figures.submission_p95_ms:<6.1f}"
                    )
                for name, rate in (
                    ("state transitions/s (dedicated)", dedicated["transitions_per_s"]),
                    ("  commands/s (dedicated)", dedicated["commands_per_s"]),
                ):
                    print(f"{name:<44}{rate:>14.0f}{ceiling:>14.0f}{rate / ceiling:>8.2f}")
                for label in ("sequential", "16_drivers"):
                    rate = local[f"{label}_commands_per_s"]
                    name = f"grain commands/s in-process ({label.replace('_', ' ')})"
                    print(f"{name:<44}{rate:>14.0f}{ceiling:>14.0f}{rate / ceiling:>8.2f}")
                print(
                    f"{'python CPU per command in-process (ms)':<44}"
                    f"{local['16_drivers_cpu_ms_per_command']:>14.2f}"
                )
                print(
                    f"{'Ray no-op actor calls/s (one actor)':<44}"
                    f"{noop:>14.0f}{ceiling:>14.0f}{noop / ceiling:>8.2f}"
                )
                print(
                    f"{'cold activation p50 / p99 ms (hosted)':<44}"
                    f"{hosted.cold_p50_ms:>7.1f} / {hosted.cold_p99_ms:<6.1f}"
                )
                print(
                    f"{'activation p50 / p99 ms (dedicated)':<44}"
                    f"{dedicated['activation_p50_ms']:>7.0f} / "
                    f"{dedicated['activation_p99_ms']:<6.0f}"
                )
                print(
                    f"{'memory per idle activation (hosted)':<44}"
                    f"{hosted.idle_bytes_per_activation / 1024:>11.1f} KiB"
                )
                print(
                    f"{'memory per run (dedicated, actor RSS)':<44}"
                    f"{dedicated['bytes_per_run'] / 2**20:>11.1f} MiB"
                )
            if args.only is None or "reads" in args.only:
                print("API replica reads: to_thread vs async on the loop ...", flush=True)
                results["reads"] = reads.run(url, concurrency=args.concurrency)
            if args.only is None or "http" in args.only:
                try:
                    from . import http
                except ImportError:
                    print("(http benchmark not available)")
                else:
                    results["http"] = http.run(url, concurrency=32, seconds=args.http_seconds)
            if args.only is None or "e2e" in args.only:
                ceiling = _ceiling(results, url, args.pgbench_seconds)
                print(
                    f"end to end: {args.e2e_runs} runs x {e2e.STEPS} steps over HTTP, "
                    f"{args.e2e_workers} worker process(es) x {args.e2e_worker_concurrency} ...",
                    flush=True,
                )
                peer = peers.restate(args.e2e_runs, args.concurrency) if args.peers else None
                if peer is not None:
                    results["restate"] = peer.as_dict()
                ours: dict[str, dict[str, Any]] = {}
                for transport in args.e2e_transport.split(","):
                    figures = e2e.run(
                        url, **_e2e_options(args), transport=transport, paced=args.e2e_paced
                    )
                    key = "e2e" if transport == "claim" else f"e2e_{transport.replace('-', '_')}"
                    results[key] = {"pgbench_tps": ceiling, **figures}
                    e2e.report(figures, ceiling)
                    ours[transport] = figures
                if peer is not None:
                    peers.report(peer, ours)
            if args.only is None or "shards" in args.only:
                print(f"end to end on 1 and on 2 databases: {args.e2e_runs} runs", flush=True)
                results["shards"] = shards.e2e_side_by_side(
                    url,
                    **_e2e_options(args),
                    transport=args.shards_transport,
                    order=[int(n) for n in args.shards_order.split(",")],
                )
                shards.e2e_report(results["shards"])
            if args.only is None or "sse" in args.only:
                print(f"SSE: {args.sse_streams} streams over {args.sse_runs} runs ...", flush=True)
                results["sse"] = sse.run(
                    url,
                    streams=args.sse_streams,
                    runs=args.sse_runs,
                    seconds=args.sse_seconds,
                    rate=args.sse_rate,
                )
                sse.report(results["sse"])
            if args.only is None or "fairness" in args.only:
                print(
                    f"fairness: tenant A {args.fairness_a_runs} runs at once, tenant B one "
                    f"every {args.fairness_b_every} s ...",
                    flush=True,
                )
                results["fairness"] = fairness.run(
                    url,
                    a_runs=args.fairness_a_runs,
                    b_every_s=args.fairness_b_every,
                    b_unloaded=args.fairness_b_unloaded,
                    concurrency=args.concurrency,
                    worker_concurrency=args.fairness_worker_concurrency,
                    work_seconds=args.fairness_work_seconds,
                )
                fairness.report(results["fairness"])
            if args.only is None or "journal" in args.only:
                print("journaled calls vs progress reports (in-process grains) ...", flush=True)
                results["journal"] = journal.run(
                    url,
                    runs=args.journal_runs,
                    calls=args.journal_calls,
                    drivers=args.concurrency,
                    value_bytes=args.journal_bytes,
                )
                journal.report(results["journal"])
            if args.only is None or "output" in args.only:
                ceiling = _ceiling(results, url, args.pgbench_seconds)
                print(
                    f"streamed output: {args.output_attempts} attempts x {args.output_rate:.0f} "
                    f"chunks/s for {args.output_seconds:.0f} s ...",
                    flush=True,
                )
                results["output"] = output.run(
                    url,
                    ceiling,
                    attempts=args.output_attempts,
                    rate=args.output_rate,
                    seconds=args.output_seconds,
                )
                output.report(results["output"])
        finally:
            ray.shutdown()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
    return 0


def _e2e_options(args: argparse.Namespace) -> dict[str, int]:
    """The end to end's options (``bench.e2e.run``), the same for every layout and worker."""
    return {
        "runs": args.e2e_runs,
        "concurrency": args.concurrency,
        "workers": args.e2e_workers,
        "worker_concurrency": args.e2e_worker_concurrency,
        "in_flight": args.e2e_in_flight,
    }


def _ceiling(results: dict[str, object], url: str, seconds: int) -> float:
    """pgbench's tx/s from this run: the one already measured, or measured now."""
    measured = results.get("transitions")
    if isinstance(measured, dict):
        return float(measured["pgbench_tps"])
    print("pgbench (UPDATE run + INSERT outbox, 8 clients) ...", flush=True)
    return common.pgbench_tps(url, seconds=seconds)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark PostgreSQL job-queue systems side by side on this machine.

Usage: python bench/run.py [--quick] [--systems raw,procrastinate,pgqueuer] [--output PATH]
See bench/README.md for what is measured.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
# import as the `bench` package from the repo root; keep bench/ itself off sys.path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != BENCH_DIR]
sys.path.insert(0, REPO_ROOT)

from bench.harness import pg  # noqa: E402
from bench.harness.phases import Plan, log, measure_system  # noqa: E402
from bench.harness.report import markdown  # noqa: E402
from bench.systems import REGISTRY, get_system  # noqa: E402
from bench.systems.base import MetricSpec, Options, Row, System  # noqa: E402

DEFAULT_SYSTEMS = "raw,procrastinate,pgqueuer,postjob_sa"
ALWAYS_REPORTED = ("psycopg2-binary", "SQLAlchemy", "postjob_sa")

QUICK = {
    "jobs": 2000,
    "reps": 1,
    "latency_jobs": 40,
    "latency_warmup": 5,
    "checkout_sizes": "1000,100000",
    "checkout_unvacuumed": 100_000,
    "checkout_samples": 100,
    "quiet_wait": 5.0,
}
FULL = {
    "jobs": 20_000,
    "reps": 3,
    "latency_jobs": 200,
    "latency_warmup": 10,
    "checkout_sizes": "1000,1000000",
    "checkout_unvacuumed": 1_000_000,
    "checkout_samples": 200,
    "quiet_wait": 20.0,
}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 1 rep (< 3 min)")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"known: {', '.join(REGISTRY)}")
    p.add_argument(
        "--output",
        default=os.path.join(BENCH_DIR, "results", "latest.json"),
        help="JSON results path (default bench/results/latest.json)",
    )
    p.add_argument(
        "--dsn-base",
        default=os.environ.get("PJBENCH_DSN_BASE", "postgresql://root@127.0.0.1:5432"),
        help="server URL without database; each system gets pjbench_<system>",
    )
    sizes = p.add_argument_group("sizes (defaults depend on --quick)")
    sizes.add_argument("--jobs", type=int, help="N: jobs per drain and batched enqueue")
    sizes.add_argument("--reps", type=int, help="repetitions; the median is reported")
    sizes.add_argument("--latency-jobs", type=int, help="M: timed jobs per latency run")
    sizes.add_argument("--latency-warmup", type=int, help="untimed jobs before them")
    sizes.add_argument("--checkout-sizes", help="finished-row counts for (e), comma-separated")
    sizes.add_argument("--checkout-unvacuumed", type=int, help="(e) unvacuumed case; 0 = skip")
    sizes.add_argument("--checkout-samples", type=int, help="checkouts timed per rep")
    sizes.add_argument(
        "--quiet-wait",
        type=float,
        help="max seconds to wait for an idle machine before each timed phase (20 / quick 5)",
    )
    fixed = p.add_argument_group("shape")
    fixed.add_argument("--workers", type=int, default=2, help="W: worker processes")
    fixed.add_argument("--enqueue-batch", type=int, default=1000, help="jobs per batched txn")
    fixed.add_argument("--latency-spacing-ms", type=float, default=20.0)
    knobs = p.add_argument_group("system configs")
    knobs.add_argument("--raw-batch", type=int, default=100, help="raw batched checkout size")
    knobs.add_argument("--procrastinate-concurrency", type=_ints, default=(1, 8))
    knobs.add_argument("--pgqueuer-batch", type=_ints, default=(10, 100))
    knobs.add_argument(
        "--opt", action="append", default=[], metavar="KEY=VALUE", help="passed to systems"
    )
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    options = Options(
        raw_batch=args.raw_batch,
        procrastinate_concurrency=tuple(args.procrastinate_concurrency),
        pgqueuer_batch=tuple(args.pgqueuer_batch),
        extra=dict(o.split("=", 1) for o in args.opt),
    )
    return Plan(
        jobs=args.jobs,
        workers=args.workers,
        reps=args.reps,
        enqueue_batch=args.enqueue_batch,
        latency_jobs=args.latency_jobs,
        latency_spacing_s=args.latency_spacing_ms / 1000.0,
        latency_warmup=args.latency_warmup,
        checkout_sizes=_ints(args.checkout_sizes),
        checkout_unvacuumed=args.checkout_unvacuumed,
        checkout_samples=args.checkout_samples,
        checkout_ready=1000,
        quick=args.quick,
        quiet_wait_s=args.quiet_wait,
        options=options,
    )


def versions(systems: list[System]) -> dict[str, str | None]:
    names: list[str] = []
    for s in systems:
        names += [d for d in s.distributions if d not in names]
    names += [d for d in ALWAYS_REPORTED if d not in names]
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    t_start = time.time()
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    systems = [get_system(n) for n in names]
    admin = pg.url_for(args.dsn_base, "postgres")
    try:
        server = pg.server_settings(admin)
    except Exception as exc:
        log(
            f"cannot reach PostgreSQL at {args.dsn_base} ({str(exc).strip()}); on this box: "
            "pg_ctlcluster --skip-systemctl-redirect 15 main start"
        )
        return 2
    doc: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "command": " ".join([sys.executable, *sys.argv]),
        "mode": "quick" if args.quick else "full",
        "plan": asdict(plan),
        "python": platform.python_version(),
        "versions": versions(systems),
        "server": server,
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_at_start": os.getloadavg(),
        },
        "rows": [],
        "details": {},
        "skipped": {},
    }
    log(f"{doc['mode']} run: N={plan.jobs}, W={plan.workers}, reps={plan.reps}, systems={names}")
    rows: list[Row] = []
    specs: list[MetricSpec] = []
    for system in systems:
        reason = system.unavailable_reason()
        if reason:
            log(f"=== {system.name}: skipped ({reason})")
            doc["skipped"][system.name] = reason
            continue
        log(f"=== {system.name} (database {system.database}) ===")
        t0 = time.time()
        try:
            url = pg.fresh_database(args.dsn_base, system.database)
            result = measure_system(system, url, plan)
            rows += result.rows
            specs += system.metric_specs()
            doc["details"][system.name] = result.details
        except Exception:
            log(f"{system.name} FAILED:\n{traceback.format_exc()}")
            doc["skipped"][system.name] = "failed: " + traceback.format_exc(limit=3)
        doc.setdefault("elapsed_s_per_system", {})[system.name] = time.time() - t0
        doc["rows"] = [asdict(r) for r in rows]
        _write(args.output, doc)  # keep partial results if a later system crashes
    doc["elapsed_s"] = time.time() - t_start
    doc["host"]["loadavg_at_end"] = os.getloadavg()
    header = [
        f"## Job-queue benchmark ({doc['mode']}, {doc['started_at']})",
        "",
        f"N={plan.jobs} no-op jobs, W={plan.workers} worker processes, {plan.reps} rep(s) "
        f"(median); (a) uses N/4={plan.single_jobs} jobs, (b) {plan.enqueue_batch} jobs/txn; "
        f"(d) {plan.latency_jobs} jobs every {args.latency_spacing_ms:g} ms. "
        f"Python {doc['python']}, PostgreSQL {doc['server'].get('server_version', '?')}, "
        f"synchronous_commit={doc['server'].get('synchronous_commit')}, "
        f"fsync={doc['server'].get('fsync')}, "
        f"shared_buffers={doc['server'].get('shared_buffers_human')}.",
    ]
    if doc["skipped"]:
        header += ["", *[f"Skipped {k}: {v.splitlines()[0]}" for k, v in doc["skipped"].items()]]
    peers = {s.name for s in systems if s.is_peer}
    doc["markdown"] = markdown(rows, peers, specs, doc["details"], header)
    _write(args.output, doc)
    print(doc["markdown"])
    print(f"\ntotal runtime {doc['elapsed_s']:.0f} s; results in {args.output}")
    return 0 if not any(k for k, v in doc["skipped"].items() if v.startswith("failed")) else 1


def _write(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())

"""The measurements (a)-(f) for one system, producing result rows plus details."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from bench.harness import pg
from bench.harness.measure import median, now, percentile, run_on_schedule, wait_until_quiet
from bench.harness.workers import run_workers
from bench.systems.base import CheckoutCase, Options, Row, RunShape, System, WorkerConfig


@dataclass(frozen=True)
class Plan:
    jobs: int  # N
    workers: int  # W
    reps: int
    enqueue_batch: int
    latency_jobs: int
    latency_spacing_s: float
    latency_warmup: int
    checkout_sizes: tuple[int, ...]
    checkout_unvacuumed: int  # 0 = skip
    checkout_samples: int
    checkout_ready: int
    quick: bool
    quiet_wait_s: float  # max wait for an idle machine before each timed phase
    options: Options

    @property
    def single_jobs(self) -> int:
        return self.jobs // 4


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def quiet(url: str, plan: Plan, what: str) -> dict[str, float | int]:
    """Wait (bounded) for an idle machine; note other databases' activity."""
    state = wait_until_quiet(plan.quiet_wait_s)
    state.update(pg.other_databases_activity(url))
    if state["waited_s"] >= 1 or state["busy_cores"] > 0.3:
        log(
            f"  {what}: machine busy ({state['busy_cores']:.2f} cores after waiting "
            f"{state['waited_s']:.0f} s; other DBs: {state['other_db_active']} active, "
            f"{state['other_db_in_xact']} in a transaction)"
        )
    return state


@dataclass
class SystemResult:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, system: str, config: str, metric: str, value: float, unit: str) -> None:
        self.rows.append(Row(system, config, metric, float(value), unit))


def measure_system(system: System, url: str, plan: Plan) -> SystemResult:
    out = SystemResult()
    system.setup(url)
    _enqueue(system, url, plan, out)
    for cfg in system.worker_configs(plan.options):
        _drain(system, url, plan, cfg, out)
        _latency(system, url, plan, cfg, out)
    _checkout(system, url, plan, out)
    shape = RunShape(plan.jobs, plan.workers, plan.reps, plan.quick)
    extra = system.extra_metrics(url, plan.options, shape)
    out.rows.extend(extra)
    return out


# (a), (b) ------------------------------------------------------------------
def _enqueue(system: System, url: str, plan: Plan, out: SystemResult) -> None:
    for variant in system.enqueue_variants(plan.options):
        if variant.one_per_txn is not None:
            _enqueue_metric(
                system,
                url,
                plan,
                out,
                variant.name,
                "enqueue_1_per_txn",
                plan.single_jobs,
                partial(variant.one_per_txn, url),
            )
        if variant.batched is not None:
            _enqueue_metric(
                system,
                url,
                plan,
                out,
                variant.name,
                "enqueue_batched",
                plan.jobs,
                partial(_call_batched, variant.batched, url, plan.enqueue_batch),
            )


def _call_batched(
    fn: Callable[[str, Sequence[int], int], float], url: str, batch: int, keys: Sequence[int]
) -> float:
    return fn(url, keys, batch)


def _enqueue_metric(
    system: System,
    url: str,
    plan: Plan,
    out: SystemResult,
    variant: str,
    metric: str,
    n: int,
    run: Callable[[Sequence[int]], float],
) -> None:
    rates: list[float] = []
    quiets: list[dict[str, float | int]] = []
    for _ in range(plan.reps):
        system.reset(url)
        pg.execute(url, "CHECKPOINT")
        quiets.append(quiet(url, plan, f"{system.name} {metric}"))
        elapsed = run(range(n))
        got = system.job_count(url)
        if got != n:
            raise RuntimeError(f"{metric} [{variant}]: expected {n} jobs, found {got}")
        rates.append(n / elapsed)
    out.add(system.name, variant, metric, median(rates), "jobs/s")
    out.details.setdefault("enqueue", {})[f"{variant}/{metric}"] = {
        "jobs": n,
        "per_rep_jobs_per_s": rates,
        "quiet_before": quiets,
    }
    log(f"{system.name} [{variant}] {metric}: {median(rates):,.0f} jobs/s")


# (c) -----------------------------------------------------------------------
def _drain(system: System, url: str, plan: Plan, cfg: WorkerConfig, out: SystemResult) -> None:
    n = plan.jobs
    reps: list[dict[str, Any]] = []
    for _ in range(plan.reps):
        system.reset(url)
        system.prefill(url, list(range(n)))
        pg.settle(url, system.tables(url))
        before = quiet(url, plan, f"{system.name} [{cfg.label}] drain")
        x0 = pg.transactions(url)
        pool = run_workers(system.name, url, cfg, count=plan.workers, listening=False)
        x1 = pg.transactions_after_quiet(url)
        check = system.verify_drain(url, n)
        seconds = pool.t_last_end - pool.t_release
        rest_cpu = max(pool.machine_busy_s - pool.worker_cpu_s, 0.0)
        rep = {
            "seconds": seconds,
            "jobs_per_s": n / seconds,
            "worker_cpu_us_per_job": pool.worker_cpu_s / n * 1e6,
            "rest_cpu_us_per_job": rest_cpu / n * 1e6,
            "backend_cpu_us_per_job": pool.backend_cpu_s / n * 1e6,
            # rest minus this database's backends: PostgreSQL's background
            # processes, the driver, and anything else running on the machine
            "outside_cpu_us_per_job": max(rest_cpu - pool.backend_cpu_s, 0.0) / n * 1e6,
            "machine_busy_s": pool.machine_busy_s,
            "quiet_before": before,
            "server_xacts_per_job": (x1 - x0) / n,
            "verified": check.verified,
            "check": check.detail,
            "per_worker_s": [r.t_end - pool.t_release for r in pool.reports],
        }
        reps.append(rep)
        if not check.verified:
            log(f"{system.name} [{cfg.label}] drain NOT verified: {check.detail}")
    out.details.setdefault("drain", {})[cfg.label] = {"jobs": n, "params": cfg.params, "reps": reps}
    for metric, key, unit in (
        ("drain", "jobs_per_s", "jobs/s"),
        ("drain_worker_cpu", "worker_cpu_us_per_job", "us/job"),
        ("drain_rest_cpu", "rest_cpu_us_per_job", "us/job"),
        ("drain_backend_cpu", "backend_cpu_us_per_job", "us/job"),
        ("drain_outside_cpu", "outside_cpu_us_per_job", "us/job"),
        ("drain_server_xacts", "server_xacts_per_job", "xacts/job"),
    ):
        out.add(system.name, cfg.label, metric, median([r[key] for r in reps]), unit)
    verified = all(r["verified"] for r in reps)
    out.add(system.name, cfg.label, "drain_verified", 1.0 if verified else 0.0, "bool")
    log(
        f"{system.name} [{cfg.label}] drain: {median([r['jobs_per_s'] for r in reps]):,.0f} "
        f"jobs/s, verified={verified}"
    )


# (d) -----------------------------------------------------------------------
def _latency(system: System, url: str, plan: Plan, cfg: WorkerConfig, out: SystemResult) -> None:
    reps: list[dict[str, Any]] = []
    for _ in range(plan.reps):
        system.reset(url)
        pg.settle(url, system.tables(url))
        before = quiet(url, plan, f"{system.name} [{cfg.label}] latency")
        sent: dict[int, tuple[float, float]] = {}
        total = plan.latency_warmup + plan.latency_jobs

        def produce(sent: dict[int, tuple[float, float]] = sent, total: int = total) -> None:
            producer = system.open_producer(url)
            try:
                time.sleep(1.0)  # workers settle into their idle wait

                def warm(i: int) -> None:
                    producer.enqueue(-1 - i)

                run_on_schedule(plan.latency_warmup, plan.latency_spacing_s, warm)
                time.sleep(0.2)

                def timed(i: int) -> None:
                    sent[i] = producer.enqueue(i)

                run_on_schedule(plan.latency_jobs, plan.latency_spacing_s, timed)
            finally:
                producer.close()
            deadline = now() + 30
            while system.done_count(url) < total and now() < deadline:
                time.sleep(0.05)

        pool = run_workers(
            system.name, url, cfg, count=plan.workers, listening=True, while_running=produce
        )
        starts: dict[int, float] = {}
        for r in pool.reports:
            starts.update(r.starts)
        reps.append({**_latency_stats(sent, starts), "quiet_before": before})
    out.details.setdefault("latency", {})[cfg.label] = {"params": cfg.params, "reps": reps}
    for p in (50, 95, 99):
        value = median([r[f"p{p}_ms"] for r in reps])
        out.add(system.name, cfg.label, f"latency_p{p}", value, "ms")
    complete = all(r["missing"] == 0 for r in reps)
    out.add(system.name, cfg.label, "latency_complete", 1.0 if complete else 0.0, "bool")
    log(
        f"{system.name} [{cfg.label}] latency p50/p95/p99: "
        + "/".join(f"{median([r[f'p{p}_ms'] for r in reps]):.2f}" for p in (50, 95, 99))
        + f" ms, complete={complete}"
    )


def _latency_stats(
    sent: dict[int, tuple[float, float]], starts: dict[int, float]
) -> dict[str, Any]:
    """latency = job-body start - the moment the producer's enqueue call returned.

    On 2 cores the producer can be descheduled between the server's commit and
    its own return, so single values can be slightly negative. `from_call_*`
    measures from just before the call instead (an upper bound).
    """
    after = [(starts[k] - t_ret) * 1e3 for k, (_t_call, t_ret) in sent.items() if k in starts]
    before = [(starts[k] - t_call) * 1e3 for k, (t_call, _t_ret) in sent.items() if k in starts]
    stats: dict[str, Any] = {"n": len(after), "missing": len(sent) - len(after)}
    for p in (50, 95, 99):
        stats[f"p{p}_ms"] = percentile(after, p)
        stats[f"from_call_p{p}_ms"] = percentile(before, p)
    stats["min_ms"] = min(after, default=float("nan"))
    stats["max_ms"] = max(after, default=float("nan"))
    return stats


# (e) -----------------------------------------------------------------------
def checkout_cases(plan: Plan) -> list[CheckoutCase]:
    cases = [
        CheckoutCase(f"vacuumed {_short(k)}", k, plan.checkout_ready, True)
        for k in plan.checkout_sizes
    ]
    if plan.checkout_unvacuumed:
        k = plan.checkout_unvacuumed
        cases.append(CheckoutCase(f"unvacuumed {_short(k)}", k, plan.checkout_ready, False))
    return cases


def _short(n: int) -> str:
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def _checkout(system: System, url: str, plan: Plan, out: SystemResult) -> None:
    if plan.checkout_samples * plan.reps > plan.checkout_ready:
        raise ValueError("checkout samples x reps must not exceed the ready rows")
    for case in checkout_cases(plan):
        t_prep = now()
        probe = system.open_checkout_probe(url, case)
        if probe is None:
            return
        prep_s = now() - t_prep
        before = quiet(url, plan, f"{system.name} checkout [{case.label}]")
        try:
            p50s: list[float] = []
            p95s: list[float] = []
            firsts: list[float] = []
            for _ in range(plan.reps):
                times: list[float] = []
                for _ in range(plan.checkout_samples):
                    t0 = now()
                    got = probe.checkout_one()
                    times.append((now() - t0) * 1e3)
                    if not got:
                        raise RuntimeError(f"checkout found no job ({case.label})")
                firsts.append(times[0])
                p50s.append(percentile(times, 50))
                p95s.append(percentile(times, 95))
            plan_text = probe.explain()
        finally:
            probe.close()
        out.add(system.name, case.label, "checkout_p50", median(p50s), "ms")
        out.add(system.name, case.label, "checkout_p95", median(p95s), "ms")
        out.add(system.name, case.label, "checkout_first", firsts[0], "ms")
        out.details.setdefault("checkout", {})[case.label] = {
            "case": asdict(case),
            "table_bytes": probe.table_bytes,
            "index_bytes": probe.index_bytes,
            "prepare_s": prep_s,
            "quiet_before": before,
            "p50_ms_per_rep": p50s,
            "p95_ms_per_rep": p95s,
            "first_ms_per_rep": firsts,
            "explain": plan_text,
        }
        log(
            f"{system.name} checkout [{case.label}]: p50 {median(p50s):.3f} ms, "
            f"p95 {median(p95s):.3f} ms (table {probe.table_bytes / 1e6:.1f} MB)"
        )

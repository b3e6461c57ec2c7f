"""Markdown tables (one per metric, with ratios) and the JSON document."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.systems.base import MetricSpec, Row

FLOOR = "raw"

STANDARD_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("enqueue_1_per_txn", "(a) enqueue, one job per transaction", "jobs/s", True),
    MetricSpec("enqueue_batched", "(b) enqueue, batched", "jobs/s", True),
    MetricSpec("drain", "(c) drain throughput", "jobs/s", True),
    MetricSpec("drain_worker_cpu", "(c) drain: worker CPU", "µs/job", False),
    MetricSpec("drain_rest_cpu", "(c) drain: rest-of-machine CPU (≈ PostgreSQL)", "µs/job", False),
    MetricSpec("drain_backend_cpu", "(c) drain: CPU of this database's backends", "µs/job", False),
    MetricSpec("drain_server_xacts", "(c) drain: server transactions", "xacts/job", False),
    MetricSpec("latency_p50", "(d) idle wake-up latency p50", "ms", False),
    MetricSpec("latency_p95", "(d) idle wake-up latency p95", "ms", False),
    MetricSpec("latency_p99", "(d) idle wake-up latency p99", "ms", False),
    MetricSpec("checkout_p50", "(e) single-job checkout p50", "ms", False, per_config=True),
    MetricSpec("checkout_p95", "(e) single-job checkout p95", "ms", False, per_config=True),
    MetricSpec("checkout_first", "(e) first checkout after setup", "ms", False, per_config=True),
)
CHECKS = ("drain_verified", "latency_complete")
NOT_TABLED = (*CHECKS, "drain_outside_cpu")


@dataclass(frozen=True)
class Labeled:
    row: Row
    is_peer: bool


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def _ratio(x: float, ref: float | None) -> str:
    if ref is None or ref == 0 or math.isnan(ref) or math.isnan(x):
        return "-"
    return f"{x / ref:.2f}×"


def _best(values: Iterable[float], higher: bool) -> float | None:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return None
    return max(vals) if higher else min(vals)


def metric_table(spec: MetricSpec, rows: list[Labeled]) -> list[str]:
    """One markdown table: every row of the metric, with its ratios to raw and to peers.

    Ratios are value / reference. The raw references: one column per raw config
    when raw has several (e.g. 1/txn and 100/txn), or, for per-config metrics,
    the raw row of the same config. The peer reference is the best peer config.
    """
    mine = [r for r in rows if r.row.metric == spec.key]
    if not mine:
        return []
    raw_rows = [r.row for r in mine if r.row.system == FLOOR]
    raw_cols = [] if spec.per_config else list(dict.fromkeys(r.config for r in raw_rows))

    def peer_ref(config: str) -> float | None:
        pool = [
            r.row.value
            for r in mine
            if r.is_peer and (not spec.per_config or r.row.config == config)
        ]
        return _best(pool, spec.higher_is_better)

    def raw_ref(config: str) -> float | None:
        return _best([r.value for r in raw_rows if r.config == config], spec.higher_is_better)

    titles = [f"vs raw {c}" for c in raw_cols] if len(raw_cols) > 1 else ["vs raw floor"]
    better = "higher" if spec.higher_is_better else "lower"
    lines = [
        f"### {spec.title} ({spec.unit}, {better} is better)",
        "",
        f"| system | config | {spec.unit} | {' | '.join(titles)} | vs best peer |",
        "|---|---|---:|" + "---:|" * (len(titles) + 1),
    ]
    for r in mine:
        if spec.per_config:
            refs = [raw_ref(r.row.config)]
        elif len(raw_cols) > 1:
            refs = [raw_ref(c) for c in raw_cols]
        else:
            refs = [_best([x.value for x in raw_rows], spec.higher_is_better)]
        ratios = " | ".join(_ratio(r.row.value, ref) for ref in refs)
        lines.append(
            f"| {r.row.system} | {r.row.config} | {_fmt(r.row.value)} | {ratios} "
            f"| {_ratio(r.row.value, peer_ref(r.row.config))} |"
        )
    lines.append("")
    return lines


def markdown(
    rows: list[Row],
    peers: set[str],
    extra_specs: list[MetricSpec],
    details: dict[str, Any],
    header: list[str],
) -> str:
    labeled = [Labeled(r, r.system in peers) for r in rows]
    standard = {s.key for s in STANDARD_METRICS}
    specs = list(STANDARD_METRICS) + [s for s in extra_specs if s.key not in standard]
    known = {s.key for s in specs} | set(NOT_TABLED)
    for r in rows:  # metrics nobody declared still get a table
        if r.metric not in known:
            specs.append(MetricSpec(r.metric, r.metric, r.unit, False, per_config=True))
            known.add(r.metric)
    lines = list(header) + [
        "",
        "Ratios are value ÷ reference: ÷ each raw config (the floor) and ÷ the best peer "
        f"config (peers: {', '.join(sorted(peers)) or 'none'}); (e) compares the same case.",
        "",
    ]
    for spec in specs:
        lines += metric_table(spec, labeled)
    lines += _checks(rows)
    lines += _outside_load(rows)
    lines += _checkout_details(details)
    return "\n".join(lines)


def _checks(rows: list[Row]) -> list[str]:
    checks = [r for r in rows if r.metric in CHECKS]
    if not checks:
        return []
    bad = [r for r in checks if r.value != 1.0]
    lines = ["### Checks", ""]
    if not bad:
        lines.append(
            f"All {sum(r.metric == 'drain_verified' for r in checks)} drain configs verified "
            "in SQL (every job in its done state) and every latency run saw all its jobs."
        )
    for r in bad:
        lines.append(f"* FAILED: {r.system} [{r.config}] {r.metric}")
    return lines + [""]


def _outside_load(rows: list[Row]) -> list[str]:
    """How much CPU went elsewhere during the drains (the machine may be shared)."""
    outside = [r for r in rows if r.metric == "drain_outside_cpu"]
    if not outside:
        return []
    cells = ", ".join(f"{r.system} {r.config} {_fmt(r.value)}" for r in outside)
    return [
        "### Outside load during drains",
        "",
        "CPU µs/job spent outside the workers and this database's backends (PostgreSQL "
        "background processes, the driver, and anything else on the machine); large "
        f"values mean the drain shared the machine: {cells}.",
        "",
    ]


def _checkout_details(details: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for system, d in details.items():
        for label, c in d.get("checkout", {}).items():
            if not lines:
                lines += ["### (e) table state and plan of the last checkout", ""]
            lines += [
                f"**{system}, {label}** (finished {c['case']['finished']:,}, "
                f"ready {c['case']['ready']:,}): table {c['table_bytes'] / 1e6:.1f} MB, "
                f"partial index {c['index_bytes'] / 1e6:.2f} MB",
                "",
                "```",
                c["explain"],
                "```",
                "",
            ]
    return lines

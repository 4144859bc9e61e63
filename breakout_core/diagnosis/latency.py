"""Latency of one call, sample by sample: warm-up excluded, every timed sample kept.

The timed loop is a bare `for` with two `perf_counter_ns` and two `thread_time_ns` reads and
two list appends, so the harness adds about a microsecond to each sample. Each call's thread
CPU time is kept beside its wall time: on a shared machine a call waits for a core as long as
other jobs hold it, which its wall time counts and its CPU time does not (a runtime that runs
the call on other threads, ONNX Runtime with more than one intra-op thread, shows less CPU
time than it spends). Percentiles are numpy's, with the
method named (the same one breakout_core.statistics.stats and DuckDB's quantile_cont use), so a
P95 here can be recomputed from the stored samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from breakout_core.statistics.latency_rounds import MIN_TIMED_CALLS
from breakout_core.statistics.stats import PERCENTILE_METHOD

TIMER = "time.perf_counter_ns"
CPU_TIMER = "time.thread_time_ns"


@dataclass(frozen=True)
class LatencyResult:
    samples_ms: np.ndarray  # float64, every timed call in order, milliseconds
    warmup: int  # calls made first and not timed
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    std_ms: float  # sample std, ddof=1
    percentile_method: str  # numpy.percentile(method=...)
    timer: str
    timer_resolution_s: float  # time.get_clock_info('perf_counter').resolution
    timer_implementation: str
    cpu_ms: np.ndarray | None = None  # float64, each call's thread CPU time; None where the clock is elsewhere

    @property
    def n(self) -> int:
        return int(self.samples_ms.size)

    def summary(self) -> dict[str, Any]:
        """Everything but the samples, for a table row or a log line."""
        return {
            "n": self.n,
            "warmup": self.warmup,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "mean_ms": self.mean_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "std_ms": self.std_ms,
            "percentile_method": self.percentile_method,
            "timer": self.timer,
            "timer_resolution_s": self.timer_resolution_s,
        }


def measure_latency(
    fn: Callable[..., Any],
    *args: Any,
    warmup: int = 10,
    iterations: int = 100,
) -> LatencyResult:
    """Call `fn(*args)` `warmup` times untimed, then `iterations` times, timing each call.

    `iterations` below MIN_TIMED_CALLS (64) is refused. For a runtime:
    `measure_latency(runtime.infer, obs_batch)`; the call includes the copy of the output
    that every runtime makes, as a caller would pay it.
    """
    if iterations < MIN_TIMED_CALLS:
        raise ValueError(f"iterations must be >= {MIN_TIMED_CALLS} timed calls, got {iterations}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        fn(*args)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    samples: list[int] = []
    cpu: list[int] = []
    append, append_cpu = samples.append, cpu.append
    for _ in range(iterations):
        cpu_start = cpu_clock()
        start = clock()
        fn(*args)
        append(clock() - start)
        append_cpu(cpu_clock() - cpu_start)
    return latency_result(np.asarray(samples, dtype=np.float64) / 1e6, warmup=warmup,
                          cpu_ms=np.asarray(cpu, dtype=np.float64) / 1e6)


def latency_result(samples_ms: np.ndarray, *, warmup: int = 0, timer: str | None = None,
                   timer_resolution_s: float | None = None, cpu_ms: np.ndarray | None = None) -> LatencyResult:
    """Statistics of samples already taken (milliseconds); at least MIN_TIMED_CALLS of them.

    `timer` and `timer_resolution_s` name a clock other than this process's perf_counter
    (a page's performance.now()); by default the samples are perf_counter's. `cpu_ms`, each
    call's thread CPU time where it was read, one per sample.
    """
    samples_ms = np.asarray(samples_ms, dtype=np.float64).reshape(-1)
    if samples_ms.size < MIN_TIMED_CALLS:
        raise ValueError(f"need >= {MIN_TIMED_CALLS} latency samples, got {samples_ms.size}")
    if not np.all(np.isfinite(samples_ms)) or np.any(samples_ms < 0):
        raise ValueError("latency samples must be finite and >= 0")
    if cpu_ms is not None:
        cpu_ms = np.asarray(cpu_ms, dtype=np.float64).reshape(-1)
        if cpu_ms.shape != samples_ms.shape:
            raise ValueError(f"need one CPU time per latency sample, got {cpu_ms.size} for {samples_ms.size}")
    p50, p90, p95, p99 = np.percentile(samples_ms, [50, 90, 95, 99], method=PERCENTILE_METHOD)
    info = time.get_clock_info("perf_counter")
    return LatencyResult(
        samples_ms=samples_ms,
        warmup=int(warmup),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p95_ms=float(p95),
        p99_ms=float(p99),
        mean_ms=float(samples_ms.mean()),
        min_ms=float(samples_ms.min()),
        max_ms=float(samples_ms.max()),
        std_ms=float(samples_ms.std(ddof=1)),
        percentile_method=PERCENTILE_METHOD,
        timer=timer or TIMER,
        timer_resolution_s=float(info.resolution if timer_resolution_s is None else timer_resolution_s),
        timer_implementation=info.implementation if timer is None else timer,
        cpu_ms=cpu_ms,
    )

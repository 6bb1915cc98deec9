"""A timing as records keep it: every replay's time per call, and the median and spread that follow
from those samples. The timer (attnlab.gpu.bench) makes them; the physics check (attnlab.records.physics)
recomputes them from a record's samples, exactly, because the samples are rounded first.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

@dataclass
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    reps: int
    inner: int
    samples_us: list[float]  # every replay's time per call, as timed: the median and spread follow from them

    def to_dict(self) -> dict:
        return asdict(self)


SAMPLE_DECIMALS = 4  # 0.1 ns: far below the events' resolution, and a record stays small


def summarize(samples: list[float], reps: int, inner: int) -> Timing:
    """The Timing of raw samples (rounded to SAMPLE_DECIMALS first, so that a record's median and
    spread can be recomputed exactly from what it stores)."""
    samples = [round(float(x), SAMPLE_DECIMALS) for x in samples]
    qs = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else [samples[0]] * 9
    return Timing(statistics.median(samples), qs[0], qs[-1], reps, inner, samples)

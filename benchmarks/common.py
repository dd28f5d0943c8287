"""Shared by the benchmark scripts: the repository on sys.path, the models they measure, a median timer."""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]  # the checkout's code (and benchmarks), also when not installed

from fedvit.core.config import ModelConfig  # noqa: E402

# The documented numbers were measured with the class-token readout (the papers'; the default job now uses "vis").
TINY = ModelConfig(head="cls")  # the default job's shape: 32 px, patch 8, D = 64, 2 blocks
VIT_S16 = ModelConfig(
    name="vit_small_patch16_224", img_size=0, patch_size=0, embed_dim=0, depth=0, num_heads=0, head="cls"
)


def median_time(repeats: int, fn: Callable, *args) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn(*args)``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_csv(rows: list[dict], path: Path) -> None:
    """``rows`` (dicts with the same keys) as a CSV table with a header row; says where it went."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def side_by_side(fn: Callable, cases: list, workers: int, **kwargs) -> Iterator:
    """``fn(case, threads, **kwargs)`` for every case, in order: one at a time on 2 threads (``workers`` 1), or
    ``workers`` at a time in spawned processes on one thread each (so two cases never share a core's threads)."""
    with contextlib.ExitStack() as stack:
        if workers == 1:
            yield from (fn(case, 2, **kwargs) for case in cases)
            return
        pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
        yield from pool.imap(functools.partial(fn, threads=1, **kwargs), cases)


def search_caps(parser: argparse.ArgumentParser, text: str | None) -> list[int | None]:
    """``--search-steps``' caps of the label estimate's class-mix search ("0,1,2": integers >= 0), or [None] (the
    audit's own cap) where it was not given; a bad value ends the run through ``parser``."""
    if text is None:
        return [None]
    try:
        caps = [int(k) for k in text.split(",")]
    except ValueError:
        parser.error(f"--search-steps takes integers, comma-separated, got {text!r}")
    if min(caps) < 0:
        parser.error(f"--search-steps must be >= 0, got {text}")
    return caps

"""The stretches of free runs a heap map's trim estimate takes (`account.heapmap._stretches`): judged a step of
runs at a time, the same as found in the whole strip at once, wherever a stretch crosses a step."""

from __future__ import annotations

import random

import numpy as np
import pytest

from heapwalk.glibc.account.heapmap import _stretches


def _whole(kinds, runnable):
    """Every stretch of marked runs as (first, one past its last), from the whole array at once."""
    marked = np.concatenate(([False], runnable[kinds], [False])).astype(np.int8)
    edges = np.diff(marked)
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _stepped(kinds, runnable, step):
    out = []
    for firsts, pasts in _stretches(kinds, runnable, step):
        assert len(firsts) == len(pasts) and len(pasts)
        out.extend(zip(firsts.tolist(), pasts.tolist()))
    return out


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("step", [1, 2, 5, 64, 1 << 18])
def test_stretches_a_step_at_a_time_are_the_whole_strips(seed, step):
    rng = random.Random(seed)
    runnable = np.array([rng.random() < 0.5 for _ in range(8)], dtype=bool)
    runnable[0], runnable[1] = True, False
    n = rng.choice([1, 2, 7, 64, 65, 300])
    bias = rng.random()
    kinds = np.array([rng.choice([0, 2, 3]) if rng.random() < bias else rng.choice([1, 4, 5, 6, 7])
                      for _ in range(n)], dtype=np.uint8)
    assert _stepped(kinds, runnable, step) == _whole(kinds, runnable)


def test_stretches_of_nothing_or_everything():
    runnable = np.array([True, False], dtype=bool)
    assert _stepped(np.zeros(0, dtype=np.uint8), runnable, 4) == []
    assert _stepped(np.ones(10, dtype=np.uint8), runnable, 4) == []
    assert _stepped(np.zeros(10, dtype=np.uint8), runnable, 4) == [(0, 10)]
    assert _stepped(np.zeros(8, dtype=np.uint8), runnable, 4) == [(0, 8)]

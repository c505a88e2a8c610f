"""serving.workload.named: the workloads bench_policies.py --workloads and fit --replay accept, by name."""

from __future__ import annotations

import numpy as np
import pytest

from serving.workload.named import SEEDED, WORKLOADS, workload


def _same(a: object, b: object) -> bool:
    cols = ("arrival_s", "prompt_tokens", "output_tokens")
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in cols)


# the default seed of each generated workload (what the reference rows replay)
DEFAULT_SEEDS = {"sine": 11, "mmpp": 5, "ramp": 13, "mmpp-diurnal": 31, "mmpp-holdout": 23}


@pytest.mark.parametrize("name", SEEDED)
def test_name_at_seed_is_the_same_generator_with_that_seed(name: str) -> None:
    plain, fleet = workload(name, None, 300.0)
    same, same_fleet = workload(f"{name}@{DEFAULT_SEEDS[name]}", None, 300.0)
    other, other_fleet = workload(f"{name}@101", None, 300.0)
    assert _same(plain, same) and fleet == same_fleet == other_fleet
    assert not _same(plain, other)
    assert abs(other.duration_s - plain.duration_s) < 0.05 * plain.duration_s  # same length, another draw


@pytest.mark.parametrize("bad", ["code@3", "mooncake@1", "mmpp@x", "mmpp@-1"])
def test_a_seed_on_a_bundled_trace_or_a_bad_seed_is_an_error(bad: str) -> None:
    with pytest.raises(ValueError, match="only the generated workloads take a seed"):
        workload(bad, None, 600.0)


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'") as e:
        workload("nope", None, 600.0)
    assert all(name in str(e.value) for name in WORKLOADS) and "file:PATH" in str(e.value)

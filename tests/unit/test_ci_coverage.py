"""The 95% intervals cover what they claim: a seeded, smaller run of benchmarks/ci_coverage.py.

Independent prompt draws on the simulated engine in virtual time (deterministic for the seeds); the truth is the
mean of the draws (1 for two engines of one profile). With 24 draws the bounds are loose (a calibrated interval
covers 21-24 of 24 draws); an interval that holds the ramp-down or the batch fixed (30% coverage, a third of the
spread) fails them.
"""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import ci_coverage  # noqa: E402


TWIN_TPOT = "twin engine TPOT p50 ratio"


@pytest.fixture(scope="module")
def table():
    return ci_coverage.check(draws=24, concurrency=16, first_seed=2000)


@pytest.mark.long(0.6)
def test_intervals_cover_the_mean_of_independent_draws_at_concurrency_16(table):
    for name, row in table.items():
        if name == TWIN_TPOT:  # test_twin_engines_tpot_ratio_interval_covers_and_rarely_flags, below
            continue
        assert row["intervals"] == row["draws"], name
        assert row["coverage"] >= 0.8, (name, row)
        if row["relative_sd"] < 1e-3:  # the slower build's ratio hardly varies between draws (its drafts and
            continue  # schedule are the reference's): the paired interval is wider than that spread, the flag counts
        # at most 2.5 times the draws' spread: conservative where a method's step cost hardly depends on content
        # (AR at 16 requests on the runtime of mechanisms: 2.1, its draws within 1.1% of each other, while a
        # session's charged seconds carry its own prefill, which the batch shares), never narrow
        assert 0.6 <= row["width_ratio"] <= 2.5, (name, row)
    # engines: the slower build found slower in nearly every draw, the twin (the same profile) flagged in few
    assert table["slower engine throughput ratio"]["flagged"] >= 0.9
    assert table["slower engine TPOT p50 ratio"]["flagged"] >= 0.9
    assert table["twin engine throughput ratio"]["flagged"] <= 3 / 24


@pytest.mark.xfail(
    strict=True,
    reason="known defect: on the runtime of mechanisms (the generic runtime derived from the H200 records, and the "
    "measured H200 runtime alike) two engines of one profile with different draft seeds differ in TPOT p50 by more "
    "than the paired session bootstrap of the median ratio allows: 19 of 24 draws covered, 5 of 24 flagged (23 of 24 "
    "and 1 of 24 on the earlier generic runtime). The engine comparison's TPOT verdict over-flags until its interval "
    "takes the engine-level variation in; this test passes, and fails as XPASS, once it does.",
)
def test_twin_engines_tpot_ratio_interval_covers_and_rarely_flags(table):
    row = table[TWIN_TPOT]
    assert row["intervals"] == row["draws"]
    assert row["coverage"] >= 0.8 and 0.6 <= row["width_ratio"] <= 2.5, row
    assert row["flagged"] <= 3 / 24, row

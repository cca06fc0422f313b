"""The lag panel's arithmetic and its sample ring (torpor/inspector/lag.py), no broker."""

from __future__ import annotations

import pytest

from torpor.inspector.lag import (
    MAX_SAMPLES,
    PROBED_GAP,
    LagHistory,
    Member,
    PartitionLag,
    is_probed,
    lag_of,
    owners,
    resume_offset,
)


def test_a_group_that_committed_nothing_yet_is_behind_by_everything_retained() -> None:
    assert lag_of(None, 0, 7) == 7
    assert lag_of(None, 5, 7) == 2  # retention deleted 0..4: the group would start at 5


def test_a_partition_with_no_records_has_no_lag_committed_or_not() -> None:
    assert lag_of(None, 0, 0) == 0
    assert lag_of(None, 12, 12) == 0  # every record deleted by retention
    assert is_probed(None, 0, 0) is False


def test_lag_is_end_minus_committed() -> None:
    assert lag_of(3, 0, 10) == 7
    assert lag_of(10, 0, 10) == 0


def test_a_committed_offset_retention_has_passed_resumes_at_the_first_retained() -> None:
    assert resume_offset(2, 5) == 5
    assert lag_of(2, 5, 9) == 4


def test_a_committed_offset_past_the_stable_end_is_no_negative_lag() -> None:
    # An open transaction holds the last stable offset back below what was committed before it.
    assert lag_of(12, 0, 10) == 0


def test_caught_up_behind_a_commit_marker_shows_zero_once_the_gap_was_read() -> None:
    # The processor committed one past its last record; the commit marker took the next offset.
    assert lag_of(41, 0, 42) == 1  # offsets alone
    assert is_probed(41, 0, 42) is True
    assert lag_of(41, 0, 42, records_in_gap=0) == 0  # the read found no record: caught up


def test_a_read_gap_counts_its_records_and_never_more_than_its_offsets() -> None:
    assert lag_of(10, 0, 15, records_in_gap=3) == 3  # three inputs, their markers
    assert lag_of(10, 0, 15, records_in_gap=99) == 5


def test_only_short_gaps_are_read() -> None:
    assert is_probed(0, 0, PROBED_GAP) is True
    assert is_probed(0, 0, PROBED_GAP + 1) is False
    assert lag_of(0, 0, PROBED_GAP + 1) == PROBED_GAP + 1  # an upper bound, shown as offsets


def test_partitions_are_owned_by_the_member_assigned_them_named_by_instance() -> None:
    static = Member("m-1", "p0", "torpor-processor", "/10.0.0.1", (0, 2))
    dynamic = Member("m-2", None, "client-b", "/10.0.0.2", (1,))
    anonymous = Member("m-3", None, "", "/10.0.0.3", ())
    assert owners([static, dynamic, anonymous]) == {0: "p0", 2: "p0", 1: "client-b"}
    assert anonymous.name == "m-3"
    assert static.as_json()["partitions"] == [0, 2]
    assert PartitionLag(1, None, 0, 3, 3, None).as_json() == {
        "partition": 1, "committed": None, "start": 0, "end": 3, "lag": 3, "owner": None}


def test_the_ring_keeps_the_window_and_forgets_older_samples() -> None:
    history = LagHistory(window_ms=10_000)
    history.add(0, {0: 5, 1: 0})
    history.add(4_000, {0: 3, 1: 0})
    history.add(9_000, {0: 1, 1: 2})
    assert history.series(0) == ((0, 5), (4_000, 3), (9_000, 1))
    history.add(12_000, {0: 0, 1: 0})
    assert history.series(0) == ((4_000, 3), (9_000, 1), (12_000, 0))
    assert history.series(1, since_ms=9_000) == ((9_000, 2), (12_000, 0))
    assert history.partitions == (0, 1)


def test_the_ring_is_bounded_however_often_samples_come() -> None:
    history = LagHistory()
    for at in range(MAX_SAMPLES * 3):
        history.add(at, {0: at})
    assert len(history.series(0)) == MAX_SAMPLES
    assert history.series(0)[-1] == (MAX_SAMPLES * 3 - 1, MAX_SAMPLES * 3 - 1)


def test_a_partition_that_went_away_leaves_the_ring_after_the_window() -> None:
    history = LagHistory(window_ms=1_000)
    history.add(0, {0: 1, 5: 1})
    history.add(2_000, {0: 0})
    assert history.partitions == (0,)
    assert history.series(5) == ()


def test_an_unknown_partition_has_no_samples() -> None:
    assert LagHistory().series(3) == ()


def test_a_ring_without_room_is_refused() -> None:
    with pytest.raises(ValueError):
        LagHistory(window_ms=0)
    with pytest.raises(ValueError):
        LagHistory(max_samples=0)

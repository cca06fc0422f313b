"""The partition lifecycle: only the arrows of the table, and a refusal that names both states."""

from __future__ import annotations

import pytest

from torpor.streams.lifecycle import TRANSITIONS, IllegalTransitionError, PartitionLifecycle, PartitionState


def test_a_partition_goes_from_assigned_through_restore_to_closed() -> None:
    lifecycle = PartitionLifecycle("inputs", 3)
    path = (PartitionState.RESTORING, PartitionState.RUNNING, PartitionState.REVOKING, PartitionState.CLOSED)
    for state in path:
        lifecycle.transition_to(state)
    assert lifecycle.state is PartitionState.CLOSED


def test_a_partition_revoked_while_restoring_never_runs() -> None:
    lifecycle = PartitionLifecycle("inputs", 0)
    lifecycle.transition_to(PartitionState.RESTORING)
    lifecycle.transition_to(PartitionState.REVOKING)
    with pytest.raises(IllegalTransitionError):
        lifecycle.transition_to(PartitionState.RUNNING)


def test_folding_before_the_restore_is_refused_with_both_states_named() -> None:
    lifecycle = PartitionLifecycle("inputs", 1)
    with pytest.raises(IllegalTransitionError, match=r"inputs\[1\] cannot go from assigned to running"):
        lifecycle.transition_to(PartitionState.RUNNING)
    assert not lifecycle.is_running()


def test_closed_is_terminal_and_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(PartitionState)
    assert TRANSITIONS[PartitionState.CLOSED] == frozenset()


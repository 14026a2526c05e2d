"""The collector's pause (`patchset._gc`): off during it, as it was after it; what it made is
left to the oldest generation (not walked at once by the next collection); what a caller froze
stays frozen."""

from __future__ import annotations

import gc

from patchset._gc import collector_paused


def test_what_a_pause_made_goes_to_the_oldest_generation() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        made = [[n] for n in range(1000)]
    assert gc.isenabled()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(made) in oldest and id(made[-1]) in oldest
    assert not {id(o) for o in gc.get_objects(generation=0)} & {id(made), id(made[0])}


def test_a_callers_frozen_objects_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            made = [[n] for n in range(10)]
        assert gc.get_freeze_count() == frozen  # not thawed by the pause
        assert made
    finally:
        gc.unfreeze()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

"""A run host's cyclic collector (``actors.run_host.collect_less``, issue 33): what the process
holds once started is left out of the scans, and the young generation is collected less often."""

from __future__ import annotations

import gc

from actors.run_host import GC_YOUNGEST, collect_less


def test_a_started_host_freezes_its_objects_and_collects_the_young_less_often() -> None:
    threshold = gc.get_threshold()
    try:
        collect_less()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNGEST, *threshold[1:])
        collect_less()  # a second call (a restarted host's) keeps the threshold
        assert gc.get_threshold()[0] == GC_YOUNGEST
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)

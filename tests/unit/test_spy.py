"""``bench.spy``'s folding of py-spy's raw stacks (no processes, no py-spy)."""

from __future__ import annotations

from bench.spy import fold, frame_name


def test_a_frame_is_named_by_its_function_and_short_path_without_the_line() -> None:
    assert (
        frame_name("decide (/work/x/runcontrol/grain/decision.py:88)")
        == "decide (runcontrol/grain/decision.py)"
    )
    assert (
        frame_name("Worker.main_loop (/v/lib/python3.11/site-packages/ray/_private/worker.py:1069)")
        == "Worker.main_loop (ray/_private/worker.py)"
    )
    assert frame_name("sleep (asyncio/tasks.py:605)") == "sleep (asyncio/tasks.py)"


def test_fold_counts_own_samples_at_the_leaf_and_each_function_once_per_stack() -> None:
    raw = [
        "main (a.py:1);run (runcontrol/x.py:2);run (runcontrol/x.py:9);leaf (b.py:3) 5",
        "main (a.py:1);other (c.py:4) 3",
        "",
        "not a stack",
    ]
    total, own, inclusive = fold(raw)
    assert total == 8
    assert own == {"leaf (b.py)": 5, "other (c.py)": 3}
    # run recurses: counted once per stack, not twice
    assert inclusive["run (runcontrol/x.py)"] == 5
    assert inclusive["main (a.py)"] == 8

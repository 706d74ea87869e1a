"""benchmarks/fa2_splits.py: FlashAttention 2's decode split heuristic, on the CPU."""

from __future__ import annotations

import math

from conftest import load_script


def _splits():
    return load_script("benchmarks/fa2_splits.py")


def test_the_heuristic_takes_the_fewest_splits_85_percent_as_full_as_the_fullest():
    s = _splits()
    # upstream's own example: 48 blocks over 108 slots, 2 splits fill 89% of them, the fewest within 85% of the best
    assert s.heuristic(48, 108, 64) == 2
    assert s.heuristic(90, 108, 64) == 1  # blocks that fill 80% of the slots run unsplit
    # 11 KV blocks: 5 and 7-10 splits leave as many blocks per split as one fewer, so are not counted
    assert s.heuristic(144, 264, 11) == 11 and s.heuristic(160, 264, 11) == 3
    assert s.kv_block(256) == 64 and s.kv_block(128) == 128 and s.kv_block(64) == 256


def test_a_decode_step_runs_another_split_between_timed_points():
    s = _splits()
    # gemma-3-12b's global layer (16 query heads, 8 KV, head dim 256): 18 sequences of 653 cached tokens run 11
    # splits, the timed points around (17 and 20 sequences at 512 and 768 tokens) 3
    assert s.splits(18, 16, 8, 256, 653, False) == 11
    assert {s.splits(b, 16, 8, 256, n, False) for b in (17, 20) for n in (512, 768)} == {3}
    assert s.splits(28, 16, 8, 256, 653, False) == 1  # 224 blocks fill 80% of 264 slots
    # a windowed call packs no query heads: twice the blocks, so unsplit already at 14 sequences
    assert s.splits(14, 16, 8, 256, 653, True) == 1 and s.splits(14, 16, 8, 256, 653, False) == 2
    assert s.kind(11, [3, 3]) == "more" and s.kind(3, [3, 3]) == "same" and s.kind(2, [3, 4]) == "fewer"
    assert s.kind(3, [2, 4]) == "mixed"


def test_the_split_time_model_counts_waves_times_kv_blocks_a_split():
    s = _splits()
    # gemma-3-12b's global layer at 18 x 653: 144 thread blocks x 11 splits over 264 slots = 6 waves of one KV
    # block each; at 17 x 512: 136 x 3 = 2 waves of 3 of its 8 KV blocks
    assert s.thread_blocks(18, 16, 8, False) == 144 and s.thread_blocks(18, 16, 8, True) == 288
    assert s.split_time(18, 16, 8, 256, 653, False, 1) == 6 * (1 + 1)
    assert s.split_time(17, 16, 8, 256, 512, False, 2) == 2 * (2 + 3)


def test_the_model_reading_scales_interpolation_by_the_models_own_misreading():
    s = _splits()
    corners = [(16, 512), (16, 1024), (32, 512), (32, 1024)]
    # a model flat over the cell leaves the reading as interpolated
    assert abs(s.model_reading(2.0, lambda b, n: 5.0, 20, 700, corners) - 2.0) < 1e-9
    # a model that grows as the interpolation does leaves it too (log-linear in both axes)
    assert abs(s.model_reading(2.0, lambda b, n: b * n, 20, 700, corners) - 2.0) < 1e-9
    # a step at the query the corners do not show scales the reading by that step
    assert abs(s.model_reading(2.0, lambda b, n: 3.0 if (b, n) == (20, 700) else 1.0, 20, 700, corners) - 6.0) < 1e-9


def test_the_split_time_model_is_scored_beside_interpolation_on_each_subset():
    s = _splits()
    corners = ((16, 512), (16, 1024), (32, 512), (32, 1024))
    g = (16, 8, 256, False)
    # (source, split kind, measured, reading, geometry, batch, length, points): on the scans, one point read 1.2x
    # too fast that runs more splits, one read right; on the held-out queries one read right
    reads = [("scans", "more", 1.2, 1.0, g, 20, 700, corners), ("scans", "same", 1.0, 1.0, g, 20, 700, corners),
             ("held_out", "same", 2.0, 2.0, g, 20, 700, corners)]
    out = s.split_time_model(reads)
    assert set(out) == {"scans_all", "scans_more", "held_out_all"}  # no held-out point runs more splits
    assert out["scans_more"]["interpolate"]["points"] == 1 and out["scans_all"]["interpolate"]["points"] == 2
    assert out["scans_more"]["interpolate"]["over_1.10"] == 1 and out["held_out_all"]["interpolate"]["over_1.10"] == 0
    assert round(out["scans_more"]["interpolate"]["mean_abs_log"], 4) == round(math.log(1.2), 4)
    # each alpha reads through the model: at 20 x 700 FA2 runs other splits than at the corners, so the model's
    # reading differs from interpolation's and from one alpha to the next
    assert set(out["scans_all"]) == {"interpolate", *(f"alpha_{a}" for a in s.ALPHAS)}
    logs = {k: v["mean_abs_log"] for k, v in out["held_out_all"].items()}
    assert logs["interpolate"] == 0 and len({logs[f"alpha_{a}"] for a in s.ALPHAS}) > 1

"""benchmarks/fa2_splits.py: FlashAttention 2's decode split heuristic, on the CPU."""

from __future__ import annotations

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

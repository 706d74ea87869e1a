"""Workloads: real models' attention layers at the batch and sequence mixes engines run.

The matrix's timing shapes (kernels/problem.py TIMING_SHAPES) are three synthetic shapes with 16 or 32 heads
and no grouped-query attention. A workload is a model preset's layer type (its query/KV head counts, head
dims, window, softcap, sinks) at one (batch, sequence) point:

- **buckets** (`BUCKETS`): a small grid per op that rankings are made on. Prefill: tokens per sequence x
  batch; decode: batch x context length, and for a sliding-window layer one more context just past its window
  (`layer_buckets`: a layer's points). A query's (batch, length) falls in the bucket nearest to it in log space
  (`bucket_of`), so every query has a bucket.
- **held-out shapes** (`HELD_OUT`): other (batch, length) points, never used for ranking, that the
  selector's per-bucket choice is judged on (benchmarks/regret.py).

Pure: no torch. Presets come from matrix/data/models.json (`load_presets`, through `attnmatrix.matrix.models`,
the one reader of that file): one entry per model with its layer types, each cited to its published config.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from attnmatrix.selector_workloads import (
    LENGTH_ALIGNMENT,
    bracket,
    interpolation_weights,
    log_mean,
    nearest_point,
    series,
    timed_features,
    workload_features,
)
from attnmatrix.vocabulary import features_of

from .models import call_params, layer_ops

# (batch, length): prefill length = tokens per sequence (query = key length); decode length = context. Prefill batches a
# factor of 1.5 or 1.33 apart (1, 2, 3, 4, 6, 8, 12 ...): a kernel's split-KV and wave heuristics turn on the number of
# sequences times heads against the SM count, and a factor-2 batch axis misses the turns. Decode batches a factor of
# about 1.2 apart (DECODE_BATCHES_BY_1_2: 1 ... 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48 ...; the grid times some of
# them at a wave's end instead, below): a decode kernel's split rule steps at single batches (upstream FA3's
# num_splits_heuristic adds a wave of thread blocks at one batch and not the next, benchmarks/fa3_split_waves.py), and
# read off a scan of every batch (benchmarks/batch_axis.py) this axis leaves 12 of 1,664 scanned batches over 1.10x the
# fastest where the factor-1.5 axis (DECODE_BATCHES_BY_1_5) left 32 of 2,132, for 1.73x its decode points. Decode also
# times the first batch past each of the first six waves of thread blocks over the SMs for 8 and 4 KV heads
# (WAVE_BATCHES: 17, 34, 50, 67, 83, 100, 133, 166, 199; one more wave costs a sixth or more of the step there, less
# beyond): on sm_90 FA4 runs a decode step unsplit, one block per KV head of a sequence and one per SM, and every
# backend's time steps there (16 to 17 sequences of 8 KV heads: fa4 1.6x, vllm_fa3 1.7x; benchmarks/placement_rules.py
# fa4_waves), each wave's end and batch 9 (below): 417 decode points a layer call. Prefill lengths a factor of 1.5 or
# 1.33 apart up to 1024 tokens, where a kernel's tile steps are a large share of its work, and a factor of 2 beyond;
# decode contexts a factor of 1.5 or 1.33 apart: a decode kernel splits the context into KV blocks among the SMs, and
# its time turns with that split where a factor-2 axis does not see it (the decode misses of benchmarks/regret.py
# between contexts 2048 and 4096). The grid is their product, less the points whose work would dwarf one engine step
# (prefill: over 64k tokens; decode: over 1M cached tokens), where a query is placed from the timed points around it.
#
# Prefill lengths up to 1024 are also timed 40 tokens past each (PREFILL_UNALIGNED): FA4 runs fastest at lengths
# that are a multiple of LENGTH_ALIGNMENT (64) and up to 2.2x slower at a length past one
# (benchmarks/results/scan-sm_90-h200-20261202-prefill-*.jsonl), and an engine's prompts mostly are not. A query
# is placed from the timed lengths of its own kind (selector_workloads.series). Decode contexts are multiples of 64
# alone: timed 40 tokens past 512, 768 and 1024 too, they placed the sixth held-out draw's decode queries worse than
# the multiples alone (benchmarks/results/decode-unaligned-sm_90-h200-20261204.jsonl, README there): 40 tokens past a
# multiple is one phase of a kernel's tile, and a cache's length is any.
#
# A decode step of a sliding-window layer is also timed at the first multiple of 64 past the window (`past_window`,
# `layer_buckets`): past it the step attends the window's keys alone, and FlashAttention's kernels take about the same
# time at every context beyond it but step up right past it (mistral-7b sliding, vllm_fa3: 166 us at 34 sequences of its
# window of 4096 cached tokens, 209 at 34 of 6144, 199.5 at 35 of 4310), where cuDNN's time keeps growing; read between
# the window and the next grid context (a factor of 1.5 on), that step is smeared over the gap. The timings are the
# preset layer's, at its window: a query of another window in the same cell and head counts reads the step where the
# preset's window puts it. Between points a kernel's time is still not a smooth function of the shape (wave
# quantisation, tile steps), so benchmarks/regret.py reports beside the selector's regret how the backends fastest at
# the grid points around a query (`around`) fare there. The grid is meant to be small enough that a full sm_90 sweep of
# the installed backends over the presets fits in 30 minutes of one H200; a 1/16 sample of it timed again
# (benchmarks/grid_reread.py) puts the whole at about 34 minutes, at or over that: what each of its timed parts cost is
# in benchmarks/results/README.md (benchmarks/batch_axis.py weighs denser batch axes). The grid keeps every line:
# of the lines whose own points the rest of the grid reads well, left out most saving first
# (benchmarks/grid_thinning.py), the first four (decode contexts 3072, 12288 and 24576, prefill batch 16) cost the
# held-out queries, ranked by the thinner grid's timings alone, nothing (6 over 1.10 either way) but leave a sweep at
# about 30.9 minutes with FA4's warm-up, and by the time it fits (the sixth, 29.4) 9 are over. The cost is in
# building and warming each backend's calls at a point (benchmarks/sweep_phases.py), not in the number of points alone.
# Nor does it time the factor-1.2 batches it times at a wave's end instead (DECODE_BATCHES_BY_1_2's 32, 48, ... 192),
# though the committed timings hold them: each adds 189 to 345 decode timings to a sweep. Of the four held-out misses
# over 1.10 a selector made from the grid alone has beyond the generated one's two, two end with the narrower
# interpolation band batch 32's rows give, not with its points, and two, of the sets judged, only with all eight
# batches timed and their band, about 41.0 minutes with FA4's warm-up (benchmarks/grid_thinning.py, the added batches).
PREFILL_BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
PREFILL_LENGTHS = [256, 384, 512, 768, 1024, 2048, 4096, 8192, 16384]
PREFILL_UNALIGNED = [n + 40 for n in PREFILL_LENGTHS if n <= 1024]
DECODE_BATCHES_BY_1_2 = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160,
                         192, 224, 256]
SMS = 132  # of the GPU the grid is timed on (an H200; an H100 SXM has as many)


def wave_ends(heads_kv: int, top: int, sms: int = SMS) -> tuple[int, ...]:
    """The largest batch each wave of one thread block per KV head of a sequence, one block per SM, holds, up to
    the first at or past `top`: a decode kernel's time steps one batch past each."""
    ends = [sms // heads_kv]
    while ends[-1] < top:
        ends.append((len(ends) + 1) * sms // heads_kv)
    return tuple(ends)


# The last batch of each of the first six waves for 8 and 4 KV heads (the presets' commonest; every wave of 2 and 1 up
# to 198 among them), WAVE_ENDS: 16, 33, 49, 66, 82, 99, 132, 165, 198, and the first batch past each, WAVE_BATCHES:
# 17, 34, 50, 67, 83, 100, 133, 166, 199. A batch of the factor-1.2 axis within 5% below a wave's end is timed at the
# end instead (32 -> 33, 48 -> 49, ... 192 -> 198): each wave's step then lies between two timed batches, where read
# between a batch below the end and the first past it the step was smeared over the end's side too (gemma-3-1b global,
# one KV head, 131 sequences, read between 128 and 133).
WAVE_ENDS = sorted({e for h in (8, 4) for e in wave_ends(h, 256)[:6]})
WAVE_BATCHES = [e + 1 for e in WAVE_ENDS]
# cuDNN's decode steps one sequence past 1, 2, 4, 8, 16 and 33 whatever the head counts (the batch scan,
# benchmarks/results/scan-sm_90-h200-20261203-3-decode-batch-vllm-graph.jsonl: llama-3.2-1b at 2048 cached tokens,
# 13.7 us at 8 sequences, 18.5 at 9, 18.8 at 10; vllm_fa3 steps there too for 8 KV heads, 18.8 -> 25.9): the grid
# times both sides of each of those steps once it times 9, which the factor-1.2 axis skips.
STEP_BATCHES = [9]
DECODE_BATCHES = sorted({next((e for e in WAVE_ENDS if b < e <= b * 1.05), b) for b in DECODE_BATCHES_BY_1_2}
                        | set(WAVE_BATCHES) | set(STEP_BATCHES))
# the batch axis the draws before 2026120303 were drawn on (GRID_OF_DRAW)
DECODE_BATCHES_BY_1_5 = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
DECODE_LENGTHS = [512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
_PREFILL = tuple((b, s) for b, s in itertools.product(PREFILL_BATCHES, sorted(PREFILL_LENGTHS + PREFILL_UNALIGNED))
                 if b * s <= 65536)
DECODE_CACHE_CAP = 2**20  # cached tokens of one decode step, at most


def decode_grid(batches: list[int] | tuple[int, ...],
                lengths: list[int] | tuple[int, ...] = DECODE_LENGTHS) -> tuple[tuple[int, int], ...]:
    """The decode bucket points of a batch axis: its product with the context lengths, within DECODE_CACHE_CAP."""
    return tuple((b, c) for b, c in itertools.product(batches, sorted(lengths)) if b * c <= DECODE_CACHE_CAP)


def grid_of(decode_batches: list[int], decode_lengths: list[int] | tuple[int, ...] = DECODE_LENGTHS,
            ) -> dict[str, tuple[tuple[int, int], ...]]:
    """The bucket points per op with this decode batch and context axis (prefill's grid is fixed so far)."""
    return {"prefill": _PREFILL, "mla_prefill": _PREFILL, "decode": decode_grid(decode_batches, decode_lengths)}


BUCKETS = grid_of(DECODE_BATCHES)
GRID_BY_1_5, GRID_BY_1_2 = grid_of(DECODE_BATCHES_BY_1_5), grid_of(DECODE_BATCHES_BY_1_2)
GRID_WITH_WAVES = grid_of(sorted(DECODE_BATCHES_BY_1_2 + [17, 34, 50, 67, 83]))  # pinned: the fifth draw's, as drawn
# pinned: the sixth draw's, as drawn (decode contexts up to 1024 also 40 tokens past each)
GRID_WITH_UNALIGNED = grid_of(sorted(DECODE_BATCHES_BY_1_2 + [17, 34, 50, 67, 83]),
                              [512, 552, 768, 808, 1024, 1064, *DECODE_LENGTHS[3:]])
# pinned: the seventh draw's, as drawn
GRID_WITH_SIX_WAVES = grid_of(sorted(DECODE_BATCHES_BY_1_2 + [17, 34, 50, 67, 83, 100, 133, 166, 199]))
# the eighth draw's: the batches the committed timings hold once the wave ends are timed (the grid's, and the factor-1.2
# axis's batches the ends replace, timed before), so that no drawn shape lies on a timed batch
GRID_WITH_WAVE_ENDS = grid_of(sorted(DECODE_BATCHES_BY_1_2 + [17, 34, 50, 67, 83, 100, 133, 166, 199]
                                     + [33, 49, 66, 82, 99, 132, 165, 198]))
# the tenth draw's: the eighth's and batch 9 (STEP_BATCHES), every batch the committed timings hold
GRID_WITH_STEP_BATCHES = grid_of(sorted(DECODE_BATCHES_BY_1_2 + [9, 17, 34, 50, 67, 83, 100, 133, 166, 199]
                                        + [33, 49, 66, 82, 99, 132, 165, 198]))


def past_window(window: int | None, grid: dict[str, tuple] | None = None) -> int | None:
    """The first context length past a sliding window that a decode step of the layer is also timed at (a multiple
    of LENGTH_ALIGNMENT, as the grid's lengths), or None: no window, or one the decode contexts of `grid` (default:
    BUCKETS) do not straddle (a window under its shortest context: every timed context is past it already)."""
    if window is None:
        return None
    length = (window // LENGTH_ALIGNMENT + 1) * LENGTH_ALIGNMENT
    lengths = {n for _, n in (BUCKETS if grid is None else grid)["decode"]}
    return length if min(lengths) < length < max(lengths) and length not in lengths else None


def layer_buckets(layer: Layer, op: str, grid: dict[str, tuple] | None = None) -> tuple[tuple[int, int], ...]:
    """The bucket points a layer's `op` is timed at: those of `grid` (default: BUCKETS), and for a decode step of a
    sliding-window layer also the first length past its window (`past_window`) at every grid batch within the cache
    cap."""
    grid = BUCKETS if grid is None else grid
    points = grid[op]
    past = past_window(layer.window, grid) if op == "decode" else None
    if past is None:
        return points
    batches = sorted({b for b, _ in points})
    return tuple(sorted(points + decode_grid(batches, [past])))
# Shapes inside the cells of the grid they were chosen on, never on a bucket point: batches between its batches (5, 7,
# 10 ... on the factor-1.5 axis; batch 1 and 2, the grid's first values, on a grid line), lengths between grid lengths,
# prefill's past a multiple of 64 but one (640, a multiple between 512 and 768), decode's near the middle (in log space)
# of a context cell, spread from one sequence to the largest batches. Fixed before the sweep that times them; the bucket
# points around each (the cell's corners, `around`) are in the grid. A grid made denser takes held-out shapes inside its
# new cells, drawn before it is timed: shapes of the older grid's cells sit near the new grid points, and would flatter
# it (decode's shapes before the draw of 2026120303 were chosen inside the cells of the factor-1.5 batch axis: on the
# factor-1.2 axis some lie on a batch line). FRESH shapes, drawn at random (`draw_shapes`, on the grid `GRID_OF_DRAW`
# names) and fixed here before they were timed, judge the grid and the placement rules on shapes no rule was chosen on;
# `report` scores each draw apart. A rule chosen after a draw was timed may have been chosen on it: reading vLLM's FA4
# in the query's CUDA graph (selector_workloads.graph_readings) was chosen on the held-out shapes of the first draw and
# those before it, so decode was drawn again after it.
_PREFILL_FRESH = ((5, 4200), (9, 1507), (11, 449), (21, 444))
_DECODE_FRESH = ((5, 3611), (14, 2183), (115, 1617), (188, 3033))
_DECODE_FRESH_GRAPHS = ((20, 22349), (22, 5304), (46, 8689), (132, 617))
# draw_shapes(20261202, {"prefill": 4, "decode": 4}); draw_shapes(20261203, {"decode": 4}); a third, larger, after
# every placement rule of the selector was chosen: draw_shapes(2026120302, {"prefill": 8, "decode": 12}). Prefill's
# shapes are also MLA prefill's.
_PREFILL_FRESH_3 = ((5, 7669), (7, 2022), (7, 2417), (10, 2168), (19, 575), (22, 1682), (27, 944), (28, 1671))
_DECODE_FRESH_3 = ((7, 13017), (10, 2629), (18, 5673), (25, 3924), (28, 4278), (56, 7504), (62, 14409),
                   (67, 7477), (115, 7999), (151, 1377), (218, 561), (238, 3255))
# The fourth, decode's first on the factor-1.2 batch axis, drawn before that axis was timed:
# draw_shapes(2026120303, {"decode": 16}).
_DECODE_FRESH_4 = ((13, 27861), (17, 5218), (19, 5525), (19, 18184), (35, 4310), (38, 1343), (38, 2172), (60, 2266),
                   (93, 1187), (97, 552), (109, 614), (138, 984), (156, 4133), (161, 517), (202, 789), (218, 673))
# The fifth, drawn with the wave batches (WAVE_BATCHES) in the grid, before they were timed:
# draw_shapes(2026120304, {"decode": 16}).
_DECODE_FRESH_5 = ((9, 1281), (11, 1825), (23, 2926), (23, 5727), (60, 3269), (76, 1326), (76, 3175), (89, 5552),
                   (105, 826), (141, 2487), (173, 3967), (183, 1895), (188, 2925), (203, 2633), (203, 2998),
                   (231, 2896))
# The sixth, drawn with decode contexts 40 tokens past 512, 768 and 1024 in the grid and the contexts past each window
# (`layer_buckets`) chosen, before either was timed: draw_shapes(2026120401, {"decode": 24}).
_DECODE_FRESH_6 = ((9, 1335), (9, 1653), (11, 706), (11, 862), (13, 1016), (18, 10338), (19, 17384), (21, 6035),
                   (22, 593), (22, 7510), (22, 28273), (25, 4541), (27, 9300), (31, 11323), (33, 1772), (51, 767),
                   (54, 7316), (57, 3282), (79, 3308), (82, 894), (88, 828), (105, 6607), (108, 2223), (121, 4956))
# The seventh, drawn with the batches past the first six waves (WAVE_BATCHES: 100, 133, 166 and 199 added) in the
# grid, before they were timed: draw_shapes(2026120402, {"decode": 24}).
_DECODE_FRESH_7 = ((9, 5975), (11, 10845), (18, 2614), (25, 2901), (26, 5732), (26, 29826), (27, 5455), (33, 2136),
                   (52, 2269), (61, 6759), (63, 1440), (65, 655), (79, 9992), (103, 2794), (104, 789), (109, 4907),
                   (110, 5671), (117, 4937), (131, 2972), (150, 744), (152, 1209), (188, 4092), (223, 1806),
                   (233, 3198))
# The eighth, drawn with the wave ends (WAVE_ENDS) in the grid, before they were timed, off every batch the timings
# hold: draw_shapes(2026120403, {"decode": 24}, grid=GRID_WITH_WAVE_ENDS).
_DECODE_FRESH_8 = ((9, 1967), (11, 8835), (11, 22371), (13, 27992), (18, 653), (21, 6264), (22, 3645), (26, 1089),
                   (27, 7667), (35, 1199), (36, 2350), (36, 12706), (39, 13665), (41, 2833), (53, 5421), (61, 7512),
                   (76, 677), (78, 9490), (125, 611), (141, 2674), (150, 1146), (219, 646), (225, 2459), (232, 1534))
# The ninth, drawn on the eighth's grid (the batches the timings hold) before the decode context scan of every layer
# call at batches 1, 3, 18 and 65 was timed, to judge a placement rule chosen on that scan:
# draw_shapes(2026120404, {"decode": 24}, grid=GRID_WITH_WAVE_ENDS).
_DECODE_FRESH_9 = ((9, 3031), (11, 1541), (15, 1314), (18, 1473), (18, 5427), (19, 997), (19, 25711), (23, 2643),
                   (26, 16449), (30, 690), (35, 790), (35, 1183), (35, 4074), (63, 14483), (74, 1296), (81, 1573),
                   (85, 3462), (97, 7278), (119, 5282), (139, 1742), (154, 1735), (193, 1725), (194, 1102), (225, 886))
# The tenth, drawn on every batch the timings hold once batch 9 is timed (GRID_WITH_STEP_BATCHES), after every
# placement rule of the selector and the grid were chosen, to judge them as they stand: prefill's shapes (also MLA
# prefill's) the first drawn since the third draw: draw_shapes(2026120405, {"prefill": 8, "decode": 24},
# grid=GRID_WITH_STEP_BATCHES).
_PREFILL_FRESH_10 = ((5, 5574), (13, 398), (19, 2022), (20, 709), (22, 324), (36, 660), (40, 344), (46, 619))
_DECODE_FRESH_10 = ((13, 9132), (15, 1839), (18, 734), (23, 1969), (23, 2551), (23, 31344), (25, 11603), (25, 12943),
                    (30, 530), (36, 773), (36, 4128), (44, 9183), (45, 645), (45, 3232), (52, 571), (57, 6462),
                    (69, 6850), (74, 720), (75, 1704), (91, 925), (92, 685), (94, 4087), (123, 2133), (183, 1076))
# The eleventh, prefill's (also MLA prefill's), drawn after cuDNN's prefill was read at the end of its tile
# (selector_workloads.tile_end_readings), a rule chosen after the tenth draw's prefill misses, to judge it:
# draw_shapes(2026120406, {"prefill": 16}, grid=GRID_WITH_STEP_BATCHES).
_PREFILL_FRESH_11 = ((5, 398), (5, 427), (5, 2250), (5, 6040), (7, 1361), (7, 2262), (9, 474), (9, 1763), (14, 1259),
                     (15, 353), (23, 421), (23, 644), (27, 1518), (33, 313), (36, 639), (47, 487))
# draw (its seed) -> op -> shapes, oldest first; FRESH: every draw's shapes per op
FRESH_DRAWS = {"20261202": {"prefill": _PREFILL_FRESH, "mla_prefill": _PREFILL_FRESH, "decode": _DECODE_FRESH},
               "20261203": {"decode": _DECODE_FRESH_GRAPHS},
               "2026120302": {"prefill": _PREFILL_FRESH_3, "mla_prefill": _PREFILL_FRESH_3,
                              "decode": _DECODE_FRESH_3},
               "2026120303": {"decode": _DECODE_FRESH_4},
               "2026120304": {"decode": _DECODE_FRESH_5},
               "2026120401": {"decode": _DECODE_FRESH_6},
               "2026120402": {"decode": _DECODE_FRESH_7},
               "2026120403": {"decode": _DECODE_FRESH_8},
               "2026120404": {"decode": _DECODE_FRESH_9},
               "2026120405": {"prefill": _PREFILL_FRESH_10, "mla_prefill": _PREFILL_FRESH_10,
                              "decode": _DECODE_FRESH_10},
               "2026120406": {"prefill": _PREFILL_FRESH_11, "mla_prefill": _PREFILL_FRESH_11}}
GRID_OF_DRAW = {"20261202": GRID_BY_1_5, "20261203": GRID_BY_1_5, "2026120302": GRID_BY_1_5, "2026120303": GRID_BY_1_2,
                "2026120304": GRID_WITH_WAVES, "2026120401": GRID_WITH_UNALIGNED, "2026120402": GRID_WITH_SIX_WAVES,
                "2026120403": GRID_WITH_WAVE_ENDS, "2026120404": GRID_WITH_WAVE_ENDS,
                "2026120405": GRID_WITH_STEP_BATCHES, "2026120406": GRID_WITH_STEP_BATCHES}
FRESH = {op: tuple(p for draw in FRESH_DRAWS.values() for p in draw.get(op, ())) for op in BUCKETS}
_PREFILL_HELD_OUT = ((1, 700), (2, 11000), (5, 640), (5, 3000), (7, 1500), (14, 460), (20, 700), (40, 360))
HELD_OUT: dict[str, tuple[tuple[int, int], ...]] = {
    "prefill": _PREFILL_HELD_OUT + _PREFILL_FRESH + _PREFILL_FRESH_3 + _PREFILL_FRESH_10 + _PREFILL_FRESH_11,
    "mla_prefill": _PREFILL_HELD_OUT + _PREFILL_FRESH + _PREFILL_FRESH_3 + _PREFILL_FRESH_10 + _PREFILL_FRESH_11,
    "decode": ((1, 880), (5, 10000), (7, 1770), (10, 5000), (20, 2500), (40, 1250), (80, 3550), (160, 620))
    + _DECODE_FRESH + _DECODE_FRESH_GRAPHS + _DECODE_FRESH_3 + _DECODE_FRESH_4 + _DECODE_FRESH_5 + _DECODE_FRESH_6
    + _DECODE_FRESH_7 + _DECODE_FRESH_8 + _DECODE_FRESH_9 + _DECODE_FRESH_10,
}
DEFAULT_MODELS = Path(__file__).resolve().parent / "data" / "models.json"


# draw_shapes' range per op: the largest batch, and the lengths; the grid's own token cap refuses the rest
_DRAW_RANGE = {"prefill": (64, 256, 16384), "mla_prefill": (64, 256, 16384), "decode": (256, 512, 32768)}
_DRAW_TRIES = 100_000  # a count the grid cannot hold fails instead of drawing forever


def draw_shapes(seed: int, counts: dict[str, int], taken: dict[str, tuple] | None = None,
                grid: dict[str, tuple] | None = None) -> dict[str, tuple]:
    """Held-out shapes drawn at random: per op of `counts`, in its order, from one random.Random(seed), batch
    round(exp(U(0, ln B))) and length round(exp(U(ln L0, ln L1))) over the grid's range (`_DRAW_RANGE`), a draw
    refused on a batch or length of `grid` (default: BUCKETS), at a multiple of 64, off the grid (a corner of its
    cell not a bucket point: over the token cap) or at a shape of `taken` (default: the held-out shapes of the
    earlier draws and the fixed ones) or drawn before; the first `counts[op]` kept, sorted."""
    taken = HELD_OUT if taken is None else taken
    grid = BUCKETS if grid is None else grid
    rng = random.Random(seed)
    out = {}
    for op, count in counts.items():
        top, low, high = _DRAW_RANGE[op]
        batches, lengths = {p[0] for p in grid[op]}, {p[1] for p in grid[op]}
        kept: list[tuple[int, int]] = []
        for _ in range(_DRAW_TRIES):
            if len(kept) == count:
                break
            b = round(math.exp(rng.uniform(0, math.log(top))))
            n = round(math.exp(rng.uniform(math.log(low), math.log(high))))
            if b in batches or n in lengths or n % 64 == 0 or (b, n) in kept or (b, n) in taken.get(op, ()):
                continue
            if len(around(op, b, n, grid)) == 4:  # strictly inside a cell whose four corners the grid has
                kept.append((b, n))
        if len(kept) < count:
            raise ValueError(f"{op}: {len(kept)} of {count} shapes after {_DRAW_TRIES} draws (seed {seed})")
        out[op] = tuple(sorted(kept))
    return out


def bucket_label(op: str, batch: int, length: int) -> str:
    return f"b{batch}_{'kv' if op == 'decode' else 's'}{length}"


def bucket_of(op: str, batch: int, length: int) -> tuple[int, int]:
    """The bucket nearest to (batch, length) in log space among the points of its length's kind
    (`selector_workloads.series`; ties: the smaller point), as the selector picks it."""
    if op not in BUCKETS:
        raise ValueError(f"op {op!r}: no workload buckets (known: {', '.join(BUCKETS)})")
    if batch < 1 or length < 1:
        raise ValueError(f"batch {batch} and length {length} must be >= 1")
    return nearest_point(series(BUCKETS[op], length, batch), batch, length)


def around(op: str, batch: int, length: int, grid: dict[str, tuple] | None = None) -> tuple[tuple[int, int], ...]:
    """The bucket points at the corners of the cell of `grid` (default: BUCKETS) that holds (batch, length): four
    inside the grid, the two on a grid line, the point itself where it is one, the edge's points beyond an edge;
    those the grid leaves out (its largest corners) are not among them, and where that leaves none, the nearest
    point. The grid is that of the points of the length's kind (`selector_workloads.series`), as the selector
    places it."""
    points = set(series((BUCKETS if grid is None else grid)[op], length, batch))
    batches, lengths = bracket(batch, {p[0] for p in points}), bracket(length, {p[1] for p in points})
    corners = tuple(p for p in itertools.product(batches, lengths) if p in points)
    return corners or (nearest_point(points, batch, length),)


def layer_features(case_key: str) -> tuple[str, ...]:
    """The layer's feature tokens of a timed row's case (the vLLM profile's cache block is the call, not the
    layer)."""
    return tuple(t for t in case_key.rsplit("/", 1)[-1].split("+") if t != "none" and not t.startswith("paged_kv:"))


def cell_of(case_key: str) -> tuple:
    """(arch, op, dtype, head_dim, head_dim_v, features) of a timed row's case: the selector cell its timings
    rank (decode's with its causal mask, `workload_features`; the vLLM profile's cache block left out)."""
    arch, _, op, dtype, dims, _ = case_key.split("/")
    hd, _, hdv = dims.partition("x")
    return arch, op, dtype, int(hd), int(hdv or hd), workload_features(op, layer_features(case_key))


def point_noise(row: dict) -> float | None:
    """How far two independent readings of one timed point are apart: slower / faster of the medians of its even
    and of its odd rounds (benchmarks/regret.py times backends in turns); None with fewer than two rounds."""
    rounds = row.get("rounds") or []
    if len(rounds) < 2:
        return None
    a, b = median(rounds[0::2]), median(rounds[1::2])
    return max(a, b) / min(a, b)


def spread_of(ratios: list[float]) -> dict:
    """{points, median, p90, max} of ratios (each >= 1), rounded to 4 places; None for an empty list."""
    ratios = sorted(ratios)

    def q(p: float) -> float | None:
        return round(ratios[min(len(ratios) - 1, int(p * len(ratios)))], 4) if ratios else None

    return {"points": len(ratios), "median": q(0.5), "p90": q(0.9), "max": round(ratios[-1], 4) if ratios else None}


def noise(rows: list[dict]) -> dict:
    """The distribution of `point_noise` over the timed points of `rows`; its p90 is the tie band."""
    return spread_of([x for r in rows if r.get("set") in ("bucket", "held_out") and r.get("outcome") == "pass"
                      for x in [point_noise(r)] if x is not None])


def latest_calls(rows: list[dict]) -> list[dict]:
    """`rows` less the timed rows of a backend's call on a layer (backend, case, heads) whose profile a later check
    row of that call changed: a backend re-timed in another call (kernels/vllm_fa.py: vLLM's FA3 step) ranks by
    the timings of its latest call alone, never by a mix of two. The committed files are read oldest first (their
    names start with the date, then a sequence number where one date has several: `load_rows`)."""
    latest = call_profiles(rows)
    gridded: dict[tuple, set] = {}  # call -> the profiles its bucket points were timed in
    for r in rows:
        if r.get("set") == "bucket":
            gridded.setdefault(call_of(r), set()).add(r.get("profile"))
    for call, profiles in gridded.items():
        if call in latest and latest[call] not in profiles:
            # a call re-timed at its held-out shapes alone would lose its ranking without a word
            raise PresetError(f"{call[0]} on {call[1]} ({call[2]}/{call[3]} heads): its latest call "
                              f"({latest[call]!r}) timed no bucket point, the grid was timed in "
                              f"{' and '.join(map(repr, sorted(profiles, key=str)))}; time the grid in the latest "
                              f"call (benchmarks/regret.py sweep --backends {call[0]})")
    return [r for r in rows if r.get("set") not in TIMED_SETS or in_call(r, latest)]


def call_of(row: dict) -> tuple:
    """A backend's call on a layer, as the rows of one name it: (backend, case, heads_q, heads_kv)."""
    return row.get("backend"), row.get("case"), row.get("heads_q"), row.get("heads_kv")


def call_profiles(rows: list[dict]) -> dict[tuple, str | None]:
    """Each call's (`call_of`) latest profile, from the last check row of it in `rows`."""
    return {call_of(r): r.get("profile") for r in rows if r.get("set") == "check"}


def in_call(row: dict, profiles: dict[tuple, str | None]) -> bool:
    """Whether a timed row was made in the call `profiles` holds for it (a call they do not hold: any)."""
    return profiles.get(call_of(row), row.get("profile")) == row.get("profile")


def bucket_orders(rows: list[dict]) -> tuple[dict, dict]:
    """(noise, orders) from sweep rows (benchmarks/regret.py). The noise is `noise(rows)` (p90 is the tie band);
    orders maps (arch, op, dtype, head_dim, head_dim_v, features, heads_q, heads_kv, batch, length) to
    (((backend, ms), ...) fastest first, how many of the first are within the band of the fastest).
    Only backends whose check passed on that layer count, by the timings of their latest call (`latest_calls`)."""
    rows = latest_calls(rows)
    passed = {(r["backend"], r["case"], r["heads_q"], r["heads_kv"]) for r in rows
              if r["set"] == "check" and r["outcome"] == "pass"}
    times: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["set"] == "bucket" and r["outcome"] == "pass" and (r["backend"], r["case"], r["heads_q"],
                                                                 r["heads_kv"]) in passed:
            key = (*cell_of(r["case"]), r["heads_q"], r["heads_kv"], r["batch"], r["length"])
            times.setdefault(key, {})[r["backend"]] = r["ms"]
    spread = noise(rows)
    band = spread["p90"] or 1.0
    orders = {}
    for key, per in sorted(times.items()):
        order = sorted(((b, round(ms, 5)) for b, ms in per.items()), key=lambda x: (x[1], x[0]))
        orders[key] = (tuple(order), sum(1 for _, t in order if t / order[0][1] <= band))
    return spread, orders


def selector_rows(orders: dict) -> dict[tuple, list[tuple]]:
    """orders (`bucket_orders`) as the selector's rows (selector_workloads.place): (arch, op, dtype, head_dim,
    head_dim_v, features) -> [(heads_q, heads_kv, batch, length, ties, ((backend, ms), ...) fastest first), ...]."""
    rows: dict[tuple, list[tuple]] = {}
    for (arch, op, dtype, hd, hdv, feats, hq, hkv, batch, length), (order, ties) in orders.items():
        rows.setdefault((arch, op, dtype, hd, hdv, tuple(feats)), []).append((hq, hkv, batch, length, ties, order))
    return rows


def interpolation_error(orders: dict) -> dict:
    """How far a backend's time at a bucket point is from its time read off its two neighbours on one axis (log-
    linear between them; on the length axis, among the lengths of the point's kind, `selector_workloads.series`),
    over every such point of `orders` (`bucket_orders`): the error of reading a backend's time between timed points
    two grid steps apart, so at least that of a query between two adjacent points. Its p90 is the band within
    which two backends placed between points cannot be told apart (the selector's `workload_interpolation_band`).
    It is the error at grid points: a length just past a kernel's tile can jump further (benchmarks/shape_scan.py)."""
    per_backend: dict[tuple, dict[tuple[int, int], float]] = {}
    for key, (order, _) in orders.items():
        for backend, ms in order:
            per_backend.setdefault((*key[:8], backend), {})[(key[8], key[9])] = ms
    ratios = []
    for times in per_backend.values():
        at_length: dict[int, list[tuple[int, int]]] = {}  # the points of each length, not rescanned per point
        for p in times:
            at_length.setdefault(p[1], []).append(p)
        for (b, n), ms in times.items():
            batch_line = {p for p in at_length[n] if p[0] != b}
            length_line = {p for p in series(times, n, b) if p[0] == b and p[1] != n}
            for line in (batch_line, length_line):
                weights = interpolation_weights(line, b, n)
                if len(weights) == 2:  # a neighbour on either side
                    read = log_mean(weights, times)
                    ratios.append(max(ms, read) / min(ms, read))
    return spread_of(ratios)


WORKLOADS_DIR = Path(__file__).resolve().parent / "data" / "workloads"


# What a timed row shares with its backend's check row on the same layer and op: written once, on the check row
# (`compact`), and filled back into every timed row when read (`load_rows`).
SHARED_FIELDS = ("arch", "case", "device", "entry", "heads_kv", "heads_q", "kernel_version", "layers", "profile")
# The timed rows of a file (a sweep's bucket and held-out points, a shape scan's points): each follows its check row.
TIMED_SETS = ("bucket", "held_out", "scan")


def compact(row: dict, check: dict | None) -> dict:
    """`row` without the fields its check row already states (a timed row of a sweep or scan file)."""
    if check is None or row.get("set") not in TIMED_SETS:
        return row
    return {k: v for k, v in row.items() if not (k in SHARED_FIELDS and check.get(k) == v)}


def load_rows(paths: list[Path] | None = None) -> list[dict]:
    """Sweep rows from the committed workload files (matrix/data/workloads/*.jsonl) or `paths`, each timed row
    with the fields it shares with its check row (`compact`) filled back in."""
    files = paths if paths is not None else sorted(WORKLOADS_DIR.glob("*.jsonl"))
    rows = []
    for f in files:
        checks: dict[tuple, dict] = {}
        for n, line in enumerate(Path(f).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise PresetError(f"{f}:{n}: not JSON ({e})") from None
            if not isinstance(row, dict) or "set" not in row:
                raise PresetError(f"{f}:{n}: not a sweep row (a JSON object with a `set` field)")
            key = (row.get("backend"), row.get("layer"), row.get("op"))
            if row["set"] == "check":
                checks[key] = row
            elif row["set"] in TIMED_SETS:
                check = checks.get(key)
                if check is None:
                    raise PresetError(f"{f}:{n}: a timed row of {'/'.join(map(str, key))} before its check row")
                row = {**{k: check[k] for k in SHARED_FIELDS if k in check}, **row}
            rows.append(row)
    return rows


@dataclass(frozen=True)
class Layer:
    """One layer type of a model preset, as the attention kernel sees it (per tensor-parallel rank)."""

    model: str
    layer: str  # "global", "local", "mla" ...
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    window: int | None = None  # left window (tokens) of a sliding-window layer
    softcap: float | None = None
    sinks: bool = False
    qk_rope: int | None = None  # MLA: the rope part of head_dim
    source: str = ""
    # Every attention layer of the model has this layer's window (or none): vLLM plans FA3's schedule ahead of the
    # call only then (kernels/vllm_fa.py), so two layers of one call can still be called differently.
    one_window_size: bool = True

    @property
    def name(self) -> str:
        return f"{self.model}:{self.layer}"

    def ops(self) -> tuple[str, ...]:
        return layer_ops(self.qk_rope)

    def features(self, op: str) -> tuple[str, ...]:
        """The feature tokens of the call the sweep times for this layer's `op`: the selector's query for the
        layer (`models.call_params`, as `LayerType.query_params` asks it), decode's without its causal mask
        (`selector_workloads.timed_features`)."""
        params = call_params(op, self.heads_q, self.heads_kv, sliding_window=self.window, softcap=self.softcap,
                             sinks=self.sinks, qk_rope=self.qk_rope)
        return timed_features(op, features_of(**params))


class PresetError(ValueError):
    pass


def load_presets(path: str | Path | None = None) -> list[Layer]:
    """Every layer type of the model presets (matrix/data/models.json or `path`, read and checked against each
    layer's cited config by `attnmatrix.matrix.models`), per GPU at each model's typical tensor-parallel split."""
    from attnmatrix.matrix.models import ModelError, load_models

    try:
        models = load_models(path)
    except ModelError as e:
        raise PresetError(str(e)) from None
    out = []
    for name, m in sorted(models.items()):
        one_window = len({ly.sliding_window for ly in m.layers}) == 1
        for ly in m.layers:
            hq, hkv = ly.per_rank(m.tp)
            out.append(Layer(model=name, layer=ly.type, heads_q=hq, heads_kv=hkv, head_dim=ly.head_dim,
                             head_dim_v=ly.head_dim_v, window=ly.sliding_window, softcap=ly.softcap,
                             sinks=ly.sinks, qk_rope=ly.qk_rope_head_dim, source=m.source,
                             one_window_size=one_window))
    return out

"""Workload hints: a cell's supported backends in the order its timings near the hinted shape give.

benchmarks/regret.py times the backends of a cell on real models' layers (their head counts, matrix/data/
models.json) at a grid of (batch, length) points, the workload buckets (matrix/workloads.py BUCKETS); the
generator ships the timings as the selector's DATA['workloads']: per cell, rows (heads_q, heads_kv, batch,
length, ties, ((backend, ms), ...) fastest first), and DATA['workload_band'], the measurement noise within which
two backends tie.

A hinted query takes the timed layer nearest to its head counts, then places the backends at its (batch,
length), among the timed lengths of the query's kind (a multiple of 64 or not, `series`): at a timed point, by
that point's timings; between points, by each backend's time interpolated in log
space from the timed points around it (bilinear between the grid values that bracket each axis; on a grid line,
between the two points on it), since a ranking read off one neighbouring point misses where the order changes
between points. Where a bracketing point was not timed (the grid leaves out the largest corners), the nearest
timed points stand in, weighted by 1 / squared distance. A backend not timed at some of the points is placed from
those it was timed at. With one axis hinted, the timed point nearest on that axis is used. A backend whose decode
split follows the batch of vLLM's CUDA graph (DATA['graph_batches']) is read in the query's graph (`graph_readings`),
and one that runs a fast path at some power-of-two decode lengths (DATA['power_of_two_paths']) is read at other
lengths without the timings where it took it (`fast_path_readings`), and one that computes a prefill's keys in whole
tiles (DATA['whole_tiles']) is read at the end of the query's tile (`tile_end_readings`).

Standard library only: part of the vendored selector (selector.py, selector_engine.py, selector_vllm.py,
selector_workloads.py, vocabulary.py).
"""

from __future__ import annotations

from math import exp, log

# Optional workload hints of select_backends: the layer's head counts and the batch's shape. Prefill's point is
# (batch_size, seq_len), decode's (batch_size, context_len); num_tokens stands for the batch where it is not
# given (prefill: num_tokens // seq_len sequences, so only beside seq_len; decode: one token per sequence).
WORKLOAD_HINTS = ("num_heads", "num_kv_heads", "num_tokens", "batch_size", "seq_len", "context_len")
# The length hint of each op's point.
LENGTH_HINT = {"prefill": "seq_len", "mla_prefill": "seq_len", "decode": "context_len"}
# Timed points an interpolated placement draws on where the grid cell around a point is not complete.
NEIGHBOURS = 4
# Decode: the one query token at the end of the cache sees the whole cache, so a causal mask changes nothing.
# The workload sweep calls decode without it (`timed_features`), and its timings answer the causal query every
# decoder asks (`workload_features`: the key of a cell's timings).
MASK_FREE_OPS = {"decode": "causal"}
# FA4 runs fastest at sequence lengths that are a multiple of 64 and up to 2.2x slower just past one, where other
# kernels step at their own tiles: the workload grid times short prefill lengths of both kinds (matrix/workloads.py
# PREFILL_UNALIGNED), and a query is placed from the timed lengths of its own kind (`series`).
LENGTH_ALIGNMENT = 64
# cuDNN's prefill takes the same time at every length from just past a multiple of 128 to the next multiple (it
# computes whole 128-token tiles; benchmarks/results/scan-sm_90-h200-20261202-prefill-b40.jsonl at head dim 128,
# -prefill-b12.jsonl at 256), where FlashAttention's kernels grow every 16 or 64 tokens. Read between timed lengths
# a tile apart, such a step is smeared over the gap: a length early in a tile is placed as if it paid for part of
# the next. Any backend whose two timings in the query's tile are within the interpolation band is read off the
# tile (`tile_readings`): between them the timed points cannot tell a step from a slow growth, and a kernel that
# grows within that band across a tile is read up to that much too fast late in it.
TILE = 128
# vLLM replays a decode step from the CUDA graph captured for the smallest captured batch size that holds it, and a
# kernel that picks its split of the KV cache from the number of sequences it is launched with (DATA['graph_batches']:
# vLLM's FA4 copy) takes about the same time at every batch one graph holds and steps where the captured size steps
# (matrix/vllm_graphs.py). Read between two timed batches of different graphs, such a step is smeared over the gap
# and the kernel looks faster than it is just past the lower graph; it is read at the nearest timed batch at or above
# the query in the query's graph (`graph_reading_batch`). Never at a timed batch below the query: within one graph
# the time still grows with the step's own sequences.
GRAPH_OPS = ("decode",)
# cuDNN's SDPA runs some decode steps whose cached length is a power of two on a faster path than its trend: at one
# and three sequences it takes 9.2 us at 1024 tokens where 992 and 1056 take 12.4 and 11.8 (gemma-3-1b global), and at
# 65 sequences 9.6 us at 512 where 544 takes 13.7 (qwen3-235b); its time at other lengths follows a staircase that
# never dips (benchmarks/results/scan-sm_90-h200-20261204-*-decode-context.jsonl: every decode layer call, contexts
# 512-2176 every 32 tokens). Interpolated from such a point, a length near it is read as if it took the fast path. A
# timed power-of-two length where a backend that declares the path (DATA['power_of_two_paths']) is faster than its
# reading from the other timed lengths around it by more than the interpolation band is its fast path there, and a
# query at another length reads that backend without it (`fast_path_readings`); a path within the band is left in,
# as the timed points cannot tell it from the kernel's trend.
FAST_PATH_OPS = ("decode",)
# A backend that computes a prefill's keys in whole TILE-token tiles (DATA['whole_tiles']: cuDNN) takes about the time
# of the tile's end at every length of the tile (above: 150 us at every length from 264 to 384 tokens, 231 from 392 to
# 512, 40 sequences of qwen3-32b). Between two timed lengths two or more tiles apart (the grid's lengths past 512 are
# 128 to 1024 tokens apart) an interpolation reads a length early in a tile as if it paid for part of the next tiles:
# 46 sequences of 619 tokens, in the tile that ends at 640, were read between 552 and 808 (five and seven tiles).
# Such a backend is read at its tile's end, among the timed multiples of LENGTH_ALIGNMENT, whose tile-end times follow
# its staircase, times what its partial tile costs it over the tile's end at the batches around (`tile_end_readings`,
# `partial_tile`); where the grid times a length of the query's tile past a multiple of LENGTH_ALIGNMENT and its end,
# within the interpolation band of each other, the backend is read off those two instead (`tile_readings`).
# MLA prefill's cuDNN call (head dims 192/128 and 256) is read as the others are: no scan shows its tiles, and read
# so its hidden grid points end no regret over 1.10 (benchmarks/placement_rules.py `whole_tiles_mla`).
WHOLE_TILE_OPS = ("prefill",)


def workload_features(op, feats):
    """The feature tokens a cell's workload timings are keyed by: the query's, decode's with its causal mask."""
    mask = MASK_FREE_OPS.get(op)
    return tuple(sorted({*feats, mask})) if mask else tuple(feats)


def timed_features(op, feats):
    """The feature tokens of the call the workload sweep times for a query's `feats`: decode's without its mask."""
    mask = MASK_FREE_OPS.get(op)
    return tuple(t for t in feats if t != mask)


def nearest_point(points, batch=None, length=None):
    """The (batch, length) point nearest to the given axes in log space (an axis not given is ignored; ties:
    the smaller point). The one bucket rule: matrix/workloads.py's bucket_of uses it too."""

    def dist(p):
        return ((log(batch / p[0]) ** 2 if batch else 0.0) + (log(length / p[1]) ** 2 if length else 0.0), p)

    return min(points, key=dist) if points else None


def series(points, length, batch=None):
    """The timed (batch, length) points a query of `length` is placed from: where some timed lengths are a
    multiple of LENGTH_ALIGNMENT and some are not, those of the query's kind; a length that is no multiple past the
    longest such timed length (at the query's batch where that is a timed batch: the token cap ends some batches'
    earlier) is placed from the multiples beyond it, as the grid times the other kind only where a partial tile is
    a large share of the work. Every point where the length is not given or the grid has one kind only (decode)."""
    points = list(points)
    odd = [p for p in points if p[1] % LENGTH_ALIGNMENT]
    if length is None or not odd or len(odd) == len(points):
        return points
    if length % LENGTH_ALIGNMENT == 0:
        return [p for p in points if p[1] % LENGTH_ALIGNMENT == 0]
    top = max(p[1] for p in [p for p in odd if p[0] == batch] or odd)
    return [p for p in points if p[1] % LENGTH_ALIGNMENT or p[1] > top]


def hinted_point(op, hints):
    """(batch, length) of the hints for `op` (either may be None), or None when neither is given. Decode's
    num_tokens is its batch (one token per sequence); prefill's stands for batch_size only beside seq_len (8192
    tokens are one long sequence or 64 short ones)."""
    length = hints.get(LENGTH_HINT[op])
    batch = hints.get("batch_size")
    if batch is None and hints.get("num_tokens"):
        if op == "decode":
            batch = hints["num_tokens"]
        elif length is not None:
            batch = max(1, hints["num_tokens"] // length)
    return None if batch is None and length is None else (batch, length)


def nearest_layer(rows, hints):
    """The rows of the timed layer nearest to the hinted head counts (query heads, then the GQA ratio, in log
    space; exact when timed; the smallest layer without head hints)."""
    hq = hints.get("num_heads")
    if hq is not None:
        hkv = hints.get("num_kv_heads") or hq

        def far(r):
            return abs(log(r[0] / hq)) + abs(log((r[0] / r[1]) / (hq / hkv)))

        best = min(far(r) for r in rows)
        rows = [r for r in rows if far(r) == best]
    heads = min((r[0], r[1]) for r in rows)
    return [r for r in rows if (r[0], r[1]) == heads]


class Placement:
    """Where a hinted query's backends stand: `order` ((backend, ms), ...) fastest first, ms measured at a timed
    point (`exact`) or interpolated from `points` (or read off the query's tile: `tiled`); the first `ties` are
    within the noise band of the fastest, the first `uncertain` (placed between points) within the interpolation
    band: the timed points cannot tell them apart there."""

    __slots__ = ("heads", "batch", "length", "points", "exact", "order", "ties", "uncertain", "tiled", "graphed",
                 "unpathed", "tile_ends")

    def __init__(self, heads, batch, length, points, exact, order, ties, uncertain=None, tiled=(), graphed=(),
                 unpathed=(), tile_ends=()):
        self.heads, self.batch, self.length = heads, batch, length
        self.points, self.exact, self.order, self.ties = points, exact, order, ties
        self.uncertain = ties if uncertain is None else max(ties, uncertain)
        self.tiled = tiled  # the backends read off the query's tile (`tile_readings`), not interpolated
        self.graphed = graphed  # ((backend, batch read at), ...): read in the query's CUDA graph (`graph_readings`)
        # ((backend, (length, ...)), ...): read without the timed lengths of its fast path (`fast_path_readings`)
        self.unpathed = unpathed
        # ((backend, length read at, partial tile), ...): read at its tile's end (`tile_end_readings`)
        self.tile_ends = tile_ends

    def basis(self) -> str:
        heads = f"heads {self.heads[0]}/{self.heads[1]}"
        if self.exact:
            return f"{heads}, batch {self.batch}, length {self.length}"
        tiled = f"; {', '.join(self.tiled)} read off the {TILE}-token tile it is flat over" if self.tiled else ""
        graphed = "".join(f"; {b} read at batch {at}, timed in the CUDA graph vLLM runs batch {self.batch} in"
                          for b, at in self.graphed)
        unpathed = "".join(
            f"; {b} read without its timings at {', '.join(map(str, ns))} tokens, "
            f"{'a power' if len(ns) == 1 else 'powers'} of two where it ran a faster path than at the lengths around"
            for b, ns in self.unpathed)
        ends = "".join(f"; {b} read at {at} tokens, the end of the {TILE}-token tile it computes whole, times "
                       f"{partial:.3f} for its partial tile" for b, at, partial in self.tile_ends)
        if len(self.points) == 1:
            return (f"{heads}, the timed point nearest on the hinted axis: batch {self.batch}, length {self.length}"
                    f"{tiled}{graphed}{unpathed}{ends}")
        near = ", ".join(f"{b}x{n}" for b, n in self.points)
        return (f"{heads}, batch {self.batch}, length {self.length}, "
                f"interpolated from the timed points (batch x length) {near}{tiled}{graphed}{unpathed}{ends}")


def bracket(v, values):
    """The grid values on either side of `v` (one value where `v` is one, or beyond the grid)."""
    lo = max((x for x in values if x <= v), default=None)
    hi = min((x for x in values if x >= v), default=None)
    return tuple(sorted({x for x in (lo, hi) if x is not None}))


def interpolation_weights(by_point, batch, length):
    """Timed point -> interpolation weight for (batch, length): bilinear in log space over the bracketing grid
    points where all of them were timed, else 1 / squared log distance over the NEIGHBOURS nearest."""
    bs, ls = bracket(batch, {p[0] for p in by_point}), bracket(length, {p[1] for p in by_point})
    corners = [(b, n) for b in bs for n in ls]
    if all(c in by_point for c in corners):
        def share(v, side, values):
            if len(values) == 1:
                return 1.0
            lo, hi = values
            f = log(v / lo) / log(hi / lo)
            return f if side == hi else 1.0 - f

        return {(b, n): share(batch, b, bs) * share(length, n, ls) for b, n in corners}

    def dist(p):
        return (log(batch / p[0]) ** 2 + log(length / p[1]) ** 2, p)

    return {p: 1.0 / dist(p)[0] for p in sorted(by_point, key=dist)[:NEIGHBOURS]}


def log_mean(weights, times):
    """The weighted mean of times[p] over the points p of `weights`, in log space (the interpolation's reading)."""
    total = sum(weights.values())
    return exp(sum(w * log(times[p]) for p, w in weights.items()) / total)


def tile_readings(by_point, batch, length, band):
    """backend -> its time at (batch, length), for the backends whose time is flat over the query's TILE-token tile:
    timed at the tile's length past a multiple of LENGTH_ALIGNMENT and at the tile's end (a multiple), within
    `band` of each other at every timed batch around the query. Read at the first of the two, interpolated between
    the batches. {} for a length that is a multiple, or a tile the grid has no such pair of lengths in."""
    if length % LENGTH_ALIGNMENT == 0:
        return {}
    start = (length - 1) // TILE * TILE
    end = start + TILE
    past = sorted({p[1] for p in by_point if start < p[1] < end and p[1] % LENGTH_ALIGNMENT})
    if len(past) != 1:
        return {}
    batches = bracket(batch, {p[0] for p in by_point if p[1] == past[0] and (p[0], end) in by_point})
    if not batches:
        return {}
    # batch -> (the backends' times at the tile's length past a multiple, at its end)
    timed = {b: (dict(by_point[(b, past[0])][5]), dict(by_point[(b, end)][5])) for b in batches}
    weights = interpolation_weights({(b, past[0]): None for b in batches}, batch, past[0])
    out = {}
    for backend in sorted(set.intersection(*(set(at) & set(e) for at, e in timed.values()))):
        if all(max(at[backend], e[backend]) / min(at[backend], e[backend]) <= band for at, e in timed.values()):
            out[backend] = log_mean(weights, {(b, past[0]): at[backend] for b, (at, _) in timed.items()})
    return out


def tile_end(length):
    """The last length of the TILE-token tile `length` falls in: the length a whole-tile backend takes the time of."""
    return -(-length // TILE) * TILE


def tile_end_readings(by_point, batch, length, backends):
    """backend -> (the tile's end, its partial tile, its time at (batch, length)) for each of `backends` (those
    computing whole tiles) at a length that is not itself a tile's end: its time at the tile's end, interpolated in
    log space among its timed multiples of LENGTH_ALIGNMENT (`series` of the tile's end) between the timed batches
    and lengths that bracket it, times its partial tile (`partial_tile`). A backend is not read so where no timed
    points bracket the tile's end (below or past the grid's lengths, or where the token cap leaves out a corner: the
    nearest points would all be shorter). {} at a tile's end (the query's own reading is the tile's)."""
    end = tile_end(length)
    if end == length or not backends:
        return {}
    aligned = series(by_point, end, batch)
    out = {}
    for backend in backends:
        times = {p: dict(r[5])[backend] for p, r in by_point.items() if backend in dict(r[5])}
        at = {p: times[p] for p in aligned if p in times}
        batches = bracket(batch, {p[0] for p in at})
        lengths = bracket(end, {p[1] for p in at})
        corners = [(b, n) for b in batches for n in lengths]
        if not lengths or not lengths[0] <= end <= lengths[-1] or not batches or not batches[0] <= batch <= batches[-1]:
            continue
        if not all(c in at for c in corners):
            continue
        partial = partial_tile(times, batch)
        w = {p: x for p, x in interpolation_weights({c: at[c] for c in corners}, batch, end).items() if x > 0}
        out[backend] = (end, partial, log_mean(w, at) * partial)
    return out


def partial_tile(times, batch):
    """How much longer a whole-tile backend takes at a length within a tile than at the tile's end (which leaves no
    partial tile to mask: 146 us at 384 tokens where 264-376 take 150, qwen3-32b at 40 sequences), at the timed
    batches that bracket `batch` (it grows with the batch; `explain` prints the factor a query is read with): the
    median, over the timed lengths there that are not a tile's end and whose tile's end was timed at the same batch,
    of the one's time over the other's; 1.0 where the grid times no such pair. Below 1 where a length within the tile
    runs faster than its end (at head dim 256, and with a sliding window, whose prefill is not flat over a tile):
    the factor is read as timed. `times`: (batch, length) -> ms."""
    pairs = {(b, n): ms / times[(b, tile_end(n))] for (b, n), ms in times.items()
             if tile_end(n) != n and (b, tile_end(n)) in times}
    around = bracket(batch, {b for b, _ in pairs})
    ratios = sorted(r for (b, _), r in pairs.items() if b in around)
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else exp((log(ratios[mid - 1]) + log(ratios[mid])) / 2)


def graph_reading_batch(batch, sizes, timed):
    """The batch a backend whose decode split follows vLLM's captured batch (`sizes`, the captured batch sizes) is
    read at among its `timed` batches: where a timed batch at or above `batch` is in the query's graph (the batches
    above the next smaller captured size, up to the smallest one that holds `batch`), the smallest timed batch of
    that graph, or `batch` itself where that is smaller (a query between two timed batches of its graph is
    interpolated between them); `batch` where no timed batch at or above it shares its graph, or past the largest
    captured size."""
    if not sizes or batch > sizes[-1]:
        return batch
    graph = next(n for n in sizes if n >= batch)
    below = max((n for n in sizes if n < batch), default=0)
    same = sorted(b for b in timed if below < b <= graph)
    if not same or same[-1] < batch:
        return batch
    return max(batch, same[0])


def graph_readings(by_point, batch, length, graphs):
    """backend -> (the batch it is read at, its time there) for each backend of `graphs` (backend -> vLLM's
    captured batch sizes) that `graph_reading_batch` reads at another batch than the query's (then a timed batch):
    interpolated in log space between its timed lengths at that batch on either side of `length`. A backend whose
    timed lengths at that batch do not bracket `length` (past the grid's token cap) is not read so: the nearest
    points would be at other batches, some below the query."""
    out = {}
    for backend, sizes in sorted(graphs.items()):
        at = {p: dict(r[5])[backend] for p, r in by_point.items() if backend in dict(r[5])}
        read = graph_reading_batch(batch, sizes, {p[0] for p in at})
        line = {p: ms for p, ms in at.items() if p[0] == read}
        if read == batch or not line or not min(p[1] for p in line) <= length <= max(p[1] for p in line):
            continue
        weights = {p: w for p, w in interpolation_weights(line, read, length).items() if w > 0}
        out[backend] = (read, log_mean(weights, line))
    return out


def is_power_of_two(n):
    """Whether the length `n` is a power of two (the lengths a fast path is looked for at)."""
    return n > 0 and n & (n - 1) == 0


def fast_path_lengths(times, band):
    """The power-of-two lengths of one timed batch where a backend ran a fast path: its time there (`times`: length
    -> ms) below its reading from the other kind of timed length around it by more than `band`, log-linear
    between the nearest on either side, or from the two nearest above where none is below (the grid's shortest
    context, 512, is a power of two). A power of two past the longest other length is not judged: a query beyond
    it is read from it as the grid's edge."""
    other = sorted(n for n in times if not is_power_of_two(n))
    out = []
    for n in sorted(x for x in times if is_power_of_two(x)):
        lo, hi = [x for x in other if x < n][-1:], [x for x in other if x > n]
        a, c = (lo[0], hi[0]) if lo and hi else tuple(hi[:2]) if len(hi) >= 2 else (None, None)
        if a is None:
            continue
        f = log(n / a) / log(c / a)
        if times[n] * band < exp((1.0 - f) * log(times[a]) + f * log(times[c])):
            out.append(n)
    return out


def fast_path_readings(by_point, batch, length, weights, backends, band):
    """backend -> (the timed lengths left out, its time at (batch, length)) for each of `backends` (those declaring
    a fast path at powers of two) that ran its fast path (`fast_path_lengths`) at some of the points the query is
    interpolated from (`weights`): interpolated from its timed points at the other lengths; below the shortest of
    them, read at it: just past a power of two cuDNN's time steps up to the next stair of its staircase and grows
    little over it (qwen3-235b at 65 sequences: 13.7 us at 544 cached tokens, 14.3 at 768). {} at a power-of-two
    length (the query may take the path itself)."""
    if is_power_of_two(length):
        return {}
    out = {}
    around = {p for p, w in weights.items() if w > 0}
    for backend in backends:
        at = {p: dict(r[5])[backend] for p, r in by_point.items() if backend in dict(r[5])}
        lengths = {n for b in {p[0] for p in around}
                   for n in fast_path_lengths({p[1]: ms for p, ms in at.items() if p[0] == b}, band)
                   if (b, n) in around}
        if not lengths:
            continue
        # those lengths left out at every batch, so that the query's cell is bracketed by the other lengths
        rest = {p: ms for p, ms in at.items() if p[1] not in lengths}
        w = {p: x for p, x in interpolation_weights(rest, batch, length).items() if x > 0}
        out[backend] = (tuple(sorted(lengths)), log_mean(w, rest))
    return out


def _within(order, band):
    """How many of `order` ((backend, ms), ... fastest first) are within `band` of the fastest."""
    return sum(1 for _, ms in order if ms / order[0][1] <= band) if order else 0


def place(rows, op, hints, band=1.0, spread=1.0, by_kind=True, tiles=True, graphs=None, paths=(), whole_tiles=(),
          tile_ops=WHOLE_TILE_OPS):
    """The Placement of a hinted query among a cell's timed rows, or None without a usable hint. `band`: the
    measurement noise within which two timings tie; `spread`: the interpolation error within which two backends
    placed between timed points cannot be told apart; `by_kind`: among the timed lengths of the query's kind
    (`series`; False: every timed length); `tiles`: a backend whose time is flat over the query's tile read off
    it (`tile_readings`; False: interpolated like the others); `graphs`: backend -> vLLM's captured batch sizes,
    for the backends whose decode split follows them (read in the query's graph: `graph_readings`; None: none);
    `paths`: the backends that run a fast path at some power-of-two lengths (read at other lengths without the
    timings where they took it: `fast_path_readings`); `whole_tiles`: the backends that compute a prefill's keys in
    whole tiles (read at the query's tile's end: `tile_end_readings`) at the ops of `tile_ops`. The last six as
    benchmarks/placement_rules.py compares rules."""
    point = hinted_point(op, hints)
    if not rows or point is None:
        return None
    rows = nearest_layer(rows, hints)
    heads = (rows[0][0], rows[0][1])
    batch, length = point
    every = by_point = {(r[2], r[3]): r for r in rows}
    if by_kind:
        by_point = {p: by_point[p] for p in series(by_point, length, batch)}
    if point in by_point:  # a timed point: its own order
        r = by_point[point]
        return Placement(heads, batch, length, (point,), True, r[5], r[4])
    if batch is None or length is None:  # one axis hinted: the timed point nearest on it, the other axis unknown
        near = nearest_point(sorted(by_point), batch, length)
        r = by_point[near]
        return Placement(heads, near[0], near[1], (near,), False, r[5], r[4], _within(r[5], spread))
    weights = {p: w for p, w in interpolation_weights(by_point, batch, length).items() if w > 0}
    timed = {p: dict(by_point[p][5]) for p in weights}
    est = {}
    for b in sorted(set().union(*timed.values())):
        at = {p: weights[p] for p in weights if b in timed[p]}  # a backend not timed at a point: from the others
        est[b] = log_mean(at, {p: timed[p][b] for p in at})
    unpathed = fast_path_readings(by_point, batch, length, weights, paths, spread) if op in FAST_PATH_OPS else {}
    est.update({b: ms for b, (_, ms) in unpathed.items()})
    graphed = graph_readings(by_point, batch, length, graphs) if graphs and op in GRAPH_OPS else {}
    # a backend read in its graph is not also read off its tile (decode's timed lengths are all multiples of 64)
    tiled = {b: ms for b, ms in (tile_readings(every, batch, length, spread) if tiles else {}).items()
             if b not in graphed}
    # one read off its tile is read from its own two times in the tile, not at the tile's end
    ended = (tile_end_readings(every, batch, length,
                               [b for b in whole_tiles if b in est and b not in tiled and b not in graphed])
             if op in tile_ops else {})
    est.update(tiled)
    est.update({b: ms for b, (_, ms) in graphed.items()})
    est.update({b: ms for b, (_, _, ms) in ended.items()})
    order = tuple(sorted(((b, round(ms, 5)) for b, ms in est.items()), key=lambda x: (x[1], x[0])))
    unpathed = {b: v for b, v in unpathed.items() if b not in graphed and b not in tiled and b not in ended}
    return Placement(heads, batch, length, tuple(sorted(weights)), False, order, _within(order, band),
                     _within(order, spread), tuple(tiled), tuple((b, at) for b, (at, _) in graphed.items()),
                     tuple((b, ns) for b, (ns, _) in sorted(unpathed.items())),
                     tuple((b, at, partial) for b, (at, partial, _) in sorted(ended.items())))

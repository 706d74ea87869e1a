"""Workloads: real models' attention layers at the batch and sequence mixes engines run.

The matrix's timing shapes (kernels/problem.py TIMING_SHAPES) are three synthetic shapes with 16 or 32 heads
and no grouped-query attention. A workload is a model preset's layer type (its query/KV head counts, head
dims, window, softcap, sinks) at one (batch, sequence) point:

- **buckets** (`BUCKETS`): a small grid per op that rankings are made on. Prefill: tokens per sequence x
  batch; decode: batch x context length. A query's (batch, length) falls in the bucket nearest to it in
  log space (`bucket_of`), so every query has a bucket.
- **held-out shapes** (`HELD_OUT`): other (batch, length) points, never used for ranking, that the
  selector's per-bucket choice is judged on (benchmarks/regret.py).

Pure: no torch. Presets come from matrix/data/models.json (`load_presets`, through `attnmatrix.matrix.models`,
the one reader of that file): one entry per model with its layer types, each cited to its published config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.selector_engine import nearest_point

# (batch, length): prefill length = tokens per sequence (query = key length); decode length = context.
# Two values per axis, far apart, so that the points bracket what engines run (short chat prefill to long
# documents; a few to hundreds of decoding sequences) and a full sm_90 sweep stays inside a few minutes.
BUCKETS: dict[str, tuple[tuple[int, int], ...]] = {
    "prefill": ((1, 512), (1, 8192), (16, 512), (16, 4096)),
    "mla_prefill": ((1, 512), (1, 8192), (16, 512), (16, 4096)),
    "decode": ((8, 1024), (8, 16384), (128, 1024), (128, 8192)),
}
# Shapes between and beyond the bucket points; none of them is a bucket point.
HELD_OUT: dict[str, tuple[tuple[int, int], ...]] = {
    "prefill": ((1, 2048), (4, 1024), (2, 16384), (32, 256), (8, 2048)),
    "mla_prefill": ((1, 2048), (4, 1024), (2, 16384), (32, 256), (8, 2048)),
    "decode": ((1, 4096), (32, 2048), (64, 32768), (256, 512), (16, 4096)),
}
# The length axis's name per op, as the selector's hints spell it.
LENGTH_NAME = {"prefill": "seq_len", "mla_prefill": "seq_len", "decode": "context_len"}
DEFAULT_MODELS = Path(__file__).resolve().parent / "data" / "models.json"


def bucket_label(op: str, batch: int, length: int) -> str:
    return f"b{batch}_{'kv' if op == 'decode' else 's'}{length}"


def bucket_of(op: str, batch: int, length: int) -> tuple[int, int]:
    """The bucket nearest to (batch, length) in log space (ties: the smaller point), as the selector picks it."""
    if op not in BUCKETS:
        raise ValueError(f"op {op!r}: no workload buckets (known: {', '.join(BUCKETS)})")
    if batch < 1 or length < 1:
        raise ValueError(f"batch {batch} and length {length} must be >= 1")
    return nearest_point(BUCKETS[op], batch, length)


def layer_features(case_key: str) -> tuple[str, ...]:
    """The layer's feature tokens of a timed row's case (the vLLM profile's cache block is the call, not the
    layer)."""
    return tuple(t for t in case_key.rsplit("/", 1)[-1].split("+") if t != "none" and not t.startswith("paged_kv:"))


def bucket_orders(rows: list[dict]) -> tuple[dict, dict]:
    """(noise, orders) from sweep rows (benchmarks/regret.py). The noise is the distribution of slower/faster
    of a backend's two timings at one bucket point (p90 is the tie band); orders maps
    (arch, op, dtype, head_dim, head_dim_v, features, heads_q, heads_kv, batch, length) to
    (((backend, median ms), ...) fastest first, how many of the first are within the band of the fastest).
    Only backends whose check passed on that layer count."""
    from statistics import median

    passed = {(r["backend"], r["case"], r["heads_q"], r["heads_kv"]) for r in rows
              if r["set"] == "check" and r["outcome"] == "pass"}
    times: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["set"] == "bucket" and r["outcome"] == "pass" and (r["backend"], r["case"], r["heads_q"],
                                                                 r["heads_kv"]) in passed:
            _, _, op, dtype, dims, _ = r["case"].split("/")
            hd, _, hdv = dims.partition("x")
            feats = layer_features(r["case"])
            if op == "decode":  # one query token at the end sees the whole cache: causal or not, the same call
                feats = tuple(sorted(set(feats) | {"causal"}))
            key = (r["arch"], op, dtype, int(hd), int(hdv or hd), feats, r["heads_q"],
                   r["heads_kv"], r["batch"], r["length"])
            times.setdefault(key, {}).setdefault(r["backend"], {})[r.get("rep", 0)] = r["ms"]
    ratios = sorted(max(v.values()) / min(v.values()) for per in times.values() for v in per.values() if len(v) > 1)

    def q(p: float) -> float | None:
        return round(ratios[min(len(ratios) - 1, int(p * len(ratios)))], 4) if ratios else None

    band = q(0.9) or 1.0
    orders = {}
    for key, per in sorted(times.items()):
        order = sorted(((b, round(median(v.values()), 5)) for b, v in per.items()), key=lambda x: (x[1], x[0]))
        orders[key] = (tuple(order), sum(1 for _, t in order if t / order[0][1] <= band))
    return {"pairs": len(ratios), "median": q(0.5), "p90": band, "max": ratios[-1] if ratios else None}, orders


WORKLOADS_DIR = Path(__file__).resolve().parent / "data" / "workloads"


def load_rows(paths: list[Path] | None = None) -> list[dict]:
    """Sweep rows from the committed workload files (matrix/data/workloads/*.jsonl) or `paths`."""
    files = paths if paths is not None else sorted(WORKLOADS_DIR.glob("*.jsonl"))
    rows = []
    for f in files:
        for n, line in enumerate(Path(f).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise PresetError(f"{f}:{n}: not JSON ({e})") from None
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

    @property
    def name(self) -> str:
        return f"{self.model}:{self.layer}"

    def ops(self) -> tuple[str, ...]:
        return ("mla_prefill",) if self.qk_rope is not None else ("prefill", "decode")

    def features(self, op: str) -> tuple[str, ...]:
        """The matrix's feature tokens for this layer's call (the selector's query for it)."""
        toks = []
        if op != "decode":
            toks.append("causal")
        if self.window:
            toks.append("sliding_window")
        if self.softcap:
            toks.append("softcap")
        if self.sinks:
            toks.append("sinks")
        if self.heads_kv != self.heads_q and op != "mla_prefill":
            toks.append("gqa")
        if self.qk_rope is not None:
            toks.append(f"qk_rope:{self.qk_rope}")
        return tuple(sorted(toks))


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
        for ly in m.layers:
            hq, hkv = ly.per_rank(m.tp)
            out.append(Layer(model=name, layer=ly.type, heads_q=hq, heads_kv=hkv, head_dim=ly.head_dim,
                             head_dim_v=ly.head_dim_v, window=ly.sliding_window, softcap=ly.softcap,
                             sinks=ly.sinks, qk_rope=ly.qk_rope_head_dim, source=m.source))
    return out


def workload_points(op: str, held_out: bool = False) -> tuple[tuple[int, int], ...]:
    return (HELD_OUT if held_out else BUCKETS)[op]

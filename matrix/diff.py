"""What changed between two resolved matrices: support gained or lost, tiers, speed."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import ResolvedMatrix


@dataclass(frozen=True)
class Change:
    kind: str  # added, removed, gained, lost, status, tier, faster, slower
    key: str
    before: str
    after: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "cell": self.key, "before": self.before, "after": self.after}


# The noise of a re-timing: the same 200 cells (359 timed shapes) measured twice on one H200, the second time's
# latency over the first's: 90% of them within 0.837..1.162 (benchmarks/results/rerun_variance.json, by
# benchmarks/rerun_variance.py; tests/test_slips.py keeps this figure equal to the committed measurement).
RERUN_NOISE: tuple[float, float] = (0.837, 1.162)


def diff_matrices(a: ResolvedMatrix, b: ResolvedMatrix, *, speed_threshold: float = 0.10,
                  noise: tuple[float, float] | None = None) -> list[Change]:
    """Changes from `a` to `b`; latency changes smaller than `speed_threshold` (relative) are noise, and so,
    with `noise` (a band of `b`/`a` latency ratios, e.g. RERUN_NOISE for a rerun), is a ratio inside it."""
    out: list[Change] = []
    for k in sorted(set(a.cells) | set(b.cells), key=str):
        ca, cb = a.cells.get(k), b.cells.get(k)
        key = (ca or cb).case.key  # type: ignore[union-attr]
        if ca is None:
            out.append(Change("added", key, "-", f"{cb.status} ({cb.tier})"))
            continue
        if cb is None:
            out.append(Change("removed", key, f"{ca.status} ({ca.tier})", "-"))
            continue
        if ca.status != cb.status:
            kind = "gained" if cb.status == "supported" else "lost" if ca.status == "supported" else "status"
            out.append(Change(kind, key, f"{ca.status} ({ca.tier})", f"{cb.status} ({cb.tier})"))
        elif ca.tier != cb.tier:
            out.append(Change("tier", key, str(ca.tier), str(cb.tier)))
        la, lb = ca.latency_ms, cb.latency_ms
        if la and lb and abs(lb - la) / la > speed_threshold and not (noise and noise[0] <= lb / la <= noise[1]):
            out.append(Change("faster" if lb < la else "slower", key, f"{la:.4g} ms", f"{lb:.4g} ms"))
    return out

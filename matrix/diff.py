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


def diff_matrices(a: ResolvedMatrix, b: ResolvedMatrix, *, speed_threshold: float = 0.10) -> list[Change]:
    """Changes from `a` to `b`; latency changes smaller than `speed_threshold` (relative) are noise."""
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
        if la and lb and abs(lb - la) / la > speed_threshold:
            out.append(Change("faster" if lb < la else "slower", key, f"{la:.4g} ms", f"{lb:.4g} ms"))
    return out

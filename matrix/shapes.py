"""The problem shapes probes run on: one small shape per op for validation against the reference, larger ones
for timing. Standard library only, so the pages can turn a timed shape's name (records keep the name) back into
its sizes: batch, query and key lengths, heads (decode's GB/s of KV read needs them).
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW = 256  # left window of sliding-window cases (right = 0, as in causal local attention)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    window: int = WINDOW  # left window of a sliding-window case on this shape

    def describe(self) -> str:
        """`b64_kv4096: batch 64 x 4096 keys, 32 heads` / `b8_s2048: batch 8 x 2048 tokens, 16 heads`."""
        heads = f"{self.heads_q} heads" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv} heads"
        if self.seqlen_q == 1:
            return f"{self.name}: batch {self.batch} x {self.seqlen_k} keys, {heads}"
        if self.seqlen_q == self.seqlen_k:
            return f"{self.name}: batch {self.batch} x {self.seqlen_q} tokens, {heads}"
        return f"{self.name}: batch {self.batch} x {self.seqlen_q} queries x {self.seqlen_k} keys, {heads}"


# Shapes: a small one for validation against the reference, larger ones for timing. MLA prefill is
# timed on the same shapes as prefill, so the two read side by side.
# Their windows cut most of each row's keys (a window that cuts little cannot tell a kernel that drops it).
_VAL_PREFILL = Shape("val", 2, 300, 300, 8, 8, window=64)
VALIDATION_SHAPES = {"prefill": _VAL_PREFILL, "mla_prefill": _VAL_PREFILL,
                     "decode": Shape("val", 4, 1, 700, 8, 8, window=192)}
_PREFILL = [Shape("b1_s8192", 1, 8192, 8192, 16, 16), Shape("b8_s2048", 8, 2048, 2048, 16, 16),
            Shape("b32_s512", 32, 512, 512, 16, 16)]
TIMING_SHAPES = {
    "prefill": _PREFILL, "mla_prefill": _PREFILL,
    "decode": [Shape("b64_kv4096", 64, 1, 4096, 32, 32), Shape("b16_kv16384", 16, 1, 16384, 32, 32),
               Shape("b256_kv1024", 256, 1, 1024, 32, 32)],
}
# The CPU is a pipeline smoke target: small shapes keep a sweep to seconds.
_CPU_PREFILL = [Shape("b1_s512", 1, 512, 512, 4, 4), Shape("b2_s256", 2, 256, 256, 4, 4),
                Shape("b4_s128", 4, 128, 128, 4, 4)]
CPU_TIMING_SHAPES = {
    "prefill": _CPU_PREFILL, "mla_prefill": _CPU_PREFILL,
    "decode": [Shape("b8_kv1024", 8, 1, 1024, 4, 4), Shape("b4_kv2048", 4, 1, 2048, 4, 4),
               Shape("b16_kv512", 16, 1, 512, 4, 4)],
}


def timing_shape(device_is_cpu: bool, op: str, name: str) -> Shape | None:
    """The timing shape a record names, or None for a name this version does not define."""
    shapes = (CPU_TIMING_SHAPES if device_is_cpu else TIMING_SHAPES).get(op, [])
    return next((s for s in shapes if s.name == name), None)

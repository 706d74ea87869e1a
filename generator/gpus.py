"""Page titles with GPU product names (the vocabulary's ARCH_INFO), and the memory bandwidth of timed device
models (matrix/data/gpus.json) that decode's "% of HBM bandwidth" divides by, each with its citation.
Presentation only: nothing here decides support or order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from attnmatrix.vocabulary import products

GPUS_PATH = Path(__file__).resolve().parent.parent / "matrix" / "data" / "gpus.json"
SCHEMA = "attnmatrix.gpus/2"


@dataclass(frozen=True)
class Bandwidth:
    gbps: float
    source: str
    note: str


@dataclass(frozen=True)
class Gpus:
    devices: dict[str, Bandwidth]

    @staticmethod
    def products(arch: str) -> tuple[str, ...]:
        return products(arch)

    def title(self, arch: str) -> str:
        """"sm_100 — B200 / GB200"; the arch alone where no product is listed; "CPU" for the CPU."""
        if arch == "cpu":
            return "CPU — PyTorch SDPA"
        names = self.products(arch)
        return f"{arch} — {' / '.join(names[:3])}" if names else arch


def parse_gpus(data: object, where: str = str(GPUS_PATH)) -> Gpus:
    """Check and read gpus.json; a bad field is named with the file."""
    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"{where}: {field}: {why}")

    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise bad("schema", f"expected {SCHEMA!r}")
    devices = data.get("devices", {})
    if not isinstance(devices, dict):
        raise bad("devices", "expected an object of device model -> bandwidth")
    out_dev = {}
    for dev, d in devices.items():
        bw = d.get("memory_bandwidth_gbps") if isinstance(d, dict) else None
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
            raise bad(f"devices.{dev}.memory_bandwidth_gbps", "expected a positive number")
        if not isinstance(d.get("source"), str) or not d["source"].startswith("https://"):
            raise bad(f"devices.{dev}.source", "expected the https address that states the bandwidth")
        out_dev[dev] = Bandwidth(float(bw), d["source"], str(d.get("note", "")))
    return Gpus(out_dev)


@lru_cache(maxsize=1)
def load_gpus(path: str = str(GPUS_PATH)) -> Gpus:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    return parse_gpus(data, path)

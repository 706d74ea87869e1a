"""The file name a set of result records goes by in matrix/data/results/: what it holds, not when it ran.

usage: python scripts/evidence_name.py RESULTS.jsonl [...]
Prints <archs>-<kernels>-<device>-<date>.jsonl:
- <archs>: the archs the records are for, joined by `+`;
- <kernels>: each kernel family with its library's version (fa4-4.0.0b36, sdpa-torch2.11.0,
  trtllm-flashinfer0.7.4), or `unavailable` where every record of the family says its library or its
  kernels could not be loaded;
- <device>: the device that ran them (h200, amd-epyc), or the tier of records that did not run (compiled);
- <date>: the newest record's date.
e.g. sm_90-fa4-4.0.0b36+sdpa-torch2.11.0-h200-20261201.jsonl. Two files with different names hold different
kernels, devices or dates. The tool never reads a file's name: this is for the people who read the folder.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

# A library's short name where it differs from the kernel family it versions (fa4 is flash-attn-4 already).
LIBRARY_LABEL = {"torch": "torch", "flashinfer-python": "flashinfer", "flashinfer-cubin": "flashinfer-cubin"}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def _arch_key(arch: str) -> tuple:
    digits = re.sub(r"\D", "", arch)
    return (0, int(digits)) if digits else (1, arch)


def evidence_name(paths: list[str]) -> str:
    archs: set[str] = set()
    versions: dict[str, set[str]] = defaultdict(set)  # family -> "torch2.11.0", "4.0.0b36", "unavailable"
    devices: set[str] = set()
    dates: set[str] = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    case, prov = rec["case"], rec.get("provenance") or {}
                    fam, arch = case["backend"].split("_")[0], case["arch"]
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    raise SystemExit(f"{path}:{n}: not a result record ({e})") from None
                archs.add(arch)
                if rec.get("outcome") == "unavailable":
                    versions[fam].add("unavailable")
                else:
                    label = LIBRARY_LABEL.get(prov.get("library", ""), "")
                    version = str(prov.get("kernel_version", "unknown")).replace("+", "-")
                    versions[fam].add(("" if label == fam else label) + version)
                tier = rec.get("tier", "validated")
                devices.add(_slug(str(prov.get("device", "unknown")).replace("NVIDIA", "")) if tier == "validated"
                            else str(tier))
                dates.add(str(prov.get("date", "")).replace("-", ""))
    if not archs:
        raise SystemExit("no records in " + ", ".join(paths))
    kernels = []
    for fam, vs in sorted(versions.items()):
        if len(vs) > 1:
            vs.discard("unavailable")  # a family that ran somewhere here is named by what ran
        kernels += [f"{fam}-{v}" for v in sorted(vs)]
    return "-".join(["+".join(sorted(archs, key=_arch_key)), "+".join(kernels), "+".join(sorted(devices)),
                     max(dates) or "undated"]) + ".jsonl"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__.strip().splitlines()[2])
    print(evidence_name(sys.argv[1:]))

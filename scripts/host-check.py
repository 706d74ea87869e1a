#!/usr/bin/env python3
"""Which comparison guards an error message in a compiled extension's host code (x86-64, binutils objdump).

usage: python3 scripts/host-check.py EXTENSION.so "error message" [--json]

A CUDA extension refuses a GPU in its host code before any kernel runs, e.g. FlashAttention 2's
`TORCH_CHECK(cond, "FlashAttention only supports Ampere GPUs or newer.")`. Which GPUs pass depends on
`cond` in the build that ships, which need not be the source one reads (FA2's source has had both
`is_sm90 || is_sm8x` and `cc_major >= 8`). This finds every function that loads the message's address,
the block that throws it, and the conditional jump into that block with the comparison just before it:
`cmpl $0x7, <major>; jle <throw>` is "major >= 8", nothing more.

Prints one line per guarded site: function, comparison, jump. Needs `objdump` and `readelf` on PATH;
nothing is executed from the extension.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

ADDR = re.compile(r"^\s*([0-9a-f]+):\t(.*)$")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.+)>:$")


def section(path: str, name: str) -> tuple[int, int, int]:
    """(address, file offset, size) of an ELF section."""
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.replace("[ ", "[").split()
        if name in parts:
            i = parts.index(name)
            return int(parts[i + 2], 16), int(parts[i + 3], 16), int(parts[i + 4], 16)
    raise SystemExit(f"{path}: no {name} section")


def guards(path: str, message: str) -> list[dict]:
    ro_addr, ro_off, ro_size = section(path, ".rodata")
    with open(path, "rb") as f:
        f.seek(ro_off)
        rodata = f.read(ro_size)
    at = rodata.find(message.encode() + b"\0")
    if at < 0:
        raise SystemExit(f"{path}: the message is not in .rodata")
    target = f"{ro_addr + at:x}"
    text_addr, _, text_size = section(path, ".text")
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={text_addr}",
                          f"--stop-address={text_addr + text_size}", path],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    insns: list[tuple[str, str, str]] = []  # (address, instruction, function it belongs to)
    function = "?"
    for line in dis:
        head = FUNCTION.match(line)
        if head:
            function = head.group(1)
        elif m := ADDR.match(line):
            insns.append((m.group(1), m.group(2), function))
    by_target: dict[str, list[int]] = {}
    for i, (_, ins, _) in enumerate(insns):
        jump = re.match(r"j[a-z]+\s+([0-9a-f]+) <", ins)
        if jump:
            by_target.setdefault(jump.group(1), []).append(i)
    sites = []
    for i, (_, ins, _) in enumerate(insns):
        if f"# {target} " not in ins + " ":
            continue
        # The throw block starts where the exception object is allocated (or the check-fail call is set up):
        # walk back to the first instruction some jump lands on.
        j = i
        while j > 0 and insns[j][0] not in by_target:
            j -= 1
        for k in by_target.get(insns[j][0], []):
            sites.append({"function": insns[k][2], "compare": insns[k - 1][1].strip(),
                          "jump": insns[k][1].split("<")[0].strip(), "message_at": target})
    return sites


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("extension")
    ap.add_argument("message")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sites = guards(args.extension, args.message)
    if args.json:
        print(json.dumps(sites, indent=1))
    else:
        for s in sites:
            print(f"{s['function']}: {s['compare']} ; {s['jump']}")
    return 0 if sites else 1


if __name__ == "__main__":
    sys.exit(main())

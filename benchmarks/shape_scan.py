"""Time the backends in turns at the shapes you name, for one model layer: where the selector's order between
timed points is a guess (`explain` says which backends its timings cannot tell apart), your own shapes settle it.

    python benchmarks/shape_scan.py --backends vllm_fa3,fa2,fa4 --layer gemma-2-2b:global --op decode \\
        --batch 12 --lengths 4096:8192:256 -o scan.jsonl [--plot scan.png]        # GPU (or sdpa_cpu on a CPU)
    python benchmarks/shape_scan.py --report scan.jsonl [--plot scan.png]           # the table again, no GPU

`--layer` repeats: several layers are scanned one after the other in one process (FA4 compiles once per layer),
and `-o` is rewritten after each, so a scan cut short keeps the layers it finished.

The layer is a model preset's layer type (`attnmatrix explain --model NAME` lists them; matrix/data/models.json),
so the heads, head dims, window, softcap and sinks are the model's. Each backend is checked once against the
reference on the layer, then every point is timed as benchmarks/regret.py times the workload buckets: the
backends take turns on the same inputs, each from a CUDA graph with the L2 flushed (kernels/interleaved_timing.py).
`--batch` and `--lengths` take comma lists of integers and START:STOP:STEP ranges (STOP included); every
(batch, length) pair is a point. The table gives each point's backends fastest first with their time relative to
the fastest; a point of the workload grid (matrix/workloads.py BUCKETS) is marked `*`: between them is where the
grid cannot see.

Lines (JSON): regret.py's sweep rows with "set": "scan", each timed row without the fields its check row states
(`workloads.compact`; `workloads.load_rows` fills them back in). `-o` writes a new file or
replaces a scan file (a file of other rows is refused, untouched), atomically: a killed scan leaves the old one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnmatrix.matrix import workloads as W  # noqa: E402
from workload_timing import time_workload  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def axis(text: str) -> list[int]:
    """A comma list of integers and START:STOP:STEP ranges (STOP included), e.g. `1,2,4` or `1:40:1,44:96:4`, as a
    list of positive integers in that order."""
    values: list[int] = []
    try:
        for part in text.split(","):
            if ":" in part:
                start, stop, step = (int(x) for x in part.split(":"))
                if step < 1 or stop < start:
                    raise ValueError
                values += range(start, stop + 1, step)
            else:
                values.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of integers and START:STOP:STEP ranges "
                                         "(STOP >= START, STEP >= 1)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be at least 1")
    return values


def find_layer(name: str, presets: str | None) -> W.Layer:
    layers = {ly.name: ly for ly in W.load_presets(presets if presets else W.DEFAULT_MODELS)}
    if name not in layers:
        raise SystemExit(f"--layer {name}: no such preset layer; known: {', '.join(sorted(layers))}")
    return layers[name]


def read_scan(path: str) -> list[dict]:
    """The rows of a scan file (read as sweep files are, `workloads.load_rows`); a file that is not one is refused."""
    try:
        rows = W.load_rows([Path(path)])
    except OSError as e:
        raise SystemExit(f"{path}: cannot read ({e.strerror})") from None
    except W.PresetError as e:
        raise SystemExit(str(e)) from None
    other = sorted({str(r["set"]) for r in rows} - {"check", "scan"})
    if other:
        raise SystemExit(f"{path}: not a scan file (it holds {', '.join(other)} rows)")
    return rows


def replace_atomically(path: str, write) -> None:
    """`write(tmp)` into a temporary file beside `path`, then put it in `path`'s place in one step."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def scan(args: argparse.Namespace) -> list[dict]:
    """Time every point for each --layer in turn, in one process (FA4 compiles each layer's kernels once). With -o,
    the file is replaced after each layer with every row so far: a killed scan keeps the layers it finished."""
    layers = [find_layer(name, args.presets) for name in args.layer]
    for layer in layers:
        if args.op not in layer.ops():
            raise SystemExit(f"--op {args.op}: {layer.name} runs {', '.join(layer.ops())}")
    if args.output and os.path.exists(args.output):
        read_scan(args.output)  # only a scan file is replaced
    from attnmatrix.kernels.base import load_device_backends

    backends, device, arch, device_name = load_device_backends(args.backends)
    points = [(b, n) for b in args.batch for n in args.lengths]
    rows: list[dict] = []
    status = 0
    for i, layer in enumerate(layers, 1):
        t0 = time.monotonic()
        status = time_workload(backends, layer, args.op, [layer.name], arch, device, device_name, rows.append,
                               argparse.Namespace(warm_only=False, rounds=args.rounds, dtype=args.dtype),
                               points=(("scan", points),)) or status
        print(f"[{i}/{len(layers)}] {layer.name}: {len(points)} points in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)
        if args.output:
            text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in compacted(rows))
            replace_atomically(args.output, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
    if status:
        raise SystemExit(status)
    return rows


def compacted(rows: list[dict]) -> list[dict]:
    """The rows as a file holds them: each timed row without what its check row (the one before it) states."""
    checks: dict[tuple, dict] = {}
    out = []
    for r in rows:
        key = (r.get("backend"), r.get("layer"), r.get("op"))
        if r.get("set") == "check":
            checks[key] = r
        out.append(W.compact(r, checks.get(key)))
    return out


def table(rows: list[dict]) -> list[str]:
    """One line per point: its backends fastest first, each with its time relative to the fastest (a scan of
    several layers: each point's layer first)."""
    passed = {(r["backend"], r["layer"]) for r in rows if r.get("set") == "check" and r.get("outcome") == "pass"}
    at: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("set") == "scan" and r.get("outcome") == "pass" and (r["backend"], r["layer"]) in passed:
            at.setdefault((r["layer"], r["op"], r["batch"], r["length"]), {})[r["backend"]] = r["ms"]
    several = len({k[0] for k in at}) > 1
    lines = []
    for (layer, op, batch, length), times in sorted(at.items()):
        best = min(times.values())
        order = "  ".join(f"{b} {t * 1e3:.1f} us (x{t / best:.2f})" for b, t in sorted(times.items(),
                                                                                       key=lambda x: (x[1], x[0])))
        grid = "*" if (batch, length) in W.BUCKETS.get(op, ()) else " "
        lines.append(f"{grid} {f'{layer:24} ' if several else ''}b{batch:<4} {'kv' if op == 'decode' else 's'}"
                     f"{length:<7} {order}")
    return lines


def plot(rows: list[dict], path: str) -> None:
    """Each backend's time against the length (one line per batch), the workload grid's lengths dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passed = {r["backend"] for r in rows if r.get("set") == "check" and r.get("outcome") == "pass"}
    timed = [r for r in rows if r.get("set") == "scan" and r.get("outcome") == "pass" and r["backend"] in passed]
    if not timed:
        raise SystemExit("--plot: no timed point to plot")
    if len({r["layer"] for r in timed}) > 1:
        raise SystemExit("--plot: one layer's scan at a time (this one holds several)")
    op = timed[0]["op"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for backend in sorted({r["backend"] for r in timed}):
        for batch in sorted({r["batch"] for r in timed}):
            pts = sorted((r["length"], r["ms"] * 1e3) for r in timed if r["backend"] == backend and r["batch"] == batch)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".", label=f"{backend} b{batch}")
    lengths = [r["length"] for r in timed]
    for n in sorted({n for _, n in W.BUCKETS.get(op, ())}):
        if min(lengths) <= n <= max(lengths):
            ax.axvline(n, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("context length (tokens)" if op == "decode" else "tokens per sequence")
    ax.set_ylabel("time per call (us)")
    ax.set_title(f"{timed[0]['layer']} {op} on {timed[0].get('device', '?')} (dotted: workload grid)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    replace_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None}))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", help="comma-separated, timed in turns at every point")
    ap.add_argument("--layer", action="append", help="a preset layer, MODEL:LAYER (e.g. gemma-2-2b:global); "
                    "repeat it to scan several layers in one process, one after the other")
    ap.add_argument("--op", choices=sorted(W.BUCKETS), help="the layer's op to time")
    ap.add_argument("--batch", type=axis, default=[1],
                    help="batch sizes: 1,2,4 or START:STOP:STEP, or both: 1:40:1,44:96:4 (default 1)")
    ap.add_argument("--lengths", type=axis, help="tokens per sequence (prefill) or context (decode), as --batch")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="(default bfloat16)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of turns per point (default 6)")
    ap.add_argument("--presets", help="models file (default matrix/data/models.json)")
    ap.add_argument("-o", "--output", help="JSON Lines of the scan (overwritten)")
    ap.add_argument("--report", metavar="FILE", help="print the table of a scan file instead of timing")
    ap.add_argument("--plot", metavar="PNG", help="also plot each backend's time against the length")
    args = ap.parse_args(argv)
    if args.plot and os.path.exists(args.plot) and Path(args.plot).read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        ap.error(f"--plot {args.plot}: exists and is not a PNG; left untouched")
    if args.report:
        rows = read_scan(args.report)
    else:
        missing = [f"--{n}" for n in ("backends", "layer", "op", "lengths") if not getattr(args, n)]
        if missing:
            ap.error(f"to time a scan, give {', '.join(missing)} (or --report FILE)")
        if args.rounds < 2:
            ap.error("--rounds must be at least 2")
        rows = scan(args)
    print("\n".join(table(rows)))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Performance plots, from the resolved matrix alone: per arch, SVG bar charts of the measured cells.

Which cells: supported, `validated` cells (not of test-only backends) whose winning record was timed.
Two panels per arch, one per workload (`PANELS`), in the unit people compare for it:

- causal bfloat16 prefill, compute-bound: TFLOP/s (`ResolvedCell.tflops`, the median over the timed shapes,
  counting only unmasked work), and as a percentage of the bf16 matmul peak of the device model that timed
  it: the highest `provenance["matmul_peak_tflops"]` any of the matrix's measured cells on that device
  recorded (a peak is the device's ceiling, not a run's: each sweep measures it afresh, and a run whose clocks
  or operands held it lower would otherwise read as its cells running nearer the ceiling);
- causal bfloat16 decode (one query token), memory-bound: GB/s of KV cache read (per timed shape, the K and V
  bytes of that shape, `attnmatrix.matrix.shapes`, over its latency; the median over the shapes), and as a
  percentage of the device's HBM bandwidth where matrix/data/gpus.json cites one (`generator.gpus`).

`site/plots/<arch>-tflops.svg` holds the absolute figures, `site/plots/<arch>-peak.svg` the percentages (when
some cell has a recorded peak or a cited bandwidth). Each panel names its timed shapes; each backend has a
colour of the Okabe-Ito palette (safe for colour-blind readers) and a marker on its bars.

An arch without measured cells gets no plot (the pages say so), and without any measurement anywhere
matplotlib is not even imported.

Determinism: the SVG text must be byte-identical for the same matrix (so `attnmatrix check` can compare it).
The figure is built without pyplot (no global backend or state), under matplotlib's built-in defaults (a
user's matplotlibrc or style is ignored) plus `RC` below: a fixed `svg.hashsalt`, text kept as text
(`svg.fonttype: none`, so no glyph outlines from whatever font files are installed), no date or creator in
the metadata, fixed figure size and margins (no `tight` bounding boxes that depend on text extents), and
every input sorted. The bytes can still change with the matplotlib version, which the header records.
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

from attnmatrix.matrix.policy import SUPPORTED, ResolvedCell, ResolvedMatrix, arch_sort_key
from attnmatrix.matrix.shapes import timing_shape

from . import tables as T
from .gpus import load_gpus

PLOT_DIR = "site/plots"
KINDS = ("tflops", "peak")
PEAK_FIELD = "matmul_peak_tflops"


@dataclass(frozen=True)
class Panel:
    op: str
    dtype: str
    features: tuple[str, ...]
    title: str  # above the panel
    prose: str  # in the pages' text
    unit: str  # the absolute figure's axis label
    fraction: str  # the percentage's axis label


PANELS = (
    Panel("prefill", "bfloat16", ("causal",), "prefill, causal, bfloat16", "causal bfloat16 prefill",
          "TFLOP/s", "% of measured matmul peak"),
    Panel("decode", "bfloat16", ("causal",), "decode (one query token), causal, bfloat16", "causal bfloat16 decode",
          "GB/s of KV cache read", "% of HBM bandwidth"),
)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}

# One colour per backend by its place in the backend order (the same backend has the same colour on every arch
# of one matrix): the Okabe-Ito palette, distinguishable with the common colour-vision deficiencies, and a marker
# per backend on top of each bar; 8 colours and 7 markers give 56 distinct pairs.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LABELLED_BARS = 40  # a panel with more bars than this gets no value labels (they would overlap)
FIGSIZE = (10.0, 7.5)  # inches; 720 x 540 pt in the SVG
RC = {
    "svg.hashsalt": "attnmatrix",
    "svg.fonttype": "none",
    "svg.image_inline": True,
    "font.family": "DejaVu Sans",  # bundled with matplotlib: the same metrics everywhere
    "font.size": 10.0,
    "axes.titlesize": 11.0,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "axes.axisbelow": True,
    "grid.alpha": 0.4,
    "legend.frameon": False,
    "path.simplify": False,
}
SVG_METADATA = {"Date": None, "Creator": None}


@dataclass(frozen=True)
class Point:
    backend: str
    head_dim: int
    head_dim_v: int
    value: float  # prefill: TFLOP/s; decode: GB/s of KV cache read
    fraction: float | None  # of the device's matmul peak (prefill) or cited HBM bandwidth (decode), if known
    device: str
    shapes: tuple[str, ...] = ()  # the timed shapes behind the figure

    @property
    def tflops(self) -> float:
        return self.value

    @property
    def peak_fraction(self) -> float | None:
        return self.fraction


@dataclass(frozen=True)
class ArchPlots:
    """What one arch's plots show, and the repo-relative paths of the files (None: not produced)."""

    arch: str
    backends: tuple[str, ...]  # in backend order
    devices: tuple[str, ...]
    panels: tuple[tuple[Panel, tuple[Point, ...]], ...]
    tflops_path: str
    peak_path: str | None
    peaks: tuple[tuple[str, float], ...] = ()  # (device, the matmul peak its fractions divide by)
    bandwidths: tuple[tuple[str, float, str], ...] = ()  # (device, cited HBM GB/s, its source) decode divides by

    @property
    def tflops_file(self) -> str:
        """The file name, for links relative to site/plots."""
        return self.tflops_path.rsplit("/", 1)[1]

    @property
    def peak_file(self) -> str | None:
        return None if self.peak_path is None else self.peak_path.rsplit("/", 1)[1]

    @property
    def peak_exceeded(self) -> bool:
        """Some cell ran faster than the recorded matmul peak: that peak is then an underestimate."""
        return any((pt.fraction or 0) > 1.0 for p, pts in self.panels if p.op != "decode" for pt in pts)

    def shapes(self, panel: Panel) -> tuple[str, ...]:
        """The timed shapes of a panel's points, described (`b64_kv4096: batch 64 x 4096 keys, 32 heads`)."""
        pts = dict(self.panels).get(panel, ())
        names = sorted({n for pt in pts for n in pt.shapes})
        return tuple(s.describe() if (s := timing_shape(self.arch == "cpu", panel.op, n)) else n for n in names)


def _peak(cell: ResolvedCell) -> float | None:
    raw = cell.timed_by.provenance.get(PEAK_FIELD) if cell.timed_by else None
    try:
        peak = float(raw)  # recorded as a string, e.g. "741.3"
    except (TypeError, ValueError):
        return None
    return peak if math.isfinite(peak) and peak > 0 else None


def is_measured(cell: ResolvedCell) -> bool:
    t = cell.tflops
    return cell.status == SUPPORTED and cell.tier == "validated" and t is not None and math.isfinite(t)


def kv_read_gbps(cell: ResolvedCell) -> float | None:
    """Decode's GB/s of KV cache read: per timed shape, batch x keys x KV heads x (D + Dv) x bytes per element
    over its latency; the median over the shapes whose sizes `attnmatrix.matrix.shapes` knows. None if none."""
    per = []
    for t in cell.timings:
        shape = timing_shape(cell.case.arch == "cpu", cell.case.op, t.shape)
        if shape is None or not t.latency_ms or t.latency_ms <= 0:
            continue
        kv_bytes = (shape.batch * shape.seqlen_k * shape.heads_kv * (cell.case.head_dim + cell.case.head_dim_v)
                    * DTYPE_BYTES[cell.case.dtype])
        per.append(kv_bytes / (t.latency_ms * 1e-3) / 1e9)
    return statistics.median(per) if per else None


def _device(cell: ResolvedCell) -> str:
    return str(cell.timed_by.provenance.get("device", "")) if cell.timed_by else ""


def device_peaks(m: ResolvedMatrix) -> dict[str, float]:
    """Device model -> the highest matmul peak its measured cells recorded (see the module docstring)."""
    peaks: dict[str, float] = {}
    for c in T.public_cells(m):
        peak = _peak(c) if is_measured(c) else None
        if peak is not None and _device(c):
            peaks[_device(c)] = max(peak, peaks.get(_device(c), 0.0))
    return peaks


def _point(cell: ResolvedCell, peaks: dict[str, float]) -> Point | None:
    shapes = tuple(sorted(t.shape for t in cell.timings))
    if cell.case.op == "decode":
        gbps = kv_read_gbps(cell)
        if gbps is None:
            return None
        bw = load_gpus().devices.get(_device(cell))
        return Point(cell.case.backend, cell.case.head_dim, cell.case.head_dim_v, gbps,
                     None if bw is None else gbps / bw.gbps, _device(cell), shapes)
    t = float(cell.tflops)  # type: ignore[arg-type]
    peak = peaks.get(_device(cell))
    return Point(cell.case.backend, cell.case.head_dim, cell.case.head_dim_v, t,
                 None if peak is None else t / peak, _device(cell), shapes)


def plot_index(m: ResolvedMatrix) -> dict[str, ArchPlots]:
    """arch -> its plots, for every arch with measured cells in at least one panel (cheap: no matplotlib)."""
    per: dict[str, dict[Panel, list[Point]]] = defaultdict(lambda: defaultdict(list))
    peaks = device_peaks(m)
    bandwidths = load_gpus().devices
    for c in T.public_cells(m):  # case order
        if not is_measured(c):
            continue
        for p in PANELS:
            if (c.case.op, c.case.dtype, c.case.features) == (p.op, p.dtype, p.features):
                pt = _point(c, peaks)
                if pt is not None:
                    per[c.case.arch][p].append(pt)
    out = {}
    for arch in sorted(per, key=arch_sort_key):
        panels = tuple((p, tuple(sorted(per[arch].get(p, []), key=_point_key))) for p in PANELS)
        points = [pt for _, pts in panels for pt in pts]
        backends = tuple(sorted({pt.backend for pt in points}, key=lambda b: T.backend_order_key(m, b, arch)))
        has_fraction = any(pt.fraction is not None for pt in points)
        devices = {pt.device for pt in points}
        decode_devices = {pt.device for p, pts in panels if p.op == "decode" for pt in pts}
        out[arch] = ArchPlots(arch, backends, tuple(sorted(d for d in devices if d)), panels,
                              f"{PLOT_DIR}/{arch}-tflops.svg", f"{PLOT_DIR}/{arch}-peak.svg" if has_fraction else None,
                              tuple((d, peaks[d]) for d in sorted(devices & peaks.keys())),
                              tuple((d, bandwidths[d].gbps, bandwidths[d].source)
                                    for d in sorted(decode_devices & bandwidths.keys())))
    return out


def _point_key(pt: Point) -> tuple:
    return (pt.head_dim != pt.head_dim_v, pt.head_dim, pt.head_dim_v, pt.backend)


def _backend_order(m: ResolvedMatrix) -> list[str]:
    public = sorted((b for b in m.backends if not T.is_test_only(m, b)), key=lambda b: T.backend_order_key(m, b))
    extra = sorted({c.case.backend for c in T.public_cells(m)} - set(public))
    return [*public, *extra]


def backend_colors(m: ResolvedMatrix) -> dict[str, str]:
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(_backend_order(m))}


def backend_markers(m: ResolvedMatrix) -> dict[str, str]:
    return {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(_backend_order(m))}


# --- drawing ----------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")


def plain(text: str, limit: int = 160) -> str:
    """Free text (device names) as a literal label: no control characters (invalid in XML), no mathtext."""
    s = _UNSAFE.sub("?", str(text)).replace("\r", " ").replace("\n", " ")
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return s.replace("$", r"\$")


def _dims(hd: int, hdv: int) -> str:
    return str(hd) if hd == hdv else f"{hd}×{hdv}"


def _value(pt: Point, kind: str) -> float | None:
    if kind == "tflops":
        return pt.value
    return None if pt.fraction is None else 100.0 * pt.fraction


def _draw_panel(ax, panel: Panel, points: tuple[Point, ...], kind: str, backends: tuple[str, ...],
                colors: dict[str, str], markers: dict[str, str], shapes: tuple[str, ...]) -> None:
    vals = [(pt, v) for pt in points if (v := _value(pt, kind)) is not None]
    ax.set_title(panel.title, loc="left", pad=14 if vals and shapes else 6)
    if not vals:
        ax.text(0.5, 0.5, "not measured on this arch" if kind == "tflops" else
                ("no measurement with a recorded matmul peak" if panel.op != "decode" else
                 "no measurement on a device with a cited HBM bandwidth"),
                transform=ax.transAxes, ha="center", va="center", color="#555555")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        return
    if shapes:  # the timed shapes behind every bar, named under the panel's title
        ax.text(0.0, 1.015, plain("timed: " + "; ".join(shapes), 240), transform=ax.transAxes, ha="left",
                va="bottom", fontsize=7, color="#444444")
    dims = sorted({(pt.head_dim, pt.head_dim_v) for pt, _ in vals}, key=lambda d: (d[0] != d[1], d))
    here = [b for b in backends if any(pt.backend == b for pt, _ in vals)]
    width = 0.8 / len(here)
    for i, b in enumerate(here):
        xs, ys = [], []
        for pt, v in vals:
            if pt.backend == b:
                xs.append(dims.index((pt.head_dim, pt.head_dim_v)) - 0.4 + width * (i + 0.5))
                ys.append(v)
        bars = ax.bar(xs, ys, width=width * 0.92, color=colors[b], edgecolor="#222222", linewidth=0.4, label=b)
        ax.plot(xs, ys, linestyle="none", marker=markers[b], markersize=5, color=colors[b],
                markeredgecolor="#222222", markeredgewidth=0.6)
        if len(vals) <= LABELLED_BARS:
            ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], padding=4, fontsize=7, rotation=90)
    ax.set_xticks(range(len(dims)), [_dims(*d) for d in dims])
    ax.set_xlim(-0.6, len(dims) - 0.4)
    ax.set_xlabel("head size (D, or D×Dv)")
    ax.set_ylabel(panel.unit if kind == "tflops" else panel.fraction)
    top = max(v for _, v in vals)
    ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)


def render_svg(ap: ArchPlots, kind: str, colors: dict[str, str], markers: dict[str, str] | None = None) -> str:
    """One arch's plot as SVG text (without the attnmatrix header)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    markers = markers or {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(colors)}
    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # matplotlib's built-in defaults, whatever the user's matplotlibrc says
        matplotlib.rcParams.update(RC)
        fig = Figure(figsize=FIGSIZE)
        axes = fig.subplots(len(PANELS), 1)
        fig.subplots_adjust(left=0.08, right=0.80, top=0.84, bottom=0.08, hspace=0.6)
        what = ("prefill TFLOP/s, decode GB/s of KV cache read" if kind == "tflops"
                else "prefill % of matmul peak, decode % of HBM bandwidth")
        fig.suptitle(f"{ap.arch}: {what}", x=0.08, y=0.975, ha="left", fontsize=13)
        on = ", ".join(ap.devices) or "no device recorded"
        fig.text(0.08, 0.915, plain(f"validated cells, median over the timed shapes; measured on {on}"),
                 ha="left", va="center", color="#444444")
        for ax, (panel, points) in zip(axes, ap.panels, strict=True):
            _draw_panel(ax, panel, points, kind, ap.backends, colors, markers, ap.shapes(panel))
        shown = {pt.backend for _, pts in ap.panels for pt in pts if _value(pt, kind) is not None}
        handles = [Line2D([], [], color=colors[b], linewidth=6, marker=markers[b], markersize=6,
                          markeredgecolor="#222222", label=b) for b in ap.backends if b in shown]
        fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.81, 0.84), title="backend")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=SVG_METADATA)
    # no trailing blanks (matplotlib ends path lines with one): whitespace fixers must not make the file stale
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def matplotlib_version() -> str:
    import matplotlib

    return matplotlib.__version__


def with_header(svg: str, header: str) -> str:
    """Put the generated-file header (an XML comment) right after the XML declaration."""
    first, nl, rest = svg.partition("\n")
    if not first.startswith("<?xml"):
        return header + svg
    return first + nl + header + rest


def render_plots(m: ResolvedMatrix, header: str) -> dict[str, str]:
    """{repo-relative path: SVG text} for every arch with measured cells; {} (and no matplotlib) otherwise.

    `header` is the generated-file comment (`<!-- ... -->` lines) to put at the top of each file."""
    index = plot_index(m)
    if not index:
        return {}
    try:
        version = matplotlib_version()
    except ImportError as e:
        raise RuntimeError("the matrix has measured cells, and their performance plots need matplotlib: "
                           "pip install 'attnmatrix[docs]'") from e
    colors = backend_colors(m)
    markers = backend_markers(m)
    head = header + f"<!-- Rendered with matplotlib {version}; other versions may give other bytes. -->\n"
    out = {}
    for ap in index.values():
        out[ap.tflops_path] = with_header(render_svg(ap, "tflops", colors, markers), head)
        if ap.peak_path is not None:
            out[ap.peak_path] = with_header(render_svg(ap, "peak", colors, markers), head)
    return out

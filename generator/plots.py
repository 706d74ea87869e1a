"""Performance plots, from the resolved matrix alone: per arch, SVG bar charts of the measured cells.

Which cells: supported, `validated` cells (not of test-only backends) whose winning record was timed and
carries TFLOP/s (`ResolvedCell.tflops`, the median over the timed shapes, counting only unmasked work).
Two panels per arch, one per workload (`PANELS`): causal bfloat16 prefill and causal bfloat16 decode, one bar
per backend and head size. Per arch:

- `site/plots/<arch>-tflops.svg`: TFLOP/s;
- `site/plots/<arch>-peak.svg`: the same as a percentage of the bf16 matmul peak of the device model that
  timed each cell: the highest `provenance["matmul_peak_tflops"]` any of the matrix's measured cells on that
  device recorded. A peak is the device's ceiling, not a run's: each sweep measures it afresh
  (`kernels.timing.matmul_peak`), and a run whose clocks or operands held it lower would otherwise read
  as its cells running nearer the ceiling. A device with no recorded peak is left out; an arch where
  none has one gets no such plot.

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
from collections import defaultdict
from dataclasses import dataclass

from attnmatrix.matrix.policy import SUPPORTED, ResolvedCell, ResolvedMatrix, arch_sort_key

from . import tables as T

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


PANELS = (
    Panel("prefill", "bfloat16", ("causal",), "prefill, causal, bfloat16", "causal bfloat16 prefill"),
    Panel("decode", "bfloat16", ("causal",), "decode (one query token), causal, bfloat16", "causal bfloat16 decode"),
)

# Fixed colours, one per backend by its place in the backend order (the same backend has the same colour on
# every arch of one matrix). Matplotlib's tab10 followed by a few darker ones.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
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
    tflops: float
    peak_fraction: float | None  # tflops / the device model's measured matmul peak, if any was recorded
    device: str


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
        return any((pt.peak_fraction or 0) > 1.0 for _, pts in self.panels for pt in pts)


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


def _point(cell: ResolvedCell, peaks: dict[str, float]) -> Point:
    t = float(cell.tflops)  # type: ignore[arg-type]
    peak = peaks.get(_device(cell))
    return Point(cell.case.backend, cell.case.head_dim, cell.case.head_dim_v, t,
                 None if peak is None else t / peak, _device(cell))


def plot_index(m: ResolvedMatrix) -> dict[str, ArchPlots]:
    """arch -> its plots, for every arch with measured cells in at least one panel (cheap: no matplotlib)."""
    per: dict[str, dict[Panel, list[Point]]] = defaultdict(lambda: defaultdict(list))
    peaks = device_peaks(m)
    for c in T.public_cells(m):  # case order
        if not is_measured(c):
            continue
        for p in PANELS:
            if (c.case.op, c.case.dtype, c.case.features) == (p.op, p.dtype, p.features):
                per[c.case.arch][p].append(_point(c, peaks))
    out = {}
    for arch in sorted(per, key=arch_sort_key):
        panels = tuple((p, tuple(sorted(per[arch].get(p, []), key=_point_key))) for p in PANELS)
        points = [pt for _, pts in panels for pt in pts]
        backends = tuple(sorted({pt.backend for pt in points}, key=lambda b: T.backend_order_key(m, b, arch)))
        has_peak = any(pt.peak_fraction is not None for pt in points)
        out[arch] = ArchPlots(arch, backends, tuple(sorted({pt.device for pt in points if pt.device})), panels,
                              f"{PLOT_DIR}/{arch}-tflops.svg", f"{PLOT_DIR}/{arch}-peak.svg" if has_peak else None,
                              tuple((d, peaks[d]) for d in sorted({pt.device for pt in points} & peaks.keys())))
    return out


def _point_key(pt: Point) -> tuple:
    return (pt.head_dim != pt.head_dim_v, pt.head_dim, pt.head_dim_v, pt.backend)


def backend_colors(m: ResolvedMatrix) -> dict[str, str]:
    public = sorted((b for b in m.backends if not T.is_test_only(m, b)), key=lambda b: T.backend_order_key(m, b))
    extra = sorted({c.case.backend for c in T.public_cells(m)} - set(public))
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate([*public, *extra])}


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
        return pt.tflops
    return None if pt.peak_fraction is None else 100.0 * pt.peak_fraction


def _draw_panel(ax, panel: Panel, points: tuple[Point, ...], kind: str, backends: tuple[str, ...],
                colors: dict[str, str]) -> None:
    vals = [(pt, v) for pt in points if (v := _value(pt, kind)) is not None]
    ax.set_title(panel.title, loc="left")
    if not vals:
        ax.text(0.5, 0.5, "not measured on this arch" if kind == "tflops" else
                "no measurement with a recorded matmul peak", transform=ax.transAxes, ha="center", va="center",
                color="#555555")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        return
    dims = sorted({(pt.head_dim, pt.head_dim_v) for pt, _ in vals}, key=lambda d: (d[0] != d[1], d))
    here = [b for b in backends if any(pt.backend == b for pt, _ in vals)]
    width = 0.8 / len(here)
    for i, b in enumerate(here):
        xs, ys = [], []
        for pt, v in vals:
            if pt.backend == b:
                xs.append(dims.index((pt.head_dim, pt.head_dim_v)) - 0.4 + width * (i + 0.5))
                ys.append(v)
        bars = ax.bar(xs, ys, width=width * 0.92, color=colors[b], label=b)
        if len(vals) <= LABELLED_BARS:
            ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], padding=2, fontsize=7, rotation=90)
    ax.set_xticks(range(len(dims)), [_dims(*d) for d in dims])
    ax.set_xlim(-0.6, len(dims) - 0.4)
    ax.set_xlabel("head size (D, or D×Dv)")
    ax.set_ylabel("TFLOP/s" if kind == "tflops" else "% of measured matmul peak")
    top = max(v for _, v in vals)
    ax.set_ylim(0, top * 1.25 if top > 0 else 1.0)


def render_svg(ap: ArchPlots, kind: str, colors: dict[str, str]) -> str:
    """One arch's plot as SVG text (without the attnmatrix header)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # matplotlib's built-in defaults, whatever the user's matplotlibrc says
        matplotlib.rcParams.update(RC)
        fig = Figure(figsize=FIGSIZE)
        axes = fig.subplots(len(PANELS), 1)
        fig.subplots_adjust(left=0.08, right=0.80, top=0.86, bottom=0.08, hspace=0.45)
        what = ("TFLOP/s by backend and head size" if kind == "tflops"
                else "TFLOP/s as % of the measured bf16 matmul peak")
        fig.suptitle(f"{ap.arch}: {what}", x=0.08, y=0.975, ha="left", fontsize=13)
        on = ", ".join(ap.devices) or "no device recorded"
        fig.text(0.08, 0.915, plain(f"validated cells, median over the timed shapes; measured on {on}"),
                 ha="left", va="center", color="#444444")
        for ax, (panel, points) in zip(axes, ap.panels, strict=True):
            _draw_panel(ax, panel, points, kind, ap.backends, colors)
        shown = {pt.backend for _, pts in ap.panels for pt in pts if _value(pt, kind) is not None}
        handles = [Patch(facecolor=colors[b], label=b) for b in ap.backends if b in shown]
        fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.81, 0.86), title="backend")
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
    head = header + f"<!-- Rendered with matplotlib {version}; other versions may give other bytes. -->\n"
    out = {}
    for ap in index.values():
        out[ap.tflops_path] = with_header(render_svg(ap, "tflops", colors), head)
        if ap.peak_path is not None:
            out[ap.peak_path] = with_header(render_svg(ap, "peak", colors), head)
    return out

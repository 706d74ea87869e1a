"""Performance plots and the changelog page: what they show, where they are embedded, and byte-identical output."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from attnmatrix.generator import plots as P
from attnmatrix.generator import render_all
from attnmatrix.generator.render import CHANGELOG_PATH, render_changelog
from attnmatrix.matrix.evidence import Evidence, load_backends
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.shapes import CPU_TIMING_SHAPES, TIMING_SHAPES

# find_spec, not importorskip: one test checks that matplotlib is not imported when nothing is measured
pytestmark = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                reason="matplotlib is not installed (pip install 'attnmatrix[docs]')")

META = {"matrix_id": "plots0123abc", "kernel_versions": {"fa4": ["4.0.0b36"], "fa2": ["2.8.3.post2"],
                                                        "sdpa_cpu": ["2.13.0+cpu"]},
        "files": ["matrix/data/results/test.jsonl"]}
H200 = {"device": "NVIDIA H200", "matmul_peak_tflops": "741.3"}


def rec(arch, backend, op="prefill", hd=128, hdv=None, feats=("causal",), outcome="pass", tflops=None, *,
        tier="validated", prov=None, version="4.0.0b36", dtype="bfloat16"):
    """A valid record; `tflops` (a number or a list, one per timed shape) makes it timed."""
    d = {"schema": 1, "outcome": outcome, "tier": tier,
         "case": {"arch": arch, "backend": backend, "op": op, "dtype": dtype, "head_dim": hd,
                  "head_dim_v": hd if hdv is None else hdv, "features": list(feats)}}
    if tier == "declared":
        d["provenance"] = {"date": "2026-11-01"}
        d["sources"] = ["test: a cited source"]
    else:
        d["provenance"] = {"device": "AMD EPYC" if arch == "cpu" else "NVIDIA H200", "kernel_version": version,
                           "torch": "2.13.0", "date": "2026-11-30", "library": "lib", **(prov or {})}
    if outcome == "pass" and tier == "validated":
        d["error"] = {"max_abs_err": 0.002}
    elif outcome != "pass":
        d["reason"] = f"{backend} refused head size {hd}"
    if tflops is not None:
        vals = tflops if isinstance(tflops, list) else [tflops]
        shapes = (CPU_TIMING_SHAPES if arch == "cpu" else TIMING_SHAPES)[op]  # real names: decode's GB/s needs sizes
        d["timings"] = [{"shape": shapes[i % len(shapes)].name, "latency_ms": 1.0 + i, "tflops": t}
                        for i, t in enumerate(vals)]
    return parse_record(d)


def measured_records():
    """GPU cells with a recorded matmul peak, CPU cells without, and cells that must not be plotted."""
    out = []
    for i, (b, base) in enumerate((("fa4", 500.0), ("fa2", 300.0), ("sdpa_cudnn", 420.0))):
        for hd, hdv in ((64, 64), (128, 128), (256, 256), (192, 128)):
            out.append(rec("sm_90", b, hd=hd, hdv=hdv, tflops=[base + hd, base + hd + 10 + i, base], prov=H200))
            out.append(rec("sm_90", b, "decode", hd=hd, hdv=hdv, tflops=base / 40 + hd / 64, prov=H200))
    out += [
        rec("sm_90", "fa4", hd=512, outcome="rejected"),  # unsupported: not plotted
        rec("sm_90", "sdpa_flash", hd=128, tier="declared"),  # declared: not plotted
        rec("sm_90", "sdpa_efficient", hd=128, feats=("causal", "softcap"), tflops=99.0, prov=H200),  # other feats
        rec("sm_90", "sdpa_efficient", hd=128, dtype="float16", tflops=98.0, prov=H200),  # other dtype
        rec("sm_90", "fake_nan", hd=128, tflops=1234.0, prov=H200),  # test-only backend
        rec("sm_100", "fa4", hd=128, tier="compiled", outcome="compiled"),  # no measurement on sm_100
        rec("sm_90", "sdpa_efficient", hd=64, tflops=150.0, prov={"device": "NVIDIA H100 80GB HBM3"}),  # no peak
    ]
    for hd in (64, 128):
        out.append(rec("cpu", "sdpa_cpu", hd=hd, tflops=0.002 * hd / 64, version="2.13.0+cpu"))
        out.append(rec("cpu", "sdpa_cpu", "decode", hd=hd, tflops=0.0005, version="2.13.0+cpu"))
    return out


def make_matrix(records=None):
    records = measured_records() if records is None else records
    return resolve(Evidence(records=list(records), where=["test.jsonl:1"] * len(records), backends=load_backends()))


def unmeasured_records():
    return [r for r in measured_records() if not r.timings]


# --- what is plotted ------------------------------------------------------------------------------

def test_plot_index_selects_validated_timed_cells_per_arch():
    idx = P.plot_index(make_matrix())
    assert list(idx) == ["sm_90", "cpu"]  # sm_100 has no measurement
    sm90 = idx["sm_90"]
    assert sm90.backends == ("fa4", "fa2", "sdpa_cudnn", "sdpa_efficient")  # backend order; no test-only fake
    assert sm90.tflops_path == "site/plots/sm_90-tflops.svg" and sm90.peak_path == "site/plots/sm_90-peak.svg"
    (prefill, pre_pts), (decode, dec_pts) = sm90.panels
    assert (prefill.op, decode.op) == ("prefill", "decode")
    assert len(pre_pts) == 3 * 4 + 1 and len(dec_pts) == 3 * 4
    fa4_128 = next(p for p in pre_pts if (p.backend, p.head_dim) == ("fa4", 128))
    assert fa4_128.tflops == 500.0 + 128  # the median of the timed shapes
    assert fa4_128.peak_fraction == pytest.approx(628.0 / 741.3)
    no_peak = next(p for p in pre_pts if p.backend == "sdpa_efficient")
    assert no_peak.tflops == 150.0 and no_peak.peak_fraction is None
    assert sm90.devices == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    # decode in GB/s of KV cache read: b64_kv4096 (64 x 4096 keys x 32 KV heads x (128 + 128) x 2 bytes) in 1 ms,
    # and as a fraction of the H200's cited 4.8 TB/s
    fa4_dec = next(p for p in dec_pts if (p.backend, p.head_dim) == ("fa4", 128))
    assert fa4_dec.value == pytest.approx(64 * 4096 * 32 * 256 * 2 / 1e-3 / 1e9)
    assert fa4_dec.fraction == pytest.approx(fa4_dec.value / 4800) and fa4_dec.shapes == ("b64_kv4096",)
    assert sm90.bandwidths == (("NVIDIA H200", 4800.0, "https://www.nvidia.com/en-us/data-center/h200/"),)
    assert sm90.shapes(decode) == ("b64_kv4096: batch 64 x 4096 keys, 32 heads",)
    cpu = idx["cpu"]
    assert cpu.backends == ("sdpa_cpu",) and cpu.peak_path is None  # CPU sweeps record no matmul peak
    # the CPU's decode is plotted from its shapes and latencies, whatever its rounded TFLOP/s
    (_, cpu_dec), = [(p, pts) for p, pts in cpu.panels if p.op == "decode"]
    assert [round(pt.value, 2) for pt in cpu_dec] == [round(8 * 1024 * 4 * d * 2 / 1e-3 / 1e9, 2) for d in (128, 256)]


def test_render_all_writes_one_svg_per_arch_and_kind():
    out = render_all(make_matrix(), META)
    svgs = sorted(p for p in out if p.startswith("site/plots/"))
    assert svgs == ["site/plots/cpu-tflops.svg", "site/plots/sm_90-peak.svg", "site/plots/sm_90-tflops.svg"]
    for p in svgs:
        text = out[p]
        root = ET.fromstring(text.encode("utf-8"))  # well-formed XML
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        head = "\n".join(text.splitlines()[:12])
        assert text.startswith("<?xml ")
        assert "Generated by attnmatrix from matrix plots0123abc" in head and "attnmatrix generate" in head
        assert "4.0.0b36" in head and "Rendered with matplotlib" in head
        assert not re.search(r"\d{4}-\d{2}-\d{2}T|\d\d:\d\d:\d\d", text), p  # no timestamps
        assert "<dc:date>" not in text and "<dc:creator>" not in text
        assert not any(line != line.rstrip() for line in text.splitlines()), p  # no trailing blanks
        assert "<text" in text and "<glyph" not in text  # text stays text (svg.fonttype none)
    tflops = out["site/plots/sm_90-tflops.svg"]
    for label in ("fa4", "fa2", "sdpa_cudnn", "sdpa_efficient", "192×128", "TFLOP/s",
                  "prefill, causal, bfloat16", "NVIDIA H200"):
        assert label in tflops, label
    assert "fake_nan" not in tflops
    assert "% of measured matmul peak" in out["site/plots/sm_90-peak.svg"]


def test_pages_embed_the_plots():
    out = render_all(make_matrix(), META)
    sm = out["site/support-matrix.md"]
    assert "](plots/sm_90-tflops.svg)" in sm and "](plots/sm_90-peak.svg)" in sm
    assert "](plots/cpu-tflops.svg)" in sm and "](plots/cpu-peak.svg)" not in sm
    assert "no percentage plot" in sm
    assert "](../plots/sm_90-tflops.svg)" in out["site/archs/sm_90.md"]
    assert "](../plots/sm_90-peak.svg)" in out["site/archs/sm_90.md"]
    assert "](../plots/cpu-tflops.svg)" in out["site/archs/cpu.md"]
    assert "No performance plot for `sm_100` yet" in out["site/archs/sm_100.md"]
    assert "plots/" not in out["site/archs/sm_100.md"]


def test_no_measurements_no_plot_and_the_pages_say_so():
    out = render_all(make_matrix(unmeasured_records()), META)
    assert not [p for p in out if p.startswith("site/plots/")]
    assert "No performance plots yet" in out["site/support-matrix.md"]
    assert "plots/" not in out["site/support-matrix.md"]
    assert "No performance plot for `sm_90` yet" in out["site/archs/sm_90.md"]


@pytest.mark.slow
def test_no_measurements_never_imports_matplotlib():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_plots import META, make_matrix, unmeasured_records
        from attnmatrix.generator import render_all
        render_all(make_matrix(unmeasured_records()), META)
        print("matplotlib" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip() == "False"


# --- determinism ----------------------------------------------------------------------------------

def _svgs(out: dict[str, str]) -> dict[str, str]:
    return {p: t for p, t in out.items() if p.endswith(".svg")}


def test_plots_are_byte_identical_run_to_run_and_for_any_record_order():
    a = _svgs(render_all(make_matrix(), META))
    assert a and a == _svgs(render_all(make_matrix(), META))
    shuffled = measured_records()
    random.Random(3).shuffle(shuffled)
    assert _svgs(render_all(make_matrix(shuffled), META)) == a
    # and they depend on the data (the comparison can fail)
    fewer = [r for r in measured_records() if r.case.backend != "fa2"]
    assert _svgs(render_all(make_matrix(fewer), META))["site/plots/sm_90-tflops.svg"] != a[
        "site/plots/sm_90-tflops.svg"]


def _digest_in_subprocess(tmp_path: Path, env: dict[str, str]) -> str:
    code = textwrap.dedent("""
        import hashlib, json, sys
        sys.path.insert(0, sys.argv[1])
        from test_plots import META, make_matrix
        from attnmatrix.generator import render_all
        out = {p: t for p, t in render_all(make_matrix(), META).items() if p.endswith(".svg")}
        print(hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest())
    """)
    r = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                       env={**os.environ, **env}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.slow
def test_plots_are_byte_identical_across_processes_hash_seeds_and_user_styles(tmp_path):
    here = hashlib.sha256(json.dumps(_svgs(render_all(make_matrix(), META)), sort_keys=True).encode()).hexdigest()
    assert _digest_in_subprocess(tmp_path, {"PYTHONHASHSEED": "1"}) == here
    assert _digest_in_subprocess(tmp_path, {"PYTHONHASHSEED": "12345"}) == here
    # a user's matplotlibrc must not leak into the generated files
    rc = tmp_path / "matplotlibrc"
    rc.write_text("svg.fonttype: path\nsvg.hashsalt: other\naxes.facecolor: red\nfont.size: 17\n"
                  "figure.dpi: 33\naxes.prop_cycle: cycler('color', ['k'])\n", encoding="utf-8")
    assert _digest_in_subprocess(tmp_path, {"MATPLOTLIBRC": str(rc), "PYTHONHASHSEED": "7"}) == here


def test_render_leaves_global_matplotlib_state_alone():
    import matplotlib

    before = dict(matplotlib.rcParams)
    backend = matplotlib.get_backend()
    render_all(make_matrix(), META)
    assert dict(matplotlib.rcParams) == before and matplotlib.get_backend() == backend


def test_free_text_cannot_break_the_svg():
    hostile = {"device": "GPU $x^2$ <b>&amp;</b> --> \x00\x1b\u2028 " + "long " * 60, "matmul_peak_tflops": "nan"}
    records = [rec("sm_90", "fa4", hd=128, tflops=100.0, prov=hostile)]
    out = render_all(make_matrix(records), META)
    text = out["site/plots/sm_90-tflops.svg"]
    ET.fromstring(text.encode("utf-8"))
    assert "measured on GPU $x^2$ &lt;b&gt;&amp;amp;&lt;/b&gt; -" in text  # literal text: no mathtext, escaped
    assert "\x00" not in text and "\x1b" not in text and "\u2028" not in text
    assert "site/plots/sm_90-peak.svg" not in out  # a non-finite peak is no peak


# --- changelog ------------------------------------------------------------------------------------

def test_changelog_without_a_previous_matrix():
    text = render_all(make_matrix(), META)[CHANGELOG_PATH]
    assert "Current matrix: `plots0123abc`." in text
    assert "No previous version of the matrix is recorded" in text


def test_changelog_lists_the_diff_from_the_previous_matrix():
    # before: no sdpa_cudnn cells, and fa4 at 512 only declared supported (now validated: rejected)
    before = [r for r in measured_records() if r.case.backend != "sdpa_cudnn" and r.case.head_dim != 512]
    before.append(rec("sm_90", "fa4", hd=512, tier="declared"))
    cur = make_matrix()
    text = render_changelog(cur, dict(META, previous={"matrix_id": "prev000001", "matrix": make_matrix(before),
                                                      "source": "git abc1234"}))
    assert "Current matrix: `plots0123abc`." in text
    assert "Previous matrix: `prev000001` (git abc1234)." in text
    assert "| [Lost support](#lost) | 1 |" in text and "| [New cells](#added) | 8 |" in text
    assert "## Lost support { #lost }" in text
    assert "| sm_90/fa4/prefill/bfloat16/512x512/causal | supported (declared) | unsupported (validated) |" in text
    assert "| sm_90/sdpa_cudnn/decode/bfloat16/64x64/causal | - | supported (validated) |" in text
    assert "| `sm_90` | `sdpa_cudnn` |  | 8 |" in text
    assert "Gained support" not in text  # only the kinds that occur
    assert "fake_nan" not in text  # test-only backends stay out, as everywhere on the site
    same = render_changelog(cur, dict(META, previous={"matrix_id": META["matrix_id"], "matrix": cur}))
    assert "nothing changed" in same


def test_changelog_rejects_a_malformed_previous():
    with pytest.raises(ValueError, match="previous"):
        render_changelog(make_matrix(), dict(META, previous={"matrix_id": "x"}))
    with pytest.raises(ValueError, match="previous"):
        render_changelog(make_matrix(), dict(META, previous=make_matrix()))


def test_peak_exceeded_flags_an_underestimated_peak() -> None:
    from attnmatrix.generator.plots import ArchPlots, Panel, Point

    panel = Panel(op="prefill", dtype="bfloat16", features=("causal",), title="t", prose="p", unit="TFLOP/s",
                  fraction="%")

    def plots(fraction: float) -> ArchPlots:
        pt = Point("fa4", 128, 128, 500.0, fraction, "H200")
        return ArchPlots("sm_90", ("fa4",), ("H200",), ((panel, (pt,)),), "site/plots/x.svg", "site/plots/y.svg")

    assert plots(1.1).peak_exceeded and not plots(0.99).peak_exceeded


def test_fractions_divide_by_the_highest_peak_recorded_on_the_device_model() -> None:
    """One sweep on an H200 measured a 690 TFLOP/s peak, a later one 905: the device's ceiling is 905 for
    both sweeps' cells (a run whose clocks or operands held its peak lower must not make its cells look
    nearer the ceiling); another device keeps its own."""
    recs = [rec("sm_90", "fa4", hd=128, tflops=600.0, prov={"matmul_peak_tflops": "690.0"}),
            rec("sm_90", "fa2", hd=128, tflops=300.0, prov={"matmul_peak_tflops": "905.0"}),
            rec("sm_90", "sdpa_cudnn", hd=128, tflops=400.0,
                prov={"device": "NVIDIA H100 80GB HBM3", "matmul_peak_tflops": "650.0"})]
    m = make_matrix(recs)
    assert P.device_peaks(m) == {"NVIDIA H200": 905.0, "NVIDIA H100 80GB HBM3": 650.0}
    sm90 = P.plot_index(m)["sm_90"]
    frac = {pt.backend: pt.peak_fraction for _, pts in sm90.panels for pt in pts}
    assert frac == pytest.approx({"fa4": 600 / 905, "fa2": 300 / 905, "sdpa_cudnn": 400 / 650})
    assert sm90.peaks == (("NVIDIA H100 80GB HBM3", 650.0), ("NVIDIA H200", 905.0))
    assert not sm90.peak_exceeded

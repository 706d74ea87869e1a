"""benchmarks/shape_scan.py: the backends timed in turns at the shapes a user names, for one preset layer."""

from __future__ import annotations

import json

import pytest
from conftest import load_script


def _scan():
    return load_script("benchmarks/shape_scan.py")


def test_axis_takes_lists_and_ranges_with_the_stop_included():
    S = _scan()
    assert S.axis("1,2,4") == [1, 2, 4]
    assert S.axis("256:512:128") == [256, 384, 512]
    assert S.axis("1:3:1,8,16:24:8") == [1, 2, 3, 8, 16, 24]
    for bad in ("0,1", "a", "1:2", "8:4:1", "512:256:-32", "1:3:1,x", "1,,2"):
        with pytest.raises(Exception, match="integers|at least 1"):
            S.axis(bad)


def test_a_scan_on_the_cpu_times_every_point_and_marks_the_grid(tmp_path, capsys):
    S = _scan()
    out = tmp_path / "scan.jsonl"
    assert S.main(["--backends", "sdpa_cpu", "--layer", "llama-3.2-1b:full", "--op", "decode", "--batch", "1",
                   "--lengths", "512,700", "--rounds", "2", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["set"] for r in rows] == ["check", "scan", "scan"] and rows[0]["outcome"] == "pass"
    assert all(r["outcome"] == "pass" and r["ms"] > 0 and len(r["rounds"]) == 2 for r in rows[1:])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("* b1    kv512 ") and lines[1].startswith("  b1    kv700 ")  # 512: a grid point
    assert "sdpa_cpu" in lines[1] and "(x1.00)" in lines[1]
    # the table again from the file, with a plot
    pytest.importorskip("matplotlib")
    png = tmp_path / "scan.png"
    assert S.main(["--report", str(out), "--plot", str(png)]) == 0
    assert capsys.readouterr().out.splitlines() == lines and png.read_bytes()[:4] == b"\x89PNG"


def test_a_scan_names_what_is_wrong(capsys):
    S = _scan()
    with pytest.raises(SystemExit, match="no such preset layer; known: .*llama-3.2-1b:full"):
        S.main(["--backends", "sdpa_cpu", "--layer", "nope:x", "--op", "decode", "--lengths", "64"])
    with pytest.raises(SystemExit, match="runs mla_prefill"):
        S.main(["--backends", "sdpa_cpu", "--layer", "deepseek-v3:mla", "--op", "decode", "--lengths", "64"])
    with pytest.raises(SystemExit):
        S.main(["--layer", "llama-3.2-1b:full"])
    assert "give --backends, --op, --lengths" in capsys.readouterr().err


def test_a_scan_replaces_only_a_scan_file_and_plots_only_over_a_png(tmp_path, capsys):
    S = _scan()
    theirs = tmp_path / "notes.jsonl"
    theirs.write_text('{"mine": 1}\n')
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text('{"set": "done", "layer": "m:l", "op": "decode", "backends": []}\n')
    args = ["--backends", "sdpa_cpu", "--layer", "llama-3.2-1b:full", "--op", "decode", "--lengths", "64",
            "--rounds", "2"]
    with pytest.raises(SystemExit, match="notes.jsonl:1: not a sweep row"):
        S.main([*args, "-o", str(theirs)])
    assert theirs.read_text() == '{"mine": 1}\n'
    with pytest.raises(SystemExit, match="not a scan file .it holds done rows"):
        S.main([*args, "-o", str(sweep)])
    picture = tmp_path / "plot.png"
    picture.write_text("not a picture")
    with pytest.raises(SystemExit):
        S.main([*args, "--plot", str(picture)])
    assert "exists and is not a PNG" in capsys.readouterr().err and picture.read_text() == "not a picture"
    with pytest.raises(SystemExit, match="unknown backend 'nope'"):
        S.main(["--backends", "nope", "--layer", "llama-3.2-1b:full", "--op", "decode", "--lengths", "64"])
    with pytest.raises(SystemExit, match="cannot read"):
        S.main(["--report", str(tmp_path / "missing.jsonl")])
    ours = tmp_path / "scan.jsonl"
    assert S.main([*args, "-o", str(ours)]) == 0
    assert S.main([*args, "-o", str(ours)]) == 0  # a scan file is replaced
    assert [json.loads(line)["set"] for line in ours.read_text().splitlines()] == ["check", "scan"]
    # no temporary file left beside them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.jsonl", "plot.png", "scan.jsonl", "sweep.jsonl"]


def test_several_layers_scan_in_one_process_into_one_compact_file(tmp_path, capsys, monkeypatch):
    from attnmatrix.matrix import workloads as W

    S = _scan()
    out = tmp_path / "scan.jsonl"
    args = ["--backends", "sdpa_cpu", "--layer", "llama-3.2-1b:full", "--layer", "gemma-3-1b:global", "--op", "decode",
            "--batch", "1,3", "--lengths", "64", "--rounds", "2", "-o", str(out)]
    assert S.main(args) == 0
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    first, second = "llama-3.2-1b:full", "gemma-3-1b:global"
    assert [(r["layer"], r["set"]) for r in raw] == [(first, "check"), (first, "scan"), (first, "scan"),
                                                      (second, "check"), (second, "scan"), (second, "scan")]
    # a timed row leaves out what its check row states; reading the file fills it back in
    assert all("case" not in r and "heads_q" not in r for r in raw if r["set"] == "scan")
    rows = W.load_rows([out])
    assert {(r["layer"], r["heads_q"], r["heads_kv"]) for r in rows} == {("llama-3.2-1b:full", 32, 8),
                                                                        ("gemma-3-1b:global", 4, 1)}
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 4 and table[0].startswith("  gemma-3-1b:global") and "llama-3.2-1b:full" in table[-1]
    with pytest.raises(SystemExit, match="one layer's scan at a time"):
        S.main(["--report", str(out), "--plot", str(tmp_path / "p.png")])
    # a scan cut short keeps the layers it finished
    calls = []
    real = S.time_workload

    def dies_on_the_second(*a, **k):
        calls.append(a[1].name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(S, "time_workload", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        S.main(args)
    assert {r["layer"] for r in W.load_rows([out])} == {"llama-3.2-1b:full"}

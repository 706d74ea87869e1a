"""The repository describes the product: declared facts and their source notes agree, committed figures
are cited and come with no raw logs, and no text tells the story of a particular run or machine."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "matrix" / "data"

# One section per declared fact or ranking: "### `id` — backend outcome" or "### ranking `id` — ...".
_SECTION = re.compile(r"^### (?:ranking )?`([^`]+)` — (.*?)(?=^##|\Z)", re.M | re.S)


def _declared_entries(data: Path = DATA) -> list[dict]:
    """Every entry of declared.json that has an id (facts, rankings, and whatever lists come later)."""
    doc = json.loads((data / "declared.json").read_text())
    lists = [v for v in doc.values() if isinstance(v, list)] if isinstance(doc, dict) else [doc]
    return [e for entries in lists for e in entries if isinstance(e, dict) and "id" in e]


def _source_notes(data: Path = DATA) -> dict[str, str]:
    text = (data / "DECLARED_SOURCES.md").read_text()
    sections: dict[str, str] = {}
    for m in _SECTION.finditer(text):
        assert m.group(1) not in sections, f"DECLARED_SOURCES.md: `{m.group(1)}` has two sections"
        sections[m.group(1)] = m.group(2)
    return sections


def _check_sections_agree(data: Path = DATA) -> None:
    sections = _source_notes(data)
    for e in _declared_entries(data):
        text = sections[e["id"]]
        heading = text.split("\n", 1)[0]
        if "backend" in e and "outcome" in e:
            assert heading.startswith(f"{e['backend']} {e['outcome']}"), (e["id"], heading)
        if "sources" in e:
            assert re.findall(r"^- source: `(.+)`$", text, re.M) == list(e["sources"]), e["id"]
        if "statement" in e:
            assert re.findall(r"^- says: (.+)$", text, re.M) == [e["statement"]], e["id"]


def test_declared_sources_has_one_section_per_declared_fact():
    ids = [e["id"] for e in _declared_entries()]
    sections = _source_notes()
    assert len(ids) == len(set(ids)), "declared.json repeats an id"
    assert sorted(set(ids) - sections.keys()) == [], "declared.json ids with no section in DECLARED_SOURCES.md"
    assert sorted(sections.keys() - set(ids)) == [], "DECLARED_SOURCES.md sections for ids not in declared.json"


def test_each_section_states_its_facts_backend_outcome_sources_and_statement():
    _check_sections_agree()


def test_a_section_that_disagrees_is_caught(tmp_path):
    """The check can fail: a source note whose statement drifted from declared.json is reported."""
    entry = next(e for e in _declared_entries() if "statement" in e)
    text = (DATA / "DECLARED_SOURCES.md").read_text()
    (tmp_path / "DECLARED_SOURCES.md").write_text(text.replace(f"- says: {entry['statement']}", "- says: other"))
    (tmp_path / "declared.json").write_text((DATA / "declared.json").read_text())
    with pytest.raises(AssertionError, match=re.escape(entry["id"])):
        _check_sections_agree(tmp_path)


def test_benchmark_results_hold_cited_figures_and_no_logs():
    results = ROOT / "benchmarks" / "results"
    files = sorted(p for p in results.rglob("*") if p.is_file() and p.name != "README.md")
    assert [p for p in files if p.suffix == ".log"] == []
    assert [p for p in results.iterdir() if p.is_dir()] == [], "no per-run folders: descriptive file names instead"
    citing = (results / "README.md").read_text() + (ROOT / "README.md").read_text() + "".join(
        p.read_text() for p in (ROOT / "site").rglob("*.md"))
    # a file is cited by its name, or by its stem where the README names a run's .jsonl and .summary.json together
    uncited = [p.name for p in files if p.name not in citing and p.name.split(".")[0] not in citing]
    assert uncited == [], "files in benchmarks/results that no page or README cites"


def test_evidence_files_are_named_by_what_they_hold():
    """matrix/data/results/<archs>-<kernels>-<device>-<date>.jsonl, as scripts/evidence_name.py derives it."""
    spec = importlib.util.spec_from_file_location("evidence_name", ROOT / "scripts" / "evidence_name.py")
    naming = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(naming)
    for path in sorted((DATA / "results").glob("*.jsonl")):
        assert path.name == naming.evidence_name([str(path)]), "rename it: python scripts/evidence_name.py FILE"


@pytest.mark.slow
def test_the_matrix_does_not_depend_on_file_names_or_their_order(tmp_path):
    """Evidence files are named for people: the same records under meaningless names, read in the
    reverse order, resolve to the same matrix."""
    from attnmatrix.matrix.evidence import load_evidence
    from attnmatrix.matrix.policy import resolve

    files = sorted((DATA / "results").glob("*.jsonl"))
    for i, path in enumerate(reversed(files)):
        shutil.copy(path, tmp_path / f"{i:02d}.jsonl")
    cells = [{key: cell.to_json() for key, cell in resolve(ev).cells.items()}
             for ev in (load_evidence(), load_evidence([tmp_path], include_embedded=False))]
    assert cells[0] == cells[1]


def test_no_text_tells_the_story_of_a_run():
    """Comments, docs and data describe the product, never which run, machine loan or search index found what."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    # assembled so that this file does not match itself
    pattern = r"\bsessions? [0-9]|\ble" + r"nt\b|given " + "back|search" + "-index|index " + "id"
    out = subprocess.run(["git", "grep", "-niE", pattern], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout == ""


# --- CI runs the README's test command, then the slow suite, with an honest exit code -----------------------------


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Set up and run the tests", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()


@pytest.mark.parametrize("fast_rc, slow_rc, want", [(0, 0, 0), (1, 0, 1), (0, 1, 1), (2, 1, 2)])
def test_ci_runs_the_readme_command_and_the_slow_suite_and_reports_a_failure(tmp_path, fast_rc, slow_rc, want):
    script = (ROOT / ".ci" / "run").read_text()
    assert _readme_test_command() in script and "python -m pytest -q -m slow" in script
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text(script)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    # `python` stands in for the install and both test runs; `chromium` keeps apt-get out of it.
    (stubs / "python").write_text('#!/bin/sh\necho "python $*" >> "$LOG"\ncase "$*" in *pip*) exit 0;; '
                                  '*"-m slow"*) exit "$SLOW_RC";; *) exit "$FAST_RC";; esac\n')
    (stubs / "chromium").write_text("#!/bin/sh\nexit 0\n")
    for s in stubs.iterdir():
        s.chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "LOG": str(log), "FAST_RC": str(fast_rc), "SLOW_RC": str(slow_rc)}
    r = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True)
    assert r.returncode == want, r.stdout + r.stderr
    ran = log.read_text().splitlines()
    assert ran[-2:] == ["python -m pytest -q", "python -m pytest -q -m slow"]  # the slow suite runs either way


def test_the_default_run_leaves_out_the_slow_suite():
    assert re.search(r"""^addopts = "-m 'not slow'"$""", (ROOT / "pyproject.toml").read_text(), re.M)


def layout_problems(readme: str, files: list[str]) -> list[str]:
    """What README's layout table says that the tree (`files`, as git lists them) does not have: a folder or
    file it names that does not exist (a name is read from the root, the row's folder, its `vllm/` engine or
    `attnmatrix/`), and a top-level folder it does not describe."""
    table = readme.split("## Layout", 1)[1].strip().split("\n\n", 1)[0].splitlines()[2:]
    folders = set()
    for f in files:
        parts = f.split("/")[:-1]
        folders |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    known = set(files) | folders
    problems, described = [], set()
    for row in table:
        first, rest = row.strip().strip("|").split("|", 1)
        row_folders = [t.rstrip("/") for t in re.findall(r"`([^`]+)`", first)]
        described |= set(row_folders)
        problems += [f"folder {d}/ does not exist" for d in row_folders if d not in folders]
        for name in re.findall(r"`([^`\s]+)`", rest):
            if not re.search(r"\.(py|sh|json|jsonl|md|yaml)$|/", name) or name.startswith("attnmatrix."):
                continue
            path = name.rstrip("/").replace("<engine>", "vllm")
            where = [path, f"attnmatrix/{path}", *(f"{d}/{path}" for d in row_folders)]
            if not known & set(where):
                problems.append(f"{name} (row {', '.join(row_folders)}) does not exist")
    problems += [f"top-level folder {t}/ is not described" for t in sorted({f.split("/")[0] for f in files if "/" in f})
                 if t not in described]
    return problems


def test_the_readme_layout_table_matches_the_tree():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert layout_problems(readme, files) == []
    # the check can say no: a named file that is gone, a top-level folder the table leaves out
    assert layout_problems(readme, [f for f in files if f != "attnmatrix/workflow.py"] + ["newtool/x.py"]) == [
        "workflow.py (row attnmatrix) does not exist", "top-level folder newtool/ is not described"]

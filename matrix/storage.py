"""Reading and writing result files (JSON Lines), atomically and resumably.

- Every problem names the file, the line and the field.
- A sweep appends one line per finished case and fsyncs it, so a killed sweep loses at most the case
  in flight; a torn last line (the process died mid-write) is cut off on resume, never parsed.
- Whole-file writes (merged matrices, generated files) go to a temporary file that replaces the
  target in one `os.replace`, so a reader never sees half a file and a failure changes nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .machine_paths import scrub_machine_paths
from .records import Record, RecordError, parse_record


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located precisely enough to fix it."""

    file: str
    line: int | None
    field: str
    message: str
    record: str | None = None  # case key, when known

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "")
        rec = f" [{self.record}]" if self.record else ""
        return f"{where}{rec}: {self.field}: {self.message}"


def split_where(where: str) -> tuple[str, int | None]:
    """Where a record came from (`file:line`, or `file#...` for an embedded fact) as a Problem's (file, line)."""
    f, _, n = where.rpartition(":")
    if f and n.isdigit():
        return f, int(n)
    return where.split("#", 1)[0], None


class InputError(Exception):
    """Input could not be read at all (missing file, not UTF-8 ...). Exit code 2."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def _case_key_of(obj: object) -> str | None:
    try:
        from .cases import Case

        return Case.from_dict(obj["case"]).key  # type: ignore[index]
    except Exception:
        return None


def read_records(path: str | os.PathLike, *, problems: list[Problem] | None = None) -> list[tuple[int, Record]]:
    """Parse a JSONL result file into (line number, Record) pairs.

    Malformed lines are reported into `problems` (every one of them) and skipped; without a
    `problems` list the first problem raises InputError. A missing or undecodable file raises
    InputError: there is nothing to report line by line.
    """
    p = Path(path)
    collect = problems is not None
    found: list[Problem] = problems if collect else []
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError([Problem(str(p), None, "(file)", f"cannot read: {e.strerror or e}")]) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InputError([Problem(str(p), line, "(file)", f"not UTF-8 text (byte 0x{raw[e.start]:02x})")]) from e
    out: list[tuple[int, Record]] = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            msg = e.msg.removesuffix(" at")  # "Unterminated string starting at": one "at", then the column
            found.append(Problem(str(p), n, "(json)", f"not valid JSON: {msg} at column {e.colno}"))
            continue
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits, nesting too deep
            found.append(Problem(str(p), n, "(json)", f"not valid JSON: {e}"))
            continue
        try:
            out.append((n, parse_record(obj)))
        except RecordError as e:
            key = _case_key_of(obj)
            found.extend(Problem(str(p), n, f, m, key) for f, m in e.problems)
    if found and not collect:
        raise InputError(found)
    return out


def dump_record(rec: Record) -> str:
    """One canonical line: sorted keys, no spaces, so equal records are equal bytes. The reason keeps no path of
    the machine that wrote it (machine_paths.py): what a kernel says must read the same from every machine."""
    d = rec.to_dict()
    if "reason" in d:
        d["reason"] = scrub_machine_paths(d["reason"])
    line = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (valid JSON escape "\ud800", not UTF-8): keep it escaped
        line = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return line


def atomic_write_text(path: str | os.PathLike, text: str) -> bool:
    """Write `text` to `path` through a temporary file and `os.replace`. Returns True if it changed."""
    p = Path(path)
    data = text.encode("utf-8")
    try:
        if p.read_bytes() == data:
            return False
    except OSError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        # mkstemp makes the file private (0600); the result is an ordinary file: 0666 less the umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def write_records(path: str | os.PathLike, records: Iterable[Record]) -> bool:
    lines = [dump_record(r) for r in records]
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def check_result_file(path: str | os.PathLike) -> bytes:
    """Refuse to write into a file that is not one of ours, before anything touches it.

    Ours: absent, empty, or UTF-8 JSON Lines whose complete lines are all result records (the last line
    may be a torn write: the start of a JSON object without its newline). Anything else (notes, a
    binary file, another tool's JSON) raises InputError naming the first line that is not a record, so
    `probe -o notes.txt` or `merge -o README.md` changes nothing. Returns the file's bytes.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError([Problem(str(p), None, "(file)", "is a directory, not a result file")])
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return b""
    except OSError as e:
        raise InputError([Problem(str(p), None, "(file)", f"cannot read: {e.strerror or e}")]) from e
    refuse = "not an attnmatrix result file (JSON Lines of records): refusing to write into it"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError([Problem(str(p), None, "(file)", f"{refuse}; it is not UTF-8 text")]) from None
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]
    for n, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            parse_record(json.loads(line))
        except (ValueError, RecursionError, RecordError, TypeError):
            raise InputError([Problem(str(p), n, "(file)", f"{refuse}; line {n} is not a record")]) from None
    if tail.strip() and not tail.lstrip().startswith("{"):
        raise InputError([Problem(str(p), len(lines), "(file)", f"{refuse}; line {len(lines)} is not a record")])
    return data


def _is_record_line(line: bytes) -> bool:
    try:
        parse_record(json.loads(line))
        return True
    except (ValueError, RecursionError, RecordError, TypeError):
        return False


class ResultStore:
    """An append-only JSONL file of one sweep. Re-opening it resumes: finished cases are known.

    The file is opened in append mode and each record is flushed and fsynced before the runner
    moves on, so `kill -9` at any point leaves every finished case on disk exactly once. A file that is
    not a result file is refused before it is touched (`check_result_file`).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        check_result_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired_bytes = self._repair_tail()
        self.done: dict[str, Record] = {}
        if self.path.exists():
            for _, rec in read_records(self.path):
                self.done[rec.key] = rec
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the store

    def _repair_tail(self) -> int:
        """A last line without its newline is either a complete record (an editor or another tool dropped the
        newline: it is kept, and the newline added) or a write the process did not finish (cut off).
        Returns the bytes cut."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return 0
            keep = data.rfind(b"\n") + 1
            if _is_record_line(data[keep:]):
                f.write(b"\n")
                cut = 0
            else:
                f.truncate(keep)
                cut = len(data) - keep
            f.flush()
            os.fsync(f.fileno())
            return cut

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def append(self, rec: Record) -> None:
        if rec.key in self.done:
            return  # resuming never duplicates a case
        self._fh.write(dump_record(rec) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done[rec.key] = rec

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_result_files(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    """Expand directories into their `*.jsonl` files, sorted for determinism."""
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(p.glob("*.jsonl"))
        else:
            yield p

"""Citations as links: a source string of the matrix -> the address it names, where it names one.

Forms (matrix/data/declared.json and record sources):
- `owner/repo@<commit>:<path>#L10-L12` -> the file at that commit on GitHub, at those lines;
  `...#symbol` -> the file at that commit (the symbol stays in the text);
- `owner/repo PR #123` / `owner/repo issue #45` -> the pull request / issue;
- `pypi:<package>==<version>:<path>...` -> the package's release page on PyPI (the path is inside its files);
- an https:// address -> itself.
Anything else (a run's provenance) has no link.
"""

from __future__ import annotations

import re

_REPO = r"(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)"
_AT = re.compile(_REPO + r"@(?P<commit>[0-9a-f]{7,40}):(?P<path>[^\s#;]+)(?:#(?P<anchor>[^\s;]+))?")
_NUM = re.compile(_REPO + r" (?P<kind>PR|issue) #(?P<n>\d+)")
_PYPI = re.compile(r"pypi:(?P<pkg>[A-Za-z0-9_.-]+)==(?P<ver>[A-Za-z0-9_.+!-]+?)(?:\([a-z]+\))?(?::|$)")
_URL = re.compile(r"https://[^\s;,)]+")
_LINES = re.compile(r"L\d+(?:-L\d+)?")


def source_url(source: str) -> str | None:
    """The address a source string names, or None."""
    s = str(source).strip()
    mo = _AT.match(s)
    if mo:
        url = f"https://github.com/{mo['repo']}/blob/{mo['commit']}/{mo['path']}"
        anchor = mo["anchor"] or ""
        return url + (f"#{anchor}" if _LINES.fullmatch(anchor) else "")
    mo = _NUM.match(s)
    if mo:
        return f"https://github.com/{mo['repo']}/{'pull' if mo['kind'] == 'PR' else 'issues'}/{mo['n']}"
    mo = _PYPI.match(s)
    if mo:
        return f"https://pypi.org/project/{mo['pkg']}/{mo['ver']}/"
    mo = _URL.search(s)
    return mo.group(0) if mo else None

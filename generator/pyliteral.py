"""Python literals written for a reader: typed values (tuples, ints, floats, strings, None) within a line length.

A value whose literal fits on the line is written on it; a longer tuple or dict is broken after its opening
bracket and its items packed onto lines of their own, each as far as it fits; a longer string is split into
adjacent string literals inside parentheses (Python joins them). Deterministic: the same value gives the same
lines, so a changed value changes only its own lines.
"""

from __future__ import annotations

import math

INDENT = "    "


def literal(v: object) -> str:
    """A one-line Python literal for `v` that evaluates back to an equal value."""
    if v is None or isinstance(v, (bool, int)):
        return repr(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} as a Python literal")
        return repr(v)
    if isinstance(v, str):
        return repr(str(v))
    if isinstance(v, tuple):
        inner = ", ".join(literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write a {type(v).__name__} as a Python literal")


def lines(v: object, indent: str, width: int, prefix: str = "", suffix: str = ",") -> list[str]:
    """`prefix` + the literal of `v` + `suffix`, at `indent`, in lines of at most `width` characters where the
    value can be broken (a name or a number longer than the line stays whole)."""
    one = f"{indent}{prefix}{literal(v)}{suffix}"
    if len(one) <= width:
        return [one]
    inner = indent + INDENT
    if isinstance(v, str):
        room = max(20, width - len(inner) - 2)
        chunks, rest = [], v
        while rest:
            cut = rest[:room]
            while len(repr(cut)) > room and len(cut) > 1:  # escapes make a literal longer than its text
                cut = cut[:-1]
            sp = cut.rfind(" ")
            if 0 < sp < len(cut) - 1 and len(cut) < len(rest):
                cut = cut[: sp + 1]  # break after a space, so each piece reads as words
            chunks.append(cut)
            rest = rest[len(cut):]
        return [f"{indent}{prefix}(", *(f"{inner}{c!r}" for c in chunks), f"{indent}){suffix}"]
    if isinstance(v, dict) or (isinstance(v, tuple) and v):
        opening, closing = ("{", "}") if isinstance(v, dict) else ("(", ")")
        items = [(f"{literal(k)}: ", x) for k, x in v.items()] if isinstance(v, dict) else [("", x) for x in v]
        out = [f"{indent}{prefix}{opening}"]
        line = ""
        for p, x in items:
            piece = p + literal(x) + ","
            if len(inner) + len(piece) > width:  # an item that needs lines of its own
                if line:
                    out.append(inner + line)
                    line = ""
                out += lines(x, inner, width, p)
            elif len(inner) + len(line) + len(piece) + (1 if line else 0) <= width:
                line = f"{line} {piece}" if line else piece
            else:
                out.append(inner + line)
                line = piece
        if line:
            out.append(inner + line)
        return [*out, f"{indent}{closing}{suffix}"]
    return [one]


def block(v: object, indent: int, width: int = 120, prefix: str = "", suffix: str = ",") -> str:
    """`lines` joined, for templates: `{{ value|block(8, prefix=key) }}`."""
    return "\n".join(lines(v, " " * indent, width, prefix, suffix))

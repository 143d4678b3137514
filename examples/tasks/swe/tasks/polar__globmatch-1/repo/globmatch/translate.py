"""Glob patterns to regular expressions."""

from __future__ import annotations

import re


def translate(pattern: str) -> str:
    """A regular expression for ``pattern``.

    ``*`` and ``?`` never match ``/``; ``**/`` matches any number of whole directories (including none) and a
    trailing ``**`` matches everything below a directory. ``[abc]`` and ``[!abc]`` are character classes.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and pattern.find("]", i + 1) != -1:
            end = pattern.find("]", i + 1)
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body}]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)

"""Text that a record or a handler controls, made safe for a terminal: the one escaping
function of the CLI, its live views and the services' own log lines.

An error message, a job's name or a log line may hold what a terminal acts on: ESC (so
CSI and OSC sequences: a new window title, a cleared screen, an OSC 8 hyperlink, an OSC 52
clipboard write), BEL, CR, the C1 range (U+009B is CSI, U+009D OSC on some terminals),
and the invisible Unicode controls that reorder or hide text (the bidirectional overrides
and isolates of Trojan Source, zero-width and line separators). `escaped` writes each as
an escape (`\\x1b`, `\\u202e`), so the text is shown as the data it is and does nothing.
"""

from __future__ import annotations

import re

# C0 but tab and newline, DEL, C1; the Arabic letter mark, zero-width and directional
# marks, line and paragraph separators, bidirectional embeddings, overrides and isolates,
# word joiners, the BOM.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
CONTROL = re.compile(f"[\t\n{_CONTROLS}]")  # every one, tab and newline included
_IN_TEXT = re.compile(f"[{_CONTROLS}]")
# What JSON's encoder leaves raw (it escapes U+0000-U+001F itself).
_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escaped(text: str, *, one_line: bool = False) -> str:
    """`text` with every control character written as an escape: tabs and newlines stay,
    unless `one_line` (a table cell, a log field)."""
    return (CONTROL if one_line else _IN_TEXT).sub(_escape, text)


def json_escaped(document: str) -> str:
    """A JSON document with the controls its encoder left raw as `\\u` escapes: the same
    data, valid JSON, and nothing a terminal acts on."""
    return _IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", document)

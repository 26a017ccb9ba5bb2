"""Text for a person's terminal carries no control sequences from the data it shows.

Model names, router ids, rejection reasons and key names reach the CLI's output from
plans, Redis and the planner's API, and any of them may come from someone hostile: an
ESC, OSC or BEL in one could retitle the window, write the clipboard, move the cursor or
hide lines. Every command's stdout and stderr pass through `TerminalSafe`, which shows
each control character as a visible escape (``\\x1b``), keeping newlines and tabs and,
on a terminal, the colour sequences (SGR) that the CLI's own tables use.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

# C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A whole Select Graphic Rendition sequence: colours and weights, nothing else.
_SGR = re.compile("\x1b\\[[0-9;]*m")


def _visible(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def escape_controls(text: str, *, keep_sgr: bool = False) -> str:
    """`text` with every control character shown as ``\\xNN`` (newline and tab kept);
    with `keep_sgr`, whole colour sequences are kept too."""
    if not keep_sgr:
        return _CONTROL.sub(_visible, text)
    parts, last = [], 0
    for m in _SGR.finditer(text):
        parts.append(_CONTROL.sub(_visible, text[last:m.start()]))
        parts.append(m.group())
        last = m.end()
    parts.append(_CONTROL.sub(_visible, text[last:]))
    return "".join(parts)


class TerminalSafe:
    """A text stream that escapes control characters on their way to `raw` (see the
    module docstring); everything else is the wrapped stream's."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw
        try:
            self._keep_sgr = raw.isatty()
        except (AttributeError, ValueError):
            self._keep_sgr = False

    def write(self, text: str) -> int:
        self.raw.write(escape_controls(text, keep_sgr=self._keep_sgr))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def protect_std_streams() -> None:
    """Route this process's stdout and stderr through `TerminalSafe` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TerminalSafe):
            setattr(sys, name, TerminalSafe(stream))

"""The one exception type for bad user input, and how bad input is shown in it.

The CLI prints a ``TpusimError`` as a single line and exits with code 2, so a user
who mistypes a topology or a chip sees what is wrong and what is accepted, never a
traceback from our internals. Text a user typed is shown with ``shown`` (``repr``, cut to
a length), so a tab, a newline or a terminal escape in it is never echoed raw; parsers
call ``plain_text`` first, which refuses anything but printable ASCII (Unicode digits
such as ``٨`` look like numbers but are not accepted ones).
"""


class TpusimError(ValueError):
    """Bad input a user can fix: the message says what is wrong and what is accepted."""


def shown(text: object, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters: how an error message quotes what the user gave."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[:limit - 4] + "...'"


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\x1b``): text read from a file (a report's script name)
    printed to a terminal must not move its cursor or recolour it."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def plain_text(text: object, what: str, accepted: str, max_length: int = 256, ascii_only: bool = True) -> str:
    """``text`` when it is printable ASCII (any printable text with ``ascii_only=False``, e.g. a file path)
    of at most ``max_length`` characters; otherwise a TpusimError that names ``what``, shows the text
    quoted and says what is ``accepted``."""
    if not isinstance(text, str):
        raise TpusimError(f"{what} must be text, not {shown(text)}; {accepted}")
    if len(text) > max_length:
        raise TpusimError(f"{what} {shown(text)} is too long ({len(text)} characters, at most {max_length}); "
                          f"{accepted}")
    bad = next((ch for ch in text if not (" " <= ch <= "~" or (not ascii_only and ch.isprintable()))), None)
    if bad is not None:
        kind = "a control character" if bad.isascii() or not bad.isprintable() else "a non-ASCII character"
        raise TpusimError(f"{what} {shown(text)} contains {kind} ({shown(bad)}, U+{ord(bad):04X}); {accepted}")
    return text

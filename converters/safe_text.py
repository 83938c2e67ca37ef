"""Text from a model, or from the process that ran one, made inert before anyone reads it.

A model's names, what it prints and every field of the worker's answer are the attacker's text. On a
terminal, a control character is a command (an escape sequence sets the window title, clears the screen, moves
the cursor over the line above), a line break forges a line of ours, and a bidirectional override shows text
in another order than it is. `inert` writes each such character as its escape, so what is shown is what was
sent, on one line.
"""

import re
import unicodedata

# A run of characters drawn as blank: every Unicode space (the no-break and ideographic ones too) and the letters and
# symbols fonts draw as nothing (Hangul's fillers, the blank Braille pattern), which pad a line as spaces do.
_SPACES = re.compile("[\\s\u115f\u1160\u2800\u3164\uffa0]{2,}")

# Unicode's categories of characters that are not shown as themselves: controls (C0, DEL, C1), formats (the
# bidirectional overrides and isolates, zero-width joiners), line and paragraph separators, surrogates, private use
# and unassigned code points (a terminal may give any meaning to these).
_NOT_SHOWN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def _escaped(character):
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert(text):
    """`text` (any value, shown as str) with every character a terminal would act on escaped: one line, shown
    as it was sent."""
    text = str(text)
    if text.isprintable():  # the common case, at C speed (the space is printable, tabs and breaks are not)
        return text
    return "".join(_escaped(character) if unicodedata.category(character) in _NOT_SHOWN else character
                   for character in text)


def inert_data(value, collapse_spaces=False):
    """A JSON value (dicts, lists, strings, numbers) with every string in it, keys included, made `inert`; with
    `collapse_spaces`, each run of blank characters made one space (a field padded to a terminal's width would
    show its rest as a line of its own)."""
    if isinstance(value, str):
        text = inert(value)
        return _SPACES.sub(" ", text) if collapse_spaces else text
    if isinstance(value, dict):
        return {inert_data(key, collapse_spaces): inert_data(item, collapse_spaces) for key, item in value.items()}
    if isinstance(value, list):
        return [inert_data(item, collapse_spaces) for item in value]
    return value

"""The text a request without a reference is likely to rewrite: its implicit reference.

Most editing tools do not send OpenAI's ``prediction`` (aider, Zed, Cline, Void; Continue has it
off): they put the file in the prompt, fenced, and ask for it back rewritten (aider's whole-file
format, Continue's and Cline's apply prompts) or for search/replace blocks quoting it (aider's
diff format). The largest fenced code block of a request's messages is then, with rare exceptions,
the file, and refdec drafts from it as it drafts from a prediction: the copy cursor follows it and
the acceptance table prices it by what it earns, so a block the reply does not copy costs little.
The output is unchanged either way; only the speed is. ``refdec serve`` looks for it in a request
without ``prediction`` (its messages' texts, or a completion's prompt), ``generate`` in a prompt
given without ``references`` (the prompt's text, decoded: refdec.engine.arguments).

A block shorter than :data:`MIN_REFERENCE_CHARS` is not worth a reference (a short snippet the
context index drafts from anyway): a request with none gets no implicit reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MIN_REFERENCE_CHARS", "fenced_blocks", "implicit_reference"]

MIN_REFERENCE_CHARS = 200

# a fence of 3+ backticks or tildes (CommonMark), an optional info string, the body, the same fence
# (at least as long) alone on its line; indentation of up to 3 spaces, as CommonMark allows
_FENCED = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<body>.*?)^ {0,3}(?P=fence)[`~]*[ \t]*$",
                     re.S | re.M)


def fenced_blocks(text: str) -> list[str]:
    """The bodies of ``text``'s fenced code blocks, in order (an unclosed fence holds none)."""
    return [match.group("body") for match in _FENCED.finditer(text)]


def implicit_reference(texts: Iterable[str], min_chars: int = MIN_REFERENCE_CHARS) -> str | None:
    """The largest fenced code block of ``texts`` (a request's message contents, or a completion
    prompt; the last of equally large ones), or None when none has ``min_chars`` characters."""
    best = None
    for text in texts:
        for body in fenced_blocks(text or ""):
            if len(body) >= min_chars and (best is None or len(body) >= len(best)):
                best = body
    return best

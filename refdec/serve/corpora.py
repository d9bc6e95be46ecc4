"""The server's named corpora: loaded at start-up, added and removed at run time, chosen per request.

``refdec serve --index NAME=FILE.refdec`` (several) loads corpus indexes under names; the first is
the default, drafting for a request that names none. A request chooses another with the extension
field ``corpus`` (OpenAI clients send it through ``extra_body={"corpus": NAME}``), or none with
``"corpus": ""``. ``POST /v1/corpora`` builds a corpus from documents sent in the body (never from
a server path), ``DELETE /v1/corpora/NAME`` removes one, ``GET /v1/corpora`` lists them with their
sizes. A request keeps the index it started with: removing a corpus does not disturb the requests
drafting from it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_CORPORA = 64  # the most corpora a server holds, loaded and added together


@dataclass(frozen=True)
class Corpus:
    """One named corpus: its index (refdec.CorpusIndex or ShardedIndex) and where it came from
    (``"file"``: ``--index`` at start-up; ``"request"``: ``POST /v1/corpora``)."""
    name: str
    index: object
    origin: str

    def describe(self, default: bool) -> dict:
        """The corpus as ``GET /v1/corpora`` lists it."""
        index = self.index
        return {"id": self.name, "object": "corpus", "origin": self.origin, "default": default,
                "documents": int(index.num_documents), "tokens": int(len(index)),
                "bytes": int(getattr(index, "nbytes", 0))}


def check_name(name) -> str:
    """``name`` if it is a corpus name (1-64 of letters, digits, ``.``, ``_``, ``-``, starting with
    a letter or digit), else ValueError naming it."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"a corpus name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                         f"digit; got {name!r}")
    return name


class CorpusRegistry:
    """Named corpora, safe to read and change from any thread. ``default``: the name drafting for
    a request that names no corpus (None: none)."""

    def __init__(self) -> None:
        self._corpora: dict[str, Corpus] = {}
        self._lock = threading.Lock()
        self.default: str | None = None

    def add(self, name: str, index, origin: str) -> Corpus:
        """Registers ``index`` under ``name``; ValueError for a bad name, KeyError when the name is
        taken, OverflowError past :data:`MAX_CORPORA`. The first corpus added at start-up becomes the
        default."""
        check_name(name)
        corpus = Corpus(name, index, origin)
        with self._lock:
            if name in self._corpora:
                raise KeyError(name)
            if len(self._corpora) >= MAX_CORPORA:
                raise OverflowError(f"this server holds {MAX_CORPORA} corpora at most; remove one first")
            self._corpora[name] = corpus
            if self.default is None and origin == "file":
                self.default = name
        return corpus

    def remove(self, name: str) -> Corpus:
        """Unregisters ``name`` (KeyError when absent); a request drafting from it goes on."""
        with self._lock:
            corpus = self._corpora.pop(name)
            if self.default == name:
                self.default = None
        return corpus

    def index_for(self, name: str | None):
        """The index a request drafts from: ``name``'s (KeyError when absent), the default's for
        None, no index for ``""``."""
        with self._lock:
            if name == "":
                return None
            if name is None:
                name = self.default
                if name is None:
                    return None
            return self._corpora[name].index

    def describe(self) -> list[dict]:
        with self._lock:
            return [corpus.describe(name == self.default) for name, corpus in self._corpora.items()]

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._corpora

    def __len__(self) -> int:
        with self._lock:
            return len(self._corpora)


def parse_index_argument(value: str) -> tuple[str, str]:
    """``--index``'s ``NAME=FILE`` or ``FILE`` (named by its file name's stem) as (name, path)."""
    name, sep, path = value.partition("=")
    if not sep:
        path, name = value, Path(value).stem
    return check_name(name), path

"""Workloads for the model-free drafting simulator.

A workload is a list of ``Case``: the prompt tokens, the true output tokens the
drafter has to predict, the per-request reference documents (the file being
edited) and, optionally, the name of a corpus index shared by all cases.

    edits          shared/data/edits-click.jsonl: prompt = original file + commit
                   message (``edit_prompt``), references = [original file],
                   output = the updated file.
    humaneval      shared/data/humaneval.jsonl.gz: prompt = the HumanEval prompt,
                   output = its canonical solution, corpus = Python stdlib sources.
    summarization, rag
                   shared/data/specbench-question.jsonl (by ``category``), output =
                   Gemma 3 270M's greedy continuation (``benchmarks/make_outputs.py``).
    mtbench        shared/data/mtbench-question.jsonl first turns, same outputs cache.

Token ids are cached under ``benchmarks/cache/`` (git-ignored); the data is read
from ``shared/data`` at run time (``$REFDEC_DATA`` overrides) and never copied.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
CACHE_DIR = BENCH_DIR / "cache"
OUTPUTS_DIR = CACHE_DIR / "outputs"

# Chat-model outputs: categories of specbench / mtbench whose true output is the
# default model's greedy continuation.
GENERATED_WORKLOADS = ("summarization", "rag", "mtbench")
ALL_WORKLOADS = ("edits", "edits+stdlib", "edits-model", "humaneval", "summarization", "rag", "mtbench")
# edits-model: the edit prompts from this pair on, with the default model's own greedy output
# (512 tokens, make_outputs.py --categories edits-model) as the true output: what the decoder
# meets end to end. e2e.py benchmarks the first 10 pairs, so tuning on edits-model stays off them.
EDITS_MODEL_FIRST = 10


def data_dir() -> Path:
    """``$REFDEC_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("REFDEC_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class Case:
    """One simulated request.

    prompt      int32 array of shape (L,): the prompt tokens (BOS included).
    output      int32 array of shape (m,): the true continuation to be drafted.
    references  list of int32 arrays: per-request reference documents.
    name        a short label for diagnostics.
    """

    prompt: np.ndarray
    output: np.ndarray
    references: list = field(default_factory=list)
    name: str = ""


@dataclass
class Workload:
    name: str
    cases: list
    corpus: str | None = None  # name of a shared corpus index (see ``corpus_index``)


# ---------------------------------------------------------------- templates

def edit_prompt(before: str, message: str, path: str = "") -> str:
    """The edit prompt: the original file, the requested change, then the header
    after which the model writes the updated file. ``refdec edit`` uses the same
    shape."""
    name = f" {path}" if path else ""
    return (
        f"Original file{name}:\n```\n{before}```\n\n"
        f"Change: {message.strip()}\n\n"
        f"The same file{name} after the change:\n```\n"
    )


def chat_prompt(question: str) -> str:
    """Gemma 3's turn format around one user message (the default model's
    tokenizer has no chat template; these are its <start_of_turn> tokens)."""
    return f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n"


# ---------------------------------------------------------------- tokenising

_TOKENIZER = None


def tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from refdec.models import load_tokenizer

        _TOKENIZER = load_tokenizer()
    return _TOKENIZER


def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:20]


def prompt_key(prompt_text: str) -> str:
    """Cache key of a generated output: a hash of the prompt text."""
    return _key("prompt", prompt_text)


def encode(text: str, *, bos: bool) -> np.ndarray:
    ids = tokenizer()(text, add_special_tokens=bos).input_ids
    return np.asarray(ids, dtype=np.int32)


def write_json_atomic(path: Path, obj) -> None:
    """Writes ``obj`` as JSON to ``path`` under a temporary name, then renames it: a killed
    run leaves no half-written cache file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _cached_token_lists(name: str, texts: list) -> list:
    """Encode ``texts`` (pairs (text, bos)) once; cache the ids as JSON."""
    key = _key(name, *(f"{int(b)}{t}" for t, b in texts))
    path = CACHE_DIR / "tokens" / f"{name}-{key}.json"
    if path.exists():
        lists = json.loads(path.read_text())
    else:
        lists = [encode(t, bos=b).tolist() for t, b in texts]
        write_json_atomic(path, lists)
    return [np.asarray(x, dtype=np.int32) for x in lists]


# ---------------------------------------------------------------- raw rows

def edit_rows() -> list:
    path = data_dir() / "edits-click.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_rows() -> list:
    with gzip.open(data_dir() / "humaneval.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_questions(category: str, limit: int | None = None) -> list:
    """First-turn questions of a specbench category, or of mtbench (``"mtbench"``)."""
    if category == "mtbench":
        path = data_dir() / "mtbench-question.jsonl"
        rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    else:
        path = data_dir() / "specbench-question.jsonl"
        rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
        rows = [r for r in rows if r["category"] == category]
    questions = [r["turns"][0] for r in rows]
    return questions[:limit] if limit else questions


# ---------------------------------------------------------------- workloads

def load_edits(limit: int | None = None) -> Workload:
    rows = edit_rows()[:limit] if limit else edit_rows()
    texts = []
    for r in rows:
        texts.append((edit_prompt(r["before"], r["message"], r["path"]), True))
        texts.append((r["before"], False))
        texts.append((r["after"], False))
    ids = _cached_token_lists("edits", texts)
    cases = [
        Case(prompt=ids[3 * i], references=[ids[3 * i + 1]], output=ids[3 * i + 2],
             name=f"{r['path']}@{r['commit'][:8]}")
        for i, r in enumerate(rows)
    ]
    return Workload("edits", cases)


def edits_model_path(case: Case) -> Path:
    """Cache file of the default model's output for an edit case (keyed by its prompt ids)."""
    return OUTPUTS_DIR / f"edits-model-{_key('edits-model', ' '.join(map(str, case.prompt.tolist())))}.json"


def load_edits_model(limit: int | None = None) -> Workload:
    """The edit pairs from ``EDITS_MODEL_FIRST`` on whose model output is cached; the true
    output is that output, the reference the original file (as ``edits``)."""
    cases = []
    for case in load_edits().cases[EDITS_MODEL_FIRST:]:
        path = edits_model_path(case)
        if not path.exists():
            continue
        output = np.asarray(json.loads(path.read_text())["output_ids"], dtype=np.int32)
        cases.append(Case(prompt=case.prompt, references=case.references, output=output, name=case.name))
        if limit and len(cases) >= limit:
            break
    return Workload("edits-model", cases)


def load_humaneval(limit: int | None = None) -> Workload:
    rows = humaneval_rows()[:limit] if limit else humaneval_rows()
    texts = []
    for r in rows:
        texts.append((r["prompt"], True))
        texts.append((r["canonical_solution"], False))
    ids = _cached_token_lists("humaneval", texts)
    cases = [Case(prompt=ids[2 * i], output=ids[2 * i + 1], name=r["task_id"])
             for i, r in enumerate(rows)]
    return Workload("humaneval", cases, corpus="stdlib")


def load_generated(category: str, limit: int | None = None, require_output: bool = True) -> Workload:
    """Chat prompts whose outputs ``make_outputs.py`` has cached; the cases without a cached
    output are skipped, unless ``require_output=False`` (end-to-end runs, which compare
    against HF greedy itself): then every question is a case, with an empty ``output``
    where none is cached."""
    cases = []
    for i, q in enumerate(chat_questions(category)):
        text = chat_prompt(q)
        path = OUTPUTS_DIR / f"{prompt_key(text)}.json"
        if path.exists():
            rec = json.loads(path.read_text())
            prompt_ids, output_ids = rec["prompt_ids"], rec["output_ids"]
        elif require_output:
            continue
        else:
            prompt_ids, output_ids = encode(text, bos=True), []
        cases.append(Case(prompt=np.asarray(prompt_ids, dtype=np.int32),
                          output=np.asarray(output_ids, dtype=np.int32),
                          name=f"{category}/{i}"))
        if limit and len(cases) >= limit:
            break
    return Workload(category, cases)


def load_workload(name: str, limit: int | None = None, require_output: bool = True) -> Workload:
    if name == "edits":
        return load_edits(limit)
    if name == "edits-model":
        return load_edits_model(limit)
    if name == "edits+stdlib":  # the same pairs, refdec also given the stdlib corpus index
        return Workload(name, load_edits(limit).cases, corpus="stdlib")
    if name == "humaneval":
        return load_humaneval(limit)
    if name in GENERATED_WORKLOADS:
        return load_generated(name, limit, require_output)
    raise ValueError(f"unknown workload {name!r}; expected one of {ALL_WORKLOADS}")


# ---------------------------------------------------------------- corpora

def stdlib_documents() -> list:
    """(relative path, text) of the Python standard library's *.py files,
    site-packages and test suites excluded, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "test/", "idlelib/idle_test/")) or "/tests/" in rel:
            continue
        try:
            docs.append((rel, p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return docs


def corpus_index(name: str, *, show_progress: bool = False):
    """The ``refdec.CorpusIndex`` named ``name``, built once and cached under
    benchmarks/cache/."""
    import refdec

    if name != "stdlib":
        raise ValueError(f"unknown corpus {name!r}; expected 'stdlib'")
    path = CACHE_DIR / "stdlib.refdec"
    if path.exists():
        try:
            return refdec.CorpusIndex.load(str(path), tokenizer())
        except refdec.IndexFormatError as exc:  # e.g. written by an older format version
            print(f"rebuilding {path}: {exc}", file=sys.stderr)
    docs = stdlib_documents()
    ids = _cached_token_lists("stdlib", [(text, False) for _, text in docs])
    index = refdec.CorpusIndex.build(ids, tokenizer(), show_progress=show_progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    index.save(str(path))
    return refdec.CorpusIndex.load(str(path))


def draftretriever_reader(name: str):
    """REST's ``draftretriever.Reader`` over the corpus ``name`` (the same token
    ids as ``corpus_index``), its datastore built once under benchmarks/cache/."""
    import draftretriever

    if name != "stdlib":
        raise ValueError(f"unknown corpus {name!r}; expected 'stdlib'")
    path = CACHE_DIR / "stdlib.draftretriever.idx"
    if not path.exists():
        docs = stdlib_documents()
        ids = _cached_token_lists("stdlib", [(text, False) for _, text in docs])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        writer = draftretriever.Writer(str(tmp), 262144)
        for arr in ids:
            writer.add_entry(arr.tolist())
        writer.finalize()
        os.replace(tmp, path)
    return draftretriever.Reader(str(path))

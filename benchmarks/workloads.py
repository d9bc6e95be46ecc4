"""Workloads: the requests the simulator replays and the end-to-end runs decode.

A workload is a list of :class:`Case`: the prompt tokens, the true output tokens
the drafter has to predict, the per-request reference documents (the file being
edited) and, optionally, the name of a corpus index shared by all cases
(``corpora.corpus_index``).

    edits          edits-click.jsonl: prompt = refdec's edit prompt (``refdec edit``'s
                   default template, ``refdec.edit_prompt``) around the original file and
                   the commit message, references = [original file], output = the
                   updated file.
    edits+stdlib   the same cases, with the stdlib corpus index.
    edits-model    the edit prompts from pair EDITS_MODEL_FIRST on, the output being the
                   default model's own greedy output (``make_outputs.py``).
    humaneval      humaneval.jsonl.gz: prompt = the HumanEval prompt, output = its
                   canonical solution, corpus = the stdlib.
    summarization, rag
                   specbench-question.jsonl (by ``category``), output = Gemma 3 270M's
                   greedy continuation (``make_outputs.py``).
    mtbench        mtbench-question.jsonl first turns, the same outputs cache.

The data is read by ``data.py``; token ids are cached by ``tokens.py``; the model's
outputs are cached in ``paths.CACHE_DIR / "outputs"`` by ``make_outputs.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import data, tokens
from benchmarks.paths import CACHE_DIR

OUTPUTS_DIR = CACHE_DIR / "outputs"

# Chat-model outputs: categories of specbench / mtbench whose true output is the
# default model's greedy continuation.
GENERATED_WORKLOADS = ("summarization", "rag", "mtbench")
ALL_WORKLOADS = ("edits", "edits+stdlib", "edits-model", "humaneval", "summarization", "rag", "mtbench")
# edits-model: the edit prompts from this pair on, with the default model's own greedy output
# (512 tokens, make_outputs.py --categories edits-model) as the true output: what the decoder
# meets end to end. e2e.py benchmarks the first 10 pairs, so tuning on edits-model stays off them.
EDITS_MODEL_FIRST = 10


@dataclass
class Case:
    """One simulated request.

    prompt      int32 array of shape (L,): the prompt tokens (BOS included).
    output      int32 array of shape (m,): the true continuation to be drafted.
    references  list of int32 arrays: per-request reference documents.
    name        a short label for diagnostics.
    original    the file being edited (editor workloads: is the model's output a change or a copy?)
    stop        the text that ends the edited file in the output (the closing fence), with ``original``
    """

    prompt: np.ndarray
    output: np.ndarray
    references: list = field(default_factory=list)
    name: str = ""
    original: str | None = None
    stop: str | None = None


@dataclass
class Workload:
    name: str
    cases: list
    corpus: str | None = None  # name of a shared corpus index (see ``corpora.corpus_index``)


# ---------------------------------------------------------------- templates

def edit_prompt_text(row: dict) -> str:
    """The prompt ``refdec edit`` ships (``refdec.edit_prompt``, its default template) for an
    edit pair: the original file, the commit message as the instruction, the file's path."""
    from refdec.edit_prompt import build_edit_prompt

    return build_edit_prompt(row["before"], row["message"], path=row["path"]).text


def chat_prompt(question: str) -> str:
    """Gemma 3's turn format around one user message (the default model's
    tokenizer has no chat template; these are its <start_of_turn> tokens)."""
    return f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n"


# ---------------------------------------------------------------- cache keys of the model's outputs

def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:20]


def prompt_key(prompt_text: str) -> str:
    """Cache key of a generated chat output: a hash of the prompt text."""
    return _key("prompt", prompt_text)


def edits_model_path(case: Case) -> Path:
    """Cache file of the default model's output for an edit case (keyed by its prompt ids)."""
    return OUTPUTS_DIR / f"edits-model-{_key('edits-model', ' '.join(map(str, case.prompt.tolist())))}.json"


# ---------------------------------------------------------------- workloads

def load_edits(limit: int | None = None) -> Workload:
    rows = data.edit_rows()
    rows = rows[:limit] if limit else rows
    prompts = tokens.token_ids([edit_prompt_text(r) for r in rows], tag="edits-prompt", bos=True)
    befores = tokens.token_ids([r["before"] for r in rows], tag="edits-before")
    afters = tokens.token_ids([r["after"] for r in rows], tag="edits-after")
    cases = [Case(prompt=prompt, references=[before], output=after, name=f"{r['path']}@{r['commit'][:8]}")
             for r, prompt, before, after in zip(rows, prompts, befores, afters)]
    return Workload("edits", cases)


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
    rows = data.humaneval_rows()
    rows = rows[:limit] if limit else rows
    prompts = tokens.token_ids([r["prompt"] for r in rows], tag="humaneval-prompt", bos=True)
    solutions = tokens.token_ids([r["canonical_solution"] for r in rows], tag="humaneval-solution")
    cases = [Case(prompt=prompt, output=solution, name=r["task_id"])
             for r, prompt, solution in zip(rows, prompts, solutions)]
    return Workload("humaneval", cases, corpus="stdlib")


def load_generated(category: str, limit: int | None = None, require_output: bool = True) -> Workload:
    """Chat prompts whose outputs ``make_outputs.py`` has cached; the cases without a cached
    output are skipped, unless ``require_output=False`` (end-to-end runs, which compare
    against HF greedy itself): then every question is a case, with an empty ``output``
    where none is cached."""
    cases = []
    for i, q in enumerate(data.chat_questions(category)):
        text = chat_prompt(q)
        path = OUTPUTS_DIR / f"{prompt_key(text)}.json"
        if path.exists():
            rec = json.loads(path.read_text())
            prompt_ids, output_ids = rec["prompt_ids"], rec["output_ids"]
        elif require_output:
            continue
        else:
            prompt_ids, output_ids = tokens.encode(text, bos=True), []
        cases.append(Case(prompt=np.asarray(prompt_ids, dtype=np.int32),
                          output=np.asarray(output_ids, dtype=np.int32),
                          name=f"{category}/{i}"))
        if limit and len(cases) >= limit:
            break
    return Workload(category, cases)


def load_chat_workload(category: str, tokenizer, limit: int | None = None) -> Workload:
    """The chat questions of ``category`` (one of GENERATED_WORKLOADS) as a chat model is prompted:
    one user turn through ``tokenizer``'s chat template, the assistant's turn opened. No cached
    outputs (end-to-end runs compare against HF greedy itself)."""
    if category not in GENERATED_WORKLOADS:
        raise ValueError(f"chat workloads are {GENERATED_WORKLOADS}, got {category!r}")
    cases = []
    for i, question in enumerate(data.chat_questions(category, limit)):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        cases.append(Case(prompt=np.asarray(ids, dtype=np.int32), output=np.zeros(0, dtype=np.int32),
                          name=f"{category}/{i}"))
    return Workload(category, cases)


def editor_edit_rows(limit: int | None = None, max_file_chars: int = 5000) -> list[dict]:
    """The edit pairs an editor model is asked to make: a changed file of 1,000..``max_file_chars``
    characters, in file order, the first ``limit``."""
    rows = [r for r in data.edit_rows() if 1000 <= len(r["before"]) <= max_file_chars and r["before"] != r["after"]]
    return rows[:limit] if limit else rows


def load_editor_edits(tokenizer, limit: int | None = None) -> Workload:
    """The edits as ``refdec edit`` asks an instruct model (refdec.edit_prompt.build_chat_edit_prompt:
    its chat template, the commit message as the instruction, the reply begun with the fence);
    references = [the original file]; no true output (end-to-end runs compare against HF greedy)."""
    from refdec.edit_prompt import build_chat_edit_prompt

    cases = []
    for row in editor_edit_rows(limit):
        prompt = build_chat_edit_prompt(row["before"], row["message"], tokenizer)
        ids = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        before = tokenizer(row["before"], add_special_tokens=False)["input_ids"]
        cases.append(Case(prompt=np.asarray(ids, dtype=np.int32), output=np.zeros(0, dtype=np.int32),
                          references=[np.asarray(before, dtype=np.int32)], name=f"{row['path']}@{row['commit'][:8]}",
                          original=row["before"], stop=prompt.stop))
    return Workload("edits", cases)


def edit_outcome(text: str, stop: str, original: str) -> str:
    """What a model did with the file ``original``, given its output ``text`` (decoded): "changed"
    it, "copied" it unchanged, or gave no whole file ("cut": ``stop``, the closing fence, not
    reached)."""
    if stop not in text:
        return "cut"
    return "copied" if text[: text.index(stop)] == original else "changed"


def load_workload(name: str, limit: int | None = None, require_output: bool = True) -> Workload:
    """The workload ``name`` (one of ALL_WORKLOADS), its first ``limit`` cases if given."""
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

"""Every call refdec makes into llama-cpp-python, in one place (the version pyproject.toml's
``[llama]`` extra pins, which CI builds).

:class:`TreeContext` is refdec's own llama.cpp context on the model of a user's
``llama_cpp.Llama``: the same weights (shared, not copied), the Llama's context settings
(context size, threads, batch sizes, KV types, flash attention), and what tree
verification needs and a ``Llama`` does not set up: several sequences in one unified KV
cache (``n_seq_max``, ``kv_unified``; llama.cpp masks attention by sequence id, so a tree
node attends to the cells of its own sequence) and a full-size sliding-window cache (cells
of rejected branches are removed, never rolled back). The user's ``Llama`` and its
context are left as they are.

In exact mode (``TreeContext(exact=True)``, docs/llama_cpp.md) the context gives each sequence a
KV stream of its own (``kv_unified`` off: a sequence's cells are its positions, as in plain
decoding's one-sequence cache) and a decode may ask for ggml's batch-invariant matrix products
(:func:`batch_invariant_switch`: a llama.cpp built by ``refdec build-llama``), with which every
row of the batch computes what a one-token decode computes.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

try:
    import llama_cpp
    from llama_cpp import llama_cpp as _lib
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("refdec on llama.cpp needs llama-cpp-python: pip install 'refdec[llama]'") from exc

__all__ = ["LlamaDecodeError", "TreeContext", "batch_invariant_switch", "chat_template", "chat_template_prompt",
           "flash_attention_on", "is_recurrent", "llama_version"]

MAX_SEQUENCES = int(_lib.llama_max_parallel_sequences())


class LlamaDecodeError(RuntimeError):
    """``llama_decode`` refused a batch (``code`` 1: no KV slot, the context is full; else invalid
    input or an abort)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


def is_recurrent(model) -> bool:
    """Whether the llama.cpp model (a ``llama_model_p``) keeps a recurrent state per sequence: a recurrent
    model (Mamba, RWKV) or a hybrid one (Qwen3.5, LFM2, Granite 4, Nemotron-H, Falcon-H1)."""
    return bool(_lib.llama_model_is_recurrent(model)) or bool(_lib.llama_model_is_hybrid(model))


def llama_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")


_SWITCH: list = []  # [the switch or None], found once


def batch_invariant_switch():
    """ggml's ``ggml_cpu_set_batch_invariant(bool)`` in the CPU backend llama.cpp runs on, or None
    where that build lacks it: stock llama-cpp-python (``refdec build-llama`` builds one with it,
    refdec/llama_cpp/patches/). While on (process-wide), each row of a matrix product is computed
    with the kernels a one-row product uses."""
    if not _SWITCH:
        found = None
        for path in _loaded_ggml_cpu():
            try:
                setter = ctypes.CDLL(path).ggml_cpu_set_batch_invariant  # loaded: dlopen gives its handle
            except (OSError, AttributeError):
                continue
            setter.argtypes = [ctypes.c_bool]
            setter.restype = None
            found = setter
            break
        _SWITCH.append(found)
    return _SWITCH[0]


def ggml_cpu_build() -> str:
    """Which build of ggml's CPU backend this process runs (its files' names, sizes and times): a
    rebuilt llama-cpp-python (another patch, `refdec build-llama` again) times differently."""
    parts = []
    for path in _loaded_ggml_cpu():
        try:
            stat = os.stat(path)
        except OSError:
            continue
        parts.append(f"{Path(path).name}:{stat.st_size}:{int(stat.st_mtime)}")
    return ",".join(parts) or "unknown"


def _loaded_ggml_cpu() -> list[str]:
    """The paths of ggml's CPU backend mapped into this process (llama-cpp-python's wheel holds the
    library under several names, copies, not links: a library opened by another name would be a
    second instance with a switch of its own). Where the process's maps cannot be read (not
    Linux), the backend's files in llama-cpp-python's ``lib`` folder."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            mapped = {line.split()[-1] for line in maps if len(line.split()) >= 6}
        return sorted(path for path in mapped if path.startswith("/") and "ggml-cpu" in Path(path).name)
    except OSError:  # pragma: no cover - not Linux
        return [str(p) for p in sorted((Path(llama_cpp.__file__).parent / "lib").glob("*ggml-cpu*"))]


def flash_attention_on(llm) -> bool:
    """Whether ``llm``'s context may use flash attention (llama.cpp's ``flash_attn_type``: on, or
    auto, which turns it on where the backend supports it)."""
    return int(llm.context_params.flash_attn_type) != int(_lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)


class TreeContext:
    """A llama.cpp context for tree verification on ``llm``'s model.

    ``n_seq_max``: sequences (1 + the most leaves the trees of a step may hold in all, plus one
    per extra batch row); ``rollback``: a recurrent model's states kept per sequence, for its last
    ``rollback`` tokens (llama.cpp's ``n_rs_seq``; 0 for an attention model; ``self.rollback`` is what
    llama.cpp granted: 0 for an architecture it cannot roll back); ``exact``: a KV stream of
    ``sequence_cells`` cells per sequence (default the Llama's ``n_ctx``; cells at their positions;
    ``self.n_ctx`` is then a sequence's room) and :meth:`decode`'s ``invariant`` available (module
    docstring); ``n_batch``: the most tokens one ``decode`` takes (a tree's nodes + 1,
    or a prefill chunk); ``n_outputs`` (default ``n_batch``): the most entries of one ``decode``
    that want logits (llama.cpp aborts the process past its ``n_outputs_max``; its worst-case graph,
    reserved up front, holds that many vocabulary-sized rows). The batch buffers are allocated once.
    """

    def __init__(self, llm, *, n_seq_max: int, n_batch: int, n_outputs: int | None = None,
                 rollback: int = 0, exact: bool = False, sequence_cells: int | None = None) -> None:
        if not 1 <= n_seq_max <= MAX_SEQUENCES:
            raise ValueError(f"n_seq_max must be in [1, {MAX_SEQUENCES}] (llama.cpp's limit), got {n_seq_max}")
        self.llm = llm
        self.model = llm.model  # llama_model_p, owned by llm
        self.vocab = _lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(_lib.llama_vocab_n_tokens(self.vocab))
        src = llm.context_params
        params = _lib.llama_context_default_params()
        for name, _ in _lib.llama_context_params._fields_:  # the Llama's settings, ours where trees need them
            setattr(params, name, getattr(src, name))
        self.n_ctx = int(_lib.llama_n_ctx(llm.ctx))
        params.n_ctx = self.n_ctx
        params.n_seq_max = int(n_seq_max)
        # cells shared by sequences (a node's cell belongs to every leaf below it); exact: a stream per
        # sequence, of sequence_cells each (llama.cpp splits n_ctx evenly between streams)
        params.kv_unified = not exact
        if exact:
            if sequence_cells is not None:
                if not 1 <= int(sequence_cells) <= self.n_ctx:
                    raise ValueError(f"sequence_cells must be in [1, {self.n_ctx}] (the Llama's n_ctx), "
                                     f"got {sequence_cells}")
                self.n_ctx = int(sequence_cells)
            params.n_ctx = self.n_ctx * int(n_seq_max)
        self.exact = bool(exact)
        self._invariant = batch_invariant_switch() if exact else None
        if exact and self._invariant is None:
            raise ValueError("exact mode needs a llama.cpp with ggml_cpu_set_batch_invariant: "
                             "build llama-cpp-python with `refdec build-llama`")
        params.swa_full = True  # rejected branches are removed; sliding-window layers must keep full history
        params.n_batch = max(int(src.n_batch), int(n_batch))
        params.n_ubatch = max(int(src.n_ubatch), int(n_batch))  # a tree is one micro-batch: one graph
        # logits rows a decode may ask for; llama.cpp reserves at least one per sequence
        params.n_outputs_max = max(int(n_batch if n_outputs is None else n_outputs), int(n_seq_max))
        params.n_outputs_max_per_seq = 0  # a tree's sequence has a logits row per node
        params.embeddings = False
        # a recurrent state cannot be cut back to an earlier position: llama.cpp keeps the states of a
        # sequence's last ``rollback`` tokens so that seq_remove of at most that many tokens restores one
        params.n_rs_seq = int(rollback)
        self.n_batch = int(params.n_batch)
        self.n_outputs = int(params.n_outputs_max)
        self.prefill_chunk = int(llm.n_batch)  # prompts are fed as Llama.eval feeds them
        self.n_seq_max = int(n_seq_max)
        self.ctx = _lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context for tree verification (out of memory?)")
        # llama.cpp keeps no snapshots (0) for an architecture whose recurrent state it cannot roll back
        self.rollback = int(_lib.llama_n_rs_seq(self.ctx))
        self.memory = _lib.llama_get_memory(self.ctx)
        self._batch = _lib.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        b = self._batch
        self._token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        self._seq_ids = [np.ctypeslib.as_array(b.seq_id[i], shape=(self.n_seq_max,)) for i in range(self.n_batch)]
        self.decodes = 0  # llama_decode calls made (tests count them)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            _lib.llama_batch_free(self._batch)
            _lib.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass

    # -- one decode

    def decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: list, want_logits: np.ndarray,
               invariant: bool = False) -> None:
        """One ``llama_decode`` of ``n`` entries: ``tokens`` int [n], ``positions`` int [n],
        ``seq_ids[i]`` the sequence ids of entry i (a list of ints, or an int array), ``want_logits``
        bool [n] the entries whose logits :meth:`logits` may read afterwards. ``invariant`` (exact
        mode only): with ggml's batch-invariant matrix products, on for this decode alone."""
        if invariant and self._invariant is None:
            raise ValueError("invariant=True needs a TreeContext made with exact=True")
        n = int(tokens.shape[0])
        if not 1 <= n <= self.n_batch:
            raise ValueError(f"a decode takes 1..{self.n_batch} tokens, got {n}")
        if int(np.count_nonzero(want_logits)) > self.n_outputs:  # llama.cpp would abort the process
            raise ValueError(f"a decode gives logits for at most {self.n_outputs} entries, "
                             f"{int(np.count_nonzero(want_logits))} asked")
        self._token[:n] = tokens
        self._pos[:n] = positions
        self._logits[:n] = want_logits
        for i in range(n):
            ids = seq_ids[i]
            k = len(ids)
            self._n_seq_id[i] = k
            self._seq_ids[i][:k] = ids
        self._batch.n_tokens = n
        self.decodes += 1
        if invariant:
            self._invariant(True)
            try:
                rc = _lib.llama_decode(self.ctx, self._batch)
            finally:
                self._invariant(False)
        else:
            rc = _lib.llama_decode(self.ctx, self._batch)
        if rc != 0:
            what = ("no KV cache slot: the context is full (create the Llama with a larger n_ctx)" if rc == 1
                    else "aborted" if rc == 2 else "the batch was refused")
            raise LlamaDecodeError(f"llama_decode returned {rc}: {what}", code=int(rc))

    def logits(self, i: int) -> np.ndarray:
        """float32 [n_vocab]: the logits of batch entry ``i`` of the last decode (a view, valid until
        the next decode; the entry must have asked for them)."""
        ptr = _lib.llama_get_logits_ith(self.ctx, int(i))
        if not ptr:
            raise RuntimeError(f"llama.cpp holds no logits for batch entry {i}")
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))

    def set_abort(self, check) -> None:
        """While set, llama.cpp calls ``check()`` (-> bool) between the operations of every decode's
        graph and stops the decode when it returns True (:meth:`decode` raises LlamaDecodeError,
        code 2; llama.cpp removes what that decode wrote). None unsets it."""
        if check is None:
            _lib.llama_set_abort_callback(self.ctx, _lib.ggml_abort_callback(), None)
            self._abort = None
            return
        def poll(_data) -> bool:
            try:
                return bool(check())
            except Exception:  # noqa: BLE001 - an exception cannot cross into llama.cpp: decode on
                return False

        self._abort = _lib.ggml_abort_callback(poll)  # kept alive while set
        _lib.llama_set_abort_callback(self.ctx, self._abort, None)

    # -- the KV cache's sequences

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Adds ``dst`` to the cells of ``src`` at positions [p0, p1) (-1: open)."""
        _lib.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_remove(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Removes ``seq`` from its cells at positions [p0, p1) (-1: open); freed cells are reused."""
        if not _lib.llama_memory_seq_rm(self.memory, seq, p0, p1):
            why = ""
            if is_recurrent(self.model):
                why = (f": the model has recurrent layers, whose state llama.cpp restores only for a "
                       f"sequence's last {self.rollback} tokens (n_rs_seq), never further back"
                       if self.rollback else ": the model has recurrent layers, whose state llama.cpp cannot "
                       "restore to an earlier position for this architecture (n_rs_seq is 0)")
            raise RuntimeError(f"llama.cpp could not remove positions [{p0}, {p1}) of sequence {seq}{why}")

    def seq_pos_range(self, seq: int) -> tuple[int, int]:
        """(smallest, largest) position of ``seq``'s cells; (-1, -1) when it has none."""
        return (int(_lib.llama_memory_seq_pos_min(self.memory, seq)),
                int(_lib.llama_memory_seq_pos_max(self.memory, seq)))

    def clear(self) -> None:
        _lib.llama_memory_clear(self.memory, True)

    # -- the model's vocabulary

    def eos_ids(self) -> set[int]:
        """The end-of-generation tokens (eos, eot, ...) of the model's vocabulary."""
        return {t for t in (int(_lib.llama_vocab_eos(self.vocab)), int(_lib.llama_vocab_eot(self.vocab)))
                if t >= 0}

    def n_threads(self) -> tuple[int, int]:
        return int(_lib.llama_n_threads(self.ctx)), int(_lib.llama_n_threads_batch(self.ctx))


def chat_template(llm) -> str | None:
    """The chat template the GGUF file of ``llm`` carries (``tokenizer.chat_template``), None without one."""
    return (llm.metadata or {}).get("tokenizer.chat_template") or None


def chat_template_prompt(llm, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` through the chat template the GGUF file carries
    (``tokenizer.chat_template``), rendered as transformers renders it. ValueError without one."""
    template = chat_template(llm)
    if template is None:
        raise ValueError(f"{llm.model_path} carries no chat template (tokenizer.chat_template)")

    vocab = _lib.llama_model_get_vocab(llm.model)

    def text(token: int) -> str:
        return "" if token < 0 else _lib.llama_vocab_get_text(vocab, token).decode("utf-8", errors="replace")

    formatter = Jinja2ChatFormatter(template, eos_token=text(int(_lib.llama_vocab_eos(vocab))),
                                    bos_token=text(int(_lib.llama_vocab_bos(vocab))),
                                    add_generation_prompt=add_generation_prompt)
    return formatter(messages=messages).prompt

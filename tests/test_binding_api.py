"""What Python sees of the C++ core (refdec._C): parameter classes bound once from the C++
structs, an exception declared in C++, test-only entry points kept apart, named results, and
the Drafter protocol every decoding loop types against."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import refdec
from refdec import ContextIndex, CorpusIndex, Proposer, _C
from refdec.drafting.proposer import DEFAULT_PARAMS, CursorParams, Drafter, SourceParams
from tiny_models import PromptLookupProposer


def arr(tokens):
    return np.asarray(tokens, dtype=np.int32)


# ---------------------------------------------------------------------------
# CursorParams / SourceParams: the C++ structs with checked read-write fields


def test_the_defaults_are_the_cpp_structs_and_every_field_is_listed_in_order():
    params = CursorParams()
    # a few defaults as csrc/copy_cursor.h states them
    assert (params.match_gain, params.match_cap, params.start_run, params.max_scan) == (2.0, 16, 16, 16384)
    assert list(params.to_dict()) == list(CursorParams.field_names)
    assert len(CursorParams.field_names) == 24
    assert SourceParams().to_dict() == {"weight": 1.0, "half_len": 2.0}
    assert SourceParams.field_names == ("weight", "half_len")


def test_params_are_built_by_keyword_or_in_field_order():
    assert SourceParams(0.9, 4.0) == SourceParams(weight=0.9, half_len=4.0) == SourceParams(0.9, half_len=4.0)
    assert CursorParams(start_run=0).start_run == 0
    assert CursorParams(start_run=0) != CursorParams()


@pytest.mark.parametrize("call, message", [
    (lambda: CursorParams(start_runs=0), r"CursorParams\(\) got an unexpected keyword argument 'start_runs'"),
    (lambda: SourceParams(1.0, weight=1.0), r"got multiple values for argument 'weight'"),
    (lambda: SourceParams(1.0, 2.0, 3.0), r"takes at most 2 positional arguments \(3 given\)"),
])
def test_a_misnamed_or_repeated_argument_is_a_type_error(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_a_field_reads_back_the_decimal_it_was_given():
    # the C++ field is a float32; it reads (and prints) as the shortest decimal of that float32
    params = CursorParams(copy_decay=0.1, unigram_below=1 / 3)
    assert params.copy_decay == 0.1
    assert params.unigram_below == 0.33333334
    assert "copy_decay=0.1," in repr(params)


def test_assignment_is_checked_like_construction_and_a_refused_value_changes_nothing():
    params = CursorParams()
    params.start_run = 3
    assert params.start_run == 3
    with pytest.raises(ValueError, match=r"CursorParams.start_run must be an int in \[0, 2147483647\], got -1"):
        params.start_run = -1
    with pytest.raises(ValueError, match=r"CursorParams.copy_decay must be a finite number in \[0.0, 1.0\], got True"):
        params.copy_decay = True
    assert params.start_run == 3 and params.copy_decay == 1.0


def test_numpy_scalars_are_numbers_but_numpy_bools_are_not():
    params = CursorParams(match_cap=np.int64(5), copy_decay=np.float32(0.5))
    assert (params.match_cap, params.copy_decay) == (5, 0.5)
    with pytest.raises(ValueError, match="CursorParams.match_cap must be an int"):
        CursorParams(match_cap=np.bool_(True))
    with pytest.raises(ValueError, match="CursorParams.match_cap must be an int"):
        CursorParams(match_cap=16.0)


def test_repr_pickle_copy_and_replace_round_trip():
    params = CursorParams(start_run=0, copy_decay=0.25, match_gain=-1.5)
    assert eval(repr(params), {"CursorParams": CursorParams}) == params
    assert pickle.loads(pickle.dumps(params)) == params
    assert copy.copy(params) == params and copy.deepcopy(params) == params
    changed = params.replace(start_run=4, null_score=2.0)
    assert (changed.start_run, changed.null_score, changed.copy_decay) == (4, 2.0, 0.25)
    assert params.start_run == 0  # the original is left alone
    with pytest.raises(ValueError, match="CursorParams.max_candidates"):
        params.replace(max_candidates=0)


def test_params_are_mutable_so_not_hashable():
    with pytest.raises(TypeError, match="unhashable"):
        hash(SourceParams())


def test_a_proposer_keeps_its_own_copies_of_the_params_it_was_given():
    cursor = CursorParams(start_run=0)
    corpus = SourceParams(weight=0.5, half_len=1.0)
    proposer = Proposer(params={"corpus": corpus}, cursor=cursor)
    cursor.start_run = 9
    corpus.weight = 0.1
    proposer.params["context"].weight = 0.2
    assert proposer.cursor.start_run == 0
    assert proposer.params["corpus"] == SourceParams(weight=0.5, half_len=1.0)
    assert DEFAULT_PARAMS["context"] == SourceParams(weight=1.0, half_len=2.0)
    assert Proposer().params["context"].weight == 1.0


def test_the_drafting_defaults_are_stated_once_in_cpp_and_a_proposer_uses_them():
    # csrc/proposer_core.h: kContextParams, kReferenceParams, kCorpusParams, kMemoryParams, kLoopDecay,
    # kEditingLoopDecay
    assert _C.default_source_params() == {"context": SourceParams(weight=1.0, half_len=2.0),
                                          "reference": SourceParams(weight=1.0, half_len=2.0),
                                          "corpus": SourceParams(weight=0.9, half_len=4.0),
                                          "memory": SourceParams(weight=0.9, half_len=4.0)}
    assert (_C.LOOP_DECAY, _C.EDITING_LOOP_DECAY) == (0.7, 1.0)
    from refdec.drafting.tree import MAX_NODES

    assert MAX_NODES == _C.MAX_NODES == 64  # kMaxNodes: the node cap, stated once in C++
    assert DEFAULT_PARAMS == _C.default_source_params() and DEFAULT_PARAMS is not _C.default_source_params()
    assert Proposer().params == DEFAULT_PARAMS and Proposer().loop_decay == _C.LOOP_DECAY
    assert Proposer(cursor=True).loop_decay == _C.EDITING_LOOP_DECAY


def test_the_core_takes_no_default_loop_decay_since_it_depends_on_the_mode():
    with pytest.raises(TypeError, match="loop_decay"):
        _C.ProposerCore(8).set_context(ContextIndex().automaton, SourceParams(), 0)


def test_a_source_params_value_of_another_type_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"params\['corpus'\] must be a refdec.drafting.proposer.SourceParams, got \(0.9, 4.0\)"):
        Proposer(params={"corpus": (0.9, 4.0)})


# ---------------------------------------------------------------------------
# IndexFormatError: declared in C++, registered by name


def test_index_format_error_is_the_cpp_exception_seen_as_a_value_error(tmp_path):
    assert refdec.IndexFormatError is refdec.drafting.index.IndexFormatError is _C.IndexFormatError
    assert issubclass(_C.IndexFormatError, ValueError)
    path = tmp_path / "foreign.bin"
    path.write_bytes(b"not an index" * 64)
    with pytest.raises(_C.IndexFormatError, match="magic") as info:
        CorpusIndex.load(path)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


# ---------------------------------------------------------------------------
# test-only entry points live in refdec._C.testing


def test_test_only_entry_points_are_only_in_the_testing_submodule():
    for name in ("build_draft", "Matcher", "DraftSource", "_set_format_error_class"):
        assert not hasattr(_C, name), name
    assert not hasattr(_C.SuffixAutomaton, "_set_limits_for_testing")
    for name in ("build_draft", "Matcher", "DraftSource", "set_limits"):
        assert hasattr(_C.testing, name), name


def test_a_draft_crosses_as_named_int32_and_float32_arrays():
    sam = _C.SuffixAutomaton()
    sam.add_document(arr([1, 2, 3]))
    source = _C.testing.DraftSource(view=sam, state=sam.find_state(arr([1, 2])), match_len=2)
    draft = _C.testing.build_draft([source], max_nodes=4, max_depth=4)
    assert isinstance(draft, _C.DraftArrays)
    assert draft.token_ids.tolist() == [3] and draft.parents.tolist() == [-1] and draft.depths.tolist() == [1]
    assert (draft.token_ids.dtype, draft.parents.dtype, draft.scores.dtype, draft.source_ids.dtype,
            draft.depths.dtype) == (np.int32, np.int32, np.float32, np.int32, np.int32)
    # after "1": 2 then 3, a chain of depths 1 and 2
    chain = _C.testing.build_draft([_C.testing.DraftSource(view=sam, state=sam.find_state(arr([1])), match_len=1)],
                                   max_nodes=4, max_depth=4)
    assert chain.token_ids.tolist() == [2, 3] and chain.parents.tolist() == [-1, 0]
    assert chain.depths.tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"state must be in \[0, "):
        _C.testing.DraftSource(view=sam, state=10**6, match_len=2)


# Drafting sizes are checked once, in Python (refdec.Proposer: a ValueError naming the argument
# and the value); the core takes any int32 and drafts nothing for a size <= 0.


@pytest.mark.parametrize("kwargs, message", [(dict(max_depth=0), "max_depth must be an int >= 1, got 0"),
                                             (dict(max_depth=True), "max_depth must be an int >= 1, got True")])
def test_a_bad_max_depth_is_refused_by_the_proposer_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Proposer(**kwargs)


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_a_bad_max_nodes_is_refused_by_the_proposer_naming_it(bad):
    proposer = Proposer()
    proposer.start(arr([1, 2, 1]))
    with pytest.raises(ValueError, match=f"max_nodes must be an int >= 0, got {bad!r}"):
        proposer.propose(bad)


def test_the_core_drafts_nothing_for_a_size_of_zero_or_less():
    sam = _C.SuffixAutomaton()
    sam.add_document(arr([1, 2, 3]))
    source = _C.testing.DraftSource(view=sam, state=sam.find_state(arr([1, 2])), match_len=2)
    for max_nodes, max_depth in ((0, 4), (-1, 4), (4, 0), (4, -1)):
        assert len(_C.testing.build_draft([source], max_nodes=max_nodes, max_depth=max_depth).token_ids) == 0
    assert len(_C.testing.build_draft([source], max_nodes=4, max_depth=4).token_ids) == 1
    for max_depth, max_nodes, drafted in ((0, 8, 0), (8, -1, 0), (8, 0, 0), (8, 8, 8)):
        core = _C.ProposerCore(max_depth)
        core.set_context(ContextIndex().automaton, SourceParams(), 0, 1.0)
        core.feed(arr([1, 2, 1]))
        assert len(core.propose(max_nodes).token_ids) == drafted


def test_the_core_reports_matches_by_source_id_and_the_cursor_by_name():
    proposer = Proposer(references=[arr([5, 6, 7, 8])], cursor=True)
    proposer.start(arr([1]))
    proposer.accept(arr([5, 6]))  # the output copies the reference's first two tokens
    core = proposer._core
    assert core.match_lengths() == {0: 0, 1: 2}
    state = core.cursor_state(1)
    assert (state.align, state.run, state.anchor) == (2, 2, 0)
    best = core.cursor_candidates(1)[0]
    assert (best.pos, best.end, best.match) == (2, 4, 2) and 0.0 < best.weight <= 1.0


# ---------------------------------------------------------------------------
# Indexes hand the Proposer their automata through public properties


def test_indexes_expose_the_automaton_a_proposer_drafts_from():
    context = ContextIndex([1, 2, 3])
    assert isinstance(context.automaton, _C.SuffixAutomaton)
    context.extend([4])
    assert context.automaton.num_tokens == 4
    corpus = CorpusIndex.build([[1, 2, 3]], show_progress=False)
    assert isinstance(corpus.automaton, _C.FrozenIndex) and corpus.automaton.num_tokens == 3


# ---------------------------------------------------------------------------
# Drafter: the protocol of start / propose / accept


def test_the_proposer_and_the_test_stand_in_are_drafters():
    assert isinstance(Proposer(), Drafter)
    assert isinstance(PromptLookupProposer(), Drafter)


def test_an_object_without_accept_is_not_a_drafter():
    class NoAccept:
        def start(self, prompt_ids):
            pass

        def propose(self, max_nodes):
            pass

    assert not isinstance(NoAccept(), Drafter)

// Python bindings (module refdec._C). The only file that includes pybind11:
// argument conversion, GIL release and error translation, nothing else.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "automaton_view.h"
#include "draft_tree.h"
#include "frozen_index.h"
#include "matcher.h"
#include "proposer_core.h"
#include "suffix_automaton.h"

namespace py = pybind11;
using namespace refdec;

namespace {

using TokenArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
// Taken with noconvert(): only a C-contiguous int32 array, no copy.
using ExactTokenArray = py::array_t<int32_t, py::array::c_style>;

// Python class raised for IndexFormatError (set by refdec.index); ValueError until then.
PyObject* g_format_error = nullptr;

struct Tokens {
  const int32_t* data;
  int64_t size;
};

template <typename Array>
Tokens tokens_of(const Array& a, const char* name) {
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be a 1-D array of token ids, got " +
                                std::to_string(a.ndim()) + " dimensions");
  return {a.data(), static_cast<int64_t>(a.shape(0))};
}

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(T));
  return out;
}

py::tuple draft_to_numpy(const DraftResult& r) {
  return py::make_tuple(to_numpy(r.token_ids), to_numpy(r.parents), to_numpy(r.scores), to_numpy(r.source_ids));
}

// A view argument that pybind11 let through as None (a null pointer).
const AutomatonView* non_null(const AutomatonView* view) {
  if (view == nullptr) throw std::invalid_argument("view must be an automaton, not None");
  return view;
}

void check_state(const AutomatonView& v, int64_t state) {
  if (state < 0 || state >= v.num_states())
    throw std::invalid_argument("state must be in [0, " + std::to_string(v.num_states()) + "), got " +
                                std::to_string(state));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "refdec C++ core: suffix automata, frozen index, matcher, draft tree builder";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IndexFormatError& e) {
      PyErr_SetString(g_format_error != nullptr ? g_format_error : PyExc_ValueError, e.what());
    }
  });
  m.def("_set_format_error_class", [](py::object cls) {
    Py_XDECREF(g_format_error);
    g_format_error = cls.ptr();
    Py_INCREF(g_format_error);
  });

  // ---- shared read-only queries ----
  py::class_<AutomatonView>(m, "AutomatonView")
      .def_property_readonly("num_tokens", &AutomatonView::num_tokens)
      .def_property_readonly("num_documents", &AutomatonView::num_documents)
      .def_property_readonly("num_states", &AutomatonView::num_states)
      .def("match_length",
           [](const AutomatonView& v, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             return match_length(v, t.data, t.size);
           })
      .def("count",
           [](const AutomatonView& v, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             return count_occurrences(v, t.data, t.size);
           })
      .def("find_state",
           [](const AutomatonView& v, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             return find_state(v, t.data, t.size);
           })
      .def("next_tokens",
           [](const AutomatonView& v, const TokenArray& a, int64_t k) {
             if (k < 0) throw std::invalid_argument("k must be >= 0, got " + std::to_string(k));
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             const int32_t s = find_state(v, t.data, t.size);
             return next_tokens_of_state(v, s, k);
           })
      .def("continuation",
           [](const AutomatonView& v, const TokenArray& a, int64_t length) {
             if (length < 0) throw std::invalid_argument("length must be >= 0, got " + std::to_string(length));
             Tokens t = tokens_of(a, "tokens");
             std::vector<int32_t> out;
             {
               py::gil_scoped_release release;
               out = continuation_of_state(v, find_state(v, t.data, t.size), length);
             }
             return to_numpy(out);
           })
      .def("document",
           [](const AutomatonView& v, int64_t doc_idx) {
             if (doc_idx < 0 || doc_idx >= v.num_documents())
               throw std::invalid_argument("doc_idx must be in [0, " + std::to_string(v.num_documents()) +
                                           "), got " + std::to_string(doc_idx));
             const int64_t b = v.document_begin(doc_idx), e = v.document_begin(doc_idx + 1);
             py::array_t<int32_t> out(static_cast<py::ssize_t>(e - b));
             if (e > b) std::memcpy(out.mutable_data(), v.token_data() + b, (e - b) * 4);
             return out;
           })
      .def("tokens",
           [](const AutomatonView& v) {
             py::array_t<int32_t> out(static_cast<py::ssize_t>(v.num_tokens()));
             if (v.num_tokens()) std::memcpy(out.mutable_data(), v.token_data(), v.num_tokens() * 4);
             return out;
           })
      .def("transition",
           [](const AutomatonView& v, int64_t s, int32_t token) {
             check_state(v, s);
             return v.transition(static_cast<int32_t>(s), token);
           })
      .def("link", [](const AutomatonView& v, int64_t s) { check_state(v, s); return v.link(static_cast<int32_t>(s)); })
      .def("length",
           [](const AutomatonView& v, int64_t s) { check_state(v, s); return v.length(static_cast<int32_t>(s)); })
      .def("state_count",
           [](const AutomatonView& v, int64_t s) { check_state(v, s); return v.count(static_cast<int32_t>(s)); })
      .def("children", [](const AutomatonView& v, int64_t s) {
        check_state(v, s);
        std::vector<Edge> edges;
        v.children(static_cast<int32_t>(s), &edges);
        std::vector<std::pair<int32_t, int32_t>> out;
        for (const Edge& e : edges) out.emplace_back(e.token, e.target);
        return out;
      });

  // ---- mutable automaton ----
  py::class_<SuffixAutomaton, AutomatonView>(m, "SuffixAutomaton")
      .def(py::init<>())
      .def("start_document", &SuffixAutomaton::start_document)
      .def("_set_limits_for_testing", &SuffixAutomaton::set_limits_for_testing, py::arg("max_states"),
           py::arg("max_edges"))
      .def("extend", &SuffixAutomaton::extend, py::arg("token"))
      .def("extend_many",
           [](SuffixAutomaton& sam, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             sam.extend_many(t.data, t.size);
           })
      .def("add_document",
           [](SuffixAutomaton& sam, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             sam.add_document(t.data, t.size);
           })
      .def("reserve",
           [](SuffixAutomaton& sam, int64_t n) {
             if (n < 0) throw std::invalid_argument("n must be >= 0, got " + std::to_string(n));
             sam.reserve(n);
           },
           py::arg("n"))
      .def_property_readonly("released", &SuffixAutomaton::released)
      .def("match_state", &SuffixAutomaton::match_state)
      .def_property_readonly("last", &SuffixAutomaton::last)
      .def_property_readonly("num_edges", &SuffixAutomaton::num_edges);

  // ---- frozen index ----
  py::class_<FrozenIndex, AutomatonView>(m, "FrozenIndex")
      .def_static(
          "freeze",
          [](SuffixAutomaton& sam, const std::string& fingerprint, uint32_t vocab_size, bool release_sam) {
            py::gil_scoped_release release;
            return release_sam ? FrozenIndex::freeze_and_release(&sam, fingerprint, vocab_size)
                               : FrozenIndex::freeze(sam, fingerprint, vocab_size);
          },
          py::arg("sam"), py::arg("fingerprint"), py::arg("vocab_size"), py::arg("release") = false,
          "release=True frees the automaton's build structures while freezing (it cannot grow afterwards)")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release release;
            return FrozenIndex::load(path);
          },
          py::arg("path"))
      .def("verify",
           [](const FrozenIndex& f) {
             py::gil_scoped_release release;
             return f.verify();
           })
      .def("buffer",
           [](const FrozenIndex& f) {
             return py::memoryview::from_memory(reinterpret_cast<const void*>(f.header_ptr()),
                                                static_cast<py::ssize_t>(f.nbytes()));
           },
           py::keep_alive<0, 1>())
      .def_property_readonly("fingerprint", &FrozenIndex::fingerprint)
      .def_property_readonly("vocab_size", &FrozenIndex::vocab_size)
      .def_property_readonly("nbytes", &FrozenIndex::nbytes)
      .def_property_readonly("path", &FrozenIndex::path)
      .def_property_readonly("is_mapped", &FrozenIndex::is_mapped)
      .def_property_readonly("num_internal", &FrozenIndex::num_internal)
      .def_property_readonly("num_edges", &FrozenIndex::num_edges)
      .def_property_readonly("format_version", [](const FrozenIndex& f) { return f.header().version; })
      .def_property_readonly("checksum", [](const FrozenIndex& f) { return f.header().checksum; });

  // ---- matcher ----
  py::class_<Matcher>(m, "Matcher")
      .def(py::init([](const AutomatonView* view) { return std::make_unique<Matcher>(non_null(view)); }),
           py::arg("view"), py::keep_alive<1, 2>())
      .def("reset", &Matcher::reset)
      .def("advance",
           [](Matcher& mt, const TokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             mt.advance_many(t.data, t.size);
           })
      .def_property_readonly("state", &Matcher::state)
      .def_property_readonly("match_length", &Matcher::match_length);

  // ---- draft trees ----
  m.def(
      "build_draft",
      [](const std::vector<std::tuple<const AutomatonView*, int32_t, int32_t, float, float, int32_t>>& specs,
         int32_t max_nodes, int32_t max_depth) {
        if (max_nodes < 0) throw std::invalid_argument("max_nodes must be >= 0, got " + std::to_string(max_nodes));
        if (max_depth < 0) throw std::invalid_argument("max_depth must be >= 0, got " + std::to_string(max_depth));
        std::vector<DraftSource> sources;
        for (const auto& t : specs) {
          DraftSource s;
          s.view = std::get<0>(t);
          s.state = std::get<1>(t);
          s.match_len = std::get<2>(t);
          s.weight = std::get<3>(t);
          s.half_len = std::get<4>(t);
          s.source_id = std::get<5>(t);
          if (s.view == nullptr) throw std::invalid_argument("source automaton must not be None");
          check_state(*s.view, s.state);
          sources.push_back(s);
        }
        DraftResult r;
        {
          py::gil_scoped_release release;
          DraftTreeBuilder builder;
          builder.build(sources, max_nodes, max_depth, &r);
        }
        return draft_to_numpy(r);
      },
      py::arg("sources"), py::arg("max_nodes"), py::arg("max_depth"),
      "sources: list of (automaton, state, match_len, weight, half_len, source_id); returns "
      "(token_ids int32[n], parents int32[n], scores float32[n], source_ids int32[n])");

  py::class_<ProposerCore>(m, "ProposerCore")
      .def(py::init([](int32_t max_depth) {
             if (max_depth < 1) throw std::invalid_argument("max_depth must be >= 1, got " + std::to_string(max_depth));
             return std::make_unique<ProposerCore>(max_depth);
           }),
           py::arg("max_depth"))
      .def("set_context", &ProposerCore::set_context, py::arg("sam"), py::arg("weight"), py::arg("half_len"),
           py::arg("source_id"), py::arg("loop_decay") = 1.0f, py::keep_alive<1, 2>())
      .def(
          "add_matcher_source",
          [](ProposerCore& p, const AutomatonView* view, float weight, float half_len, int32_t source_id) {
            p.add_matcher_source(non_null(view), weight, half_len, source_id);
          },
          py::arg("view"), py::arg("weight"), py::arg("half_len"), py::arg("source_id"), py::keep_alive<1, 2>())
      .def("feed",
           [](ProposerCore& p, const ExactTokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             p.feed(t.data, t.size);
           },
           py::arg("tokens").noconvert(), "tokens: a C-contiguous int32 array (anything else is a TypeError)")
      .def("propose",
           [](ProposerCore& p, int32_t max_nodes) {
             if (max_nodes < 0) throw std::invalid_argument("max_nodes must be >= 0, got " + std::to_string(max_nodes));
             DraftResult r;
             {
               py::gil_scoped_release release;
               p.propose(max_nodes, &r);
             }
             return draft_to_numpy(r);
           },
           py::arg("max_nodes"))
      .def("set_backoff", &ProposerCore::set_backoff, py::arg("backoff"), py::arg("min_backoff_len"))
      .def(
          "set_cursor",
          [](ProposerCore& p, int32_t source_id, const py::dict& kw) {
            CursorParams c;
            for (auto item : kw) {
              const std::string key = py::str(item.first);
              py::handle v = item.second;
              if (key == "match_gain") c.match_gain = v.cast<float>();
              else if (key == "match_cap") c.match_cap = v.cast<int32_t>();
              else if (key == "distance_gain") c.distance_gain = v.cast<float>();
              else if (key == "distance_scale") c.distance_scale = v.cast<float>();
              else if (key == "back_penalty") c.back_penalty = v.cast<float>();
              else if (key == "null_score") c.null_score = v.cast<float>();
              else if (key == "anchor_bonus") c.anchor_bonus = v.cast<float>();
              else if (key == "diag_bonus") c.diag_bonus = v.cast<float>();
              else if (key == "copy_decay") c.copy_decay = v.cast<float>();
              else if (key == "depth_decay") c.depth_decay = v.cast<float>();
              else if (key == "decay_levels") c.decay_levels = v.cast<int32_t>();
              else if (key == "hazard_power") c.hazard_power = v.cast<float>();
              else if (key == "hazard_scale") c.hazard_scale = v.cast<float>();
              else if (key == "copy_hazard_power") c.copy_hazard_power = v.cast<float>();
              else if (key == "copy_hazard_scale") c.copy_hazard_scale = v.cast<float>();
              else if (key == "confirm_run") c.confirm_run = v.cast<int32_t>();
              else if (key == "start_run") c.start_run = v.cast<int32_t>();
              else if (key == "max_candidates") c.max_candidates = v.cast<int32_t>();
              else if (key == "max_backoff") c.max_backoff = v.cast<int32_t>();
              else if (key == "max_scan") c.max_scan = v.cast<int32_t>();
              else if (key == "max_substitutions") c.max_substitutions = v.cast<int32_t>();
              else if (key == "unigram_k") c.unigram_k = v.cast<int32_t>();
              else if (key == "unigram_weight") c.unigram_weight = v.cast<float>();
              else if (key == "unigram_below") c.unigram_below = v.cast<float>();
              else throw std::invalid_argument("unknown cursor parameter " + key);
            }
            py::gil_scoped_release release;
            p.set_cursor(source_id, c);
          },
          py::arg("source_id"), py::arg("params"),
          "params: dict of CursorParams fields (copy_cursor.h); missing fields keep their defaults")
      .def("start_output", &ProposerCore::start_output)
      .def("cursor_state", &ProposerCore::cursor_state, py::arg("source_id"))
      .def(
          "cursor_candidates",
          [](const ProposerCore& p, int32_t source_id) {
            std::vector<std::tuple<int64_t, int32_t, float>> out;
            for (const CopyCandidate& c : p.cursor_candidates(source_id)) out.emplace_back(c.pos, c.match, c.weight);
            return out;
          },
          py::arg("source_id"), "[(token_pos, match, weight)], best first")
      .def("match_lengths", &ProposerCore::match_lengths);

  m.attr("FORMAT_VERSION") = kFormatVersion;
}

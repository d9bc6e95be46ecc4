// Python bindings (module refdec._C). The only file that includes pybind11:
// argument conversion, GIL release and error translation, nothing else.
// Drafting sizes (max_depth, max_nodes) are checked in Python (refdec.Proposer),
// not here: a size <= 0 drafts nothing (DraftTreeBuilder::build).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "automaton_view.h"
#include "copy_cursor.h"
#include "draft_tree.h"
#include "frozen_index.h"
#include "matcher.h"
#include "params.h"
#include "proposer_core.h"
#include "suffix_automaton.h"

namespace py = pybind11;
using namespace refdec;

namespace {

using TokenArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
// Taken with noconvert(): only a C-contiguous int32 array, no copy.
using ExactTokenArray = py::array_t<int32_t, py::array::c_style>;
using MinhashArray = py::array_t<uint32_t, py::array::c_style>;

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

// A draft tree as Python receives it (ProposerCore.propose, testing.build_draft):
// DraftResult's vectors as numpy arrays, nodes in topological order. A struct
// sequence (named fields, like os.stat_result): made and read at C speed, once
// per drafting step.
PyStructSequence_Field kDraftArraysFields[] = {
    {"token_ids", "int32 [n]: the token each node proposes"},
    {"parents", "int32 [n]: parent node index, -1 for children of the root"},
    {"scores", "float32 [n]: estimated probability that the path to the node is accepted"},
    {"source_ids", "int32 [n]: the source that scored the node highest"},
    {"depths", "int32 [n]: depth of each node, 1 for children of the root"},
    {nullptr, nullptr},
};
PyStructSequence_Desc kDraftArraysDesc = {"refdec._C.DraftArrays", "A draft tree's arrays (see refdec.DraftTree).",
                                          kDraftArraysFields, 5};
PyTypeObject* g_draft_arrays_type = nullptr;  // made once at import, never freed

py::object draft_arrays(const DraftResult& r) {
  py::object out = py::reinterpret_steal<py::object>(PyStructSequence_New(g_draft_arrays_type));
  if (!out) throw py::error_already_set();
  PyStructSequence_SetItem(out.ptr(), 0, to_numpy(r.token_ids).release().ptr());
  PyStructSequence_SetItem(out.ptr(), 1, to_numpy(r.parents).release().ptr());
  PyStructSequence_SetItem(out.ptr(), 2, to_numpy(r.scores).release().ptr());
  PyStructSequence_SetItem(out.ptr(), 3, to_numpy(r.source_ids).release().ptr());
  PyStructSequence_SetItem(out.ptr(), 4, to_numpy(r.depths).release().ptr());
  return out;
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

// ---- parameter classes built from the field tables (params.h) ----

// The shortest decimal that reads back as the same float32 ("0.1", not
// 0.10000000149011612), so a field set to 0.1 reads 0.1 and prints so.
double shortest_double(float value) {
  if (!std::isfinite(value)) return value;
  char buf[32];
  for (int digits = 1; digits <= FLT_DIG + 3; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(value));
    if (std::strtof(buf, nullptr) == value) break;
  }
  return std::strtod(buf, nullptr);
}

bool is_numpy(py::handle value, const char* kind) {
  static py::object np = py::module_::import("numpy");
  return py::isinstance(value, np.attr(kind));
}

template <typename Params>
py::object get_field(const Params& params, const ParamField<Params>& field) {
  if (field.integer != nullptr) return py::int_(params.*field.integer);
  return py::float_(shortest_double(params.*field.real));
}

// "[lo, hi]" as Python prints the bounds (ints for an int field, floats otherwise).
template <typename Params>
std::string range_text(const ParamField<Params>& field) {
  if (field.integer != nullptr) {
    const auto lo = static_cast<int64_t>(field.lo), hi = static_cast<int64_t>(field.hi);
    return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  return "[" + std::string(py::repr(py::float_(field.lo))) + ", " +
         std::string(py::repr(py::float_(field.hi))) + "]";
}

// Sets one field from a Python value: an int field takes an int (not a bool),
// a float field a real number within float32, both within the field's range;
// anything else is a ValueError naming the field, the value and the range.
template <typename Params>
void set_field(Params* params, const ParamField<Params>& field, py::handle value, const char* struct_name) {
  const bool is_bool = PyBool_Check(value.ptr());
  if (field.integer != nullptr) {
    const bool integral = !is_bool && (PyLong_Check(value.ptr()) || is_numpy(value, "integer"));
    int overflow = 0;
    long long v = 0;
    if (integral) {
      py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
      if (!index) throw py::error_already_set();
      v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    }
    if (!integral || overflow != 0 || !in_range(field, static_cast<double>(v)))
      throw py::value_error(std::string(struct_name) + "." + field.name + " must be an int in " + range_text(field) +
                            ", got " + std::string(py::repr(value)));
    params->*field.integer = static_cast<int32_t>(v);
    return;
  }
  const bool real = !is_bool && (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()) ||
                                 is_numpy(value, "integer") || is_numpy(value, "floating"));
  double v = 0.0;
  if (real) {
    v = PyFloat_AsDouble(value.ptr());
    if (v == -1.0 && PyErr_Occurred()) {  // an int too large for a double
      PyErr_Clear();
      v = std::nan("");
    }
  }
  if (!real || !in_range(field, v) || std::fabs(v) > FLT_MAX)
    throw py::value_error(std::string(struct_name) + "." + field.name + " must be a finite number in " +
                          range_text(field) + ", got " + std::string(py::repr(value)));
  params->*field.real = static_cast<float>(v);
}

// Binds a parameter struct as a Python class: every field a checked read-write
// attribute, construction by keyword (or position, in field order), ==, repr,
// pickling, replace(**changes) and to_dict().
template <typename Params, size_t N>
void bind_params(py::module_& m, const char* name, const ParamField<Params> (&fields)[N], const char* doc) {
  using Field = ParamField<Params>;
  auto find = [&fields, name](const std::string& key) -> const Field& {
    for (const Field& f : fields)
      if (key == f.name) return f;
    throw py::type_error(std::string(name) + "() got an unexpected keyword argument '" + key + "'");
  };
  auto update = [find, name](Params* p, const py::dict& changes) {
    for (auto item : changes) set_field(p, find(py::str(item.first)), item.second, name);
  };
  auto to_dict = [&fields](const Params& p) {
    py::dict out;
    for (const Field& f : fields) out[f.name] = get_field(p, f);
    return out;
  };
  py::class_<Params> cls(m, name, doc);
  cls.def(py::init([&fields, find, name](const py::args& args, const py::kwargs& kwargs) {
    if (args.size() > N)
      throw py::type_error(std::string(name) + "() takes at most " + std::to_string(N) +
                           " positional arguments (" + std::to_string(args.size()) + " given)");
    Params p;
    for (size_t i = 0; i < args.size(); ++i) set_field(&p, fields[i], args[i], name);
    for (auto item : kwargs) {
      const Field& f = find(py::str(item.first));
      for (size_t i = 0; i < args.size(); ++i)
        if (&fields[i] == &f)
          throw py::type_error(std::string(name) + "() got multiple values for argument '" + f.name + "'");
      set_field(&p, f, item.second, name);
    }
    return p;
  }));
  for (const Field& f : fields)
    cls.def_property(
        f.name, [&f](const Params& p) { return get_field(p, f); },
        [&f, name](Params& p, py::handle value) { set_field(&p, f, value, name); });
  cls.def("__eq__", [&fields](const Params& a, py::handle other) -> py::object {
    if (!py::isinstance<Params>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    const Params& b = other.cast<const Params&>();
    for (const Field& f : fields)
      if (field_value(a, f) != field_value(b, f)) return py::bool_(false);
    return py::bool_(true);
  });
  cls.def("__repr__", [&fields, name](const Params& p) {
    std::string out = std::string(name) + "(";
    for (size_t i = 0; i < N; ++i)
      out += (i ? ", " : "") + std::string(fields[i].name) + "=" + std::string(py::repr(get_field(p, fields[i])));
    return out + ")";
  });
  cls.def("replace", [update](const Params& p, const py::kwargs& changes) {
    Params out = p;
    update(&out, changes);
    return out;
  }, "A copy with the given fields changed (checked like the constructor's).");
  cls.def("to_dict", to_dict, "{field name: value}, in field order.");
  cls.def("__copy__", [](const Params& p) { return p; });
  cls.def("__deepcopy__", [](const Params& p, py::handle) { return p; });
  cls.def(py::pickle(to_dict, [update](const py::dict& state) {
    Params p;
    update(&p, state);
    return p;
  }));
  py::tuple names(N);
  for (size_t i = 0; i < N; ++i) names[i] = py::str(fields[i].name);
  cls.attr("field_names") = names;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "refdec C++ core: suffix automata, frozen index, matcher, draft tree builder";

  auto& format_error = py::register_exception<IndexFormatError>(m, "IndexFormatError", PyExc_ValueError);
  format_error.attr("__doc__") =
      "An index file is not valid: foreign (bad magic), truncated, from another format version, internally "
      "inconsistent, or built with another tokenizer (a ValueError).";

  // ---- parameters ----
  bind_params(m, "SourceParams", kSourceParamFields,
              "How far a draft source is trusted: a match of length L starts at confidence "
              "weight * L / (L + half_len). Fields, defaults and ranges: csrc/draft_tree.h (SourceParams, "
              "kSourceParamFields). Construct by keyword (SourceParams(weight=0.9, half_len=4.0)); fields are "
              "checked on assignment (ValueError naming the field, the value and the range); ==, repr, "
              "pickling, replace(**changes) -> a changed copy, to_dict().");
  bind_params(m, "CursorParams", kCursorParamFields,
              "Editing mode: the tuning of the copy cursor that follows the output through the references. "
              "What each field does, its default and its range: csrc/copy_cursor.h (CursorParams, "
              "kCursorParamFields). Construct by keyword (CursorParams(start_run=0)); fields are checked on "
              "assignment (ValueError naming the field, the value and the range); ==, repr, pickling, "
              "replace(**changes) -> a changed copy, to_dict().");

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
           },
           "[(token, count)] following the tokens, most frequent first")
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
      .def("children",
           [](const AutomatonView& v, int64_t s) {
             check_state(v, s);
             std::vector<Edge> edges;
             v.children(static_cast<int32_t>(s), &edges);
             py::dict out;
             for (const Edge& e : edges) out[py::int_(e.token)] = e.target;
             return out;
           },
           "{token: target state} of the state's transitions");

  // ---- mutable automaton ----
  py::class_<SuffixAutomaton, AutomatonView>(m, "SuffixAutomaton")
      .def(py::init<>())
      .def("start_document", &SuffixAutomaton::start_document)
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
          [](SuffixAutomaton& sam, const std::string& fingerprint, uint32_t vocab_size, bool release_sam,
             std::optional<MinhashArray> minhash_values, std::optional<MinhashArray> minhash_sizes,
             uint32_t minhash_seed, uint32_t minhash_ngram) {
            MinhashSignatures minhash;
            if (minhash_values.has_value() != minhash_sizes.has_value())
              throw std::invalid_argument("minhash_values and minhash_sizes must be given together");
            if (minhash_values) {
              if (minhash_values->ndim() != 2 || minhash_sizes->ndim() != 1 ||
                  minhash_sizes->shape(0) != minhash_values->shape(0))
                throw std::invalid_argument("minhash_values must be uint32 [num_documents, num_perm] and "
                                            "minhash_sizes uint32 [num_documents]");
              minhash = {static_cast<uint64_t>(minhash_values->shape(0)),
                         static_cast<uint32_t>(std::min<py::ssize_t>(minhash_values->shape(1), UINT32_MAX)),
                         minhash_seed, minhash_ngram, minhash_values->data(), minhash_sizes->data()};
            }
            const MinhashSignatures* with = minhash_values ? &minhash : nullptr;
            py::gil_scoped_release release;
            return release_sam ? FrozenIndex::freeze_and_release(&sam, fingerprint, vocab_size, with)
                               : FrozenIndex::freeze(sam, fingerprint, vocab_size, with);
          },
          py::arg("sam"), py::arg("fingerprint"), py::arg("vocab_size"), py::arg("release") = false,
          py::arg("minhash_values") = py::none(), py::arg("minhash_sizes") = py::none(),
          py::arg("minhash_seed") = 0, py::arg("minhash_ngram") = 0,
          "release=True frees the automaton's build structures while freezing (it cannot grow afterwards); "
          "minhash_* are the documents' MinHash signatures to store with the index")
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
      .def_property_readonly(
          "minhash",
          [](py::object self) -> py::object {
            const FrozenIndex& f = self.cast<const FrozenIndex&>();
            const FileHeader& h = f.header();
            if (h.minhash_num_perm == 0) return py::none();
            const auto rows = static_cast<py::ssize_t>(h.num_documents);
            const auto* image = f.header_ptr();
            // Views of the image whose base is the index (it stays mapped while they live).
            MinhashArray values({rows, static_cast<py::ssize_t>(h.minhash_num_perm)},
                                reinterpret_cast<const uint32_t*>(image + h.minhash_values.offset), self);
            MinhashArray sizes({rows}, reinterpret_cast<const uint32_t*>(image + h.minhash_sizes.offset), self);
            values.attr("setflags")(py::arg("write") = false);
            sizes.attr("setflags")(py::arg("write") = false);
            return py::dict(py::arg("num_perm") = h.minhash_num_perm, py::arg("seed") = h.minhash_seed,
                            py::arg("ngram") = h.minhash_ngram, py::arg("values") = values,
                            py::arg("sizes") = sizes);
          },
          "None, or the stored MinHash signatures: num_perm, seed, ngram, and read-only views of the image "
          "values (uint32 [num_documents, num_perm]) and sizes (uint32 [num_documents])")
      .def_property_readonly("format_version", [](const FrozenIndex& f) { return f.header().version; })
      .def_property_readonly("checksum", [](const FrozenIndex& f) { return f.header().checksum; });

  // ---- drafting ----
  g_draft_arrays_type = PyStructSequence_NewType(&kDraftArraysDesc);
  if (g_draft_arrays_type == nullptr) throw py::error_already_set();
  // The global keeps its own reference: the type outlives any change to the module's attributes.
  m.attr("DraftArrays") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(g_draft_arrays_type));

  py::class_<CursorState>(m, "CursorState", "Where a copy cursor stands (csrc/copy_cursor.h).")
      .def_readonly("align", &CursorState::align)
      .def_readonly("run", &CursorState::run)
      .def_readonly("anchor", &CursorState::anchor);

  py::class_<CopyCandidate>(m, "CopyCandidate", "A reference position where the output may go on copying "
                                                "(csrc/copy_cursor.h).")
      .def_readonly("pos", &CopyCandidate::pos)
      .def_readonly("end", &CopyCandidate::end)
      .def_readonly("match", &CopyCandidate::match)
      .def_readonly("weight", &CopyCandidate::weight);

  py::class_<ProposerCore>(m, "ProposerCore")
      .def(py::init<int32_t>(), py::arg("max_depth"))
      .def("set_context", &ProposerCore::set_context, py::arg("sam"), py::arg("params"), py::arg("source_id"),
           py::arg("loop_decay"), py::keep_alive<1, 2>())
      .def(
          "add_matcher_source",
          [](ProposerCore& p, const AutomatonView* view, const SourceParams& params, int32_t source_id) {
            p.add_matcher_source({non_null(view)}, params, source_id);
          },
          py::arg("view"), py::arg("params"), py::arg("source_id"), py::keep_alive<1, 2>())
      .def(
          "add_matcher_source",
          [](ProposerCore& p, const py::tuple& shards, const SourceParams& params, int32_t source_id) {
            std::vector<const AutomatonView*> views;
            for (py::handle shard : shards) views.push_back(non_null(shard.cast<const AutomatonView*>()));
            p.add_matcher_source(views, params, source_id);
          },
          py::arg("shards"), py::arg("params"), py::arg("source_id"), py::keep_alive<1, 2>(),
          "shards: a tuple of automata over disjoint documents, drafted as one corpus")
      .def("feed",
           [](ProposerCore& p, const ExactTokenArray& a) {
             Tokens t = tokens_of(a, "tokens");
             py::gil_scoped_release release;
             p.feed(t.data, t.size);
           },
           py::arg("tokens").noconvert(), "tokens: a C-contiguous int32 array (anything else is a TypeError)")
      .def("propose",
           [](ProposerCore& p, int32_t max_nodes) {
             DraftResult r;
             {
               py::gil_scoped_release release;
               p.propose(max_nodes, &r);
             }
             return draft_arrays(r);
           },
           py::arg("max_nodes"))
      .def("set_backoff", &ProposerCore::set_backoff, py::arg("backoff"), py::arg("min_backoff_len"))
      .def(
          "set_cursor",
          [](ProposerCore& p, int32_t source_id, const CursorParams& params) {
            py::gil_scoped_release release;
            p.set_cursor(source_id, params);
          },
          py::arg("source_id"), py::arg("params"))
      .def("start_output", &ProposerCore::start_output)
      .def("cursor_state", &ProposerCore::cursor_state, py::arg("source_id"))
      .def("cursor_candidates", &ProposerCore::cursor_candidates, py::arg("source_id"), "best first")
      .def(
          "match_lengths",
          [](ProposerCore& p) {
            py::dict out;
            for (const ProposerCore::SourceMatch& s : p.match_lengths()) out[py::int_(s.source_id)] = s.match_len;
            return out;
          },
          "{source_id: match length}");

  // Drafting defaults (csrc/proposer_core.h).
  m.def(
      "default_source_params",
      [] {
        py::dict out;
        out["context"] = kContextParams;
        out["reference"] = kReferenceParams;
        out["corpus"] = kCorpusParams;
        out["memory"] = kMemoryParams;
        return out;
      },
      "{source name: SourceParams}: each source's default confidence (new copies on every call).");
  m.attr("MAX_NODES") = kMaxNodes;
  m.attr("LOOP_DECAY") = shortest_double(kLoopDecay);
  m.attr("EDITING_LOOP_DECAY") = shortest_double(kEditingLoopDecay);

  m.def(
      "step_batch",
      [](const py::list& cores, const py::list& new_tokens, int32_t max_nodes, int32_t num_threads) {
        std::vector<ProposerCore*> core_ptrs;
        std::vector<TokenSpan> spans;
        core_ptrs.reserve(cores.size());
        spans.reserve(new_tokens.size());
        for (size_t r = 0; r < cores.size(); ++r) {
          ProposerCore* core = cores[r].cast<ProposerCore*>();
          if (core == nullptr) throw std::invalid_argument("cores[" + std::to_string(r) + "] is None");
          core_ptrs.push_back(core);
        }
        for (size_t r = 0; r < new_tokens.size(); ++r) {
          py::handle h = new_tokens[r];
          if (!ExactTokenArray::check_(h))
            throw py::type_error("new_tokens[" + std::to_string(r) + "] must be a C-contiguous int32 array, got " +
                                 std::string(py::str(py::type::of(h))));
          const std::string name = "new_tokens[" + std::to_string(r) + "]";
          const Tokens t = tokens_of(py::reinterpret_borrow<ExactTokenArray>(h), name.c_str());
          spans.push_back({t.data, t.size});
        }
        DraftBatch batch;
        {
          py::gil_scoped_release release;
          step_batch(core_ptrs, spans, max_nodes, num_threads, &batch);
        }
        return py::make_tuple(to_numpy(batch.nodes.token_ids), to_numpy(batch.nodes.parents),
                              to_numpy(batch.nodes.scores), to_numpy(batch.nodes.source_ids),
                              to_numpy(batch.nodes.depths), to_numpy(batch.offsets));
      },
      py::arg("cores"), py::arg("new_tokens"), py::arg("max_nodes"), py::arg("num_threads") = 1,
      "One drafting step for R requests: feeds cores[r] new_tokens[r] (C-contiguous int32 arrays), then drafts "
      "its tree of <= max_nodes nodes (on up to num_threads threads). Returns (token_ids int32, parents int32, "
      "scores float32, source_ids int32, depths int32, offsets int64 [R + 1]): tree r is nodes "
      "[offsets[r], offsets[r + 1]), parents within its tree. Every token is checked before any core is fed "
      "(csrc/proposer_core.h).");

  m.attr("FORMAT_VERSION") = kFormatVersion;

  // ---- test-only entry points ----
  py::module_ testing = m.def_submodule("testing", "Entry points for tests only: not used by refdec itself.");
  testing.def(
      "set_limits",
      [](SuffixAutomaton& sam, int64_t max_states, int64_t max_edges) {
        sam.set_limits_for_testing(max_states, max_edges);
      },
      py::arg("sam"), py::arg("max_states"), py::arg("max_edges"),
      "Lowers the automaton's state / hashed-edge limits to exercise its 'full' error.");

  py::class_<Matcher>(testing, "Matcher", "Longest-suffix matching of a token stream (csrc/matcher.h).")
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

  py::class_<DraftSource>(testing, "DraftSource", "One source of a draft: an automaton matched at a state "
                                                  "(csrc/draft_tree.h).")
      .def(py::init([](const AutomatonView* view, int32_t state, int32_t match_len, const SourceParams& params,
                       int32_t source_id) {
             check_state(*non_null(view), state);
             DraftSource s;
             s.view = view;
             s.state = state;
             s.match_len = match_len;
             s.params = params;
             s.source_id = source_id;
             return s;
           }),
           py::arg("view"), py::arg("state"), py::arg("match_len"), py::arg("params") = SourceParams(),
           py::arg("source_id") = 0, py::keep_alive<1, 2>())
      .def_readonly("state", &DraftSource::state)
      .def_readonly("match_len", &DraftSource::match_len)
      .def_readonly("params", &DraftSource::params)
      .def_readonly("source_id", &DraftSource::source_id);

  testing.def(
      "build_draft",
      [](const std::vector<DraftSource>& sources, int32_t max_nodes, int32_t max_depth) {
        DraftResult r;
        {
          py::gil_scoped_release release;
          DraftTreeBuilder builder;
          builder.build(sources, max_nodes, max_depth, &r);
        }
        return draft_arrays(r);
      },
      py::arg("sources"), py::arg("max_nodes"), py::arg("max_depth"),
      "The best-first draft tree over the sources (DraftTreeBuilder), as DraftArrays.");
}

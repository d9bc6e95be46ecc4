// The one read-only query interface shared by the mutable suffix automaton
// (SuffixAutomaton) and the frozen, memory-mapped one (FrozenIndex). The
// matcher, the query helpers and the draft tree builder only see this.
#ifndef REFDEC_AUTOMATON_VIEW_H_
#define REFDEC_AUTOMATON_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace refdec {

// "No such state": the link of the root, a missing transition.
constexpr int32_t kNoState = -1;
// The root (empty string) is state 0 in every automaton.
constexpr int32_t kRoot = 0;

// One outgoing transition of a state.
struct Edge {
  int32_t token;   // token id labelling the transition
  int32_t target;  // state reached
};

// Read-only view of a (generalised) suffix automaton over int32 token ids
// together with the token stream it was built from.
//
// Token positions ("token_pos") index the concatenation of all documents.
// Every state id passed in must come from the same automaton; implementations
// never crash on an out-of-range id (they answer as for a state with no
// transitions), so a corrupted frozen file can only degrade answers.
//
// Thread-safety: FrozenIndex is immutable and safe for concurrent readers.
// SuffixAutomaton computes occurrence counts lazily inside count(): do not
// share one between threads.
class AutomatonView {
 public:
  virtual ~AutomatonView() = default;

  // Number of state ids (valid ids are 0 .. num_states()-1).
  virtual int64_t num_states() const = 0;
  // Target of the transition (state, token), or kNoState.
  virtual int32_t transition(int32_t state, int32_t token) const = 0;
  // Suffix link (kNoState for the root).
  virtual int32_t link(int32_t state) const = 0;
  // Length of the longest string of the state.
  virtual int32_t length(int32_t state) const = 0;
  // Number of occurrences (end positions inside documents) of the state's strings.
  virtual int64_t count(int32_t state) const = 0;
  // The end position (token_pos of the last token) of the only occurrence if
  // count(state) == 1, else -1. Its continuation is token_at(pos+1 ...) up to
  // document_end(pos).
  virtual int64_t unique_end_pos(int32_t state) const = 0;
  // Replaces *out with the outgoing transitions of the state (any order)
  // and returns true; a state with more than max_children transitions
  // leaves *out empty and returns false without reading them (the draft
  // builder skips such states: the near-root states of a large corpus have
  // tens of thousands).
  virtual bool children(int32_t state, std::vector<Edge>* out, size_t max_children) const = 0;
  // children() without a limit.
  void children(int32_t state, std::vector<Edge>* out) const { children(state, out, SIZE_MAX); }
  // Number of outgoing transitions of the state (FrozenIndex: from its CSR
  // offsets, without reading the edges; a corrupt target still counts).
  virtual int64_t num_children(int32_t state) const = 0;

  // Total number of tokens over all documents.
  virtual int64_t num_tokens() const = 0;
  // Token at a position (0 <= token_pos < num_tokens()).
  virtual int32_t token_at(int64_t token_pos) const = 0;
  // Number of documents (an open, growing document counts).
  virtual int64_t num_documents() const = 0;
  // First token_pos of a document (doc_idx == num_documents() gives num_tokens()).
  virtual int64_t document_begin(int64_t doc_idx) const = 0;
  // Exclusive end of the document holding token_pos.
  virtual int64_t document_end(int64_t token_pos) const = 0;
  // Pointer to the contiguous token array (num_tokens() entries).
  virtual const int32_t* token_data() const = 0;
};

}  // namespace refdec

#endif  // REFDEC_AUTOMATON_VIEW_H_

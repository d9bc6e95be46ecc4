// Mutable generalised suffix automaton over int32 token ids.
#ifndef REFDEC_SUFFIX_AUTOMATON_H_
#define REFDEC_SUFFIX_AUTOMATON_H_

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "automaton_view.h"

namespace refdec {

// A generalised suffix automaton (one automaton over many documents; a match
// or a continuation never crosses a document boundary) that grows online.
//
// Build: add_document(tokens), or start_document() then extend(token) per
// token (the live decoding context is one open document that keeps growing).
// Transitions: a state's first transition lives inline in its record (most
// states of text have one or two); the others live in one open-addressing
// hash table (state, token) -> target of 12-byte slots, at most 3/4 full,
// and in a singly linked list per state of their labels (for cloning and
// enumeration). On source code about 2/3 of the transitions are inline.
//
// Occurrence counts: extend() on an automaton whose counts are up to date
// walks the suffix-link chain of the new state and adds one occurrence to
// each state on it, up to max(kMinCountWalk, num_states() / 8) steps; a
// longer chain marks the counts stale. add_document() marks them stale.
// count() recomputes stale counts in one O(states) pass (counting sort by
// length). So a token costs O(its suffix-link chain) (short in text; as long
// as the run inside a run of one repeated token) and at worst one O(states)
// recount per query batch, never both beyond O(states / 8) per token.
class SuffixAutomaton : public AutomatonView {
 public:
  // Suffix-link walk extend() always affords to keep counts current (the
  // limit is max(kMinCountWalk, num_states() / 8)).
  static constexpr int64_t kMinCountWalk = 64;
  // Largest number of tokens (positions are int32).
  static constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 2;
  // Largest number of states and of hashed edges (ids are int32). Text has
  // 1.2-2 states per token, so the state limit is met first (from ~1.1e9
  // tokens); extend() refuses a token unless 2 more states fit, and unless
  // kEdgeMargin more edges fit (one token adds an edge per state of its
  // suffix-link walk, a walk that long needs a run of ~16 M tokens).
  static constexpr int64_t kMaxStates = (int64_t{1} << 31) - 2;
  static constexpr int64_t kEdgeMargin = int64_t{1} << 24;
  static constexpr int64_t kMaxEdges = (int64_t{1} << 31) - 1 - kEdgeMargin;

  SuffixAutomaton();
  // Tests only: lower the state / hashed-edge limits to exercise the "full" error.
  void set_limits_for_testing(int64_t max_states, int64_t max_edges) {
    max_states_ = std::min(max_states, kMaxStates);
    max_edges_ = std::min(max_edges, kMaxEdges);
  }

  // Starts a new document: the next extend() continues nothing before it.
  void start_document();
  // Appends one token (>= 0) to the current document.
  void extend(int32_t token);
  // start_document() then extend() over tokens[0..n); throws
  // std::invalid_argument naming the first negative token.
  void add_document(const int32_t* tokens, int64_t n);
  // Appends tokens to the current document (incremental counts kept).
  void extend_many(const int32_t* tokens, int64_t n);
  // Reserves room for about n more tokens (address space only: pages are
  // touched as they fill, so over-reserving costs no resident memory).
  void reserve(int64_t n);
  // Frees every build structure (freezing with release does this as it goes).
  // Afterwards the automaton is empty: queries answer as for no state, and
  // extend()/add_document() throw std::logic_error.
  void release();
  // True after release().
  bool released() const { return released_; }
  // Frees the transition table and edge lists (release() in two steps, for
  // freezing: the caller is done with transitions). Marks the automaton released.
  void release_transitions();

  // State of the whole current document (the longest string ending here).
  int32_t last() const { return last_; }
  // Longest suffix of the current document that also ended earlier:
  // link(last()); kRoot when the document is empty.
  int32_t match_state() const;
  // Number of transitions.
  int64_t num_edges() const { return static_cast<int64_t>(edges_.size()) + num_inline_; }
  // Makes count() answers current (no-op when already current).
  void ensure_counts() const;

  // AutomatonView.
  int64_t num_states() const override { return static_cast<int64_t>(states_.size()); }
  int32_t transition(int32_t state, int32_t token) const override;
  int32_t link(int32_t state) const override;
  int32_t length(int32_t state) const override;
  int64_t count(int32_t state) const override;
  int64_t unique_end_pos(int32_t state) const override;
  using AutomatonView::children;
  bool children(int32_t state, std::vector<Edge>* out, size_t max_children) const override;
  int64_t num_children(int32_t state) const override;
  int64_t num_tokens() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t token_at(int64_t token_pos) const override;
  int64_t num_documents() const override { return static_cast<int64_t>(doc_begin_.size()); }
  int64_t document_begin(int64_t doc_idx) const override;
  int64_t document_end(int64_t token_pos) const override;
  const int32_t* token_data() const override { return tokens_.data(); }

  // Raw per-state fields, for freezing (state must be valid).
  int32_t raw_end_pos(int32_t state) const { return states_[state].end_pos; }
  const std::vector<uint32_t>& counts() const {
    ensure_counts();
    return count_;
  }
  // Calls f(state, token, target) for every transition, in hash-table order
  // (one sequential pass; used by freezing).
  template <typename F>
  void for_each_edge(F&& f) const {
    for (std::size_t s = 0; s < states_.size(); ++s) {
      if (states_[s].token0 != kNoToken) f(static_cast<int32_t>(s), states_[s].token0, states_[s].target0);
    }
    for (const Slot& slot : table_) {
      if (slot.state != kNoState) f(slot.state, slot.token, slot.target);
    }
  }

 private:
  // "No inline transition" label.
  static constexpr int32_t kNoToken = -1;
  // Per-state record (28 bytes).
  struct State {
    int32_t len;      // length of the longest string
    int32_t link;     // suffix link, kNoState for the root
    int32_t end_pos;  // one end position (exact when count == 1)
    int32_t head;     // first hashed edge of the state's edge list, -1 when none
    uint32_t own;     // occurrences ending exactly here (prefixes of documents)
    int32_t token0;   // label of the inline transition, kNoToken when none
    int32_t target0;  // its target
  };
  // Edge list node; the target lives in the hash table slot.
  struct EdgeNode {
    int32_t token;  // label
    int32_t next;   // next edge of the same source state, -1 = end
  };
  // Hash table slot: (state, token) -> target.
  struct Slot {
    int32_t state;   // source state, kNoState for an empty slot
    int32_t token;   // label
    int32_t target;  // target state
  };
  static_assert(sizeof(Slot) == 12, "Slot must stay 12 bytes");

  int32_t new_state(int32_t len, int32_t link, int32_t end_pos);
  int32_t clone_state(int32_t q, int32_t len);
  void redirect(int32_t p, int32_t token, int32_t from, int32_t to);
  void add_edge(int32_t state, int32_t token, int32_t target);
  // Slot holding (state, token) in the hash table, or nullptr.
  const Slot* find_slot(int32_t state, int32_t token) const;
  // Target of (state, token), inline or hashed, or nullptr (state valid).
  int32_t* target_of(int32_t state, int32_t token);
  const int32_t* target_of(int32_t state, int32_t token) const;
  void grow_table();
  void bump_counts(int32_t state);
  bool valid(int32_t state) const { return state >= 0 && state < static_cast<int32_t>(states_.size()); }

  std::vector<State> states_;            // per state
  mutable std::vector<uint32_t> count_;  // occurrence counts (valid when counts_valid_)
  mutable bool counts_valid_ = true;     // false: count_ must be recomputed
  std::vector<EdgeNode> edges_;          // per hashed edge
  int64_t num_inline_ = 0;               // inline transitions
  std::vector<Slot> table_;              // open addressing, linear probing, power-of-two size
  uint64_t table_mask_ = 0;              // table_.size() - 1 (at most 3/4 of the slots are full)
  int table_shift_ = 64;                 // 64 - log2(table_.size()), for the multiplicative hash
  std::vector<int32_t> tokens_;          // all documents concatenated
  std::vector<int64_t> doc_begin_;       // first token_pos of each document
  int32_t last_ = kRoot;                 // state of the current document's whole prefix
  bool released_ = false;                // release() or release_transitions() was called
  int64_t max_states_ = kMaxStates;      // see kMaxStates (lower only in tests)
  int64_t max_edges_ = kMaxEdges;        // see kMaxEdges (lower only in tests)
};

}  // namespace refdec

#endif  // REFDEC_SUFFIX_AUTOMATON_H_

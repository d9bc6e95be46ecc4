#include "suffix_automaton.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

namespace refdec {
namespace {

constexpr uint64_t kHashMul = 0x9E3779B97F4A7C15ull;

inline uint64_t edge_key(int32_t state, int32_t token) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(token);
}

// Reserves room for `needed` elements, growing geometrically (an exact
// reserve per document would copy the arrays once per document).
template <typename T>
void reserve_geometric(std::vector<T>* v, size_t needed) {
  if (needed > v->capacity()) v->reserve(std::max(needed, v->capacity() * 3 / 2));
}

}  // namespace

SuffixAutomaton::SuffixAutomaton() {
  table_.assign(1024, Slot{kNoState, 0, kNoState});
  table_mask_ = 1023;
  table_shift_ = 64 - 10;
  new_state(0, kNoState, -1);
}

int32_t SuffixAutomaton::new_state(int32_t len, int32_t link, int32_t end_pos) {
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(State{len, link, end_pos, -1, 0, kNoToken, kNoState});
  count_.push_back(0);
  return id;
}

void SuffixAutomaton::reserve(int64_t n) {
  const size_t states = states_.size() + 2 * static_cast<size_t>(n);
  reserve_geometric(&states_, states);
  reserve_geometric(&count_, states);
  reserve_geometric(&edges_, edges_.size() + static_cast<size_t>(n));  // hashed edges: about n/3 on text
  reserve_geometric(&tokens_, tokens_.size() + n);
}

const SuffixAutomaton::Slot* SuffixAutomaton::find_slot(int32_t state, int32_t token) const {
  if (table_.empty()) return nullptr;  // released
  uint64_t i = (edge_key(state, token) * kHashMul) >> table_shift_;
  while (true) {
    const Slot& slot = table_[i];
    if (slot.state == state && slot.token == token) return &slot;
    if (slot.state == kNoState) return nullptr;
    i = (i + 1) & table_mask_;
  }
}

const int32_t* SuffixAutomaton::target_of(int32_t state, int32_t token) const {
  const State& s = states_[state];
  if (s.token0 == token) return &s.target0;
  if (s.head == -1) return nullptr;  // no hashed edge
  const Slot* slot = find_slot(state, token);
  return slot == nullptr ? nullptr : &slot->target;
}

int32_t* SuffixAutomaton::target_of(int32_t state, int32_t token) {
  return const_cast<int32_t*>(static_cast<const SuffixAutomaton*>(this)->target_of(state, token));
}

void SuffixAutomaton::grow_table() {
  // Step 1. Double the capacity; Step 2. reinsert the old slots in order.
  std::vector<Slot> old;
  old.swap(table_);
  const uint64_t capacity = old.size() * 2;
  table_.assign(capacity, Slot{kNoState, 0, kNoState});
  table_mask_ = capacity - 1;
  table_shift_ -= 1;
  for (const Slot& slot : old) {
    if (slot.state == kNoState) continue;
    uint64_t i = (edge_key(slot.state, slot.token) * kHashMul) >> table_shift_;
    while (table_[i].state != kNoState) i = (i + 1) & table_mask_;
    table_[i] = slot;
  }
}

void SuffixAutomaton::add_edge(int32_t state, int32_t token, int32_t target) {
  // Step 1. The first transition of a state goes inline.
  State& s = states_[state];
  if (s.token0 == kNoToken) {
    s.token0 = token;
    s.target0 = target;
    ++num_inline_;
    return;
  }
  // Step 2. Others into the hash table, at most 3/4 full (linear probing
  // stays short; 12-byte slots), and the state's edge list.
  if (4 * (edges_.size() + 1) > 3 * table_.size()) grow_table();
  const int32_t e = static_cast<int32_t>(edges_.size());
  edges_.push_back(EdgeNode{token, states_[state].head});
  states_[state].head = e;
  uint64_t i = (edge_key(state, token) * kHashMul) >> table_shift_;
  while (table_[i].state != kNoState) {
    assert(!(table_[i].state == state && table_[i].token == token));
    i = (i + 1) & table_mask_;
  }
  table_[i] = Slot{state, token, target};
}

int32_t SuffixAutomaton::clone_state(int32_t q, int32_t len) {
  // Step 1. The clone takes q's link, an end position of q (the clone's
  // end positions are a superset of q's) and q's occurrence count.
  const int32_t clone = new_state(len, states_[q].link, states_[q].end_pos);
  if (counts_valid_) count_[clone] = count_[q];
  // Step 2. Copy q's transitions.
  if (states_[q].token0 != kNoToken) add_edge(clone, states_[q].token0, states_[q].target0);
  for (int32_t e = states_[q].head; e != -1; e = edges_[e].next) {
    const int32_t token = edges_[e].token;
    add_edge(clone, token, find_slot(q, token)->target);
  }
  states_[q].link = clone;
  assert(states_[states_[clone].link].len < len && len < states_[q].len);
  return clone;
}

void SuffixAutomaton::redirect(int32_t p, int32_t token, int32_t from, int32_t to) {
  // Walk the suffix links from p while (p, token) still leads to `from`.
  while (p != kNoState) {
    int32_t* target = target_of(p, token);
    if (target == nullptr || *target != from) break;
    *target = to;
    p = states_[p].link;
  }
}

void SuffixAutomaton::bump_counts(int32_t state) {
  // One new occurrence ends at the current position: it belongs to `state`
  // and to every state on its suffix-link chain.
  if (!counts_valid_) return;
  const int64_t limit = std::max<int64_t>(kMinCountWalk, static_cast<int64_t>(states_.size()) / 8);
  int64_t steps = 0;
  for (int32_t s = state; s != kNoState; s = states_[s].link) {
    if (++steps > limit) {
      counts_valid_ = false;
      return;
    }
    ++count_[s];
  }
}

void SuffixAutomaton::release_transitions() {
  released_ = true;
  std::vector<Slot>().swap(table_);
  std::vector<EdgeNode>().swap(edges_);
  for (State& s : states_) {
    s.head = -1;
    s.token0 = kNoToken;
  }
  num_inline_ = 0;
}

void SuffixAutomaton::release() {
  release_transitions();
  std::vector<State>().swap(states_);
  std::vector<uint32_t>().swap(count_);
  std::vector<int32_t>().swap(tokens_);
  std::vector<int64_t>().swap(doc_begin_);
  last_ = kRoot;
  counts_valid_ = true;
}

void SuffixAutomaton::start_document() {
  if (released_) throw std::logic_error("suffix automaton was released (frozen with release): it cannot grow");
  doc_begin_.push_back(static_cast<int64_t>(tokens_.size()));
  last_ = kRoot;
}

void SuffixAutomaton::extend(int32_t token) {
  if (released_) throw std::logic_error("suffix automaton was released (frozen with release): it cannot grow");
  if (token < 0) throw std::invalid_argument("token must be >= 0, got " + std::to_string(token));
  if (static_cast<int64_t>(tokens_.size()) >= kMaxTokens)
    throw std::invalid_argument("suffix automaton is full: at most " + std::to_string(kMaxTokens) + " tokens");
  if (static_cast<int64_t>(states_.size()) + 2 > max_states_ || static_cast<int64_t>(edges_.size()) > max_edges_)
    throw std::invalid_argument("suffix automaton is full: " + std::to_string(states_.size()) + " states, " +
                                std::to_string(edges_.size()) + " hashed edges (ids are int32) after " +
                                std::to_string(tokens_.size()) + " tokens; split the corpus into shards");
  if (doc_begin_.empty()) start_document();
  const int32_t pos = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
  const int32_t last = last_;
  const int32_t last_len = states_[last].len;

  // Step 1. Generalised construction: the string last+token already exists
  // (it occurred in an earlier document). Reuse its state, or split it.
  if (const int32_t* existing = target_of(last, token)) {
    const int32_t q = *existing;
    if (states_[q].len == last_len + 1) {
      last_ = q;
    } else {
      const int32_t clone = clone_state(q, last_len + 1);
      redirect(last, token, q, clone);
      last_ = clone;
    }
    ++states_[last_].own;
    bump_counts(last_);
    return;
  }

  // Step 2. New state for the whole new prefix; add transitions from the
  // suffix-link chain of `last` until one already has `token`.
  const int32_t cur = new_state(last_len + 1, kNoState, pos);
  states_[cur].own = 1;
  int32_t p = last;
  const int32_t* found = nullptr;
  while (p != kNoState && (found = target_of(p, token)) == nullptr) {
    add_edge(p, token, cur);
    p = states_[p].link;
  }

  // Step 3. Set the suffix link of the new state, cloning q when (p, token)
  // reaches a state whose longest string is longer than len(p)+1.
  if (p == kNoState) {
    states_[cur].link = kRoot;
  } else {
    const int32_t q = *found;
    if (states_[p].len + 1 == states_[q].len) {
      states_[cur].link = q;
    } else {
      const int32_t clone = clone_state(q, states_[p].len + 1);
      redirect(p, token, q, clone);
      states_[cur].link = clone;
    }
  }
  assert(states_[states_[cur].link].len < states_[cur].len);
  last_ = cur;
  bump_counts(cur);
}

void SuffixAutomaton::add_document(const int32_t* tokens, int64_t n) {
  if (released_) throw std::logic_error("suffix automaton was released (frozen with release): it cannot grow");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      throw std::invalid_argument("token ids must be >= 0; tokens[" + std::to_string(i) + "] = " +
                                  std::to_string(tokens[i]));
  }
  if (static_cast<int64_t>(tokens_.size()) + n > kMaxTokens)
    throw std::invalid_argument("suffix automaton is full: at most " + std::to_string(kMaxTokens) + " tokens");
  reserve(n);
  counts_valid_ = false;
  start_document();
  for (int64_t i = 0; i < n; ++i) extend(tokens[i]);
}

void SuffixAutomaton::extend_many(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      throw std::invalid_argument("token ids must be >= 0; tokens[" + std::to_string(i) + "] = " +
                                  std::to_string(tokens[i]));
  }
  for (int64_t i = 0; i < n; ++i) extend(tokens[i]);
}

void SuffixAutomaton::ensure_counts() const {
  if (counts_valid_) return;
  // Step 1. Counting sort of the states by length.
  const size_t n_states = states_.size();
  int32_t max_len = 0;
  for (const State& s : states_) max_len = std::max(max_len, s.len);
  std::vector<int32_t> bucket(static_cast<size_t>(max_len) + 2, 0);
  for (const State& s : states_) ++bucket[s.len + 1];
  for (size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
  std::vector<int32_t> order(n_states);
  for (size_t s = 0; s < n_states; ++s) order[bucket[states_[s].len]++] = static_cast<int32_t>(s);
  // Step 2. In decreasing length, add each state's count into its link.
  count_.resize(n_states);
  for (size_t s = 0; s < n_states; ++s) count_[s] = states_[s].own;
  for (size_t i = n_states; i-- > 1;) {
    const int32_t s = order[i];
    const int32_t l = states_[s].link;
    if (l != kNoState) count_[l] += count_[s];
  }
  counts_valid_ = true;
}

int32_t SuffixAutomaton::match_state() const {
  if (last_ == kRoot || !valid(last_)) return kRoot;
  return states_[last_].link;
}

int32_t SuffixAutomaton::transition(int32_t state, int32_t token) const {
  if (!valid(state) || token < 0) return kNoState;
  const int32_t* target = target_of(state, token);
  return target == nullptr ? kNoState : *target;
}

int32_t SuffixAutomaton::link(int32_t state) const { return valid(state) ? states_[state].link : kNoState; }

int32_t SuffixAutomaton::length(int32_t state) const { return valid(state) ? states_[state].len : 0; }

int64_t SuffixAutomaton::count(int32_t state) const {
  if (!valid(state)) return 0;
  ensure_counts();
  return count_[state];
}

int64_t SuffixAutomaton::unique_end_pos(int32_t state) const {
  if (count(state) != 1) return -1;
  return states_[state].end_pos;
}

int64_t SuffixAutomaton::num_children(int32_t state) const {
  int64_t n = 0;
  if (valid(state)) {
    if (states_[state].token0 != kNoToken) ++n;
    for (int32_t e = states_[state].head; e != -1; e = edges_[e].next) ++n;
  }
  return n;
}

bool SuffixAutomaton::children(int32_t state, std::vector<Edge>* out, size_t max_children) const {
  out->clear();
  if (!valid(state)) return true;
  // Step 1. The labels (the edge list), stopping past the limit; Step 2. the
  // hashed targets.
  if (states_[state].token0 != kNoToken) out->push_back({states_[state].token0, states_[state].target0});
  const size_t inline_edges = out->size();
  for (int32_t e = states_[state].head; e != -1; e = edges_[e].next) {
    if (out->size() >= max_children) {
      out->clear();
      return false;
    }
    out->push_back({edges_[e].token, kNoState});
  }
  if (out->size() > max_children) {
    out->clear();
    return false;
  }
  for (size_t i = inline_edges; i < out->size(); ++i) (*out)[i].target = find_slot(state, (*out)[i].token)->target;
  return true;
}

int32_t SuffixAutomaton::token_at(int64_t token_pos) const {
  if (token_pos < 0 || token_pos >= num_tokens()) return -1;
  return tokens_[token_pos];
}

int64_t SuffixAutomaton::document_begin(int64_t doc_idx) const {
  if (doc_idx < 0) return 0;
  if (doc_idx >= num_documents()) return num_tokens();
  return doc_begin_[doc_idx];
}

int64_t SuffixAutomaton::document_end(int64_t token_pos) const {
  // First document start greater than token_pos.
  auto it = std::upper_bound(doc_begin_.begin(), doc_begin_.end(), token_pos);
  return it == doc_begin_.end() ? num_tokens() : *it;
}

}  // namespace refdec

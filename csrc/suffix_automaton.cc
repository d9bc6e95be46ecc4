#include "suffix_automaton.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

namespace refdec {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};

inline uint64_t edge_key(int32_t state, int32_t token) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(token);
}

}  // namespace

SuffixAutomaton::SuffixAutomaton() {
  new_state(0, kNoState, -1);
  table_key_.assign(1024, kEmptyKey);
  table_edge_.assign(1024, -1);
  table_mask_ = 1023;
  table_shift_ = 64 - 10;
}

int32_t SuffixAutomaton::new_state(int32_t len, int32_t link, int32_t end_pos) {
  const int32_t id = static_cast<int32_t>(len_.size());
  len_.push_back(len);
  link_.push_back(link);
  end_pos_.push_back(end_pos);
  head_.push_back(-1);
  own_.push_back(0);
  count_.push_back(0);
  return id;
}

void SuffixAutomaton::reserve(int64_t n) {
  const size_t states = len_.size() + 2 * static_cast<size_t>(n);
  len_.reserve(states);
  link_.reserve(states);
  end_pos_.reserve(states);
  head_.reserve(states);
  own_.reserve(states);
  count_.reserve(states);
  const size_t edges = edge_token_.size() + 3 * static_cast<size_t>(n);
  edge_token_.reserve(edges);
  edge_target_.reserve(edges);
  edge_next_.reserve(edges);
  tokens_.reserve(tokens_.size() + n);
  while ((table_mask_ + 1) < 2 * edges) grow_table();
}

int32_t SuffixAutomaton::find_edge(int32_t state, int32_t token) const {
  const uint64_t key = edge_key(state, token);
  uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> table_shift_;
  while (true) {
    const uint64_t k = table_key_[slot];
    if (k == key) return table_edge_[slot];
    if (k == kEmptyKey) return -1;
    slot = (slot + 1) & table_mask_;
  }
}

void SuffixAutomaton::grow_table() {
  // Step 1. Double the capacity and rehash every edge from the edge arrays.
  const uint64_t capacity = (table_mask_ + 1) * 2;
  table_key_.assign(capacity, kEmptyKey);
  table_edge_.assign(capacity, -1);
  table_mask_ = capacity - 1;
  table_shift_ -= 1;
  // Step 2. Reinsert: the source state of an edge is found by walking each state's list.
  for (int32_t s = 0; s < static_cast<int32_t>(head_.size()); ++s) {
    for (int32_t e = head_[s]; e != -1; e = edge_next_[e]) {
      const uint64_t key = edge_key(s, edge_token_[e]);
      uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> table_shift_;
      while (table_key_[slot] != kEmptyKey) slot = (slot + 1) & table_mask_;
      table_key_[slot] = key;
      table_edge_[slot] = e;
    }
  }
}

void SuffixAutomaton::add_edge(int32_t state, int32_t token, int32_t target) {
  if (2 * (edge_token_.size() + 1) > table_mask_ + 1) grow_table();
  const int32_t e = static_cast<int32_t>(edge_token_.size());
  edge_token_.push_back(token);
  edge_target_.push_back(target);
  edge_next_.push_back(head_[state]);
  head_[state] = e;
  const uint64_t key = edge_key(state, token);
  uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> table_shift_;
  while (table_key_[slot] != kEmptyKey) {
    assert(table_key_[slot] != key);
    slot = (slot + 1) & table_mask_;
  }
  table_key_[slot] = key;
  table_edge_[slot] = e;
}

int32_t SuffixAutomaton::clone_state(int32_t q, int32_t len) {
  // Step 1. The clone takes q's link, an end position of q (the clone's
  // end positions are a superset of q's) and q's occurrence count.
  const int32_t clone = new_state(len, link_[q], end_pos_[q]);
  if (counts_valid_) count_[clone] = count_[q];
  // Step 2. Copy q's transitions.
  for (int32_t e = head_[q]; e != -1; e = edge_next_[e]) add_edge(clone, edge_token_[e], edge_target_[e]);
  link_[q] = clone;
  return clone;
}

void SuffixAutomaton::redirect(int32_t p, int32_t token, int32_t from, int32_t to) {
  // Walk the suffix links from p while (p, token) still leads to `from`.
  while (p != kNoState) {
    const int32_t e = find_edge(p, token);
    if (e == -1 || edge_target_[e] != from) break;
    edge_target_[e] = to;
    p = link_[p];
  }
}

void SuffixAutomaton::bump_counts(int32_t state) {
  // One new occurrence ends at the current position: it belongs to `state`
  // and to every state on its suffix-link chain.
  if (!counts_valid_) return;
  int steps = 0;
  for (int32_t s = state; s != kNoState; s = link_[s]) {
    if (++steps > kMaxCountWalk) {
      counts_valid_ = false;
      return;
    }
    ++count_[s];
  }
}

void SuffixAutomaton::start_document() {
  doc_begin_.push_back(static_cast<int64_t>(tokens_.size()));
  last_ = kRoot;
}

void SuffixAutomaton::extend(int32_t token) {
  if (token < 0) throw std::invalid_argument("token must be >= 0, got " + std::to_string(token));
  if (static_cast<int64_t>(tokens_.size()) >= kMaxTokens)
    throw std::invalid_argument("suffix automaton is full: at most " + std::to_string(kMaxTokens) + " tokens");
  if (doc_begin_.empty()) start_document();
  const int32_t pos = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
  const int32_t last = last_;

  // Step 1. Generalised construction: the string last+token already exists
  // (it occurred in an earlier document). Reuse its state, or split it.
  const int32_t existing = find_edge(last, token);
  if (existing != -1) {
    const int32_t q = edge_target_[existing];
    if (len_[q] == len_[last] + 1) {
      last_ = q;
    } else {
      const int32_t clone = clone_state(q, len_[last] + 1);
      redirect(last, token, q, clone);
      last_ = clone;
    }
    ++own_[last_];
    bump_counts(last_);
    return;
  }

  // Step 2. New state for the whole new prefix; add transitions from the
  // suffix-link chain of `last` until one already has `token`.
  const int32_t cur = new_state(len_[last] + 1, kNoState, pos);
  own_[cur] = 1;
  int32_t p = last;
  int32_t e = -1;
  while (p != kNoState && (e = find_edge(p, token)) == -1) {
    add_edge(p, token, cur);
    p = link_[p];
  }

  // Step 3. Set the suffix link of the new state, cloning q when (p, token)
  // reaches a state whose longest string is longer than len(p)+1.
  if (p == kNoState) {
    link_[cur] = kRoot;
  } else {
    const int32_t q = edge_target_[e];
    if (len_[p] + 1 == len_[q]) {
      link_[cur] = q;
    } else {
      const int32_t clone = clone_state(q, len_[p] + 1);
      redirect(p, token, q, clone);
      link_[cur] = clone;
    }
  }
  last_ = cur;
  bump_counts(cur);
}

void SuffixAutomaton::add_document(const int32_t* tokens, int64_t n) {
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
  const size_t n_states = len_.size();
  int32_t max_len = 0;
  for (int32_t l : len_) max_len = std::max(max_len, l);
  std::vector<int32_t> bucket(static_cast<size_t>(max_len) + 2, 0);
  for (int32_t l : len_) ++bucket[l + 1];
  for (size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
  std::vector<int32_t> order(n_states);
  for (size_t s = 0; s < n_states; ++s) order[bucket[len_[s]]++] = static_cast<int32_t>(s);
  // Step 2. In decreasing length, add each state's count into its link.
  count_.assign(own_.begin(), own_.end());
  for (size_t i = n_states; i-- > 1;) {
    const int32_t s = order[i];
    if (link_[s] != kNoState) count_[link_[s]] += count_[s];
  }
  counts_valid_ = true;
}

int32_t SuffixAutomaton::match_state() const {
  if (last_ == kRoot) return kRoot;
  return link_[last_];
}

int32_t SuffixAutomaton::transition(int32_t state, int32_t token) const {
  if (!valid(state) || token < 0) return kNoState;
  const int32_t e = find_edge(state, token);
  return e == -1 ? kNoState : edge_target_[e];
}

int32_t SuffixAutomaton::link(int32_t state) const { return valid(state) ? link_[state] : kNoState; }

int32_t SuffixAutomaton::length(int32_t state) const { return valid(state) ? len_[state] : 0; }

int64_t SuffixAutomaton::count(int32_t state) const {
  if (!valid(state)) return 0;
  ensure_counts();
  return count_[state];
}

int64_t SuffixAutomaton::unique_end_pos(int32_t state) const {
  if (count(state) != 1) return -1;
  return end_pos_[state];
}

void SuffixAutomaton::children(int32_t state, std::vector<Edge>* out) const {
  out->clear();
  if (!valid(state)) return;
  for (int32_t e = head_[state]; e != -1; e = edge_next_[e]) out->push_back({edge_token_[e], edge_target_[e]});
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

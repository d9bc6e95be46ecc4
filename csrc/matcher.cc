#include "matcher.h"

#include <algorithm>

namespace refdec {

void Matcher::advance(int32_t token) {
  // Step 1. Extend the match if (state, token) exists; otherwise shorten it
  // along suffix links. Each link strictly shortens the match, so a corrupted
  // automaton (non-decreasing lengths) falls back to the root instead of looping.
  while (true) {
    const int32_t next = view_->transition(state_, token);
    if (next != kNoState) {
      state_ = next;
      ++match_len_;
      return;
    }
    if (state_ == kRoot) {
      match_len_ = 0;
      return;
    }
    const int32_t l = view_->link(state_);
    const int32_t l_len = l == kNoState ? 0 : view_->length(l);
    if (l == kNoState || l_len >= match_len_) {
      state_ = kRoot;
      match_len_ = 0;
    } else {
      state_ = l;
      match_len_ = l_len;
    }
  }
}

int32_t find_state(const AutomatonView& view, const int32_t* tokens, int64_t n) {
  int32_t state = kRoot;
  for (int64_t i = 0; i < n && state != kNoState; ++i) state = view.transition(state, tokens[i]);
  return state;
}

int64_t match_length(const AutomatonView& view, const int32_t* tokens, int64_t n) {
  Matcher m(&view);
  m.advance_many(tokens, n);
  return m.match_length();
}

int64_t count_occurrences(const AutomatonView& view, const int32_t* tokens, int64_t n) {
  if (n == 0) return view.num_tokens();
  const int32_t state = find_state(view, tokens, n);
  return state == kNoState ? 0 : view.count(state);
}

std::vector<std::pair<int32_t, int64_t>> next_tokens_of_state(const AutomatonView& view, int32_t state, int64_t k) {
  std::vector<std::pair<int32_t, int64_t>> out;
  if (state == kNoState || k <= 0) return out;
  std::vector<Edge> edges;
  view.children(state, &edges);
  out.reserve(edges.size());
  for (const Edge& e : edges) out.emplace_back(e.token, view.count(e.target));
  auto better = [](const std::pair<int32_t, int64_t>& a, const std::pair<int32_t, int64_t>& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  if (static_cast<int64_t>(out.size()) > k) {
    std::partial_sort(out.begin(), out.begin() + k, out.end(), better);
    out.resize(k);
  } else {
    std::sort(out.begin(), out.end(), better);
  }
  return out;
}

std::vector<int32_t> continuation_of_state(const AutomatonView& view, int32_t state, int64_t length) {
  std::vector<int32_t> out;
  if (state == kNoState) return out;
  std::vector<Edge> edges;
  while (static_cast<int64_t>(out.size()) < length) {
    // Step 1. A unique occurrence: copy the rest straight from the token array.
    const int64_t pos = view.unique_end_pos(state);
    if (pos >= 0) {
      const int64_t left = length - static_cast<int64_t>(out.size());  // > 0; pos + 1 + left may overflow
      const int64_t end = left >= view.document_end(pos) - pos ? view.document_end(pos) : pos + 1 + left;
      for (int64_t p = pos + 1; p < end; ++p) out.push_back(view.token_at(p));
      break;
    }
    // Step 2. Otherwise follow the most frequent child (ties: smaller token):
    // longest(state) + the tokens read so far occurs contiguously.
    view.children(state, &edges);
    if (edges.empty()) break;
    Edge best = edges[0];
    int64_t best_count = view.count(best.target);
    for (size_t i = 1; i < edges.size(); ++i) {
      const int64_t c = view.count(edges[i].target);
      if (c > best_count || (c == best_count && edges[i].token < best.token)) {
        best = edges[i];
        best_count = c;
      }
    }
    out.push_back(best.token);
    state = best.target;
  }
  return out;
}

}  // namespace refdec

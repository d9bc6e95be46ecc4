// Longest-suffix matching of a live token stream against an automaton, and
// the read-only queries answered by any AutomatonView.
#ifndef REFDEC_MATCHER_H_
#define REFDEC_MATCHER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "automaton_view.h"

namespace refdec {

// Keeps (state, match_len): the longest suffix of the tokens fed so far that
// occurs in the automaton, and its state. advance() is O(1) amortised per
// token (suffix links on a mismatch). The automaton must outlive the matcher
// and must not grow while it is used: a clone during growth splits the
// matched state, and the next mismatch would lose the match (reset() and
// re-feed after the automaton grew).
class Matcher {
 public:
  explicit Matcher(const AutomatonView* view) : view_(view) {}
  // Back to the empty match.
  void reset() {
    state_ = kRoot;
    match_len_ = 0;
  }
  // Feeds one token (any int32; a negative or unknown token resets the match).
  void advance(int32_t token);
  // Feeds tokens[0..n).
  void advance_many(const int32_t* tokens, int64_t n) {
    for (int64_t i = 0; i < n; ++i) advance(tokens[i]);
  }
  // State holding the matched suffix (kRoot when nothing matches).
  int32_t state() const { return state_; }
  // Length of the matched suffix (<= length(state())).
  int32_t match_length() const { return match_len_; }
  const AutomatonView* view() const { return view_; }

 private:
  const AutomatonView* view_;  // automaton matched against (not owned)
  int32_t state_ = kRoot;      // state of the longest matched suffix
  int32_t match_len_ = 0;      // its length
};

// State reached by reading tokens from the root, or kNoState if the sequence
// does not occur.
int32_t find_state(const AutomatonView& view, const int32_t* tokens, int64_t n);
// Length of the longest suffix of tokens[0..n) that occurs.
int64_t match_length(const AutomatonView& view, const int32_t* tokens, int64_t n);
// Occurrences of tokens[0..n) as a contiguous run inside one document;
// n == 0 gives num_tokens() (one per position).
int64_t count_occurrences(const AutomatonView& view, const int32_t* tokens, int64_t n);
// Up to k (token, count) pairs following the occurrences of the state's
// strings: most frequent first, ties by smaller token id.
std::vector<std::pair<int32_t, int64_t>> next_tokens_of_state(const AutomatonView& view, int32_t state, int64_t k);
// The tokens that follow one occurrence of the state's strings, up to
// `length` tokens, never crossing a document end: the most frequent child at
// each step, then the token array once the continuation is unique.
std::vector<int32_t> continuation_of_state(const AutomatonView& view, int32_t state, int64_t length);

}  // namespace refdec

#endif  // REFDEC_MATCHER_H_

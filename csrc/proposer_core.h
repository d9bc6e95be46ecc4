// Per-request drafting state: the live-context automaton plus matchers over
// other automata, combined into one draft tree per step.
#ifndef REFDEC_PROPOSER_CORE_H_
#define REFDEC_PROPOSER_CORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "automaton_view.h"
#include "copy_cursor.h"
#include "draft_tree.h"
#include "matcher.h"
#include "suffix_automaton.h"

namespace refdec {

// Holds the sources of one request. The context source is a SuffixAutomaton
// that feed() extends (its match is link(last): the longest suffix of the
// context that occurred before with a continuation); every other source is a
// Matcher that feed() advances. Automata are not owned and must outlive the
// core. Not thread-safe (one per request).
class ProposerCore {
 public:
  explicit ProposerCore(int32_t max_depth) : max_depth_(max_depth) {}

  // Sets the live-context source (at most one); loop_decay as DraftSource::loop_decay.
  void set_context(SuffixAutomaton* sam, const SourceParams& params, int32_t source_id, float loop_decay);
  // Adds a source matched against the context stream.
  void add_matcher_source(const AutomatonView* view, const SourceParams& params, int32_t source_id);
  // Editing mode for the matcher sources with this source_id (their automata
  // must be complete: an OccurrenceIndex is built over each): from
  // start_output() on, a CopyCursor follows the output through the reference
  // and propose() adds its candidates as fixed-copy sources (see copy_cursor.h). Throws
  // std::invalid_argument if no matcher source has the id.
  void set_cursor(int32_t source_id, const CursorParams& params);
  // The tokens fed from now on are the output: cursors start tracking them
  // (anchor at the start of the reference). Call after feeding the prompt.
  void start_output();
  // The cursor of the first source with the id (CursorState{} when it has none).
  CursorState cursor_state(int32_t source_id) const;
  // The cursor's current candidates (best first) of the first source with the id.
  std::vector<CopyCandidate> cursor_candidates(int32_t source_id) const;
  // Appends tokens to the context: extends the context automaton and advances
  // every matcher; O(n) amortised. Throws std::invalid_argument naming the
  // first negative token.
  void feed(const int32_t* tokens, int64_t n);
  // Also expand up to `backoff` shorter suffix matches of each source (the
  // suffix links of its match state, down to length min_backoff_len), each
  // scored by its own match length. 0 = only the longest match.
  void set_backoff(int32_t backoff, int32_t min_backoff_len) {
    backoff_ = backoff;
    min_backoff_len_ = min_backoff_len;
  }
  // Best-first draft tree of at most max_nodes nodes.
  void propose(int32_t max_nodes, DraftResult* out);
  // One source's match: the longest suffix of the context that occurs in it
  // with a continuation.
  struct SourceMatch {
    int32_t source_id;  // as given to set_context / add_matcher_source
    int32_t match_len;  // its length (0 = none)
  };
  // Every source's match, the context first.
  std::vector<SourceMatch> match_lengths();
  int32_t max_depth() const { return max_depth_; }

 private:
  // A matched source.
  struct MatchedSource {
    Matcher matcher;   // position in the source's automaton
    DraftSource params;  // weight, half_len, source_id (view/state/match_len filled per call)
    std::shared_ptr<OccurrenceIndex> occurrences;  // editing mode only
    std::shared_ptr<CopyCursor> cursor;            // editing mode only
  };
  // Appends the cursor candidates of a source to sources_.
  void push_cursor_sources(const MatchedSource& m);


  // Appends the source and its back-off states to sources_.
  void push_source(DraftSource s);
  // The longest suffix of a match that has a continuation: follows suffix
  // links while the state has no transition (its occurrences all end
  // documents). Updates s->state and s->match_len.
  void with_continuation(DraftSource* s);

  int32_t max_depth_;                      // deepest node of a draft
  int32_t backoff_ = 0;                    // shorter suffix states expanded per source
  int32_t min_backoff_len_ = 1;            // shortest back-off match length
  SuffixAutomaton* context_ = nullptr;     // live context automaton (not owned), or null
  DraftSource context_params_;             // its weight, half_len, source_id
  std::vector<MatchedSource> matched_;     // other sources
  bool output_started_ = false;            // cursors track the fed tokens
  std::vector<DraftSource> sources_;       // scratch for the builder
  std::vector<CopyCandidate> unigrams_;    // scratch for push_cursor_sources
  DraftTreeBuilder builder_;               // scratch buffers
};

}  // namespace refdec

#endif  // REFDEC_PROPOSER_CORE_H_

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

// Drafting defaults, stated only here (refdec.Proposer reads them through the
// binding: refdec._C.default_source_params(), LOOP_DECAY, EDITING_LOOP_DECAY).
//
// Root confidence of each kind of source (source_confidence()): the live
// context and a request's references from short matches on; a corpus a little
// less, and from longer matches (a short match in a large corpus says little);
// earlier requests' outputs (refdec.OutputMemory) as a corpus, until the
// acceptance table has learnt their own rate.
// The most nodes a step verifies per row by default, and the deepest a draft goes
// (refdec.drafting.tree.MAX_NODES reads it: refdec._C.MAX_NODES); the copy
// cursor's decay_levels are stated for a budget of this many nodes.
inline constexpr int32_t kMaxNodes = 64;
inline constexpr SourceParams kContextParams{};  // weight 1, half_len 2
inline constexpr SourceParams kReferenceParams{};
inline constexpr SourceParams kCorpusParams{0.9f, 4.0f};
inline constexpr SourceParams kMemoryParams{0.9f, 4.0f};
// set_context's loop_decay: the score factor of each draft token a live-context
// copy takes from the draft itself (a loop). It depends on the mode, which the
// caller knows (refdec.Proposer: cursor=), so set_context has no default.
// Chat outputs: 0.7 (1.0 loses 4-12% tokens/step on Spec-Bench/MT-Bench,
// benchmarks/RESULTS.md section 3). Editing mode (a copy cursor): 1.0, no
// decay: when a model repeats a block of the file it keeps repeating it
// (edits-click, the default model's own outputs: 389 -> 308 verify passes over
// the 10 e2e pairs; the true edited files: 41.57 -> 41.56 tokens/step at 64
// nodes, neutral).
inline constexpr float kLoopDecay = 0.7f;
inline constexpr float kEditingLoopDecay = 1.0f;

// Holds the sources of one request. The context source is a SuffixAutomaton
// that feed() extends (its match is link(last): the longest suffix of the
// context that occurred before with a continuation); every other source is
// matched by a Matcher per automaton that feed() advances. A source may be the
// shards of one corpus (several automata over disjoint documents): it drafts
// exactly as one automaton over all their documents would (the longest match
// over the shards; at each node the continuation counts of the shards where the
// string occurs, summed). Automata are not owned and must outlive the core.
// Not thread-safe (one per request).
class ProposerCore;

// A request's new tokens in a batch step (not owned).
struct TokenSpan {
  const int32_t* data;  // token ids (>= 0 to be fed)
  int64_t size;         // how many
};

// The draft trees of a batch step, one after another.
struct DraftBatch {
  DraftResult nodes;             // every tree's nodes, tree r at [offsets[r], offsets[r + 1]); parents index within its tree
  std::vector<int64_t> offsets;  // R + 1 entries: offsets[0] = 0, offsets[R] = the total node count
};

// One drafting step for R requests, exactly the loop
//   for r: cores[r]->feed(new_tokens[r]); cores[r]->propose(max_nodes) -> tree r
// with every tree appended to `out` (cleared first). Every token is checked
// before any core is fed: a negative id throws std::invalid_argument naming r
// and the position, and leaves every core as it was. cores and new_tokens have
// R entries each (std::invalid_argument otherwise). With num_threads > 1 the
// requests are split into contiguous runs of at least kMinRequestsPerThread,
// one per thread (the same trees); the cores must then be distinct (a core
// listed twice throws std::invalid_argument before any is fed), and an
// automaton shared between cores must be a FrozenIndex or a SuffixAutomaton no
// thread extends meanwhile (its counts are computed before the threads start).
void step_batch(const std::vector<ProposerCore*>& cores, const std::vector<TokenSpan>& new_tokens,
                int32_t max_nodes, int32_t num_threads, DraftBatch* out);

// The fewest requests step_batch gives one thread (fewer: fewer threads).
constexpr size_t kMinRequestsPerThread = 16;

class ProposerCore {
 public:
  // max_depth: the deepest node of a draft (< 1: every draft is empty).
  explicit ProposerCore(int32_t max_depth) : max_depth_(max_depth) {}

  // Sets the live-context source (at most one); loop_decay as DraftSource::loop_decay.
  void set_context(SuffixAutomaton* sam, const SourceParams& params, int32_t source_id, float loop_decay);
  // Adds a source matched against the context stream: one automaton, or the
  // shards of one corpus (throws std::invalid_argument when empty).
  void add_matcher_source(const std::vector<const AutomatonView*>& automata, const SourceParams& params,
                          int32_t source_id);
  // Editing mode for the matcher sources with this source_id (one complete
  // automaton each, not shards: an OccurrenceIndex is built over it): from
  // start_output() on, a CopyCursor follows the output through the reference
  // and propose() adds its candidates as fixed-copy sources (see copy_cursor.h). Throws
  // std::invalid_argument if no matcher source has the id, or one has shards.
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
  // Best-first draft tree of at most max_nodes nodes (none when max_nodes <= 0).
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
  // Computes the lazy occurrence counts of every matcher automaton now, so
  // that threads drafting from other cores over the same automata only read.
  void count_shared_automata() const;

 private:
  // A matched source.
  struct MatchedSource {
    std::vector<Matcher> matchers;  // one per automaton (the shards of a corpus; usually one)
    DraftSource params;             // params, source_id (view: the single automaton; state, match_len per call)
    std::shared_ptr<OccurrenceIndex> occurrences;  // editing mode only
    std::shared_ptr<CopyCursor> cursor;            // editing mode only
  };
  // Where the context's longest suffix stands in one automaton of a source.
  struct AutomatonMatch {
    const AutomatonView* view;  // the automaton (not owned)
    int32_t state;              // state holding the longest suffix of the context that occurs in it
    int32_t len;                // that suffix's length
  };
  // Appends the cursor candidates of a source to sources_.
  void push_cursor_sources(const MatchedSource& m);
  // Fills matches_ from a source's matchers.
  void match_automata(const MatchedSource& m);
  // The length of the longest suffix of the context that occurs in any
  // automaton of matches_, or with `continuation`, the longest with a
  // continuation (suffix links are followed while no automaton holding the
  // suffix has a transition from it: all its occurrences end documents);
  // level_states_ holds it. 0 = none.
  int32_t top_level(bool continuation);
  // Sets level_states_ to the state holding the context's suffix of length
  // `len` in each automaton of matches_ where it occurs (kNoState elsewhere).
  void set_level(int32_t len);
  // The next shorter suffix (of the level `len` in level_states_) whose
  // occurrences over all automata differ: the suffix link of one automaton
  // made of them all. 0 = none.
  int32_t shorter(int32_t len) const;
  // Appends the sources of the level `len` (one per automaton holding it,
  // grouped when there are several) and up to backoff_ shorter levels.
  void push_levels(const DraftSource& base, int32_t len);
  int32_t max_depth_;                      // deepest node of a draft
  int32_t backoff_ = 0;                    // shorter suffix states expanded per source
  int32_t min_backoff_len_ = 1;            // shortest back-off match length
  SuffixAutomaton* context_ = nullptr;     // live context automaton (not owned), or null
  DraftSource context_params_;             // its weight, half_len, source_id
  std::vector<MatchedSource> matched_;     // other sources
  bool output_started_ = false;            // cursors track the fed tokens
  std::vector<DraftSource> sources_;       // scratch for the builder
  std::vector<CopyCandidate> unigrams_;    // scratch for push_cursor_sources
  std::vector<AutomatonMatch> matches_;    // scratch: the automata of the source being drafted
  std::vector<int32_t> level_states_;      // scratch: per automaton of matches_, see set_level()
  int32_t next_group_ = 0;                 // next DraftSource::group of this propose()
  DraftTreeBuilder builder_;               // scratch buffers
};

}  // namespace refdec

#endif  // REFDEC_PROPOSER_CORE_H_

// Editing mode: where in a reference (the file being rewritten) the output is
// copying from, so that drafts continue at the right occurrence of repeated
// text and re-join the reference after an inserted or changed passage.
#ifndef REFDEC_COPY_CURSOR_H_
#define REFDEC_COPY_CURSOR_H_

#include <cstdint>
#include <vector>

#include "automaton_view.h"
#include "draft_tree.h"
#include "params.h"

namespace refdec {

// Every end position of every state of an automaton that no longer grows
// (a per-request reference), in O(occurrences) per query.
//
// The end positions of a state are the positions whose document-prefix state
// lies in the state's suffix-link subtree; a DFS of the link tree lays each
// subtree's positions out contiguously. Built in O(tokens + states) with
// transition() and link() only.
class OccurrenceIndex {
 public:
  explicit OccurrenceIndex(const AutomatonView* view);

  // End positions (token_pos of the last token) of the state's strings:
  // [*begin, *end), in no particular order. Empty for an invalid state.
  void occurrences(int32_t state, const int32_t** begin, const int32_t** end) const;
  const AutomatonView* view() const { return view_; }

 private:
  const AutomatonView* view_;        // not owned
  std::vector<int32_t> first_;       // per state: first index into positions_
  std::vector<int32_t> last_;        // per state: end index into positions_
  std::vector<int32_t> positions_;   // end positions in link-tree DFS order
};

// Tuning of the cursor (see CopyCursor). Valid ranges: kCursorParamFields
// below. Python: refdec.drafting.proposer.CursorParams (fields by keyword, checked).
struct CursorParams {
  // Log-odds that the output continues at a reference position q:
  //   match_gain * min(l, match_cap) - distance_gain * log(1 + d / distance_scale)
  // l = trailing output tokens equal to the reference text before q, d = q -
  // anchor when q is at or after the anchor, back_penalty * (anchor - q) before it.
  // The distance prior is heavy-tailed (a jump's odds fall as a power of its
  // length): a moved block or a far re-join backed by a long match still wins.
  float match_gain = 2.0f;
  int32_t match_cap = 16;
  float distance_gain = 2.0f;
  float distance_scale = 32.0f;
  float back_penalty = 4.0f;
  // Log-odds of "none of the candidates" (the output is new text).
  float null_score = 3.0f;
  // Added to the log-odds of the anchor (the output re-joins where the copy
  // stopped: an insertion) and of the diagonal anchor + k after k output
  // tokens since the anchor (k reference tokens replaced by k new ones).
  float anchor_bonus = 1.0f;
  float diag_bonus = 1.0f;
  // Score factor per copied token of a candidate chain.
  float copy_decay = 1.0f;
  // Score factor per tree level for every source of the draft while the
  // cursor is on (DraftTreeBuilder::set_depth_decay), weakened by the best
  // candidate's aligned run r: 1 - (1 - depth_decay) * 4 / (4 + r). 1 = off
  // (the default: the per-source survival below replaces it).
  float depth_decay = 1.0f;
  // Levels that decay at a budget of kMaxNodes (64) nodes, in proportion to the
  // budget (max_nodes * decay_levels / kMaxNodes, at least 1): depth_decay^min(depth, levels).
  int32_t decay_levels = 16;
  // Per-source survival while the cursor is on (DraftSource::hazard_power),
  // 0 = off: a suffix-match source's path score at depth d is multiplied by
  // ((hazard_scale + e) / (hazard_scale + e + d))^hazard_power, e = its match
  // length: a copy backed by a long match keeps nearly its score deep down,
  // one backed by a token or two yields the budget after a few levels.
  float hazard_power = 1.5f;
  float hazard_scale = 1.0f;
  // The same for the cursor's fixed-copy candidates and unigram chains, e =
  // the candidate's aligned run (its common suffix with the output).
  float copy_hazard_power = 1.0f;
  float copy_hazard_scale = 1.0f;
  // Aligned tokens in a row after which the alignment becomes the anchor.
  int32_t confirm_run = 8;
  // Before the first output token the alignment is the start of the first
  // document, with this many aligned tokens as its evidence (an edit rewrites
  // the file from its top); 0 = no alignment: the start is only the anchor.
  int32_t start_run = 16;
  // Candidates kept (the best one is the alignment).
  int32_t max_candidates = 3;
  // Suffix lengths tried on a re-synchronisation: the match state and up to
  // this many shorter states along its suffix links.
  int32_t max_backoff = 6;
  // Fallback when unsure: the unigram_k most frequent reference tokens, each
  // copied from its occurrence nearest the anchor, with weight unigram_weight *
  // (its share of the reference tokens); added while the best candidate's
  // weight is below unigram_below.
  int32_t unigram_k = 16;
  float unigram_weight = 1.0f;
  float unigram_below = 0.5f;
  // Substitutions learnt (a reference token written as another one, the
  // copy going on after it): at most max_substitutions kept, the latest
  // first; a copy of `from` forks with probability hits / (hits + misses + 1).
  int32_t max_substitutions = 8;
  // Occurrence lists longer than this are not scanned (the suffix is too
  // short to say where the output is).
  int32_t max_scan = 16384;
};

// Every CursorParams field, in declaration order, with its valid range (the
// fields that size per-request buffers are capped: match_cap 2**31 - 1 would
// allocate 8 GB).
inline constexpr ParamField<CursorParams> kCursorParamFields[] = {
    real_field("match_gain", &CursorParams::match_gain, -kInf, kInf),
    int_field("match_cap", &CursorParams::match_cap, 1, 4096),
    real_field("distance_gain", &CursorParams::distance_gain),
    real_field("distance_scale", &CursorParams::distance_scale, 1e-3),
    real_field("back_penalty", &CursorParams::back_penalty),
    real_field("null_score", &CursorParams::null_score, -kInf, kInf),
    real_field("anchor_bonus", &CursorParams::anchor_bonus, -kInf, kInf),
    real_field("diag_bonus", &CursorParams::diag_bonus, -kInf, kInf),
    real_field("copy_decay", &CursorParams::copy_decay, 0.0, 1.0),
    real_field("depth_decay", &CursorParams::depth_decay, 0.0, 1.0),
    int_field("decay_levels", &CursorParams::decay_levels, 1),
    real_field("hazard_power", &CursorParams::hazard_power),
    real_field("hazard_scale", &CursorParams::hazard_scale, 1e-3),
    real_field("copy_hazard_power", &CursorParams::copy_hazard_power),
    real_field("copy_hazard_scale", &CursorParams::copy_hazard_scale, 1e-3),
    int_field("confirm_run", &CursorParams::confirm_run),
    int_field("start_run", &CursorParams::start_run),
    int_field("max_candidates", &CursorParams::max_candidates, 1, 4096),
    int_field("max_backoff", &CursorParams::max_backoff, 0, 4096),
    int_field("unigram_k", &CursorParams::unigram_k, 0, 65536),
    real_field("unigram_weight", &CursorParams::unigram_weight, 0.0, 1.0),
    real_field("unigram_below", &CursorParams::unigram_below),
    int_field("max_substitutions", &CursorParams::max_substitutions, 0, 65536),
    int_field("max_scan", &CursorParams::max_scan),
};
static_assert(sizeof(CursorParams) == sizeof(kCursorParamFields) / sizeof(kCursorParamFields[0]) * 4,
              "every CursorParams field (all 4 bytes) needs its entry in kCursorParamFields");

// Where a cursor stands (CopyCursor's align(), run(), anchor()).
struct CursorState {
  int64_t align = -1;   // reference position of the next token if the output keeps copying, -1 = none
  int32_t run = 0;      // aligned tokens in a row
  int64_t anchor = -1;  // where the last confirmed copy stopped, -1 = none
};

// A reference position where the output may go on copying.
struct CopyCandidate {
  int64_t pos;    // continuation start: token_pos of the next token
  int64_t end;    // exclusive end of its document
  int32_t match;  // trailing output tokens equal to the reference before pos (<= match_cap)
  float weight;   // estimated probability that the output continues here
};

// Follows the generated output through one reference automaton.
//
//   align   the reference position of the next token if the output keeps
//           copying (-1 = none); run = aligned tokens in a row.
//   anchor  where the last confirmed copy (>= confirm_run aligned tokens)
//           stopped: after an insertion the output re-joins the reference
//           there; after a replacement or deletion, a little after it.
//
// Per output token: if it equals the reference at align, the copy goes on
// (O(1)); the candidates are the alignment and the anchor. Otherwise the
// cursor re-synchronises: for the longest suffix match and up to max_backoff
// shorter ones, the occurrence whose continuation starts nearest the anchor
// (forward preferred), plus the anchor itself and the diagonal (anchor + the
// output tokens since it), are scored by the log-odds in
// CursorParams; the best max_candidates are kept, weighted by a softmax with
// the null score, and the best becomes the alignment.
class CopyCursor {
 public:
  CopyCursor(const OccurrenceIndex* occ, const CursorParams& params);
  // New request, output starting now: no alignment, anchor at the start of
  // the first document (an edit rewrites the file from its top).
  void reset();
  // One output token, after the matcher consumed it (its longest match
  // state and length in the reference automaton).
  void advance(int32_t token, int32_t match_state, int32_t match_len);
  // Candidates, best first (at most max_candidates; empty before any output
  // only if the reference is empty).
  const std::vector<CopyCandidate>& candidates() const { return candidates_; }
  // Learnt substitutions, for DraftSource::substitutions.
  const std::vector<Substitution>& substitutions() const { return substitutions_; }
  // Appends the unigram fallback chains (see CursorParams::unigram_k).
  void unigram_candidates(std::vector<CopyCandidate>* out) const;
  int64_t align() const { return align_; }
  int32_t run() const { return run_; }
  int64_t anchor() const { return anchor_; }
  const CursorParams& params() const { return params_; }
  // The end position of an occurrence of `state` whose continuation starts
  // nearest to `target` (forward preferred), -1 if none has a continuation.
  int64_t nearest_end(int32_t state, int64_t target) const;

 private:
  // Trailing output tokens equal to the reference before pos (same document), <= match_cap.
  int32_t common_suffix(int64_t pos) const;
  // Log-odds of a candidate.
  float log_odds(int64_t pos, int32_t match) const;
  // Adds pos as a candidate unless present or without a continuation.
  void add_candidate(int64_t pos);
  // Adds the anchor and the diagonal.
  void add_structural();
  // Adds the alignment (its aligned run, capped, as the match) while it is inside its document.
  void add_alignment();
  // Sets the anchor (resets since_).
  void set_anchor(int64_t pos) {
    anchor_ = pos;
    since_ = 0;
  }
  // Softmax of the candidates' log-odds (kept in weight) with the null score; sorts best first.
  void normalise();

  // Counts a learnt substitution (from -> to) once more; a new pair replaces any older one for `from`.
  void learn(int32_t from, int32_t to);
  // Rebuilds substitutions_ from sub_counts_.
  void refresh_substitutions();

  // Counts of one learnt substitution.
  struct SubCount {
    int32_t from;    // reference token
    int32_t to;      // output token written in its place
    int32_t hits;    // times the copy went on right after the substitution
    int32_t misses;  // times `from` was copied unchanged since it was learnt
  };

  const OccurrenceIndex* occ_;             // occurrences of the reference (not owned)
  CursorParams params_;                    // tuning (match_cap, max_candidates, distance_scale clamped valid)
  int64_t align_ = -1;                     // see align()
  int64_t align_end_ = 0;                  // end of the document holding align_ - 1
  int32_t run_ = 0;                        // see run()
  int64_t anchor_ = 0;                     // see anchor()
  int64_t since_ = 0;                      // output tokens since anchor_ was set
  int64_t fed_ = 0;                        // output tokens seen
  std::vector<CopyCandidate> candidates_;  // see candidates()
  std::vector<int32_t> tail_;              // ring buffer of the last match_cap output tokens
  std::vector<std::pair<int32_t, float>> unigrams_;  // (1-token state, share of the reference), most frequent first
  std::vector<SubCount> sub_counts_;       // learnt substitutions, the latest first
  std::vector<Substitution> substitutions_;  // the same as probabilities, for the draft builder
  int32_t pending_from_ = -1;              // a mismatch at align: the reference token ...
  int32_t pending_to_ = -1;                // ... the output token written instead ...
  int64_t pending_next_ = -1;              // ... and the reference position the next token must equal (-1 = none)
};

}  // namespace refdec

#endif  // REFDEC_COPY_CURSOR_H_

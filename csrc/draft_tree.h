// Best-first draft tree over one or more automaton sources.
#ifndef REFDEC_DRAFT_TREE_H_
#define REFDEC_DRAFT_TREE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "automaton_view.h"
#include "params.h"

namespace refdec {

// A token the output has been seen to write in place of a reference token
// (re-indentation, a rename): copies of `from` also propose `to`.
struct Substitution {
  int32_t from;  // reference token
  int32_t to;    // output token written in its place
  float prob;    // probability that a copied `from` is written as `to`
};

// How far a matched source is trusted: its root confidence is
// weight * L / (L + half_len) for a match of length L (source_confidence()).
// Valid ranges: kSourceParamFields below. Python: refdec.drafting.proposer.SourceParams.
struct SourceParams {
  float weight = 1.0f;    // confidence of an arbitrarily long match, in [0, 1]
  float half_len = 2.0f;  // match length at which the confidence is weight / 2
};

inline constexpr ParamField<SourceParams> kSourceParamFields[] = {
    real_field("weight", &SourceParams::weight, 0.0, 1.0),
    real_field("half_len", &SourceParams::half_len),
};
static_assert(sizeof(SourceParams) == sizeof(kSourceParamFields) / sizeof(kSourceParamFields[0]) * 4,
              "every SourceParams field (all 4 bytes) needs its entry in kSourceParamFields");

// One source of continuations: an automaton and where the live context
// currently matches in it.
struct DraftSource {
  const AutomatonView* view = nullptr;  // automaton (not owned)
  int32_t state = kRoot;                // state of the matched suffix
  int32_t match_len = 0;                // matched length; 0 = the source proposes nothing
  SourceParams params;                  // confidence (a fixed copy: params.weight alone)
  int32_t source_id = 0;                // written to DraftTree.source_ids
  bool live = false;                    // the automaton's last document is the live context: a
                                        // unique continuation that reaches its end goes on with
                                        // the draft itself (overlapping copy, as in a loop)
  float loop_decay = 1.0f;              // live: score factor per token copied from the draft itself
  int64_t copy_from = -1;               // >= 0: a fixed copy, not a match: the chain
                                        // token_at(copy_from), token_at(copy_from + 1), ... up to
                                        // copy_end (exclusive), with confidence params.weight (state and
                                        // match_len unused)
  int64_t copy_end = 0;                 // copy_from >= 0: end of the copied document
  float copy_decay = 1.0f;              // copy_from >= 0: score factor per copied token
  const std::vector<Substitution>* substitutions = nullptr;  // copy_from >= 0: forks of copied tokens
  float evidence = 0.0f;                // tokens already seen to follow this source (its match
                                        // length, or a cursor candidate's aligned run)
  int32_t group = -1;                   // >= 0: one shard of a corpus split over several automata.
                                        // The entries of one group at a node hold the same string,
                                        // one per shard where it occurs (all with one score), and are
                                        // expanded as one automaton over all the shards' documents
                                        // would be: children merged by token, counts summed
  float hazard_power = 0.0f;            // survival: the source's path score at depth d is
  float hazard_scale = 1.0f;            // multiplied by ((s + e) / (s + e + d))^p, p = hazard_power,
                                        // s = hazard_scale, e = evidence (a per-level hazard
                                        // ~ p / (s + e + j) that falls the longer the copy held);
                                        // p = 0: no such factor
};

// Confidence of a source with a match of `match_len` tokens:
//   params.weight * match_len / (match_len + params.half_len)   (0 when match_len == 0)
// It grows with the match length. A fixed copy (copy_from >= 0) has
// confidence params.weight.
float source_confidence(const DraftSource& source);

// Output: nodes in topological order (parents[i] < i, -1 = child of the root),
// one entry per node in each vector.
struct DraftResult {
  std::vector<int32_t> token_ids;   // token proposed by each node
  std::vector<int32_t> parents;     // parent node index, -1 for children of the root
  std::vector<float> scores;        // estimated probability that the path to the node is accepted
  std::vector<int32_t> source_ids;  // source contributing the largest per-source score
  std::vector<int32_t> depths;      // depth of the node: 1 for a child of the root, else
                                    // 1 + depths[parents[i]] (the builder knows it; Python
                                    // reads it as DraftTree.depths instead of deriving it)

  // Every vector emptied / given room for n nodes / extended by `other`'s nodes
  // (as they are: parents keep indexing within their own tree).
  void clear() {
    token_ids.clear();
    parents.clear();
    scores.clear();
    source_ids.clear();
    depths.clear();
  }
  void reserve(size_t n) {
    token_ids.reserve(n);
    parents.reserve(n);
    scores.reserve(n);
    source_ids.reserve(n);
    depths.reserve(n);
  }
  void append(const DraftResult& other) {
    token_ids.insert(token_ids.end(), other.token_ids.begin(), other.token_ids.end());
    parents.insert(parents.end(), other.parents.begin(), other.parents.end());
    scores.insert(scores.end(), other.scores.begin(), other.scores.end());
    source_ids.insert(source_ids.end(), other.source_ids.begin(), other.source_ids.end());
    depths.insert(depths.end(), other.depths.begin(), other.depths.end());
  }
};

// Builds draft trees; keeps its scratch buffers between calls (not thread-safe;
// use one builder per thread).
//
// Algorithm: a trie over continuations, expanded best-first. Each trie node
// holds, per source that reaches it, (source, state, per-source path score).
// A child's per-source score = parent's per-source score *
// count(child state) / sum of the counts of the parent state's children
// (the children sum, not count(parent): the live context's match state also
// counts its final occurrence, which has no continuation). Several
// DraftSources may share a source_id (one automaton matched at several
// suffix lengths: the longest match and shorter back-off states); a node's
// score takes the max over the entries of one source_id and combines
// distinct source_ids as 1 - prod(1 - score_s). Equal tokens proposed by
// several sources share one node. Ties prefer the deeper node, so a chain of
// unique continuations (score ratio 1) is followed to max_depth first.
class DraftTreeBuilder {
 public:
  // Largest number of children scanned per (source, state); a state with
  // more children proposes none of them (such states have low-information,
  // near-root matches).
  static constexpr size_t kMaxFanout = 256;

  // The tree of at most max_nodes nodes, none deeper than max_depth (empty
  // when either is <= 0).
  void build(const std::vector<DraftSource>& sources, int32_t max_nodes, int32_t max_depth, DraftResult* out);
  // Score factor per level: a node at depth d scores (combined score) * decay^d
  // (1 = none). Below 1 a deep chain yields budget to near-root alternatives.
  // Levels below decay_levels do not decay further: (decay)^min(d, decay_levels).
  void set_depth_decay(float decay, int32_t decay_levels = 1 << 30) {
    depth_decay_ = decay;
    decay_levels_ = decay_levels;
  }

 private:
  // One (source, state, per-source score) pair of a trie node or candidate.
  struct Entry {
    int32_t source;  // index into the sources vector
    int32_t state;   // state in that source's automaton, or kCopyState
    float score;     // per-source path score
    int32_t pos;     // kCopyState only: live source: virtual token_pos copied by this node;
                     // fixed copy (copy_from >= 0): the next token_pos to read
  };
  // Entry::state of a live source copying from a position (see above).
  static constexpr int32_t kCopyState = -2;
  // A candidate child not yet in the tree.
  struct Candidate {
    float score;          // combined score
    int32_t depth;        // depth the node will have (1 = child of the root)
    int32_t seq;          // creation order, for deterministic ties
    int32_t parent;       // parent node index (-1 = root)
    int32_t token;        // proposed token
    int32_t entry_begin;  // range of its entries in cand_entries_
    int32_t entry_end;
    int32_t best_source;  // source id with the largest per-source score
  };
  // A child proposed by one source while expanding a node.
  struct Proposal {
    int32_t token;      // proposed token
    int32_t source_id;  // sources[entry.source].source_id
    Entry entry;
  };

  void expand(const std::vector<DraftSource>& sources, int32_t node, int32_t depth, const Entry* entries,
              int32_t n_entries, int32_t budget_left);
  // Step 1 of expand() for the entries of one group (DraftSource::group) among
  // entries[0, n_entries), whose path score is `score`: appends their merged
  // children to proposals_.
  void expand_group(const std::vector<DraftSource>& sources, const Entry* entries, int32_t n_entries, float score,
                    int32_t group);
  // A child of one shard's state, while a group's children are merged.
  struct ShardChild {
    int32_t token;   // transition label
    int32_t source;  // the shard's index into sources
    int32_t target;  // the child state in that shard
    int64_t count;   // its occurrence count there
  };
  // Orders proposals_ by (token, source_id): sorted when there are at most
  // kMergeAbove of them, else the runs of run_starts_ sorted and merged.
  // Entries of one (token, source_id) may come in any order (a node takes
  // their max; a group's entries of one token share one score), so the tree
  // does not depend on which is used.
  void sort_proposals();
  static constexpr size_t kMergeAbove = 16;

  std::vector<Candidate> heap_;        // max-heap of candidates
  std::vector<Entry> cand_entries_;    // entries of all candidates ever pushed
  std::vector<Proposal> proposals_;    // scratch: children of the node being expanded
  std::vector<Edge> edges_;            // scratch: children of one state
  std::vector<Candidate> grouped_;     // scratch: grouped proposals of one expansion
  std::vector<int32_t> run_starts_;    // scratch: first proposal of each entry's run
  std::vector<std::pair<int32_t, int32_t>> runs_;  // scratch: non-empty runs [begin, end)
  std::vector<Proposal> merged_;       // scratch: merged runs
  std::vector<Proposal> merge_scratch_;  // scratch: the next merge's output
  std::vector<Entry> root_entries_;    // scratch: the root's entries
  std::vector<ShardChild> shard_children_;  // scratch: see expand_group()
  std::vector<int32_t> shard_starts_;        // scratch: first child of each shard in shard_children_
  std::vector<ShardChild> merged_children_;  // scratch: merged shard runs
  std::vector<ShardChild> merge_children_;   // scratch: the next merge's output
  int32_t seq_ = 0;                    // next Candidate::seq
  float depth_decay_ = 1.0f;           // see set_depth_decay
  int32_t decay_levels_ = 1 << 30;     // see set_depth_decay
};

}  // namespace refdec

#endif  // REFDEC_DRAFT_TREE_H_

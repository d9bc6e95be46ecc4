#include "draft_tree.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <iterator>
#include <utility>

namespace refdec {
namespace {

// Heap order: higher score first, then deeper, then older.
struct CandidateLess {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    if (a.score != b.score) return a.score < b.score;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.seq > b.seq;
  }
};

// Orders (*v) by `less` when each run [starts[r], starts[r + 1]) of it
// (starts ends with v->size()) is ordered by `less` once sorted by
// `run_less`: each run is sorted by itself (most come sorted already), then
// the runs are merged, the shortest first (the longest is copied once),
// through the scratch vectors.
template <typename T, typename RunLess, typename Less>
void sort_by_runs(std::vector<T>* v, const std::vector<int32_t>& starts, RunLess run_less, Less less,
                  std::vector<std::pair<int32_t, int32_t>>* runs, std::vector<T>* merged, std::vector<T>* scratch) {
  // Step 1. Each run sorted.
  runs->clear();
  for (size_t r = 0; r + 1 < starts.size(); ++r) {
    const auto begin = v->begin() + starts[r];
    const auto end = v->begin() + starts[r + 1];
    if (begin == end) continue;
    if (!std::is_sorted(begin, end, run_less)) std::sort(begin, end, run_less);
    runs->push_back({starts[r], starts[r + 1]});
  }
  if (runs->size() < 2) return;
  // Step 2. Merged, the shortest first.
  using Run = std::pair<int32_t, int32_t>;
  std::sort(runs->begin(), runs->end(),
            [](const Run& a, const Run& b) { return a.second - a.first < b.second - b.first; });
  merged->assign(v->begin() + (*runs)[0].first, v->begin() + (*runs)[0].second);
  for (size_t r = 1; r < runs->size(); ++r) {
    scratch->clear();
    std::merge(merged->begin(), merged->end(), v->begin() + (*runs)[r].first, v->begin() + (*runs)[r].second,
               std::back_inserter(*scratch), less);
    merged->swap(*scratch);
  }
  v->swap(*merged);
}

}  // namespace

float source_confidence(const DraftSource& source) {
  const SourceParams& p = source.params;
  if (source.copy_from >= 0) return source.copy_from < source.copy_end ? std::max(p.weight, 0.0f) : 0.0f;
  if (source.match_len <= 0 || p.weight <= 0.0f) return 0.0f;
  if (p.half_len <= 0.0f) return p.weight;
  const float l = static_cast<float>(source.match_len);
  return p.weight * l / (l + p.half_len);
}

void DraftTreeBuilder::build(const std::vector<DraftSource>& sources, int32_t max_nodes, int32_t max_depth,
                             DraftResult* out) {
  out->clear();
  heap_.clear();
  cand_entries_.clear();
  seq_ = 0;
  if (max_nodes <= 0 || max_depth <= 0) return;
  out->reserve(max_nodes);

  // Step 1. The root holds every source that matched, scored by its confidence.
  root_entries_.clear();
  for (size_t i = 0; i < sources.size(); ++i) {
    const DraftSource& s = sources[i];
    if (s.view == nullptr) continue;
    if (s.copy_from >= 0) {
      const float conf = source_confidence(s);
      if (conf > 0.0f && s.copy_end <= s.view->num_tokens())
        root_entries_.push_back({static_cast<int32_t>(i), kCopyState, conf, static_cast<int32_t>(s.copy_from)});
      continue;
    }
    if (s.state < 0 || s.state >= s.view->num_states()) continue;
    const float conf = source_confidence(s);
    if (conf > 0.0f) root_entries_.push_back({static_cast<int32_t>(i), s.state, conf, -1});
  }
  if (root_entries_.empty()) return;
  expand(sources, -1, 0, root_entries_.data(), static_cast<int32_t>(root_entries_.size()), max_nodes);

  // Step 2. Best-first: pop the best candidate, emit it as the next node
  // (its parent was emitted earlier, so the order is topological), then push
  // its children.
  while (!heap_.empty() && static_cast<int32_t>(out->token_ids.size()) < max_nodes) {
    std::pop_heap(heap_.begin(), heap_.end(), CandidateLess());
    const Candidate c = heap_.back();
    heap_.pop_back();
    const int32_t node = static_cast<int32_t>(out->token_ids.size());
    out->token_ids.push_back(c.token);
    out->parents.push_back(c.parent);
    out->scores.push_back(c.score);
    out->source_ids.push_back(c.best_source);
    out->depths.push_back(c.depth);
    if (c.depth < max_depth) {
      // expand() reads the entries before it appends to cand_entries_.
      expand(sources, node, c.depth, cand_entries_.data() + c.entry_begin, c.entry_end - c.entry_begin,
             max_nodes - static_cast<int32_t>(out->token_ids.size()));
    }
  }
}

void DraftTreeBuilder::sort_proposals() {
  auto by_token_source = [](const Proposal& a, const Proposal& b) {
    return a.token != b.token ? a.token < b.token : a.source_id < b.source_id;
  };
  if (proposals_.size() <= kMergeAbove) {
    std::sort(proposals_.begin(), proposals_.end(), by_token_source);
    return;
  }
  // Otherwise the entries' runs (a run shares one source_id; a FrozenIndex
  // lists children sorted by token already), sorted and merged.
  auto by_token = [](const Proposal& a, const Proposal& b) { return a.token < b.token; };
  run_starts_.push_back(static_cast<int32_t>(proposals_.size()));
  sort_by_runs(&proposals_, run_starts_, by_token, by_token_source, &runs_, &merged_, &merge_scratch_);
}

void DraftTreeBuilder::expand_group(const std::vector<DraftSource>& sources, const Entry* entries,
                                    int32_t n_entries, float score, int32_t group) {
  // Step 1. Every shard's children (none at all when one shard alone has too many).
  shard_children_.clear();
  shard_starts_.clear();
  for (int32_t i = 0; i < n_entries; ++i) {
    const DraftSource& shard = sources[entries[i].source];
    if (shard.group != group) continue;
    shard_starts_.push_back(static_cast<int32_t>(shard_children_.size()));
    if (!shard.view->children(entries[i].state, &edges_, kMaxFanout)) return;
    for (const Edge& edge : edges_) {
      const int64_t c = shard.view->count(edge.target);
      if (c > 0) shard_children_.push_back({edge.token, entries[i].source, edge.target, c});
    }
  }
  // Step 2. Merged by token: the children of one automaton over all the
  // shards, their counts the sums; none past the fanout cap.
  auto by_token = [](const ShardChild& a, const ShardChild& b) { return a.token < b.token; };
  shard_starts_.push_back(static_cast<int32_t>(shard_children_.size()));
  sort_by_runs(&shard_children_, shard_starts_, by_token, by_token, &runs_, &merged_children_, &merge_children_);
  size_t distinct = 0;
  double sum = 0.0;
  for (size_t i = 0; i < shard_children_.size(); ++i) {
    if (i == 0 || shard_children_[i].token != shard_children_[i - 1].token) ++distinct;
    sum += static_cast<double>(shard_children_[i].count);
  }
  if (distinct > kMaxFanout) return;
  // Step 3. One proposal per shard holding a child, each scored by the summed
  // count (the arithmetic of one automaton's children in expand()).
  const int32_t source_id = n_entries > 0 ? sources[entries[0].source].source_id : 0;
  for (size_t i = 0; i < shard_children_.size();) {
    size_t j = i;
    int64_t count = 0;
    while (j < shard_children_.size() && shard_children_[j].token == shard_children_[i].token)
      count += shard_children_[j++].count;
    const float child_score = static_cast<float>(score * (static_cast<float>(count) / sum));
    for (; i < j; ++i) {
      const ShardChild& c = shard_children_[i];
      proposals_.push_back({c.token, source_id, {c.source, c.target, child_score, -1}});
    }
  }
}

void DraftTreeBuilder::expand(const std::vector<DraftSource>& sources, int32_t node, int32_t depth,
                              const Entry* entries, int32_t n_entries, int32_t budget_left) {
  if (budget_left <= 0) return;
  // Step 1. Every entry's children (one run of proposals per entry).
  proposals_.clear();
  run_starts_.clear();
  for (int32_t i = 0; i < n_entries; ++i) {
    run_starts_.push_back(static_cast<int32_t>(proposals_.size()));
    Entry e = entries[i];
    const DraftSource& source = sources[e.source];
    const AutomatonView* view = source.view;
    // Step 0. The source's survival to the next level (DraftSource::hazard_power).
    if (source.hazard_power > 0.0f) {
      const float held = std::max(source.hazard_scale, 1e-3f) + std::max(source.evidence, 0.0f) +
                         static_cast<float>(depth);
      e.score *= std::pow(held / (held + 1.0f), source.hazard_power);
    }
    // Step 1a. The shards of one corpus: all their entries at the first of them.
    if (source.group >= 0) {
      bool first = true;
      for (int32_t j = 0; j < i && first; ++j) first = sources[entries[j].source].group != source.group;
      if (first) expand_group(sources, entries + i, n_entries - i, e.score, source.group);
      continue;
    }
    // Step 1b. Fixed copy: the entry's pos is the next token_pos to read.
    if (source.copy_from >= 0) {
      const int64_t read = e.pos;
      const float score = e.score * source.copy_decay;
      if (read >= source.copy_end || score <= 0.0f) continue;
      const int32_t token = view->token_at(read);
      float keep = 1.0f;
      if (source.substitutions != nullptr) {
        for (const Substitution& sub : *source.substitutions) {
          if (sub.from != token || sub.to == token) continue;
          proposals_.push_back(
              {sub.to, source.source_id, {e.source, kCopyState, score * sub.prob, static_cast<int32_t>(read + 1)}});
          keep = 1.0f - sub.prob;
          break;
        }
      }
      proposals_.push_back(
          {token, source.source_id, {e.source, kCopyState, score * keep, static_cast<int32_t>(read + 1)}});
      continue;
    }
    // Step 1c. Live source with a unique occurrence: overlapping copy. The
    // node (depth `depth`) is at virtual position n - 1 + depth.
    int64_t copy_pos = -1;
    if (e.state == kCopyState) {
      copy_pos = e.pos;
    } else if (source.live && depth > 0) {
      copy_pos = view->unique_end_pos(e.state);
    }
    if (copy_pos >= 0) {
      const int64_t n = view->num_tokens();
      const int64_t distance = n - 1 + depth - copy_pos;
      int64_t read = copy_pos + 1;
      if (distance < 1) continue;
      const float score = read >= n ? e.score * source.loop_decay : e.score;
      while (read >= n) read -= distance;
      if (read < 0 || score <= 0.0f) continue;
      proposals_.push_back(
          {view->token_at(read), source.source_id,
           {e.source, kCopyState, score, static_cast<int32_t>(copy_pos + 1)}});
      continue;
    }
    // Step 1d. Automaton children scored by their count ratio.
    if (!view->children(e.state, &edges_, kMaxFanout) || edges_.empty()) continue;
    const size_t first = proposals_.size();
    double sum = 0.0;
    for (const Edge& edge : edges_) {
      const int64_t c = view->count(edge.target);
      if (c <= 0) continue;
      sum += static_cast<double>(c);
      proposals_.push_back({edge.token, source.source_id, {e.source, edge.target, static_cast<float>(c), -1}});
    }
    for (size_t j = first; j < proposals_.size(); ++j)
      proposals_[j].entry.score = static_cast<float>(e.score * (proposals_[j].entry.score / sum));
  }
  if (proposals_.empty()) return;

  float level_factor = 1.0f;  // depth_decay_^(depth + 1)
  if (depth_decay_ != 1.0f) level_factor = std::pow(depth_decay_, static_cast<float>(std::min(depth + 1, decay_levels_)));
  // Step 2. Group equal tokens across sources into one candidate: max over
  // the entries of one source_id, then 1 - prod(1 - score) over source_ids;
  // best source = the source_id with the largest score.
  if (n_entries > 1) sort_proposals();
  grouped_.clear();
  for (size_t i = 0; i < proposals_.size();) {
    size_t j = i;
    float miss = 1.0f;
    float best = -1.0f;
    int32_t best_source = 0;
    int32_t n_source_ids = 0;
    while (j < proposals_.size() && proposals_[j].token == proposals_[i].token) {
      ++n_source_ids;
      // One source_id: the max of its entries.
      const int32_t source_id = proposals_[j].source_id;
      float source_best = 0.0f;
      while (j < proposals_.size() && proposals_[j].token == proposals_[i].token &&
             proposals_[j].source_id == source_id) {
        source_best = std::max(source_best, proposals_[j].entry.score);
        ++j;
      }
      miss *= 1.0f - source_best;
      if (source_best > best) {
        best = source_best;
        best_source = source_id;
      }
    }
    Candidate c;
    c.score = (n_source_ids == 1 ? best : 1.0f - miss) * level_factor;
    c.depth = depth + 1;
    c.seq = 0;
    c.parent = node;
    c.token = proposals_[i].token;
    c.entry_begin = static_cast<int32_t>(i);  // index into proposals_ until pushed
    c.entry_end = static_cast<int32_t>(j);
    c.best_source = best_source;
    grouped_.push_back(c);
    i = j;
  }

  // Step 3. Keep at most budget_left candidates (no more can enter the tree
  // below this node), best first, then push them with their entries.
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score > b.score : a.token < b.token;
  };
  if (static_cast<int32_t>(grouped_.size()) > budget_left) {
    std::partial_sort(grouped_.begin(), grouped_.begin() + budget_left, grouped_.end(), better);
    grouped_.resize(budget_left);
  } else if (grouped_.size() > 1) {
    std::sort(grouped_.begin(), grouped_.end(), better);
  }
  for (Candidate c : grouped_) {
    const int32_t begin = static_cast<int32_t>(cand_entries_.size());
    for (int32_t k = c.entry_begin; k < c.entry_end; ++k) cand_entries_.push_back(proposals_[k].entry);
    c.entry_begin = begin;
    c.entry_end = static_cast<int32_t>(cand_entries_.size());
    c.seq = seq_++;
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end(), CandidateLess());
  }
}

}  // namespace refdec

#include "copy_cursor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <utility>

namespace refdec {

OccurrenceIndex::OccurrenceIndex(const AutomatonView* view) : view_(view) {
  const int64_t n_states = view->num_states();
  const int64_t n_tokens = view->num_tokens();
  // Step 1. The prefix state of each position: read every document from the
  // root; the state reached holds the whole prefix, the longest string
  // ending there.
  std::vector<int32_t> head(n_states, -1);   // per state: first position whose prefix state it is
  std::vector<int32_t> next_pos(n_tokens, -1);  // per position: next position with the same prefix state
  for (int64_t doc = 0; doc < view->num_documents(); ++doc) {
    const int64_t begin = view->document_begin(doc);
    const int64_t end = view->document_begin(doc + 1);
    int32_t state = kRoot;
    for (int64_t p = begin; p < end; ++p) {
      state = view->transition(state, view->token_at(p));
      if (state < 0 || state >= n_states) break;  // a corrupted automaton only loses occurrences
      next_pos[p] = head[state];
      head[state] = static_cast<int32_t>(p);
    }
  }
  // Step 2. The suffix-link tree as child lists.
  std::vector<int32_t> first_child(n_states, -1), next_sibling(n_states, -1);
  for (int64_t s = n_states - 1; s > 0; --s) {
    const int32_t l = view->link(static_cast<int32_t>(s));
    if (l < 0 || l >= n_states || view->length(l) >= view->length(static_cast<int32_t>(s))) continue;
    next_sibling[s] = first_child[l];
    first_child[l] = static_cast<int32_t>(s);
  }
  // Step 3. Iterative DFS: a state's range opens before its subtree's
  // positions and closes after them.
  first_.assign(n_states, 0);
  last_.assign(n_states, 0);
  positions_.reserve(n_tokens);
  std::vector<int32_t> stack{kRoot};
  std::vector<char> opened(n_states, 0);
  while (!stack.empty()) {
    const int32_t s = stack.back();
    if (!opened[s]) {
      opened[s] = 1;
      first_[s] = static_cast<int32_t>(positions_.size());
      for (int32_t p = head[s]; p != -1; p = next_pos[p]) positions_.push_back(p);
      for (int32_t c = first_child[s]; c != -1; c = next_sibling[c]) stack.push_back(c);
    } else {
      last_[s] = static_cast<int32_t>(positions_.size());
      stack.pop_back();
    }
  }
}

void OccurrenceIndex::occurrences(int32_t state, const int32_t** begin, const int32_t** end) const {
  if (state < 0 || state >= static_cast<int32_t>(first_.size())) {
    *begin = *end = positions_.data();
    return;
  }
  *begin = positions_.data() + first_[state];
  *end = positions_.data() + last_[state];
}

CopyCursor::CopyCursor(const OccurrenceIndex* occ, const CursorParams& params) : occ_(occ), params_(params) {
  params_.match_cap = std::max(params_.match_cap, 1);
  params_.max_candidates = std::max(params_.max_candidates, 1);
  params_.distance_scale = std::max(params_.distance_scale, 1e-3f);
  // The most frequent tokens and their 1-token states.
  const AutomatonView* view = occ->view();
  std::unordered_map<int32_t, int64_t> freq;
  for (int64_t p = 0; p < view->num_tokens(); ++p) ++freq[view->token_at(p)];
  std::vector<std::pair<int64_t, int32_t>> order;
  for (const auto& kv : freq) order.emplace_back(-kv.second, kv.first);
  const size_t k = std::min(order.size(), static_cast<size_t>(std::max(params_.unigram_k, 0)));
  std::partial_sort(order.begin(), order.begin() + k, order.end());
  for (size_t i = 0; i < k; ++i) {
    const int32_t state = view->transition(kRoot, order[i].second);
    if (state > kRoot)
      unigrams_.emplace_back(state, static_cast<float>(-order[i].first) / static_cast<float>(view->num_tokens()));
  }
  reset();
}

void CopyCursor::unigram_candidates(std::vector<CopyCandidate>* out) const {
  const AutomatonView* view = occ_->view();
  const int64_t target = anchor_ >= 0 ? anchor_ : 0;
  for (const auto& u : unigrams_) {
    const int64_t e = nearest_end(u.first, target + 1);  // the token itself at or after the target
    if (e < 0) continue;
    out->push_back({e, view->document_end(e), 0, params_.unigram_weight * u.second});
  }
}

void CopyCursor::reset() {
  align_ = -1;
  align_end_ = 0;
  run_ = 0;
  fed_ = 0;
  tail_.assign(params_.match_cap, -1);
  sub_counts_.clear();
  substitutions_.clear();
  pending_next_ = -1;
  const AutomatonView* view = occ_->view();
  set_anchor(view->num_documents() > 0 ? view->document_begin(0) : -1);
  if (anchor_ >= view->num_tokens()) anchor_ = -1;
  candidates_.clear();
  // The output is expected to start copying at the top of the reference.
  if (params_.start_run > 0 && anchor_ >= 0) {
    align_ = anchor_;
    align_end_ = view->document_end(anchor_);
    run_ = params_.start_run;
    add_alignment();
  }
  add_structural();
  normalise();
}

int64_t CopyCursor::nearest_end(int32_t state, int64_t target) const {
  const AutomatonView* view = occ_->view();
  const int32_t *begin, *end;
  occ_->occurrences(state, &begin, &end);
  if (end - begin > params_.max_scan) return -1;
  int64_t best = -1;
  double best_cost = std::numeric_limits<double>::infinity();
  for (const int32_t* it = begin; it != end; ++it) {
    const int64_t cont = static_cast<int64_t>(*it) + 1;  // continuation start
    const double cost = cont >= target ? static_cast<double>(cont - target)
                                       : params_.back_penalty * static_cast<double>(target - cont);
    if (cost < best_cost || (cost == best_cost && *it < best)) {
      if (cont >= view->document_end(*it)) continue;  // no continuation
      best_cost = cost;
      best = *it;
    }
  }
  return best;
}

int32_t CopyCursor::common_suffix(int64_t pos) const {
  const AutomatonView* view = occ_->view();
  if (pos <= 0 || pos > view->num_tokens()) return 0;
  const int64_t doc_end = view->document_end(pos - 1);
  const int32_t cap = params_.match_cap;
  int32_t l = 0;
  while (l < cap && l < fed_ && pos - 1 - l >= 0 && view->document_end(pos - 1 - l) == doc_end &&
         tail_[(fed_ - 1 - l) % cap] == view->token_at(pos - 1 - l))
    ++l;
  return l;
}

float CopyCursor::log_odds(int64_t pos, int32_t match) const {
  const int64_t target = anchor_ >= 0 ? anchor_ : 0;
  const float d = pos >= target ? static_cast<float>(pos - target)
                                : params_.back_penalty * static_cast<float>(target - pos);
  float s = params_.match_gain * static_cast<float>(std::min(match, params_.match_cap)) -
            params_.distance_gain * std::log1p(d / params_.distance_scale);
  if (anchor_ >= 0 && pos == anchor_) s += params_.anchor_bonus;
  if (anchor_ >= 0 && since_ > 0 && pos == anchor_ + since_) s += params_.diag_bonus;
  return s;
}

void CopyCursor::add_structural() {
  if (anchor_ < 0) return;
  add_candidate(anchor_);
  // The diagonal stays inside the anchor's document.
  if (since_ > 0 && anchor_ + since_ < occ_->view()->document_end(anchor_)) add_candidate(anchor_ + since_);
}

void CopyCursor::add_alignment() {
  if (align_ < 0 || align_ >= align_end_) return;
  const int32_t match = std::min(run_, params_.match_cap);
  candidates_.push_back({align_, align_end_, match, log_odds(align_, match)});
}

void CopyCursor::add_candidate(int64_t pos) {
  const AutomatonView* view = occ_->view();
  if (pos < 0 || pos >= view->num_tokens()) return;
  for (const CopyCandidate& c : candidates_)
    if (c.pos == pos) return;
  const int32_t match = common_suffix(pos);
  candidates_.push_back({pos, view->document_end(pos), match, log_odds(pos, match)});
}

void CopyCursor::normalise() {
  std::sort(candidates_.begin(), candidates_.end(), [](const CopyCandidate& a, const CopyCandidate& b) {
    return a.weight != b.weight ? a.weight > b.weight : a.pos < b.pos;
  });
  if (static_cast<int32_t>(candidates_.size()) > params_.max_candidates) candidates_.resize(params_.max_candidates);
  // Softmax over {candidates, null}, shifted by the largest log-odds.
  float top = params_.null_score;
  for (const CopyCandidate& c : candidates_) top = std::max(top, c.weight);
  double sum = std::exp(static_cast<double>(params_.null_score - top));
  for (const CopyCandidate& c : candidates_) sum += std::exp(static_cast<double>(c.weight - top));
  for (CopyCandidate& c : candidates_) c.weight = static_cast<float>(std::exp(static_cast<double>(c.weight - top)) / sum);
}

void CopyCursor::learn(int32_t from, int32_t to) {
  for (size_t i = 0; i < sub_counts_.size(); ++i) {
    if (sub_counts_[i].from == from && sub_counts_[i].to == to) {
      SubCount c = sub_counts_[i];
      ++c.hits;
      sub_counts_.erase(sub_counts_.begin() + i);
      sub_counts_.insert(sub_counts_.begin(), c);
      refresh_substitutions();
      return;
    }
  }
  // A new pair replaces any older one for the same `from`; the latest first.
  for (size_t i = 0; i < sub_counts_.size(); ++i)
    if (sub_counts_[i].from == from) {
      sub_counts_.erase(sub_counts_.begin() + i);
      break;
    }
  sub_counts_.insert(sub_counts_.begin(), SubCount{from, to, 1, 0});
  if (static_cast<int32_t>(sub_counts_.size()) > params_.max_substitutions) sub_counts_.resize(std::max(params_.max_substitutions, 0));
  refresh_substitutions();
}

void CopyCursor::refresh_substitutions() {
  substitutions_.clear();
  for (const SubCount& c : sub_counts_)
    substitutions_.push_back({c.from, c.to, static_cast<float>(c.hits) / static_cast<float>(c.hits + c.misses + 1)});
}

void CopyCursor::advance(int32_t token, int32_t match_state, int32_t match_len) {
  const AutomatonView* view = occ_->view();
  tail_[fed_ % params_.match_cap] = token;
  ++fed_;
  ++since_;
  candidates_.clear();
  // Step 0. Substitutions: a pending mismatch is confirmed when the copy goes
  // on right after it; a copied token with a learnt substitution counts a miss.
  if (pending_next_ >= 0) {
    if (pending_next_ < view->num_tokens() && view->token_at(pending_next_) == token) learn(pending_from_, pending_to_);
    pending_next_ = -1;
  }
  const bool copies = align_ >= 0 && align_ < align_end_ && view->token_at(align_) == token;
  if (!copies && align_ >= 0 && align_ < align_end_ && run_ >= 1 && params_.max_substitutions > 0) {
    pending_from_ = view->token_at(align_);
    pending_to_ = token;
    pending_next_ = align_ + 1 < align_end_ ? align_ + 1 : -1;
  }
  if (copies && !sub_counts_.empty()) {
    for (SubCount& c : sub_counts_)
      if (c.from == token) {
        ++c.misses;
        refresh_substitutions();
        break;
      }
  }
  if (copies) {
    // Step 1. The copy goes on: the token is the reference's next one.
    ++align_;
    if (run_ < std::numeric_limits<int32_t>::max()) ++run_;
    if (run_ >= params_.confirm_run) set_anchor(align_);
    add_alignment();
    add_structural();
    normalise();
    return;
  }
  // Step 2. Re-synchronise: per suffix length (longest first), the
  // occurrence nearest the anchor; and the anchor itself.
  const int64_t target = anchor_ >= 0 ? anchor_ : 0;
  for (int32_t i = 0; i <= params_.max_backoff && match_len > 0 && match_state > kRoot; ++i) {
    const int64_t e = nearest_end(match_state, target);
    if (e >= 0) add_candidate(e + 1);
    const int32_t l = view->link(match_state);
    if (l <= kRoot || view->length(l) >= match_len) break;
    match_state = l;
    match_len = view->length(l);
  }
  add_structural();
  normalise();
  // Step 3. The best candidate is the alignment; a confirmed one carries the anchor along.
  align_ = -1;
  run_ = 0;
  if (!candidates_.empty()) {
    align_ = candidates_[0].pos;
    align_end_ = candidates_[0].end;
    run_ = candidates_[0].match;
    if (run_ >= params_.confirm_run) set_anchor(align_);
  }
}

}  // namespace refdec

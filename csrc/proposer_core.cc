#include "proposer_core.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace refdec {

void ProposerCore::set_context(SuffixAutomaton* sam, const SourceParams& params, int32_t source_id,
                               float loop_decay) {
  context_ = sam;
  context_params_.view = sam;
  context_params_.params = params;
  context_params_.source_id = source_id;
  context_params_.live = true;
  context_params_.loop_decay = loop_decay;
}

void ProposerCore::add_matcher_source(const std::vector<const AutomatonView*>& automata, const SourceParams& params,
                                      int32_t source_id) {
  if (automata.empty()) throw std::invalid_argument("a matcher source needs at least one automaton");
  MatchedSource m;
  for (const AutomatonView* view : automata) m.matchers.emplace_back(view);
  m.params.view = automata.size() == 1 ? automata[0] : nullptr;
  m.params.params = params;
  m.params.source_id = source_id;
  matched_.push_back(m);
}

void ProposerCore::feed(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      throw std::invalid_argument("tokens must be token ids in [0, 2**31); tokens[" + std::to_string(i) + "] = " +
                                  std::to_string(tokens[i]));
  }
  // Step 1. The context automaton grows by the tokens (one open document).
  if (context_ != nullptr) context_->extend_many(tokens, n);
  // Step 2. Each matcher follows the same stream; so does each cursor once
  // the output started.
  for (MatchedSource& m : matched_) {
    if (!output_started_ || !m.cursor) {
      for (Matcher& matcher : m.matchers) matcher.advance_many(tokens, n);
      continue;
    }
    Matcher& matcher = m.matchers[0];
    for (int64_t i = 0; i < n; ++i) {
      matcher.advance(tokens[i]);
      m.cursor->advance(tokens[i], matcher.state(), matcher.match_length());
    }
  }
}

void ProposerCore::set_cursor(int32_t source_id, const CursorParams& params) {
  bool found = false;
  for (MatchedSource& m : matched_) {
    if (m.params.source_id != source_id) continue;
    if (m.matchers.size() != 1)
      throw std::invalid_argument("the copy cursor needs one automaton, source_id " + std::to_string(source_id) +
                                  " has " + std::to_string(m.matchers.size()) + " shards");
    found = true;
    m.occurrences = std::make_shared<OccurrenceIndex>(m.params.view);
    m.cursor = std::make_shared<CopyCursor>(m.occurrences.get(), params);
    m.cursor->reset();
  }
  if (!found) throw std::invalid_argument("no matcher source has source_id " + std::to_string(source_id));
}

void ProposerCore::start_output() {
  output_started_ = true;
  for (MatchedSource& m : matched_)
    if (m.cursor) m.cursor->reset();
}

CursorState ProposerCore::cursor_state(int32_t source_id) const {
  for (const MatchedSource& m : matched_)
    if (m.params.source_id == source_id && m.cursor) return {m.cursor->align(), m.cursor->run(), m.cursor->anchor()};
  return CursorState{};
}

std::vector<CopyCandidate> ProposerCore::cursor_candidates(int32_t source_id) const {
  for (const MatchedSource& m : matched_)
    if (m.params.source_id == source_id && m.cursor) return m.cursor->candidates();
  return {};
}

void ProposerCore::push_cursor_sources(const MatchedSource& m) {
  DraftSource s = m.params;
  s.copy_decay = m.cursor->params().copy_decay;
  s.substitutions = &m.cursor->substitutions();
  const std::vector<CopyCandidate>& cands = m.cursor->candidates();
  for (const CopyCandidate& c : cands) {
    s.copy_from = c.pos;
    s.copy_end = c.end;
    s.params.weight = c.weight;
    s.evidence = static_cast<float>(c.pos == m.cursor->align() ? m.cursor->run() : c.match);
    sources_.push_back(s);
  }
  // Unsure: the unigram fallback.
  if (cands.empty() || cands[0].weight < m.cursor->params().unigram_below) {
    unigrams_.clear();
    m.cursor->unigram_candidates(&unigrams_);
    for (const CopyCandidate& c : unigrams_) {
      s.copy_from = c.pos;
      s.copy_end = c.end;
      s.params.weight = c.weight;
      s.evidence = 0.0f;
      sources_.push_back(s);
    }
  }
}

void ProposerCore::propose(int32_t max_nodes, DraftResult* out) {
  // Step 1. Snapshot every source's current match, and its back-off levels.
  sources_.clear();
  next_group_ = 0;
  if (context_ != nullptr) {
    const int32_t state = context_->match_state();
    matches_.assign(1, AutomatonMatch{context_, state, context_->length(state)});
    push_levels(context_params_, top_level(false));
  }
  for (const MatchedSource& m : matched_) {
    match_automata(m);
    push_levels(m.params, top_level(true));
    if (output_started_ && m.cursor) push_cursor_sources(m);
  }
  // Step 2. Depth decay of the whole tree from the cursor's best candidate.
  float decay = 1.0f;
  if (output_started_)
    for (const MatchedSource& m : matched_)
      if (m.cursor) {
        // A long aligned run: little decay; a fresh re-synchronisation: depth_decay.
        const auto& c = m.cursor->candidates();
        const float run = c.empty() ? 0.0f
                                    : static_cast<float>(c[0].pos == m.cursor->align() ? m.cursor->run() : c[0].match);
        decay = std::min(decay, 1.0f - (1.0f - m.cursor->params().depth_decay) * 4.0f / (4.0f + run));
      }
  int32_t levels = 1 << 30;
  for (const MatchedSource& m : matched_)
    if (m.cursor) {
      const int64_t scaled = static_cast<int64_t>(m.cursor->params().decay_levels) * max_nodes / 64;
      levels = static_cast<int32_t>(std::min<int64_t>(levels, std::max<int64_t>(1, scaled)));
    }
  builder_.set_depth_decay(decay, levels);
  // Step 3. Survival per source while a cursor is on: suffix matches and
  // fixed copies each by their own evidence (copy_cursor.h).
  const CursorParams* cursor_params = nullptr;
  if (output_started_)
    for (const MatchedSource& m : matched_)
      if (m.cursor && cursor_params == nullptr) cursor_params = &m.cursor->params();
  if (cursor_params != nullptr)
    for (DraftSource& s : sources_) {
      const bool copy = s.copy_from >= 0;
      s.hazard_power = copy ? cursor_params->copy_hazard_power : cursor_params->hazard_power;
      s.hazard_scale = copy ? cursor_params->copy_hazard_scale : cursor_params->hazard_scale;
    }
  // Step 4. One best-first tree over all of them.
  builder_.build(sources_, max_nodes, max_depth_, out);
}

void ProposerCore::match_automata(const MatchedSource& m) {
  matches_.clear();
  for (const Matcher& matcher : m.matchers)
    matches_.push_back({matcher.view(), matcher.state(), matcher.match_length()});
}

int32_t ProposerCore::top_level(bool continuation) {
  // Step 1. The longest match over the automata.
  int32_t len = 0;
  for (const AutomatonMatch& a : matches_) len = std::max(len, a.len);
  level_states_.assign(matches_.size(), kNoState);
  set_level(len);
  // Step 2. Shorter while no automaton holding the suffix continues it.
  while (continuation && len > 0) {
    for (size_t k = 0; k < matches_.size(); ++k)
      if (level_states_[k] != kNoState && matches_[k].view->num_children(level_states_[k]) > 0) return len;
    len = shorter(len);
    set_level(len);
  }
  return len;
}

void ProposerCore::set_level(int32_t len) {
  for (size_t k = 0; k < matches_.size(); ++k) {
    const AutomatonMatch& a = matches_[k];
    if (len <= 0 || a.len < len) {
      level_states_[k] = kNoState;
      continue;
    }
    // Up the suffix links from the previous (longer) level, or the match:
    // the state whose lengths (len(link), len(state)] hold `len`.
    int32_t state = level_states_[k] != kNoState ? level_states_[k] : a.state;
    for (int32_t l = a.view->link(state); l != kNoState && a.view->length(l) >= len; l = a.view->link(state))
      state = l;
    level_states_[k] = state;
  }
}

int32_t ProposerCore::shorter(int32_t len) const {
  // An automaton holding the suffix: its link; one not holding it: its own
  // (shorter) match, which the suffix's occurrences there start to include.
  int32_t next = 0;
  for (size_t k = 0; k < matches_.size(); ++k) {
    if (level_states_[k] == kNoState) {
      next = std::max(next, matches_[k].len);
      continue;
    }
    const int32_t l = matches_[k].view->link(level_states_[k]);
    if (l != kNoState) next = std::max(next, matches_[k].view->length(l));
  }
  return next < len ? next : 0;  // strictly shorter (a corrupted automaton may say otherwise)
}

void ProposerCore::push_levels(const DraftSource& base, int32_t len) {
  for (int32_t level = 0; len > 0; ++level) {
    // Step 1. The level's sources: one per automaton holding the suffix.
    const int32_t group = matches_.size() > 1 ? next_group_++ : -1;
    for (size_t k = 0; k < matches_.size(); ++k) {
      if (level_states_[k] == kNoState) continue;
      DraftSource s = base;
      s.view = matches_[k].view;
      s.state = level_states_[k];
      s.match_len = len;
      s.evidence = static_cast<float>(len);
      s.group = group;
      sources_.push_back(s);
    }
    // Step 2. The next shorter suffix, while back-off allows.
    if (level == backoff_) return;
    const int32_t next = shorter(len);
    if (next <= 0 || next < min_backoff_len_) return;
    len = next;
    set_level(len);
  }
}

std::vector<ProposerCore::SourceMatch> ProposerCore::match_lengths() {
  std::vector<SourceMatch> out;
  if (context_ != nullptr) out.push_back({context_params_.source_id, context_->length(context_->match_state())});
  for (const MatchedSource& m : matched_) {
    match_automata(m);
    out.push_back({m.params.source_id, top_level(true)});
  }
  return out;
}

}  // namespace refdec

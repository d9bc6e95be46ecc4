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

void ProposerCore::add_matcher_source(const AutomatonView* view, const SourceParams& params, int32_t source_id) {
  MatchedSource m{Matcher(view), DraftSource{}};
  m.params.view = view;
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
      m.matcher.advance_many(tokens, n);
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      m.matcher.advance(tokens[i]);
      m.cursor->advance(tokens[i], m.matcher.state(), m.matcher.match_length());
    }
  }
}

void ProposerCore::set_cursor(int32_t source_id, const CursorParams& params) {
  bool found = false;
  for (MatchedSource& m : matched_) {
    if (m.params.source_id != source_id) continue;
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
  // Step 1. Snapshot every source's current match.
  sources_.clear();
  if (context_ != nullptr) {
    DraftSource s = context_params_;
    s.state = context_->match_state();
    s.match_len = context_->length(s.state);
    s.evidence = static_cast<float>(s.match_len);
    push_source(s);
  }
  for (const MatchedSource& m : matched_) {
    DraftSource s = m.params;
    s.state = m.matcher.state();
    s.match_len = m.matcher.match_length();
    with_continuation(&s);
    s.evidence = static_cast<float>(s.match_len);
    push_source(s);
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

void ProposerCore::with_continuation(DraftSource* s) {
  while (s->match_len > 0) {
    if (s->view->num_children(s->state) > 0) return;
    const int32_t l = s->view->link(s->state);
    const int32_t len = l == kNoState ? 0 : s->view->length(l);
    if (l == kNoState || len >= s->match_len) {
      s->state = kRoot;
      s->match_len = 0;
      return;
    }
    s->state = l;
    s->match_len = len;
  }
}

void ProposerCore::push_source(DraftSource s) {
  if (s.match_len <= 0) return;
  sources_.push_back(s);
  // Shorter suffixes of the match: the suffix-link chain (strictly shorter
  // lengths; the bound also guards against a corrupted automaton).
  for (int32_t i = 0; i < backoff_; ++i) {
    const int32_t l = s.view->link(s.state);
    if (l == kNoState || l == kRoot) break;
    const int32_t len = s.view->length(l);
    if (len < min_backoff_len_ || len >= s.match_len) break;
    s.state = l;
    s.match_len = len;
    s.evidence = static_cast<float>(len);
    sources_.push_back(s);
  }
}

std::vector<ProposerCore::SourceMatch> ProposerCore::match_lengths() {
  std::vector<SourceMatch> out;
  if (context_ != nullptr) out.push_back({context_params_.source_id, context_->length(context_->match_state())});
  for (const MatchedSource& m : matched_) {
    DraftSource s = m.params;
    s.state = m.matcher.state();
    s.match_len = m.matcher.match_length();
    with_continuation(&s);
    out.push_back({s.source_id, s.match_len});
  }
  return out;
}

}  // namespace refdec

#include "proposer_core.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>

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
      const int64_t scaled = static_cast<int64_t>(m.cursor->params().decay_levels) * max_nodes / kMaxNodes;
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

void ProposerCore::count_shared_automata() const {
  for (const MatchedSource& m : matched_)
    for (const Matcher& matcher : m.matchers) matcher.view()->count(0);
}

namespace {

// Feeds and proposes cores [begin, end); their trees appended to `out` (cleared first).
void step_range(const std::vector<ProposerCore*>& cores, const std::vector<TokenSpan>& new_tokens, int32_t max_nodes,
                size_t begin, size_t end, DraftBatch* out) {
  DraftResult& nodes = out->nodes;
  nodes.clear();
  nodes.reserve((end - begin) * static_cast<size_t>(max_nodes));
  out->offsets.assign(1, 0);
  out->offsets.reserve(end - begin + 1);
  DraftResult tree;
  for (size_t r = begin; r < end; ++r) {
    cores[r]->feed(new_tokens[r].data, new_tokens[r].size);
    cores[r]->propose(max_nodes, &tree);
    nodes.append(tree);
    out->offsets.push_back(static_cast<int64_t>(nodes.token_ids.size()));
  }
}

}  // namespace

void step_batch(const std::vector<ProposerCore*>& cores, const std::vector<TokenSpan>& new_tokens,
                int32_t max_nodes, int32_t num_threads, DraftBatch* out) {
  if (cores.size() != new_tokens.size())
    throw std::invalid_argument("step_batch: " + std::to_string(cores.size()) + " cores but " +
                                std::to_string(new_tokens.size()) + " token arrays");
  if (max_nodes < 0) throw std::invalid_argument("max_nodes must be >= 0, got " + std::to_string(max_nodes));
  if (num_threads < 1) throw std::invalid_argument("num_threads must be >= 1, got " + std::to_string(num_threads));
  // Step 1. Every request's tokens, before any core changes.
  for (size_t r = 0; r < new_tokens.size(); ++r)
    for (int64_t i = 0; i < new_tokens[r].size; ++i)
      if (new_tokens[r].data[i] < 0)
        throw std::invalid_argument("new_tokens[" + std::to_string(r) + "] must be token ids in [0, 2**31); new_tokens[" +
                                    std::to_string(r) + "][" + std::to_string(i) + "] = " +
                                    std::to_string(new_tokens[r].data[i]));
  const size_t num_requests = cores.size();
  const size_t threads = std::max<size_t>(
      1, std::min(static_cast<size_t>(num_threads), num_requests / kMinRequestsPerThread));
  if (threads == 1) {
    step_range(cores, new_tokens, max_nodes, 0, num_requests, out);
    return;
  }
  // Step 2. Threads: distinct cores, and the automata they share counted now.
  std::vector<ProposerCore*> sorted(cores);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument("step_batch with num_threads > 1: a core is listed twice");
  for (const ProposerCore* core : cores) core->count_shared_automata();
  // Step 3. One contiguous run of requests per thread (this one takes the first).
  std::vector<size_t> bounds(threads + 1);
  for (size_t t = 0; t <= threads; ++t) bounds[t] = num_requests * t / threads;
  std::vector<DraftBatch> parts(threads - 1);
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t)
    workers.emplace_back([&, t] {
      try {
        step_range(cores, new_tokens, max_nodes, bounds[t], bounds[t + 1], &parts[t - 1]);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  try {
    step_range(cores, new_tokens, max_nodes, bounds[0], bounds[1], out);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& worker : workers) worker.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  // Step 4. The other runs' trees after this one's, their offsets shifted.
  DraftResult& nodes = out->nodes;
  for (const DraftBatch& part : parts) {
    const int64_t shift = static_cast<int64_t>(nodes.token_ids.size());
    nodes.append(part.nodes);
    for (size_t i = 1; i < part.offsets.size(); ++i) out->offsets.push_back(part.offsets[i] + shift);
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

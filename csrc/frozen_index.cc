#include "frozen_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <new>

namespace refdec {
namespace {

constexpr char kMagic[8] = {'R', 'E', 'F', 'D', 'E', 'C', 'I', 'X'};
constexpr uint64_t kAlign = 64;

constexpr uint64_t kP1 = 11400714785074694791ull;
constexpr uint64_t kP2 = 14029467366897019727ull;
constexpr uint64_t kP3 = 1609587929392839161ull;
constexpr uint64_t kP4 = 9650029242287828579ull;
constexpr uint64_t kP5 = 2870177450012600261ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint64_t round64(uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; }
inline uint64_t merge64(uint64_t h, uint64_t v) { return (h ^ round64(0, v)) * kP1 + kP4; }

// Hex digits, then only zero bytes (an empty fingerprint is valid).
bool valid_fingerprint(const std::string& f) {
  size_t i = 0;
  while (i < f.size() && std::isxdigit(static_cast<unsigned char>(f[i]))) ++i;
  for (; i < f.size(); ++i)
    if (f[i] != '\0') return false;
  return true;
}

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Element sizes and expected element counts of each section.
constexpr uint64_t kElemSize[kNumSections] = {4, 8, 4, 4, 4, 4, 4, 4, 4};
constexpr const char* kSectionName[kNumSections] = {"tokens",      "doc_begins",    "leaf_link",
                                                    "state_len",   "state_link",    "state_count",
                                                    "edge_offsets", "edge_tokens",  "edge_targets"};

void expected_counts(const FileHeader& h, uint64_t out[kNumSections]) {
  out[kSecTokens] = h.num_tokens;
  out[kSecDocBegins] = h.num_documents + 1;
  out[kSecLeafLink] = h.num_tokens;
  out[kSecStateLen] = h.num_internal;
  out[kSecStateLink] = h.num_internal;
  out[kSecStateCount] = h.num_internal;
  out[kSecEdgeOffsets] = h.num_internal + 1;
  out[kSecEdgeTokens] = h.num_edges;
  out[kSecEdgeTargets] = h.num_edges;
}

}  // namespace

uint64_t body_checksum(const uint8_t* data, size_t size) {
  // Step 1. Four lanes over 32-byte stripes.
  uint64_t v1 = kP1 + kP2, v2 = kP2, v3 = 0, v4 = 0 - kP1;
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    v1 = round64(v1, load64(data + i));
    v2 = round64(v2, load64(data + i + 8));
    v3 = round64(v3, load64(data + i + 16));
    v4 = round64(v4, load64(data + i + 24));
  }
  // Step 2. Merge the lanes.
  uint64_t h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
  h = merge64(h, v1);
  h = merge64(h, v2);
  h = merge64(h, v3);
  h = merge64(h, v4);
  h += static_cast<uint64_t>(size);
  // Step 3. Remaining words, then bytes.
  for (; i + 8 <= size; i += 8) h = rotl(h ^ round64(0, load64(data + i)), 27) * kP1 + kP4;
  for (; i < size; ++i) h = rotl(h ^ (data[i] * kP5), 11) * kP1;
  // Step 4. Avalanche.
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::unique_ptr<FrozenIndex> FrozenIndex::freeze(const SuffixAutomaton& sam, const std::string& fingerprint,
                                                 uint32_t vocab_size, const MinhashSignatures* minhash) {
  return freeze_impl(sam, nullptr, fingerprint, vocab_size, minhash);
}

std::unique_ptr<FrozenIndex> FrozenIndex::freeze_and_release(SuffixAutomaton* sam, const std::string& fingerprint,
                                                             uint32_t vocab_size,
                                                             const MinhashSignatures* minhash) {
  try {
    auto out = freeze_impl(*sam, sam, fingerprint, vocab_size, minhash);
    sam->release();
    return out;
  } catch (...) {
    sam->release();
    throw;
  }
}

std::unique_ptr<FrozenIndex> FrozenIndex::freeze_impl(const SuffixAutomaton& sam, SuffixAutomaton* release,
                                                      const std::string& fingerprint, uint32_t vocab_size,
                                                      const MinhashSignatures* minhash) {
  if (fingerprint.size() > 64 || !valid_fingerprint(fingerprint))
    throw std::invalid_argument("fingerprint must be at most 64 hex digits, got '" + fingerprint + "'");
  if (sam.released()) throw std::invalid_argument("cannot freeze a released suffix automaton");
  if (minhash != nullptr) {
    if (minhash->num_perm < 2 || minhash->num_perm > kMaxMinhashPerm)
      throw std::invalid_argument("minhash num_perm must be in [2, " + std::to_string(kMaxMinhashPerm) + "], got " +
                                  std::to_string(minhash->num_perm));
    if (minhash->num_documents != static_cast<uint64_t>(sam.num_documents()))
      throw std::invalid_argument("minhash signatures have " + std::to_string(minhash->num_documents) +
                                  " rows, the index " + std::to_string(sam.num_documents()) + " documents");
  }
  const std::vector<uint32_t>& count = sam.counts();
  const int64_t n_states = sam.num_states();
  const int64_t n = sam.num_tokens();
  const int64_t n_docs = sam.num_documents();

  // Step 1. Number the states: internal states (count != 1, and the root)
  // keep their relative order; a leaf (count 1) becomes num_internal + its end position.
  std::vector<int32_t> new_id(n_states);
  int64_t n_internal = 0;
  for (int64_t s = 0; s < n_states; ++s) {
    if (s == kRoot || count[s] != 1) new_id[s] = static_cast<int32_t>(n_internal++);
  }
  if (n_internal + n >= (int64_t{1} << 31))
    throw std::invalid_argument("index too large to freeze: " + std::to_string(n_internal + n) + " states");
  for (int64_t s = 0; s < n_states; ++s) {
    if (s != kRoot && count[s] == 1) {
      assert(sam.raw_end_pos(static_cast<int32_t>(s)) >= 0 && sam.raw_end_pos(static_cast<int32_t>(s)) < n);
      new_id[s] = static_cast<int32_t>(n_internal + sam.raw_end_pos(static_cast<int32_t>(s)));
    }
  }
  // Out-degree of each internal state (new ids), from one pass over the hash table.
  std::vector<uint32_t> degree(n_internal + 1, 0);
  int64_t n_edges = 0;
  sam.for_each_edge([&](int32_t state, int32_t, int32_t) {
    const int32_t id = new_id[state];
    if (id < n_internal) {
      ++degree[id];
      ++n_edges;
    }
  });
  if (n_edges >= (int64_t{1} << 32)) throw std::invalid_argument("too many transitions to freeze");

  // Step 2. Lay out the header and the 64-byte aligned sections.
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kFormatVersion;
  h.header_size = sizeof(FileHeader);
  std::memcpy(h.fingerprint, fingerprint.data(), fingerprint.size());
  h.vocab_size = vocab_size;
  h.num_tokens = n;
  h.num_documents = n_docs;
  h.num_internal = n_internal;
  h.num_edges = n_edges;
  uint64_t counts[kNumSections];
  expected_counts(h, counts);
  uint64_t offset = align_up(sizeof(FileHeader));
  for (int i = 0; i < kNumSections; ++i) {
    h.sections[i].offset = offset;
    h.sections[i].size = counts[i] * kElemSize[i];
    offset = align_up(offset + h.sections[i].size);
  }
  if (minhash != nullptr) {
    h.minhash_num_perm = minhash->num_perm;
    h.minhash_seed = minhash->seed;
    h.minhash_ngram = minhash->ngram;
    h.minhash_values = {offset, static_cast<uint64_t>(n_docs) * minhash->num_perm * 4};
    offset = align_up(offset + h.minhash_values.size);
    h.minhash_sizes = {offset, static_cast<uint64_t>(n_docs) * 4};
    offset = align_up(offset + h.minhash_sizes.size);
  }
  h.file_size = offset;

  // Step 3. An anonymous mapping of zero pages holds the image; pages become
  // resident only as the sections below are written.
  std::unique_ptr<FrozenIndex> out(new FrozenIndex());
  void* map = ::mmap(nullptr, offset, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    throw std::bad_alloc();
  out->map_ = map;
  out->map_size_ = offset;
  out->anonymous_ = true;
  uint8_t* base = static_cast<uint8_t*>(map);
  auto section = [&](int id) { return base + h.sections[id].offset; };
  auto* state_len = reinterpret_cast<int32_t*>(section(kSecStateLen));
  auto* state_link = reinterpret_cast<int32_t*>(section(kSecStateLink));
  auto* state_count = reinterpret_cast<uint32_t*>(section(kSecStateCount));
  auto* edge_offsets = reinterpret_cast<uint32_t*>(section(kSecEdgeOffsets));
  auto* edge_tokens = reinterpret_cast<int32_t*>(section(kSecEdgeTokens));
  auto* edge_targets = reinterpret_cast<int32_t*>(section(kSecEdgeTargets));
  auto* leaf_link = reinterpret_cast<int32_t*>(section(kSecLeafLink));

  // Step 4. Edges: CSR offsets, then scatter the edges of internal states
  // (one pass over the hash table); the transitions can go after that.
  uint64_t edge_pos = 0;
  for (int64_t id = 0; id < n_internal; ++id) {
    edge_offsets[id] = static_cast<uint32_t>(edge_pos);
    edge_pos += degree[id];
  }
  edge_offsets[n_internal] = static_cast<uint32_t>(edge_pos);
  std::vector<uint32_t>& fill = degree;  // reused: next free slot per state
  for (int64_t id = 0; id < n_internal; ++id) fill[id] = edge_offsets[id];
  sam.for_each_edge([&](int32_t state, int32_t token, int32_t target) {
    const int32_t id = new_id[state];
    if (id < n_internal) {
      const uint32_t pos = fill[id]++;
      edge_tokens[pos] = token;
      edge_targets[pos] = new_id[target];
    }
  });
  std::vector<uint32_t>().swap(degree);
  if (release != nullptr) release->release_transitions();

  // Step 5. Per-state fields in one pass over the states.
  std::fill(leaf_link, leaf_link + n, -1);
  for (int64_t s = 0; s < n_states; ++s) {
    const int32_t id = new_id[s];
    const int32_t link = sam.link(static_cast<int32_t>(s));
    const int32_t l = link == kNoState ? -1 : new_id[link];
    if (s != kRoot && count[s] == 1) {
      assert(leaf_link[id - n_internal] == -1);  // one leaf per end position
      leaf_link[id - n_internal] = l;
      continue;
    }
    state_len[id] = sam.length(static_cast<int32_t>(s));
    state_link[id] = l;
    state_count[id] = count[s];
  }
  std::vector<int32_t>().swap(new_id);

  // Step 6. Tokens and document offsets.
  if (n) std::memcpy(section(kSecTokens), sam.token_data(), n * 4);
  auto* doc_begins = reinterpret_cast<int64_t*>(section(kSecDocBegins));
  for (int64_t d = 0; d < n_docs; ++d) doc_begins[d] = sam.document_begin(d);
  doc_begins[n_docs] = n;
  if (minhash != nullptr && n_docs) {
    std::memcpy(base + h.minhash_values.offset, minhash->values, h.minhash_values.size);
    std::memcpy(base + h.minhash_sizes.offset, minhash->sizes, h.minhash_sizes.size);
  }

  // Step 7. Sort each state's edges by token.
  std::vector<Edge> edges;
  for (int64_t id = 0; id < n_internal; ++id) {
    const uint32_t lo = edge_offsets[id], hi = edge_offsets[id + 1];
    if (hi - lo < 2) continue;
    edges.clear();
    for (uint32_t i = lo; i < hi; ++i) edges.push_back({edge_tokens[i], edge_targets[i]});
    std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.token < b.token; });
    for (uint32_t i = lo; i < hi; ++i) {
      edge_tokens[i] = edges[i - lo].token;
      edge_targets[i] = edges[i - lo].target;
    }
  }

  // Step 8. Checksum the body, write the header, make the image read-only, attach the views.
  h.checksum = body_checksum(base + sizeof(FileHeader), offset - sizeof(FileHeader));
  h.header_checksum = 0;
  h.header_checksum = body_checksum(reinterpret_cast<const uint8_t*>(&h), sizeof(FileHeader));
  std::memcpy(base, &h, sizeof(FileHeader));
  ::mprotect(map, offset, PROT_READ);
  out->attach(base, offset, "<in-memory index>");
  return out;
}

std::unique_ptr<FrozenIndex> FrozenIndex::load(const std::string& path) {
  // Step 1. Open and map the whole file read-only.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw std::invalid_argument("index file '" + path + "' does not exist");
    throw std::invalid_argument("cannot open index file '" + path + "': " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IndexFormatError("index file '" + path + "': cannot stat");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(FileHeader)) {
    ::close(fd);
    throw IndexFormatError("index file '" + path + "' is truncated or not a refdec index: " +
                           std::to_string(size) + " bytes, smaller than the " + std::to_string(sizeof(FileHeader)) +
                           "-byte header");
  }
#ifdef NDEBUG
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw IndexFormatError("index file '" + path + "': mmap failed: " + std::strerror(errno));
  void* region = map;
  const size_t region_size = size;
#else
  // Debug (sanitizer) builds: inaccessible guard pages before and after the
  // file, so any read outside the mapping faults (ASan does not see mmap'ed
  // memory) instead of silently reading a neighbour.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t file_pages = (size + page - 1) / page * page;
  const size_t region_size = file_pages + 2 * page;
  void* region = ::mmap(nullptr, region_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* map = region == MAP_FAILED ? MAP_FAILED
                                   : ::mmap(static_cast<uint8_t*>(region) + page, size, PROT_READ,
                                            MAP_SHARED | MAP_FIXED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    if (region != MAP_FAILED) ::munmap(region, region_size);
    throw IndexFormatError("index file '" + path + "': mmap failed: " + std::strerror(map_errno));
  }
#endif
  std::unique_ptr<FrozenIndex> out(new FrozenIndex());
  out->map_ = region;
  out->map_size_ = region_size;
  out->path_ = path;
  // Step 2. Validate the header and set the section views (throws on failure;
  // the destructor unmaps).
  out->attach(static_cast<const uint8_t*>(map), size, "index file '" + path + "'");
  return out;
}

FrozenIndex::~FrozenIndex() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void FrozenIndex::attach(const uint8_t* base, size_t size, const std::string& name) {
  auto fail = [&](const std::string& what) { throw IndexFormatError(name + ": " + what); };
  // Step 1. Magic, version, header size, file size.
  if (size < sizeof(FileHeader)) fail("truncated: smaller than the header");
  std::memcpy(&header_, base, sizeof(FileHeader));
  const FileHeader& h = header_;
  if (std::memcmp(h.magic, kMagic, 8) != 0) fail("not a refdec index (bad magic bytes)");
  if (h.version != kFormatVersion)
    fail("unsupported format version " + std::to_string(h.version) + " (this build reads version " +
         std::to_string(kFormatVersion) + ")");
  if (h.header_size != sizeof(FileHeader))
    fail("bad header size " + std::to_string(h.header_size) + " (expected " + std::to_string(sizeof(FileHeader)) +
         ")");
  {
    FileHeader zeroed = h;
    zeroed.header_checksum = 0;
    if (body_checksum(reinterpret_cast<const uint8_t*>(&zeroed), sizeof(FileHeader)) != h.header_checksum)
      fail("header checksum mismatch: the header is corrupt");
  }
  if (h.reserved0 != 0) fail("reserved header field is not zero");
  if (!valid_fingerprint(std::string(h.fingerprint, sizeof(h.fingerprint))))
    fail("fingerprint is not hex digits followed by zero padding");
  for (uint8_t b : h.padding)
    if (b != 0) fail("header padding is not zero");
  if (h.file_size != size)
    fail("file size mismatch: header records " + std::to_string(h.file_size) + " bytes, file has " +
         std::to_string(size) + (size < h.file_size ? " (truncated)" : " (trailing bytes)"));
  // Step 2. Sizes within the id spaces.
  if (h.num_tokens >= (uint64_t{1} << 31) || h.num_internal < 1 ||
      h.num_internal + h.num_tokens >= (uint64_t{1} << 31) || h.num_edges >= (uint64_t{1} << 32) ||
      h.num_documents > (uint64_t{1} << 40))
    fail("inconsistent sizes: tokens " + std::to_string(h.num_tokens) + ", internal states " +
         std::to_string(h.num_internal) + ", edges " + std::to_string(h.num_edges) + ", documents " +
         std::to_string(h.num_documents));
  // Step 3. Each section: expected size, aligned, after the header, inside the file.
  uint64_t counts[kNumSections];
  expected_counts(h, counts);
  uint64_t previous_end = sizeof(FileHeader);
  for (int i = 0; i < kNumSections; ++i) {
    const FileSection& sec = h.sections[i];
    const std::string what = std::string("section ") + kSectionName[i];
    if (sec.size != counts[i] * kElemSize[i])
      fail(what + " has " + std::to_string(sec.size) + " bytes, expected " + std::to_string(counts[i] * kElemSize[i]));
    if (sec.offset % kAlign != 0)
      fail(what + " offset " + std::to_string(sec.offset) + " is not aligned to " + std::to_string(kAlign) + " bytes");
    if (sec.offset > size || sec.size > size - sec.offset)
      fail(what + " lies outside the file (offset " + std::to_string(sec.offset) + ", " + std::to_string(sec.size) +
           " bytes, file " + std::to_string(size) + ")");
    if (sec.offset < previous_end)
      fail(what + " offset " + std::to_string(sec.offset) + " overlaps the header or the previous section (ends at " +
           std::to_string(previous_end) + ")");
    previous_end = sec.offset + sec.size;
  }
  // Step 3b. The optional MinHash sections: all zero without them, else checked as the others.
  if (h.minhash_num_perm == 0) {
    if (h.minhash_seed || h.minhash_ngram || h.reserved1 || h.minhash_values.offset || h.minhash_values.size ||
        h.minhash_sizes.offset || h.minhash_sizes.size)
      fail("MinHash header fields are set but minhash_num_perm is 0");
  } else {
    if (h.reserved1 != 0) fail("reserved header field is not zero");
    if (h.minhash_num_perm < 2 || h.minhash_num_perm > kMaxMinhashPerm)
      fail("minhash_num_perm " + std::to_string(h.minhash_num_perm) + " is not in [2, " +
           std::to_string(kMaxMinhashPerm) + "]");
    const FileSection* sections[2] = {&h.minhash_values, &h.minhash_sizes};
    const uint64_t expected[2] = {h.num_documents * h.minhash_num_perm * 4, h.num_documents * 4};
    const char* names[2] = {"minhash_values", "minhash_sizes"};
    for (int i = 0; i < 2; ++i) {
      const FileSection& sec = *sections[i];
      const std::string what = std::string("section ") + names[i];
      if (sec.size != expected[i])
        fail(what + " has " + std::to_string(sec.size) + " bytes, expected " + std::to_string(expected[i]));
      if (sec.offset % kAlign != 0 || sec.offset < previous_end || sec.offset > size || sec.size > size - sec.offset)
        fail(what + " offset " + std::to_string(sec.offset) + " (" + std::to_string(sec.size) +
             " bytes) is unaligned, overlaps the previous section or lies outside the file");
      previous_end = sec.offset + sec.size;
    }
  }
  base_ = base;
  size_ = size;
  auto at = [&](int id) { return base + h.sections[id].offset; };
  tokens_ = reinterpret_cast<const int32_t*>(at(kSecTokens));
  doc_begins_ = reinterpret_cast<const int64_t*>(at(kSecDocBegins));
  leaf_link_ = reinterpret_cast<const int32_t*>(at(kSecLeafLink));
  state_len_ = reinterpret_cast<const int32_t*>(at(kSecStateLen));
  state_link_ = reinterpret_cast<const int32_t*>(at(kSecStateLink));
  state_count_ = reinterpret_cast<const uint32_t*>(at(kSecStateCount));
  edge_offsets_ = reinterpret_cast<const uint32_t*>(at(kSecEdgeOffsets));
  edge_tokens_ = reinterpret_cast<const int32_t*>(at(kSecEdgeTokens));
  edge_targets_ = reinterpret_cast<const int32_t*>(at(kSecEdgeTargets));
  num_tokens_ = static_cast<int64_t>(h.num_tokens);
  num_documents_ = static_cast<int64_t>(h.num_documents);
  num_internal_ = static_cast<int64_t>(h.num_internal);
  num_edges_ = static_cast<int64_t>(h.num_edges);
  // Step 4. Document boundaries: they bound every continuation, so check
  // them all (O(documents)).
  if (doc_begins_[0] != 0 || doc_begins_[num_documents_] != num_tokens_) fail("bad document offsets");
  for (int64_t d = 0; d < num_documents_; ++d)
    if (doc_begins_[d] > doc_begins_[d + 1]) fail("document offsets are not sorted at document " + std::to_string(d));
}

bool FrozenIndex::verify() const {
  return body_checksum(base_ + sizeof(FileHeader), size_ - sizeof(FileHeader)) == header_.checksum;
}

std::string FrozenIndex::fingerprint() const {
  size_t n = 0;
  while (n < sizeof(header_.fingerprint) && header_.fingerprint[n] != '\0') ++n;
  return std::string(header_.fingerprint, n);
}

int64_t FrozenIndex::document_of(int64_t token_pos) const {
  // Last document whose begin is <= token_pos (skipping empty documents).
  const int64_t* it = std::upper_bound(doc_begins_, doc_begins_ + num_documents_ + 1, token_pos);
  return static_cast<int64_t>(it - doc_begins_) - 1;
}

int64_t FrozenIndex::document_begin(int64_t doc_idx) const {
  if (doc_idx < 0) return 0;
  if (doc_idx > num_documents_) return num_tokens_;
  return doc_begins_[doc_idx];
}

int64_t FrozenIndex::document_end(int64_t token_pos) const {
  const int64_t* it = std::upper_bound(doc_begins_, doc_begins_ + num_documents_ + 1, token_pos);
  if (it == doc_begins_ + num_documents_ + 1) return num_tokens_;
  return *it;
}

int32_t FrozenIndex::token_at(int64_t token_pos) const {
  if (token_pos < 0 || token_pos >= num_tokens_) return -1;
  return tokens_[token_pos];
}

int32_t FrozenIndex::transition(int32_t state, int32_t token) const {
  if (state >= 0 && state < num_internal_) {
    // Internal: binary search of the token among the state's sorted edges.
    uint64_t lo = edge_offsets_[state];
    uint64_t hi = edge_offsets_[state + 1];
    hi = std::min<uint64_t>(hi, static_cast<uint64_t>(num_edges_));
    lo = std::min(lo, hi);
    const int32_t* first = edge_tokens_ + lo;
    const int32_t* last = edge_tokens_ + hi;
    const int32_t* it = std::lower_bound(first, last, token);
    if (it == last || *it != token) return kNoState;
    const int32_t target = edge_targets_[it - edge_tokens_];
    return (target >= 0 && target < num_states()) ? target : kNoState;
  }
  if (is_leaf(state)) {
    // Leaf: the only continuation is the next token of the same document.
    const int64_t next = static_cast<int64_t>(state - num_internal_) + 1;
    if (next < num_tokens_ && tokens_[next] == token && next < document_end(next - 1)) return state + 1;
  }
  return kNoState;
}

int32_t FrozenIndex::link(int32_t state) const {
  if (state == kRoot) return kNoState;
  int32_t l = kRoot;
  if (state > 0 && state < num_internal_) {
    l = state_link_[state];
    // A link leads to a strictly shorter state: a corrupt file cannot make
    // a cycle of links (callers walk links until the root).
    if (l > 0 && l < num_internal_ && state_len_[l] >= state_len_[state]) return kRoot;
  } else if (is_leaf(state)) {
    l = leaf_link_[state - num_internal_];
  }
  // Links always lead to internal states; anything else is corruption.
  return (l >= 0 && l < num_internal_) ? l : kRoot;
}

int32_t FrozenIndex::length(int32_t state) const {
  if (state >= 0 && state < num_internal_) return std::max(state_len_[state], 0);
  if (is_leaf(state)) {
    const int64_t p = state - num_internal_;
    return static_cast<int32_t>(p - document_begin(document_of(p)) + 1);
  }
  return 0;
}

int64_t FrozenIndex::count(int32_t state) const {
  if (state >= 0 && state < num_internal_) return state_count_[state];
  return is_leaf(state) ? 1 : 0;
}

int64_t FrozenIndex::unique_end_pos(int32_t state) const {
  return is_leaf(state) ? static_cast<int64_t>(state - num_internal_) : -1;
}

bool FrozenIndex::children(int32_t state, std::vector<Edge>* out, size_t max_children) const {
  out->clear();
  if (state >= 0 && state < num_internal_) {
    uint64_t lo = edge_offsets_[state];
    uint64_t hi = std::min<uint64_t>(edge_offsets_[state + 1], static_cast<uint64_t>(num_edges_));
    lo = std::min(lo, hi);
    if (hi - lo > max_children) return false;
    for (uint64_t i = lo; i < hi; ++i) {
      const int32_t target = edge_targets_[i];
      if (target >= 0 && target < num_states()) out->push_back({edge_tokens_[i], target});
    }
  } else if (is_leaf(state)) {
    const int64_t p = state - num_internal_;
    if (p + 1 < document_end(p)) {
      if (max_children < 1) return false;
      out->push_back({tokens_[p + 1], state + 1});
    }
  }
  return true;
}

int64_t FrozenIndex::num_children(int32_t state) const {
  if (state >= 0 && state < num_internal_) {
    const uint64_t hi = std::min<uint64_t>(edge_offsets_[state + 1], static_cast<uint64_t>(num_edges_));
    return static_cast<int64_t>(hi - std::min<uint64_t>(edge_offsets_[state], hi));
  }
  if (is_leaf(state)) {
    const int64_t p = state - num_internal_;
    return p + 1 < document_end(p) ? 1 : 0;
  }
  return 0;
}

}  // namespace refdec

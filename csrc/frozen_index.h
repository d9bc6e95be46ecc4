// Frozen, compact, memory-mappable form of a generalised suffix automaton.
#ifndef REFDEC_FROZEN_INDEX_H_
#define REFDEC_FROZEN_INDEX_H_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "automaton_view.h"
#include "suffix_automaton.h"

namespace refdec {

// A file that is not a valid refdec index (foreign, truncated, wrong version,
// inconsistent sizes, fingerprint mismatch). Python sees refdec.IndexFormatError.
class IndexFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Section of the file: byte offset from the start of the file and byte size.
struct FileSection {
  uint64_t offset;  // from the start of the file, a multiple of 64
  uint64_t size;    // bytes (elements * element size)
};

// Section indices inside FileHeader::sections.
enum SectionId : int {
  kSecTokens = 0,       // int32  [num_tokens]        all documents concatenated
  kSecDocBegins,        // int64  [num_documents + 1] first token_pos of each document, then num_tokens
  kSecLeafLink,         // int32  [num_tokens]        suffix link of the leaf state ending at each position (-1: none)
  kSecStateLen,         // int32  [num_internal]      length of the longest string of each internal state
  kSecStateLink,        // int32  [num_internal]      suffix link (-1 for the root)
  kSecStateCount,       // uint32 [num_internal]      occurrence count
  kSecEdgeOffsets,      // uint32 [num_internal + 1]  CSR offsets into the edge arrays
  kSecEdgeTokens,       // int32  [num_edges]         transition labels, sorted within a state
  kSecEdgeTargets,      // int32  [num_edges]         transition targets (state ids)
  kNumSections
};

// On-disk header (little-endian, 512 bytes, at offset 0). The body is every
// byte after the header; `checksum` covers it (checked by verify(), O(file)).
// `header_checksum` covers the header itself and is checked on every load.
struct FileHeader {
  char magic[8];               // "REFDECIX"
  uint32_t version;            // kFormatVersion
  uint32_t header_size;        // sizeof(FileHeader)
  char fingerprint[64];        // tokenizer fingerprint (hex, zero-padded; all zero = none)
  uint32_t vocab_size;         // 0 = unknown
  uint32_t reserved0;          // zero
  uint64_t num_tokens;         // tokens over all documents
  uint64_t num_documents;      // documents
  uint64_t num_internal;       // internal states (count != 1), ids 0 .. num_internal-1
  uint64_t num_edges;          // transitions of internal states
  uint64_t file_size;          // total bytes of the file
  uint64_t checksum;           // body_checksum() of bytes [header_size, file_size)
  FileSection sections[kNumSections];  // one per SectionId
  uint64_t header_checksum;    // body_checksum() of the 512 header bytes with this field zeroed
  // Optional MinHash signatures of the documents (refdec.drafting.retrieval), after the
  // other sections. Without them every field below is zero, as in the files
  // written before they existed (a reader from before them rejects a file that
  // has them: nonzero padding).
  uint32_t minhash_num_perm;   // values per signature, in [2, kMaxMinhashPerm]; 0 = no signatures
  uint32_t minhash_seed;       // permutation seed (datasketch MinHash)
  uint32_t minhash_ngram;      // shingle length in tokens
  uint32_t reserved1;          // zero
  FileSection minhash_values;  // uint32 [num_documents, minhash_num_perm] one signature per document
  FileSection minhash_sizes;   // uint32 [num_documents]  distinct shingles of each document
  uint8_t padding[512 - 8 - 4 - 4 - 64 - 4 - 4 - 8 * 6 - 16 * kNumSections - 8 - 4 * 4 - 16 * 2];  // zero
};
static_assert(sizeof(FileHeader) == 512, "FileHeader must be 512 bytes");

constexpr uint32_t kMaxMinhashPerm = 4096;

// MinHash signatures to store with a frozen index (FileHeader::minhash_*).
struct MinhashSignatures {
  uint64_t num_documents = 0;        // rows: must equal the automaton's documents
  uint32_t num_perm = 0;             // columns, in [2, kMaxMinhashPerm]
  uint32_t seed = 0;
  uint32_t ngram = 0;
  const uint32_t* values = nullptr;  // [num_documents * num_perm], row-major
  const uint32_t* sizes = nullptr;   // [num_documents]
};

constexpr uint32_t kFormatVersion = 1;

// 64-bit checksum over a byte range (four interleaved multiply-rotate lanes
// over 8-byte words, xxhash64-style rounds; not cryptographic).
uint64_t body_checksum(const uint8_t* data, size_t size);

// Frozen suffix automaton. State ids:
//   0 .. num_internal-1                 internal states (count != 1; 0 is the root)
//   num_internal + p, 0 <= p < n        the leaf state whose only occurrence ends at
//                                       token_pos p (count 1). Its length is implicit
//                                       (p - document start + 1), its only transition
//                                       is token_at(p+1) to leaf p+1 (same document).
// Leaves carry no stored transitions: a unique continuation is read from the
// token array. Every read of a state, edge or position is bounds-checked.
class FrozenIndex : public AutomatonView {
 public:
  // Freezes a mutable automaton into an in-memory buffer (an anonymous
  // mapping, filled section by section: untouched pages cost nothing).
  // `minhash` (optional) is copied into the image.
  static std::unique_ptr<FrozenIndex> freeze(const SuffixAutomaton& sam, const std::string& fingerprint,
                                             uint32_t vocab_size, const MinhashSignatures* minhash = nullptr);
  // Same, and frees the automaton's build structures as soon as each one has
  // been copied (transitions first, then states), so the peak is about the
  // automaton plus the edge sections rather than automaton plus image. The
  // automaton is left released (SuffixAutomaton::release()), even on error.
  static std::unique_ptr<FrozenIndex> freeze_and_release(SuffixAutomaton* sam, const std::string& fingerprint,
                                                         uint32_t vocab_size,
                                                         const MinhashSignatures* minhash = nullptr);
  // Memory-maps a file and validates its header; throws IndexFormatError.
  static std::unique_ptr<FrozenIndex> load(const std::string& path);
  ~FrozenIndex() override;
  FrozenIndex(const FrozenIndex&) = delete;
  FrozenIndex& operator=(const FrozenIndex&) = delete;

  // (Saving is CorpusIndex.save in Python: write buffer() to a temporary
  // file, fsync, rename over the target.)
  // Recomputes the body checksum and compares it with the header's.
  bool verify() const;

  const FileHeader& header() const { return header_; }
  // Fingerprint without the zero padding ("" = none).
  std::string fingerprint() const;
  uint32_t vocab_size() const { return header_.vocab_size; }
  uint64_t nbytes() const { return size_; }
  // First byte of the image (the header).
  const uint8_t* header_ptr() const { return base_; }
  const std::string& path() const { return path_; }
  bool is_mapped() const { return map_ != nullptr && !anonymous_; }
  int64_t num_internal() const { return num_internal_; }
  int64_t num_edges() const { return num_edges_; }

  // AutomatonView.
  int64_t num_states() const override { return num_internal_ + num_tokens_; }
  int32_t transition(int32_t state, int32_t token) const override;
  int32_t link(int32_t state) const override;
  int32_t length(int32_t state) const override;
  int64_t count(int32_t state) const override;
  int64_t unique_end_pos(int32_t state) const override;
  using AutomatonView::children;
  bool children(int32_t state, std::vector<Edge>* out, size_t max_children) const override;
  int64_t num_children(int32_t state) const override;
  int64_t num_tokens() const override { return num_tokens_; }
  int32_t token_at(int64_t token_pos) const override;
  int64_t num_documents() const override { return num_documents_; }
  int64_t document_begin(int64_t doc_idx) const override;
  int64_t document_end(int64_t token_pos) const override;
  const int32_t* token_data() const override { return tokens_; }

 private:
  FrozenIndex() = default;
  static std::unique_ptr<FrozenIndex> freeze_impl(const SuffixAutomaton& sam, SuffixAutomaton* release,
                                                  const std::string& fingerprint, uint32_t vocab_size,
                                                  const MinhashSignatures* minhash);
  // Validates the header against the buffer and sets the section pointers.
  void attach(const uint8_t* base, size_t size, const std::string& name);
  bool is_leaf(int32_t state) const { return state >= num_internal_ && state < num_internal_ + num_tokens_; }
  int64_t document_of(int64_t token_pos) const;

  void* map_ = nullptr;          // mmap base: the file (load) or an anonymous mapping (freeze)
  size_t map_size_ = 0;          // mmap length
  bool anonymous_ = false;       // map_ is an anonymous mapping made by freeze
  const uint8_t* base_ = nullptr;  // start of the image
  size_t size_ = 0;                // bytes of the image
  std::string path_;               // file it was loaded from ("" when in memory)
  FileHeader header_{};            // copy of the header

  // Section views into the image.
  const int32_t* tokens_ = nullptr;
  const int64_t* doc_begins_ = nullptr;
  const int32_t* leaf_link_ = nullptr;
  const int32_t* state_len_ = nullptr;
  const int32_t* state_link_ = nullptr;
  const uint32_t* state_count_ = nullptr;
  const uint32_t* edge_offsets_ = nullptr;
  const int32_t* edge_tokens_ = nullptr;
  const int32_t* edge_targets_ = nullptr;
  int64_t num_tokens_ = 0;
  int64_t num_documents_ = 0;
  int64_t num_internal_ = 0;
  int64_t num_edges_ = 0;
};

}  // namespace refdec

#endif  // REFDEC_FROZEN_INDEX_H_

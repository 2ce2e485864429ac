// BpeModel: a vocabulary plus the two merge procedures lumen needs.
//
// * Rank merges (HF BPE, GGUF "gpt2"): repeatedly merge the adjacent pair with
//   the lowest merge rank, leftmost first, as transformers.js and HF tokenizers
//   do. Symbols that are not in the vocabulary fall back to <0xNN> byte tokens
//   (byte_fallback) or unk.
// * Score merges (SentencePiece BPE: GGUF "llama", llama2.c run.c): repeatedly
//   merge the adjacent pair whose concatenation is a token with the highest
//   score, leftmost first; leftover characters become byte tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lumen::tokenize {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// piece -> id over a vocabulary it does not own: an open-addressing table of
// ids (4 bytes per slot, at most half full) whose keys are the pieces
// themselves. A node-based map copies every piece: ~70 bytes per entry, 18 MB
// for a 262k vocabulary, against 2 MB here. The first id of a repeated piece
// wins; Set overrides (added tokens), also for text that is not pieces[id].
class PieceIndex {
 public:
  void Build(const std::vector<std::string>& pieces);
  void Set(const std::vector<std::string>& pieces, std::string_view piece, int32_t id);
  std::optional<int32_t> Find(const std::vector<std::string>& pieces,
                              std::string_view piece) const {
    if (!overrides_.empty()) {
      auto it = overrides_.find(piece);
      if (it != overrides_.end()) return it->second;
    }
    if (slots_.empty()) return std::nullopt;
    const size_t mask = slots_.size() - 1;
    for (size_t i = StringHash{}(piece)&mask;; i = (i + 1) & mask) {
      const int32_t id = slots_[i];
      if (id < 0) return std::nullopt;
      if (pieces[size_t(id)] == piece) return id;
    }
  }

 private:
  // The slot holding `piece`'s id, or the empty slot where it would go.
  size_t SlotOf(const std::vector<std::string>& pieces, std::string_view piece) const;
  std::vector<int32_t> slots_;  // ids, -1 empty; size a power of two
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> overrides_;
};

// Open-addressing map from an id pair to (rank, merged id).
class MergeTable {
 public:
  struct Value {
    int32_t rank;
    int32_t result;
  };
  void Reserve(size_t n);
  // Keeps the first (lowest-rank) entry for a pair.
  void Insert(int32_t a, int32_t b, Value v);
  const Value* Find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    uint64_t key = Key(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.v;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Value v{};
  };
  static uint64_t Key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static size_t Hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) >> 17; }
  void Grow();
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

struct BpeModel {
  std::vector<std::string> pieces;  // id -> piece
  std::vector<float> scores;        // id -> score (score merges)
  PieceIndex piece_to_id;
  MergeTable merges;
  // Merges as given (for export), in rank order.
  std::vector<std::pair<int32_t, int32_t>> merge_list;
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  std::string continuing_subword_prefix, end_of_word_suffix;
  int32_t byte_piece_id[256];  // "<0xNN>" -> id, or -1
  int32_t byte_char_id[256];   // byte-level alphabet char of byte b -> id, or -1
  int32_t ascii_id[128];       // single ASCII char piece -> id, or -1

  // Builds the lookup tables from `pieces` (call after pieces change).
  void BuildIndex();
  // Adds merge (a, b) with the next rank; the result must be in the vocab.
  // Returns false when a part or the result is missing.
  bool AddMerge(std::string_view a, std::string_view b);

  std::optional<int32_t> Find(std::string_view piece) const {
    return piece_to_id.Find(pieces, piece);
  }
  // Maps `piece` to `id` from now on (added tokens take precedence).
  void SetPiece(std::string_view piece, int32_t id) { piece_to_id.Set(pieces, piece, id); }

  // Rank merges over the code points of `word` (model alphabet).
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;
  // Rank merges over raw bytes mapped to the byte-level alphabet.
  void EncodeByteLevel(std::string_view bytes, std::vector<int32_t>& out) const;
  // Score merges over the code points of `text`; `byte_offset` maps a byte to
  // its token when "<0xNN>" pieces are absent (llama2.c: id = byte + 3), -1 to
  // use the pieces.
  void EncodeScored(std::string_view text, std::vector<int32_t>& out, int byte_offset = -1) const;

 private:
  struct Sym {
    int32_t id;
    uint32_t start, len;
    int32_t prev, next;
  };
  void MergeByRank(std::vector<Sym>& syms) const;
  void EmitSymbols(std::string_view text, const std::vector<Sym>& syms,
                   std::vector<int32_t>& out) const;
};

}  // namespace lumen::tokenize

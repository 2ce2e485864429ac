#include "lumen/tokenize/bpe.h"

#include <algorithm>
#include <queue>

#include "lumen/tokenize/unicode.h"

namespace lumen::tokenize {

void MergeTable::Reserve(size_t n) {
  size_t cap = 16;
  while (cap * 3 < n * 4) cap <<= 1;  // at most 3/4 full: 16 bytes a slot add up (280k merges)
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty) Insert(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.v);
  }
}

void MergeTable::Grow() { Reserve(slots_.empty() ? 12 : slots_.size()); }  // doubles

void MergeTable::Insert(int32_t a, int32_t b, Value v) {
  if ((size_ + 1) * 4 > slots_.size() * 3) Grow();
  uint64_t key = Key(a, b);
  size_t mask = slots_.size() - 1;
  for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmpty) {
      s.key = key;
      s.v = v;
      ++size_;
      return;
    }
  }
}

void PieceIndex::Build(const std::vector<std::string>& pieces) {
  size_t n = 16;
  while (n < 2 * pieces.size()) n *= 2;
  slots_.assign(n, -1);
  overrides_.clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t at = SlotOf(pieces, pieces[i]);
    if (slots_[at] < 0) slots_[at] = int32_t(i);  // the first id of a repeated piece wins
  }
}

size_t PieceIndex::SlotOf(const std::vector<std::string>& pieces, std::string_view piece) const {
  const size_t mask = slots_.size() - 1;
  size_t i = StringHash{}(piece)&mask;
  while (slots_[i] >= 0 && pieces[size_t(slots_[i])] != piece) i = (i + 1) & mask;
  return i;
}

void PieceIndex::Set(const std::vector<std::string>& pieces, std::string_view piece, int32_t id) {
  // The table's keys are pieces[id]: an id whose piece is other text goes to
  // the (small) override map, as does anything set before Build.
  if (slots_.empty() || id < 0 || size_t(id) >= pieces.size() || pieces[size_t(id)] != piece) {
    overrides_.insert_or_assign(std::string(piece), id);
    return;
  }
  if (auto it = overrides_.find(piece); it != overrides_.end()) overrides_.erase(it);
  slots_[SlotOf(pieces, piece)] = id;  // replaces an earlier id with the same piece
}

void BpeModel::BuildIndex() {
  piece_to_id.Build(pieces);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    snprintf(buf, sizeof(buf), "<0x%02X>", b);
    byte_piece_id[b] = Find(buf).value_or(-1);
    std::string ch;
    AppendUtf8(ch, ByteToUnicode(uint8_t(b)));
    byte_char_id[b] = Find(ch).value_or(-1);
    if (b < 128) ascii_id[b] = Find(std::string(1, char(b))).value_or(-1);
  }
}

bool BpeModel::AddMerge(std::string_view a, std::string_view b) {
  auto ia = Find(a), ib = Find(b);
  if (!ia || !ib) return false;
  std::string_view tail = b;
  if (!continuing_subword_prefix.empty() && tail.starts_with(continuing_subword_prefix)) {
    tail.remove_prefix(continuing_subword_prefix.size());
  }
  std::string joined;
  joined.reserve(a.size() + tail.size());
  joined.append(a).append(tail);
  auto ir = Find(joined);
  if (!ir) return false;
  merges.Insert(*ia, *ib, {int32_t(merge_list.size()), *ir});
  merge_list.emplace_back(*ia, *ib);
  return true;
}

void BpeModel::MergeByRank(std::vector<Sym>& syms) const {
  const size_t n = syms.size();
  if (n < 2) return;
  if (n <= 24) {
    // Short words: scanning is cheaper than a heap.
    int32_t head = 0;
    for (;;) {
      int32_t best = -1, best_rank = INT32_MAX, best_result = -1;
      for (int32_t i = head; syms[i].next != -1; i = syms[i].next) {
        const Sym& l = syms[i];
        const Sym& r = syms[l.next];
        if (l.id < 0 || r.id < 0) continue;
        const MergeTable::Value* v = merges.Find(l.id, r.id);
        if (v && v->rank < best_rank) {
          best_rank = v->rank;
          best = i;
          best_result = v->result;
        }
      }
      if (best < 0) break;
      Sym& l = syms[best];
      Sym& r = syms[l.next];
      l.id = best_result;
      l.len += r.len;
      l.next = r.next;
      if (r.next != -1) syms[r.next].prev = best;
      r.len = 0;
    }
    return;
  }
  struct Cand {
    int32_t rank;
    uint32_t pos;
    int32_t left, right, left_id, right_id, result;
  };
  auto cmp = [](const Cand& a, const Cand& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> q(cmp);
  auto push = [&](int32_t i) {
    if (i < 0) return;
    const Sym& l = syms[i];
    if (l.next < 0) return;
    const Sym& r = syms[l.next];
    if (l.id < 0 || r.id < 0) return;
    if (const MergeTable::Value* v = merges.Find(l.id, r.id)) {
      q.push({v->rank, l.start, i, l.next, l.id, r.id, v->result});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    Sym& l = syms[c.left];
    if (l.len == 0 || l.id != c.left_id || l.next != c.right) continue;
    Sym& r = syms[c.right];
    if (r.len == 0 || r.id != c.right_id) continue;
    l.id = c.result;
    l.len += r.len;
    l.next = r.next;
    if (r.next != -1) syms[r.next].prev = c.left;
    r.len = 0;
    push(l.prev);
    push(c.left);
  }
}

void BpeModel::EmitSymbols(std::string_view text, const std::vector<Sym>& syms,
                           std::vector<int32_t>& out) const {
  if (syms.empty()) return;
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const Sym& s = syms[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    std::string_view sub = text.substr(s.start, s.len);
    bool done = false;
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : sub) all = all && byte_piece_id[b] >= 0;
      if (all) {
        for (unsigned char b : sub) out.push_back(byte_piece_id[b]);
        done = true;
      }
    }
    if (!done && unk_id >= 0) {
      if (!(fuse_unk && !out.empty() && out.back() == unk_id && i > 0 &&
            syms[syms[i].prev].id < 0)) {
        out.push_back(unk_id);
      }
    }
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto id = Find(word)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<Sym> syms;
  syms.reserve(word.size());
  const bool affixes = !continuing_subword_prefix.empty() || !end_of_word_suffix.empty();
  std::string tmp;
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    unsigned char c = static_cast<unsigned char>(word[i]);
    int32_t id;
    if (c < 0x80 && !affixes) {
      ++i;
      id = ascii_id[c];
    } else {
      DecodeUtf8(word, i);
      std::string_view ch = word.substr(start, i - start);
      if (affixes) {
        tmp.clear();
        if (start > 0) tmp += continuing_subword_prefix;
        tmp.append(ch);
        if (i == word.size()) tmp += end_of_word_suffix;
        id = Find(tmp).value_or(-1);
      } else {
        id = Find(ch).value_or(-1);
      }
    }
    int32_t idx = int32_t(syms.size());
    syms.push_back({id, uint32_t(start), uint32_t(i - start), idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
  }
  MergeByRank(syms);
  EmitSymbols(word, syms, out);
}

void BpeModel::EncodeByteLevel(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges) {
    std::string mapped;
    mapped.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) AppendUtf8(mapped, ByteToUnicode(b));
    if (auto id = Find(mapped)) {
      out.push_back(*id);
      return;
    }
  }
  if (bytes.size() == 1) {
    int32_t id = byte_char_id[static_cast<unsigned char>(bytes[0])];
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Sym> syms(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    syms[i] = {byte_char_id[static_cast<unsigned char>(bytes[i])], uint32_t(i), 1, int32_t(i) - 1,
               i + 1 < bytes.size() ? int32_t(i + 1) : -1};
  }
  MergeByRank(syms);
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out.push_back(syms[i].id);
    } else if (unk_id >= 0) {
      out.push_back(unk_id);
    }
  }
}

void BpeModel::EncodeScored(std::string_view text, std::vector<int32_t>& out,
                            int byte_offset) const {
  if (text.empty()) return;
  std::vector<Sym> syms;
  syms.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t start = i;
    DecodeUtf8(text, i);
    int32_t idx = int32_t(syms.size());
    syms.push_back({0, uint32_t(start), uint32_t(i - start), idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
  }
  struct Cand {
    float score;
    uint32_t pos;
    int32_t left, right;
    uint32_t size;
    int32_t id;
  };
  auto cmp = [](const Cand& a, const Cand& b) {
    return a.score != b.score ? a.score < b.score : a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> q(cmp);
  auto push = [&](int32_t i) {
    if (i < 0) return;
    const Sym& l = syms[i];
    if (l.next < 0) return;
    const Sym& r = syms[l.next];
    auto id = Find(text.substr(l.start, l.len + r.len));
    if (!id) return;
    q.push({scores[*id], uint32_t(i), i, l.next, l.len + r.len, *id});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) push(int32_t(i));
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.size || l.next != c.right) continue;
    l.len += r.len;
    l.next = r.next;
    if (r.next != -1) syms[r.next].prev = c.left;
    r.len = 0;
    push(l.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    std::string_view sub = text.substr(syms[i].start, syms[i].len);
    if (auto id = Find(sub)) {
      out.push_back(*id);
      continue;
    }
    for (unsigned char b : sub) {
      int32_t id = byte_offset >= 0 ? byte_offset + b : byte_piece_id[b];
      if (id < 0) id = unk_id;
      if (id >= 0) out.push_back(id);
    }
  }
}

}  // namespace lumen::tokenize

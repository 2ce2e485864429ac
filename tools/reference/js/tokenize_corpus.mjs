// Writes tests/goldens/tokenizers/<model>.jsonl: transformers.js (bundled in
// @lenml/tokenizer-* 3.7.2) ids and decode for every case of corpus.txt.
// Usage: node tools/reference/js/tokenize_corpus.mjs [fixtures_dir]
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';
import { fileURLToPath } from 'url';

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');
const fixtures = process.argv[2] ?? path.resolve(root, '../shared/fixtures');
const goldens = path.join(root, 'tests/goldens/tokenizers');
const { TokenizerLoader } = require('@lenml/tokenizers');
const version = JSON.parse(fs.readFileSync(path.join(here, 'node_modules/@lenml/tokenizers/package.json'))).version;

export function readCases(file) {
  const bytes = fs.readFileSync(file);
  const sep = Buffer.from('\n__lumen_case__\n');
  const cases = [];
  let start = 0;
  for (;;) {
    const i = bytes.indexOf(sep, start);
    if (i < 0) break;
    cases.push(bytes.subarray(start, i));
    start = i + sep.length;
  }
  if (start < bytes.length) cases.push(bytes.subarray(start));
  const dec = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  return cases.map((b) => dec.decode(b));
}

export function loadTokenizer(model) {
  const dir = path.join(fixtures, 'tokenizers', model);
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'))),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'))),
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const cases = readCases(path.join(goldens, 'corpus.txt'));
  for (const model of ['qwen3', 'llama3_1', 'gemma3']) {
    const tok = loadTokenizer(model);
    const lines = [JSON.stringify({ generated_by: `tools/reference/js/tokenize_corpus.mjs: @lenml/tokenizers ${version} (transformers.js), fixtures/tokenizers/${model}, encode add_special_tokens=false, decode defaults` })];
    for (const text of cases) {
      const ids = tok.encode(text, { add_special_tokens: false });
      const decoded = ids.length ? tok.decode(ids) : '';
      lines.push(JSON.stringify({ text, ids, decoded }));
    }
    fs.writeFileSync(path.join(goldens, `${model}.jsonl`), lines.join('\n') + '\n');
    console.log(`${model}: ${cases.length} cases`);
  }
}

// Bundles the web app: src/main.js (+ the CSS it imports) -> OUT/app.js,
// OUT/app.css; copies src/index.html and src/favicon.svg; writes OUT/bundle_hash.h. Run by CMake
// (cmake/web.cmake) as `node web/build.mjs --out BUILD/web-dist`.
import { build } from 'esbuild';
import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const i = process.argv.indexOf('--out');
const out = resolve(i > 0 ? process.argv[i + 1] : join(here, 'dist'));
mkdirSync(out, { recursive: true });

await build({
  entryPoints: { app: join(here, 'src/main.js') },
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['chrome100', 'firefox100', 'safari15'],
  outdir: out,
  legalComments: 'eof',
  logLevel: 'warning',
});
for (const f of ['index.html', 'favicon.svg']) copyFileSync(join(here, 'src', f), join(out, f));

// The bundle's hash, compiled into web_assets.cc: a new bundle changes the
// preprocessed source, so ccache cannot hand back an object with the old bytes.
const hash = createHash('sha256');
for (const f of ['index.html', 'app.js', 'app.css', 'favicon.svg']) hash.update(readFileSync(join(out, f)));
writeFileSync(join(out, 'bundle_hash.h'), `#define LUMEN_WEB_BUNDLE_HASH "${hash.digest('hex').slice(0, 16)}"\n`);

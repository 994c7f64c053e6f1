// The app module's compute speed as the browser's engine runs it: the `analyse` export (the
// one-click answers and fixes: ~26 estimates and a few caching-allocator replays, what the
// analysis worker runs on every input) timed in Node's V8, the engine Chromium uses, after
// warm-up (so V8 has tiered the hot functions up). No page, no DOM, no frames: for comparing
// builds of the module (compiler flags, allocators), not for the page's latency, which
// scripts/perf.sh measures by the page's own clock. Prints figures; asserts nothing.
//
//   node scripts/wasm-bench.mjs [DIST]     DIST: a scripts/build.sh output (default dist/)
import { readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';

const dist = resolve(process.argv[2] ?? 'dist');
const files = readdirSync(dist);
const glueName = files.find((f) => /^trainmem-[0-9a-f]+\.js$/.test(f));
const wasmName = files.find((f) => /^trainmem-[0-9a-f]+_bg\.wasm$/.test(f));
if (!glueName || !wasmName) throw new Error(`${dist} holds no app module: run scripts/build.sh first`);

// The module's start function runs the warm-up when there is no window (src/ui/warm.rs), as in
// the compile worker; it reads the page's query from the worker's global.
globalThis.self = globalThis;
globalThis.trainmemWarmQuery = '';
const wasm = readFileSync(join(dist, wasmName));
const glue = await import(pathToFileURL(join(dist, glueName)).href);
await glue.default({ module_or_path: wasm });

const QUERIES = ['', 'seq=8192', 'model=llama-3.1-405b&gpus=128&tp=8&pp=16&seq=8192', 'model=mixtral-8x7b-v0.1&gpus=64&ep=8&zero=3'];
const CALLS = 20;
const ROUNDS = 3;
console.log(`${wasmName}: ${wasm.length} bytes`);
for (let round = 1; round <= ROUNDS; round++) {
  for (const q of QUERIES) {
    const t0 = performance.now();
    for (let i = 0; i < CALLS; i++) glue.analyse(q);
    const ms = (performance.now() - t0) / CALLS;
    // The first rounds warm the engine up; the last is the figure.
    if (round === ROUNDS) console.log(`analyse(${q || 'default'}): ${ms.toFixed(2)} ms per call (mean of ${CALLS})`);
  }
}

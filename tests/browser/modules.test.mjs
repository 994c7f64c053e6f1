// The app's files: one wasm module for the first screen, the panels a visitor opens later
// (`trainmem-more`), the benchmark and the framework config files' parsers (`trainmem-frameworks`)
// in modules of their own fetched only when opened (or when a file is first imported or
// exported), every file requested by its content-hashed name, and a policy that pins every script.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { test, before, after, serve, launch, openPage, ROOT } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch({ webgpu: true }); });
after(async () => { await browser?.close(); server?.close(); });

/** Strings of the importers and their parsers (yaml_serde, toml, shlex), found in the frameworks
 *  module's data and nowhere in the app's. */
const MARKERS = ['did not find expected', 'no key says which framework wrote it', 'missing assignment between key'];

const HASHED = /-[0-9a-f]{12,16}(_bg)?\.(js|wasm|css|svg|png)(\.br|\.gz)?$/;
// Files a host must find by a fixed name (the page, its service worker and manifest, and the
// hosts' header rules), served no-cache (see scripts/dist.py), with their compressed twins.
const STABLE = /^(index\.html|sw\.js|manifest\.webmanifest|_headers|versions\.json)(\.br|\.gz)?$/;

test('dist/ holds the first screen\'s module, the later panels\', the benchmark\'s and the frameworks\', every asset content-hashed', () => {
  const files = readdirSync(join(ROOT, 'dist'));
  const wasm = files.filter((f) => f.endsWith('.wasm'));
  assert.equal(wasm.length, 4, `wasm files: ${wasm}`);
  assert.equal(wasm.filter((f) => f.startsWith('trainmem-bench-')).length, 1);
  assert.equal(wasm.filter((f) => f.startsWith('trainmem-more-')).length, 1);
  assert.equal(wasm.filter((f) => f.startsWith('trainmem-frameworks-')).length, 1);
  for (const f of files.filter((f) => !STABLE.test(f))) assert.match(f, HASHED, `${f} carries a content hash`);
  // The lazily loaded modules' names are hashes of their contents.
  for (const f of files.filter((f) => /^trainmem-(bench|more|frameworks)-/.test(f) && !/\.(br|gz)$/.test(f))) {
    const hash = createHash('sha256').update(readFileSync(join(ROOT, 'dist', f))).digest('hex').slice(0, 16);
    assert.ok(f.includes(hash), `${f} is named by its content (${hash})`);
  }
});

test('the page loads its files by their hashed names, and the later panels and the benchmark only when opened', async () => {
  const { page, requests, problems } = await openPage(browser, server.base + '?model=gpt2');
  await page.waitForSelector('[data-testid=chart-seq][data-layout]');
  const own = requests.filter((r) => r.startsWith(server.base) && r !== server.base && !r.includes('?'));
  assert.ok(own.length >= 3, own.join('\n'));
  for (const r of own) assert.match(r, HASHED, `${r} is requested by its hashed name`);
  assert.equal(own.filter((r) => r.endsWith('.wasm')).length, 1, 'one wasm module for the first screen');
  assert.ok(!requests.some((r) => r.includes('trainmem-bench')), 'the benchmark is not loaded until opened');
  assert.ok(!requests.some((r) => r.includes('trainmem-more')), 'the later panels are not loaded until opened');
  assert.ok(!requests.some((r) => r.includes('trainmem-frameworks')), 'the frameworks module is not loaded until a file is imported or exported');
  await page.click('[data-testid=bench-open]');
  await page.waitForSelector('[data-testid=bench-adapter], [data-testid=bench-unavailable]', { timeout: 60000 });
  const bench = requests.filter((r) => r.includes('trainmem-bench'));
  assert.equal(bench.length, 2, bench.join('\n'));
  for (const r of bench) assert.match(r, /trainmem-bench-[0-9a-f]{12,16}(_bg\.wasm|\.js)$/);
  const more = requests.filter((r) => r.includes('trainmem-more'));
  assert.equal(more.length, 2, more.join('\n'));
  for (const r of more) assert.match(r, /trainmem-more-[0-9a-f]{12,16}(_bg\.wasm|\.js)$/);
  assert.deepEqual(problems, []);
});

test('the policy pins every inline script, and the lazily loaded modules are checked by their digests', async () => {
  const html = readFileSync(join(ROOT, 'dist', 'index.html'), 'utf8');
  const csp = html.match(/http-equiv="Content-Security-Policy" content="([^"]+)"/)[1];
  const inline = [...html.matchAll(/<script(?![^>]*\bsrc=)[^>]*>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
  assert.ok(inline.length >= 2, 'the loader and the import map are inline');
  for (const body of inline) {
    const digest = createHash('sha256').update(body, 'utf8').digest('base64');
    assert.ok(csp.includes(`'sha256-${digest}'`), `the policy names the script ${body.slice(0, 40)}…`);
  }
  assert.match(csp, /default-src 'none'/);
  for (const name of ['trainmem-bench', 'trainmem-more', 'trainmem-frameworks']) {
    const meta = html.match(new RegExp(`<meta name="${name}"[^>]*>`))[0];
    const wasm = meta.match(/data-wasm="\.\/([^"]+)"/)[1];
    const sri = meta.match(/data-wasm-integrity="([^"]+)"/)[1];
    const digest = 'sha384-' + createHash('sha384').update(readFileSync(join(ROOT, 'dist', wasm))).digest('base64');
    assert.equal(sri, digest, name);
    // The import map pins the module's script too.
    const js = meta.match(/data-js="\.\/([^"]+)"/)[1];
    const jsDigest = 'sha384-' + createHash('sha384').update(readFileSync(join(ROOT, 'dist', js))).digest('base64');
    assert.ok(html.includes(`"./${js}": "${jsDigest}"`), `the import map names ${js}`);
  }
});

test('the parsers are in the frameworks module, not in the app module the first screen loads', () => {
  const files = readdirSync(join(ROOT, 'dist'));
  const app = files.find((f) => /^trainmem-[0-9a-f]{12,16}_bg\.wasm$/.test(f));
  const fw = files.find((f) => /^trainmem-frameworks-[0-9a-f]{12,16}_bg\.wasm$/.test(f));
  const text = (f) => readFileSync(join(ROOT, 'dist', f)).toString('latin1');
  // Messages only the YAML, TOML and argument parsers and the importers write.
  for (const s of MARKERS) {
    assert.ok(text(fw).includes(s), `the frameworks module has '${s}'`);
    assert.ok(!text(app).includes(s), `the app module has no '${s}'`);
  }
});

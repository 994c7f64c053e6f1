// Shared by the deploy tests: web roots holding dist/ (or the Pages site) under a sub-path,
// the two kinds of server, and what the tests ask the page and its service worker.
import { cpSync, mkdtempSync, mkdirSync, readFileSync, existsSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn, execFileSync } from 'node:child_process';
import { gzipSync, brotliCompressSync } from 'node:zlib';
import { ROOT, SUBPATH, waitForApp } from './harness.mjs';
import { startServer } from './static-server.mjs';

export const DIST = join(ROOT, 'dist');
/** A content hash in a name, as scripts/dist.py checks it. */
export const HASH_TOKEN = /(?:^|[-_.])[0-9a-f]{12,16}(?=[-_.]|$)/;
/** Served under stable names by design (no-cache). */
export const STABLE = new Set(['', 'index.html', 'sw.js', 'manifest.webmanifest']);

/** web/unhashed.txt: files still allowed without a content hash (the layout before issue 12). */
export function allowedUnhashed() {
  return new Set(readFileSync(join(ROOT, 'web', 'unhashed.txt'), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#')));
}

/** Whether a path of the app (relative to its folder) is named by a content hash. */
export function isHashed(rel) {
  if (/(^|\/)snippets\//.test(rel)) return rel.split('/').some((seg) => HASH_TOKEN.test(seg));
  return HASH_TOKEN.test(rel.split('/').pop());
}

/** A fresh web root with `dir` (dist/ by default) copied under SUBPATH. */
export function webroot(dir = DIST) {
  if (!existsSync(join(dir, 'sw.js'))) throw new Error(`${dir} is not a build of scripts/build.sh (no sw.js): run it first`);
  const root = mkdtempSync(join(tmpdir(), 'trainmem-deploy-'));
  mkdirSync(join(root, SUBPATH), { recursive: true });
  cpSync(dir, join(root, SUBPATH), { recursive: true });
  return root;
}

/** The gzip-serving host: precompressed .gz siblings only, and dist/_headers applied. */
export async function gzipHost(root) {
  const s = await startServer({ root, precompressed: true, encodings: ['gzip'], headers: true, headersBase: SUBPATH });
  return { ...s, base: s.origin + SUBPATH, kind: 'gzip (precompressed, _headers)' };
}

/** The plain host: python's http.server, no compression, no cache headers. */
export async function plainHost(root) {
  const port = await new Promise((ok) => {
    import('node:net').then(({ createServer }) => {
      const s = createServer();
      s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => ok(port)); });
    });
  });
  const proc = spawn('python3', ['-m', 'http.server', String(port), '--bind', '127.0.0.1', '--directory', root], { stdio: 'ignore' });
  const origin = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try { if ((await fetch(origin + SUBPATH)).ok) break; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { origin, base: origin + SUBPATH, log: null, kind: 'plain (python http.server)', close: async () => { proc.kill(); } };
}

/** Waits until a service worker controls the page (its precache is then complete). */
export async function controlled(page) {
  return page.evaluate(async () => {
    // Fails after 20 s rather than waiting forever; the timer goes once the wait is over (a
    // timeout left behind would reject later, an uncaught error on a page still open).
    const within = (wait, what) => new Promise((ok, no) => {
      const late = setTimeout(() => no(new Error(`${what} in 20 s`)), 20000);
      wait.then((v) => { clearTimeout(late); ok(v); }, (e) => { clearTimeout(late); no(e); });
    });
    const reg = await within(navigator.serviceWorker.ready, 'no service worker ready');
    if (!navigator.serviceWorker.controller) {
      await within(new Promise((ok) => navigator.serviceWorker.addEventListener('controllerchange', ok, { once: true })), 'no controller');
    }
    return { scope: reg.scope, script: navigator.serviceWorker.controller.scriptURL };
  });
}

/** The build id of the worker controlling the page (asked by message). */
export async function workerBuild(page) {
  // Asked again every half second, of whichever worker controls the page by then: one that is
  // being replaced may never answer (without this, a test could wait forever). Fails after 20 s.
  return page.evaluate(() => new Promise((ok, no) => {
    const ask = () => navigator.serviceWorker.controller?.postMessage({ type: 'BUILD' });
    const again = setInterval(ask, 500);
    const give_up = setTimeout(() => { clearInterval(again); no(new Error('no service worker answered BUILD in 20 s')); }, 20000);
    const answered = (e) => {
      if (e.data?.type !== 'BUILD') return;
      clearInterval(again);
      clearTimeout(give_up);
      navigator.serviceWorker.removeEventListener('message', answered);
      ok(e.data.build);
    };
    navigator.serviceWorker.addEventListener('message', answered);
    ask();
  }));
}

export async function pageBuild(page) {
  return page.evaluate(() => document.querySelector('meta[name=trainmem-build]')?.content);
}

/** The verdict's fit flag and text. */
export async function verdict(page) {
  const el = await page.waitForSelector('[data-testid=verdict]');
  return { fits: await el.getAttribute('data-fits'), text: (await el.textContent()).trim() };
}

/** Changes an input so the default model stops fitting, and waits for the verdict to follow. */
export async function computeChange(page) {
  const before = await verdict(page);
  await page.fill('#in-batch', before.fits === 'true' ? '512' : '1');
  // (the default query fits; 512 sequences of 2,048 tokens do not)
  await page.waitForFunction((t) => document.querySelector('[data-testid=verdict]')?.textContent.trim() !== t, before.text, { timeout: 10000 });
  const after = await verdict(page);
  return { before, after };
}

/** Waits for some canvas on the page to hold more than one colour. */
export async function somethingDrawn(page) {
  await page.waitForFunction(() => [...document.querySelectorAll('canvas')].some((c) => {
    if (!c.width || !c.height) return false;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const first = d.slice(0, 4).join();
    for (let i = 4; i < d.length; i += 4 * 7) if (d.slice(i, i + 4).join() !== first) return true;
    return false;
  }), null, { timeout: 20000 });
}

export async function load(page, url) {
  await page.goto(url);
  await waitForApp(page);
}

/** `trainmem --version` from the native binary (built by cargo test) or cargo run. */
export function cliVersion() {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  return (existsSync(bin)
    ? execFileSync(bin, ['--version'], { encoding: 'utf8' })
    : execFileSync('cargo', ['run', '-q', '--', '--version'], { cwd: ROOT, encoding: 'utf8' })).trim();
}

/**
 * Lays a "new deploy" over a web root: the same files with a new build id in the page and the
 * worker (as a real deploy changes both), compressed siblings rewritten. Returns the new id.
 */
export function redeploy(root) {
  const dir = join(root, SUBPATH);
  const html = readFileSync(join(dir, 'index.html'), 'utf8');
  const old = html.match(/<meta name="trainmem-build" content="([0-9a-f]+)"/)[1];
  const next = (BigInt('0x' + old) ^ 0xffffn).toString(16).padStart(old.length, '0');
  for (const f of ['index.html', 'sw.js']) {
    const text = readFileSync(join(dir, f), 'utf8').replaceAll(old, next);
    writeFileSync(join(dir, f), text);
    rmSync(join(dir, f + '.gz'), { force: true });
    rmSync(join(dir, f + '.br'), { force: true });
    writeFileSync(join(dir, f + '.gz'), gzipSync(text));
    writeFileSync(join(dir, f + '.br'), brotliCompressSync(text));
  }
  return next;
}

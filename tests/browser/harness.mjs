// Shared set-up of the browser tests: serves the release build (dist/) from a sub-path of a
// plain static server on loopback — as a course site would host it — and drives the system
// Chromium through playwright-core (never a downloaded browser).
import { chromium } from 'playwright-core';
import { spawn, execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createServer } from 'node:net';
import * as nodeTest from 'node:test';

export const ROOT = resolve(import.meta.dirname, '..', '..');
export const SUBPATH = '/course/week-3/trainmem/';

/**
 * The longest one browser test may run. The slowest (an axe sweep of every course page and
 * embed in one theme) takes ~40 s on a 2-core machine; a test that hangs (a wedged renderer, a
 * service worker that never answers) fails after this instead of holding CI until its own limit.
 * (node 20's `--test-timeout` cannot say this: with `--test` it bounds each whole file.)
 */
export const TEST_TIMEOUT_MS = 180_000;
/** The longest a file's set-up or clean-up (a browser launch or close, a server) may run. */
export const HOOK_TIMEOUT_MS = 60_000;

/** `node:test`'s `test`, with TEST_TIMEOUT_MS unless the options say otherwise. */
export function test(name, options, fn) {
  if (typeof options === 'function') [options, fn] = [{}, options];
  return nodeTest.test(name, { timeout: TEST_TIMEOUT_MS, ...options }, fn);
}
/** `node:test`'s `before`, bounded by HOOK_TIMEOUT_MS. */
export const before = (fn) => nodeTest.before(fn, { timeout: HOOK_TIMEOUT_MS });
/** `node:test`'s `after`, bounded by HOOK_TIMEOUT_MS. */
export const after = (fn) => nodeTest.after(fn, { timeout: HOOK_TIMEOUT_MS });

/**
 * Settles as `promise` does, or rejects naming `what` after `ms`: for waits Playwright leaves
 * unbounded (`page.evaluate` of a promise, a CDP call).
 */
export function within(promise, ms, what) {
  let late;
  const timer = new Promise((_, no) => { late = setTimeout(() => no(new Error(`timed out after ${ms} ms: ${what}`)), ms); });
  return Promise.race([promise, timer]).finally(() => clearTimeout(late));
}

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const FLAGS = ['--headless=new', '--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

async function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => ok(port)); });
    s.on('error', fail);
  });
}

/** Copies dist/ under SUBPATH of a fresh web root and serves it with python's http.server. */
export async function serve() {
  const dist = join(ROOT, 'dist');
  if (!existsSync(join(dist, 'index.html'))) throw new Error('dist/ is missing: run `trunk build --release` first');
  const webroot = mkdtempSync(join(tmpdir(), 'trainmem-web-'));
  mkdirSync(join(webroot, SUBPATH), { recursive: true });
  cpSync(dist, join(webroot, SUBPATH), { recursive: true });
  const port = await freePort();
  const proc = spawn('python3', ['-m', 'http.server', String(port), '--bind', '127.0.0.1', '--directory', webroot], { stdio: 'ignore' });
  const origin = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try { const r = await fetch(origin + SUBPATH); if (r.ok) break; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { origin, base: origin + SUBPATH, webroot, close: () => proc.kill() };
}

/** Launches Chromium; `webgpu` adds --enable-unsafe-webgpu (SwiftShader adapter, no GPU needed). */
export async function launch({ webgpu = true } = {}) {
  // playwright gives every launch a fresh, empty profile of its own.
  const args = [...FLAGS];
  if (webgpu) args.push('--enable-unsafe-webgpu');
  return chromium.launch({ executablePath: CHROMIUM, args });
}

/** A page that records console errors, uncaught exceptions and every request it makes. */
export async function openPage(browser, url, options = {}) {
  const context = await browser.newContext({ acceptDownloads: true, ...options });
  const page = await context.newPage();
  const problems = [];
  const requests = [];
  page.on('console', (m) => { if (m.type() === 'error' || /panicked/.test(m.text())) problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push('pageerror: ' + e.message));
  page.on('request', (r) => requests.push(r.url()));
  if (url) {
    await page.goto(url);
    await waitForApp(page);
  }
  return { page, context, problems, requests };
}

export async function waitForApp(page) {
  await page.waitForSelector('[data-testid=verdict], [data-testid=estimate-error]', { timeout: 30000 });
  await settled(page);
}

/** Waits until the answers panel, where there is one, shows the current configuration's
 * answers: they come from the analysis worker, a reply after each change (`aria-busy`). */
export async function settled(page) {
  await page.waitForFunction(() => !document.querySelector('[data-testid=answers][aria-busy=true]'), null, { timeout: 30000 });
}

/** The CLI's JSON for the same configuration (the native binary built by `cargo test`). */
export function cliJson(args) {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  const out = existsSync(bin)
    ? execFileSync(bin, ['estimate', ...args, '--json'], { encoding: 'utf8' })
    : execFileSync('cargo', ['run', '-q', '--', 'estimate', ...args, '--json'], { cwd: ROOT, encoding: 'utf8' });
  return out;
}

/** An integer field of the CLI's JSON, as a string (no float rounding of large byte counts). */
export function jsonInteger(json, path) {
  const key = path.split('.').pop();
  const section = path.includes('.') ? json.slice(json.indexOf(`"${path.split('.')[0]}"`)) : json;
  const m = section.match(new RegExp(`"${key}":\\s*(\\d+)`));
  if (!m) throw new Error(`no ${path} in CLI output`);
  return m[1];
}

export function writeFile(dir, name, text) {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

/** Runs axe-core on the page (injected; the context needs `bypassCSP: true`) and returns its
 *  violations as `rule: target…` lines. */
export async function axeViolations(page, context = 'html') {
  await page.addScriptTag({ path: join(ROOT, 'node_modules', 'axe-core', 'axe.min.js') });
  const result = await page.evaluate(async (ctx) => {
    const r = await window.axe.run(ctx, { resultTypes: ['violations'] });
    return r.violations.map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
  }, context);
  return result;
}

/** The layout a chart canvas reports (`data-layout`, CSS pixels inside its content box) and the
 *  canvas' own box on the page. */
export async function canvasLayout(page, testid) {
  return page.$eval(`[data-testid=${testid}]`, (c) => {
    const r = c.getBoundingClientRect();
    return { layout: JSON.parse(c.dataset.layout), box: { x: r.x + c.clientLeft, y: r.y + c.clientTop, width: c.clientWidth, height: c.clientHeight }, backing: { width: c.width, height: c.height } };
  });
}

// Lighthouse's mobile preset on dist/ served gzip-compressed from a sub-path (the static server
// of the deploy tests, with dist/_headers applied), driving the system Chromium. Prints the
// scores (median of N runs), the metrics, what weighs on them, and Chromium's installability
// check (Lighthouse 12 dropped its PWA category; Chromium's own `Page.getInstallabilityErrors`
// is what that category's installable audit read). Reports; asserts nothing.
//
//   node scripts/lighthouse.mjs [--runs N] [--encoding gzip|br|none] [--json FILE] [--report FILE]
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import { serveDist } from '../tests/browser/static-server.mjs';

const ROOT = resolve(import.meta.dirname, '..');
const SUBPATH = '/course/trainmem/';
const CHROME = process.env.CHROME_PATH || '/usr/bin/chromium';
const arg = (name, dflt) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : dflt; };
const runs = Number(arg('--runs', '3'));
const encoding = arg('--encoding', 'gzip');
const jsonOut = arg('--json', null);
// The median run's whole Lighthouse report (every audit's details), for digging in.
const reportOut = arg('--report', null);

const server = await serveDist(join(ROOT, 'dist'), SUBPATH, {
  precompressed: encoding !== 'none', encodings: encoding === 'br' ? ['br', 'gzip'] : ['gzip'],
});
const { root, url } = server;
// Lighthouse's launcher adds its own flags (no first run, no background networking, …); more
// of ours made Chromium 156 close the target on the first navigation.
const lhFlags = '--headless=new --no-sandbox';
const flags = '--headless=new --no-sandbox --disable-quic --no-first-run --disable-background-networking --disable-component-update --disable-sync';

const reports = [];
for (let i = 0; i < runs; i++) {
  const out = join(root, `lh-${i}.json`);
  // Asynchronously: the static server answers from this same process.
  const child = spawn('lighthouse', [url, '--quiet', '--output=json', `--output-path=${out}`, `--chrome-flags=${lhFlags}`, '--max-wait-for-load=60000',
    '--only-categories=performance,best-practices,accessibility,seo'], { env: { ...process.env, CHROME_PATH: CHROME }, stdio: ['ignore', 'inherit', 'inherit'] });
  const status = await new Promise((ok) => child.on('exit', ok));
  if (status !== 0) { console.error(`lighthouse exited ${status}`); process.exit(1); }
  reports.push(JSON.parse(readFileSync(out, 'utf8')));
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const byPerf = [...reports].sort((a, b) => a.categories.performance.score - b.categories.performance.score);
const mid = byPerf[Math.floor(byPerf.length / 2)];

if (reportOut) writeFileSync(reportOut, JSON.stringify(mid));
console.log(`\nLighthouse ${mid.lighthouseVersion}, ${mid.configSettings.formFactor} preset (${mid.configSettings.throttlingMethod} throttling), ${runs} run(s)`);
console.log(`URL ${url} served ${encoding === 'none' ? 'uncompressed' : encoding === 'br' ? 'brotli/gzip' : 'gzip'}-compressed; Chromium ${mid.environment.hostUserAgent.match(/Chrome\/([\d.]+)/)?.[1]}`);
for (const c of ['performance', 'best-practices', 'accessibility', 'seo']) {
  const scores = reports.map((r) => r.categories[c].score);
  console.log(`  ${c.padEnd(15)} ${median(scores).toFixed(2)}   (runs: ${scores.map((s) => s.toFixed(2)).join(', ')})`);
}
console.log('metrics (median run):');
for (const id of ['first-contentful-paint', 'largest-contentful-paint', 'total-blocking-time', 'cumulative-layout-shift', 'speed-index', 'interactive']) {
  const a = mid.audits[id];
  if (a) console.log(`  ${a.title.padEnd(26)} ${String(a.displayValue).padEnd(10)} score ${a.score}`);
}
const failing = (cat) => mid.categories[cat].auditRefs
  .map((ref) => mid.audits[ref.id])
  .filter((a) => a && a.score !== null && a.score < 1 && a.scoreDisplayMode !== 'informative' && a.scoreDisplayMode !== 'notApplicable' && a.scoreDisplayMode !== 'manual');
for (const cat of ['performance', 'best-practices']) {
  const f = failing(cat);
  console.log(`${cat}: audits below 1: ${f.length ? '' : 'none'}`);
  for (const a of f) console.log(`  ${a.id}: ${a.score} ${a.displayValue || ''} — ${a.title}`);
}
const net = mid.audits['network-requests']?.details?.items || [];
console.log('transfers on the first load (median run):');
let total = 0;
for (const it of [...net].sort((a, b) => b.transferSize - a.transferSize)) {
  total += it.transferSize;
  console.log(`  ${String(it.transferSize).padStart(9)} B  ${it.url.replace(url, './')}`);
}
console.log(`  ${String(total).padStart(9)} B  total`);

// Installability, as Chromium itself judges it (a non-incognito profile: nothing installs in
// incognito).
const profile = mkdtempSync(join(tmpdir(), 'trainmem-lh-profile-'));
const ctx = await chromium.launchPersistentContext(profile, { executablePath: CHROME, args: flags.split(' ') });
const page = await ctx.newPage();
await page.goto(url);
await page.waitForSelector('[data-testid=verdict]', { timeout: 30000 });
await page.evaluate(() => navigator.serviceWorker.ready);
const cdp = await ctx.newCDPSession(page);
const manifest = await cdp.send('Page.getAppManifest');
const { installabilityErrors } = await cdp.send('Page.getInstallabilityErrors');
console.log(`installable (Chromium's check, manifest ${manifest.url.replace(url, './')}): ${installabilityErrors.length === 0 && manifest.errors.length === 0 ? 'yes' : 'NO'}`);
for (const e of [...manifest.errors, ...installabilityErrors]) console.log(`  ${JSON.stringify(e)}`);
await ctx.close();

if (jsonOut) writeFileSync(jsonOut, JSON.stringify({ url, encoding, runs: reports.map((r) => Object.fromEntries(Object.entries(r.categories).map(([k, v]) => [k, v.score]))), installabilityErrors }, null, 2));
await server.close();
rmSync(profile, { recursive: true, force: true });

// Where the page's start-up spends its main thread: loads dist/ (served gzip-compressed from a
// sub-path, as scripts/lighthouse.mjs does) in the system Chromium with the CPU slowed 4× (the
// factor of Lighthouse's mobile preset), records a Chromium trace, and prints every task longer
// than 20 ms on the page's main thread with the page's own marks inside it (`trainmem:*`, and
// with `--timing` the timed parts: `trainmem:time:*`) and what the browser spent compiling wasm
// functions there (V8 compiles each the first time it runs: `wasm.CompileLazy`). Lighthouse's
// Total Blocking Time is the sum over such tasks of what exceeds 50 ms. Reports; asserts nothing.
//
//   node scripts/startup-trace.mjs [--runs N] [--rate 4] [--timing]
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import { serveDist } from '../tests/browser/static-server.mjs';

const ROOT = resolve(import.meta.dirname, '..');
const SUBPATH = '/course/trainmem/';
const CHROME = process.env.CHROME_PATH || '/usr/bin/chromium';
const arg = (name, dflt) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : dflt; };
const runs = Number(arg('--runs', '1'));
const rate = Number(arg('--rate', '4'));
const timing = process.argv.includes('--timing');
/** A task this long (µs, slowed) is listed. */
const LONG_US = 20_000;
/** The kinds of work a task is described by (top-level trace events inside it). */
const PARTS = new Set(['TimerFire', 'FunctionCall', 'EvaluateScript', 'ParseHTML', 'ParseAuthorStyleSheet', 'UpdateLayoutTree', 'Layout', 'Paint', 'FireAnimationFrame', 'v8.compile', 'MajorGC', 'MinorGC']);
/** Lighthouse counts what a task takes beyond this (ms) as blocking. */
const BLOCKING_MS = 50;

const server = await serveDist(join(ROOT, 'dist'), SUBPATH);
const browser = await chromium.launch({ executablePath: CHROME, args: ['--no-sandbox'] });
try {
  for (let run = 0; run < runs; run++) {
    const ctx = await browser.newContext({ viewport: { width: 412, height: 823 }, deviceScaleFactor: 1.75 });
    const page = await ctx.newPage();
    if (timing) await page.addInitScript(() => { window.trainmemTiming = true; });
    const cdp = await ctx.newCDPSession(page);
    await cdp.send('Emulation.setCPUThrottlingRate', { rate });
    const events = [];
    cdp.on('Tracing.dataCollected', (e) => events.push(...e.value));
    const complete = new Promise((ok) => cdp.on('Tracing.tracingComplete', ok));
    await cdp.send('Tracing.start', {
      categories: 'toplevel,devtools.timeline,disabled-by-default-devtools.timeline,blink.user_timing,v8.wasm,disabled-by-default-v8.wasm.detailed',
      transferMode: 'ReportEvents',
    });
    await page.goto(server.url);
    await page.waitForFunction(() => performance.getEntriesByName('trainmem:drawn:chart-seq').length > 0, null, { timeout: 60_000 });
    await page.waitForTimeout(1000);
    await cdp.send('Tracing.end');
    await complete;
    await ctx.close();

    // The page's marks (instant events; a measure's begin and end are not).
    const marks = events.filter((e) => e.cat?.includes('user_timing') && (e.ph === 'R' || e.ph === 'I') && e.name.startsWith('trainmem:'));
    const main = marks[0]?.tid;
    // Times from the page's navigation start (its document's, not the blank page's before it).
    const nav = events.find((e) => e.name === 'navigationStart' && e.args?.data?.documentLoaderURL?.includes(SUBPATH));
    const origin = nav?.ts ?? Math.min(...events.filter((e) => e.tid === main && e.name === 'RunTask').map((e) => e.ts));
    const lazy = events.filter((e) => e.tid === main && e.name.includes('CompileLazy'));
    const tasks = events.filter((e) => e.tid === main && e.name === 'RunTask' && e.dur > LONG_US);
    console.log(`run ${run + 1}: tasks over ${LONG_US / 1000} ms on the page's main thread, CPU slowed ${rate}× (start: ms from navigation start)`);
    let blocking = 0;
    for (const t of tasks) {
      const inside = (e) => e.ts >= t.ts && e.ts <= t.ts + t.dur;
      const compiles = lazy.filter(inside);
      const compileMs = compiles.reduce((s, e) => s + (e.dur || 0), 0) / 1000;
      const ms = t.dur / 1000;
      blocking += Math.max(0, ms - BLOCKING_MS);
      const names = marks.filter(inside).map((m) => m.name.replace(/^trainmem:/, '')).join(' ');
      // What the task was, by its largest parts (script, layout, parsing, …).
      const parts = new Map();
      for (const e of events) {
        if (e.tid !== main || e.ph !== 'X' || !e.dur || !inside(e) || !PARTS.has(e.name)) continue;
        // A script's evaluation names its file.
        const file = e.name === 'EvaluateScript' && e.args?.data?.url ? ` ${e.args.data.url.split('/').pop() || 'index.html'}` : '';
        parts.set(e.name + file, (parts.get(e.name + file) || 0) + e.dur / 1000);
      }
      const what = [...parts].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([n, d]) => `${n} ${d.toFixed(0)}`).join(', ');
      console.log(`  ${((t.ts - origin) / 1000).toFixed(0).padStart(6)}  ${ms.toFixed(1).padStart(6)} ms  wasm compiled: ${String(compiles.length).padStart(4)} functions, ${compileMs.toFixed(1).padStart(5)} ms  [${what}]  ${names}`);
    }
    console.log(`  over ${BLOCKING_MS} ms in all: ${blocking.toFixed(0)} ms (the trace's own overhead included)`);
  }
} finally {
  await browser.close();
  await server.close();
}

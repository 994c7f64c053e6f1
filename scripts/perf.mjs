// Page speed by the page's own clock (performance.now() and marks in the page, never the
// harness's): see scripts/perf.sh. Prints figures; asserts nothing.
import { serve, launch, openPage } from '../tests/browser/harness.mjs';

const server = await serve();
const browser = await launch();
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
const ms = (x) => `${x.toFixed(1)} ms`;

// Runs in the page before anything else: as soon as the form and the verdict exist, type a
// micro-batch of 2 and note when the verdict shows it.
function firstInput() {
  window.__perf = {};
  const check = (before) => {
    const t = document.querySelector('[data-testid=total-bytes]');
    if (t && t.dataset.bytes !== before) { window.__perf.reflected = performance.now(); return true; }
    return false;
  };
  const tryInput = () => {
    const input = document.querySelector('#in-batch');
    const total = document.querySelector('[data-testid=total-bytes]');
    if (!input || !total) return false;
    const before = total.dataset.bytes;
    window.__perf.input = performance.now();
    input.value = '2';
    input.dispatchEvent(new Event('input', { bubbles: true }));
    if (!check(before)) {
      const mo = new MutationObserver(() => { if (check(before)) mo.disconnect(); });
      mo.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
    }
    return true;
  };
  // Watch the document from the start (the body does not exist yet, and DOMContentLoaded
  // waits for the app's module script).
  const watch = new MutationObserver(() => { if (tryInput()) watch.disconnect(); });
  watch.observe(document, { subtree: true, childList: true });
}

try {
  const loads = [];
  for (let i = 0; i < 7; i++) {
    const { page, context } = await openPage(browser, null);
    await context.addInitScript(firstInput);
    await page.goto(server.base);
    await page.waitForFunction(() => window.__perf?.reflected, null, { timeout: 30000 });
    loads.push(await page.evaluate(() => ({
      mounted: performance.getEntriesByName('trainmem:mounted')[0]?.startTime,
      verdict: performance.getEntriesByName('trainmem:verdict')[0]?.startTime,
      input: window.__perf.input,
      reflected: window.__perf.reflected,
    })));
    await context.close();
  }
  console.log(`navigation start → app mounted: median ${ms(median(loads.map((l) => l.mounted)))}`);
  console.log(`navigation start → first verdict: median ${ms(median(loads.map((l) => l.verdict)))} (7 loads: ${loads.map((l) => l.verdict.toFixed(0)).join(', ')})`);
  console.log(`navigation start → first input reflected: median ${ms(median(loads.map((l) => l.reflected)))} (7 loads: ${loads.map((l) => l.reflected.toFixed(0)).join(', ')}; typed at a median ${ms(median(loads.map((l) => l.input)))})`);

  // Input → every visible view updated: the verdict's and the ledger's figures (DOM), the
  // bar's and the open chart's canvases (their `trainmem:drawn:*` marks), and the answers
  // (`trainmem:answers`: they come from the analysis worker where there is one). Measured on a
  // page as a visitor gets it; then, for where the time goes, on a page that records its
  // timings (`trainmemTiming`: ~30 performance entries per change, which a visitor's page skips).
  const changes = async (page, n) => page.evaluate(async (n) => {
    const input = document.querySelector('#in-seq');
    const dom = () => [document.querySelector('[data-testid=total-bytes]')?.dataset.bytes, document.querySelector('[data-row=activations] .bytes')?.dataset.bytes].join('/');
    const drawnAfter = (name, t0) => performance.getEntriesByName(name).map((m) => m.startTime).filter((t) => t >= t0)[0];
    const out = [];
    for (let i = 0; i < n; i++) {
      const before = dom();
      let domAt = null;
      const mo = new MutationObserver(() => { if (domAt === null && dom() !== before && !dom().includes('undefined')) domAt = performance.now(); });
      mo.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
      const t0 = performance.now();
      input.value = String(2048 + 64 * (i + 1));
      input.dispatchEvent(new Event('input', { bubbles: true }));
      // Everything the change triggers runs in this task and its microtasks; wait a frame.
      await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
      // The answers may come from the analysis worker, after that frame: wait for them too.
      for (let waited = 0; drawnAfter('trainmem:answers', t0) === undefined && waited < 500; waited += 2) await new Promise((r) => setTimeout(r, 2));
      mo.disconnect();
      const bar = drawnAfter('trainmem:drawn:bar-canvas', t0);
      const chart = drawnAfter('trainmem:drawn:chart-seq', t0);
      const answers = drawnAfter('trainmem:answers', t0);
      if (domAt === null || bar === undefined || chart === undefined || answers === undefined) { out.push([NaN, NaN]); continue; }
      out.push([Math.max(domAt, bar, chart, answers) - t0, Math.max(domAt, bar, chart) - t0]);
    }
    return out;
  }, n);
  const settle = async (page) => {
    await page.waitForFunction(() => document.querySelector('[data-testid=chart-seq]')?.dataset.layout);
    await page.waitForTimeout(300);
  };
  const { page: visitor } = await openPage(browser, server.base);
  await settle(visitor);
  const lat = await changes(visitor, 200);
  const ok = lat.map((x) => x[0]).filter((x) => Number.isFinite(x));
  console.log(`input → every visible view updated (verdict, answers, ledger, textbook, bar, chart), ${ok.length} of ${lat.length} changes: median ${ms(median(ok))}, p95 ${ms(pct(ok, 0.95))}, max ${ms(Math.max(...ok))}`);
  // The same changes without the answers (where they come from the analysis worker, a reply later).
  const views = lat.map((x) => x[1]).filter((x) => Number.isFinite(x));
  console.log(`  of which every view but the answers: median ${ms(median(views))}, p95 ${ms(pct(views, 0.95))}`);
  // Where that time goes: the app's own `trainmem:time:*` measures, on a page that records them.
  const { page, context } = await openPage(browser, null);
  await context.addInitScript(() => { window.trainmemTiming = true; });
  await page.goto(server.base);
  await settle(page);
  const timed = await changes(page, 100);
  const timedOk = timed.map((x) => x[0]).filter((x) => Number.isFinite(x));
  console.log(`  with the page recording its timings (100 changes): every view median ${ms(median(timedOk))}, p95 ${ms(pct(timedOk, 0.95))}; its parts:`);
  const parts = await page.evaluate(() => {
    const by = {};
    for (const m of performance.getEntriesByType('measure')) if (m.name.startsWith('trainmem:time:')) (by[m.name.slice(14)] ??= []).push(m.duration);
    return by;
  });
  for (const [name, d] of Object.entries(parts).sort((a, b) => median(b[1]) - median(a[1]))) console.log(`  ${name}: median ${ms(median(d))}, p95 ${ms(pct(d, 0.95))} (${d.length} runs)`);

  // The charts: sweep (when due) + draw, each chart, under input changes.
  const all = [];
  for (const kind of ['seq', 'params', 'batch', 'gpus', 'timeline']) {
    await page.click(`[data-testid=chart-tab-${kind}]`);
    await page.waitForFunction((k) => document.querySelector(`[data-testid=chart-${k}]`)?.dataset.layout, kind);
    await page.evaluate(() => performance.clearMeasures('trainmem:charts'));
    await page.evaluate(async () => {
      const input = document.querySelector('#in-batch');
      for (let i = 0; i < 20; i++) {
        input.value = String(1 + (i % 4));
        input.dispatchEvent(new Event('input', { bubbles: true }));
        await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
      }
    });
    const d = await page.evaluate(() => performance.getEntriesByName('trainmem:charts').map((m) => m.duration));
    all.push(...d);
    console.log(`  ${kind}: sweep + draw over ${d.length} redraws: median ${ms(median(d))}, p95 ${ms(pct(d, 0.95))}`);
  }
  console.log(`charts sweep + draw, all charts (${all.length} redraws): median ${ms(median(all))}, p95 ${ms(pct(all, 0.95))}`);
} finally {
  await browser.close();
  server.close();
}

// Page speed in headless Chromium: time to interactive and input → updated ledger latency.
import { serve, launch, openPage } from '../tests/browser/harness.mjs';

const server = await serve();
const browser = await launch();
try {
  const ttis = [];
  for (let i = 0; i < 5; i++) {
    const { page, context } = await openPage(browser, null);
    const t0 = Date.now();
    await page.goto(server.base);
    await page.waitForSelector('[data-testid=verdict]');
    // Interactive: an input accepts a change and the verdict follows.
    await page.fill('#in-batch', '2');
    await page.waitForFunction(() => location.search.includes('batch=2'));
    ttis.push(Date.now() - t0);
    const nav = await page.evaluate(() => {
      const m = performance.getEntriesByName('trainmem:mounted')[0];
      return m ? m.startTime : null;
    });
    if (i === 0) console.log(`app mounted ${nav?.toFixed(1)} ms after navigation start`);
    await context.close();
  }
  ttis.sort((a, b) => a - b);
  console.log(`time to interactive (5 loads, incl. one input round trip): median ${ttis[2]} ms, min ${ttis[0]} ms, max ${ttis[4]} ms`);

  const { page } = await openPage(browser, server.base);
  const lat = await page.evaluate(async () => {
    const input = document.querySelector('#in-seq');
    // Updated = both the verdict's total and the ledger's activation row show new bytes.
    const state = () => [document.querySelector('[data-testid=total-bytes]')?.dataset.bytes, document.querySelector('[data-row=activations] .bytes')?.dataset.bytes].join('/');
    const out = [];
    for (let i = 0; i < 200; i++) {
      const before = state();
      const v = String(2048 + 64 * (i + 1));
      const changed = new Promise((resolve) => {
        const mo = new MutationObserver(() => { if (state() !== before && !state().includes('undefined')) { mo.disconnect(); resolve(); } });
        mo.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
      });
      const t0 = performance.now();
      input.value = v;
      input.dispatchEvent(new Event('input', { bubbles: true }));
      await changed;
      out.push(performance.now() - t0);
      await new Promise((r) => requestAnimationFrame(() => r()));
    }
    return out;
  });
  lat.sort((a, b) => a - b);
  const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
  console.log(`input → updated ledger over ${lat.length} changes: median ${q(0.5).toFixed(2)} ms, p95 ${q(0.95).toFixed(2)} ms, max ${lat.at(-1).toFixed(2)} ms`);
  const charts = await page.evaluate(() => performance.getEntriesByName('trainmem:charts').map((m) => m.duration));
  if (charts.length) {
    charts.sort((a, b) => a - b);
    console.log(`charts sweep + draw (${charts.length} redraws): median ${charts[Math.floor(charts.length / 2)].toFixed(1)} ms, p95 ${charts[Math.floor(charts.length * 0.95)].toFixed(1)} ms`);
  }
} finally {
  await browser.close();
  server.close();
}

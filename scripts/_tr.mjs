import { serve, launch, openPage } from '../tests/browser/harness.mjs';
import { readFileSync } from 'node:fs';
const server = await serve(); const browser = await launch();
const { page } = await openPage(browser, server.base);
await page.waitForFunction(() => document.querySelector('[data-testid=chart-seq]')?.dataset.layout);
await page.waitForTimeout(500);
await browser.startTracing(page, { path: '/tmp/trace-in.json', categories: ['devtools.timeline', 'blink.user_timing', 'v8.execute', 'disabled-by-default-devtools.timeline', 'toplevel'] });
await page.evaluate(async () => {
  const input = document.querySelector('#in-seq');
  for (let i = 0; i < 8; i++) {
    performance.mark('probe:input');
    input.value = String(2048 + 64 * (i + 1));
    input.dispatchEvent(new Event('input', { bubbles: true }));
    await new Promise((r) => setTimeout(r, 120));
  }
});
await browser.stopTracing();
const ev = JSON.parse(readFileSync('/tmp/trace-in.json')).traceEvents;
const inputs = ev.filter((e) => e.name === 'probe:input').map((e) => e.ts).sort();
const main = ev.find((e) => e.name === 'thread_name' && e.args.name === 'CrRendererMain' && ev.some((x) => x.pid === e.pid && x.name === 'probe:input'));
const on = ev.filter((e) => e.pid === main.pid && e.tid === main.tid && e.ph === 'X');
const by = {};
for (const t0 of inputs.slice(1)) {
  for (const e of on) {
    if (e.ts < t0 - 1000 || e.ts > t0 + 60000) continue;
    const k = e.name;
    (by[k] ??= []).push(e.dur / 1000);
  }
}
const rows = Object.entries(by).map(([k, v]) => [k, v.reduce((a, b) => a + b, 0) / (inputs.length - 1), v.length / (inputs.length - 1)]).sort((a, b) => b[1] - a[1]).slice(0, 25);
for (const [k, ms, n] of rows) console.log(ms.toFixed(2).padStart(7), 'ms/input', n.toFixed(1).padStart(5), 'x', k);
// RunTask timeline for one input
const t0 = inputs[4];
console.log(on.filter((e) => e.name === 'RunTask' && e.ts > t0 - 2000 && e.ts < t0 + 50000 && e.dur > 300).map((e) => `${((e.ts - t0) / 1000).toFixed(1)}+${(e.dur / 1000).toFixed(1)}`).join(' '));
await browser.close(); server.close();

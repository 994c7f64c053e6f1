// The planner's speed in the browser, by the page's own clock (performance.now() in the page,
// never the harness's). Prints figures; asserts nothing. Needs a release build in dist/.
//   node scripts/perf-plan.mjs
// 1. `window.trainmemPlanBenchmark()`: the native benchmark's request (estimator::plan::
//    benchmark_request, ~10⁵ configurations, the same as `cargo bench --bench plan`) searched
//    in one go on the main thread; median of 5 runs after a warm-up.
// 2. The Plan panel's own sliced search (the page stays responsive) on the same model, cluster
//    and target with the attention, optimizer and offload knobs also open: wall time from the
//    click to the results (`data-search-ms`) and the time spent inside the slices
//    (`data-compute-ms`).
import { serve, launch, openPage } from '../tests/browser/harness.mjs';

const server = await serve();
const browser = await launch({ webgpu: false });
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
try {
  const { page } = await openPage(browser, server.base + '?model=llama-3.1-8b&gpus=64&seq=4096');
  await page.waitForSelector('[data-testid=plan-run]');
  const runs = [];
  await page.evaluate(() => window.trainmemPlanBenchmark());
  for (let i = 0; i < 5; i++) runs.push(JSON.parse(await page.evaluate(() => window.trainmemPlanBenchmark())));
  const r = runs[0];
  console.log(`benchmark request: ${r.configurations} configurations, ${r.estimate_calls} estimate() calls, ${r.fitting} fit`);
  console.log(`search, median of 5: ${median(runs.map((x) => x.search_ms)).toFixed(1)} ms (with the ranked result: ${median(runs.map((x) => x.search_and_result_ms)).toFixed(1)} ms)`);
  console.log(`where it goes (median): laying out the space ${median(runs.map((x) => x.layout_ms)).toFixed(1)} ms; estimate() alone on the ${r.fitting} fitting configurations ${median(runs.map((x) => x.fitting_estimates_ms)).toFixed(1)} ms`);
  for (const k of ['attn', 'optim', 'offload']) await page.check(`[data-testid=plan-knob-${k}]`);
  await page.fill('[data-testid=plan-global]', '1024');
  await page.click('[data-testid=plan-run]');
  await page.waitForSelector('[data-testid=plan-results]', { timeout: 600000 });
  const p = await page.$eval('[data-testid=plan]', (e) => ({ wall: e.dataset.searchMs, compute: e.dataset.computeMs }));
  const prog = await page.$eval('[data-testid=plan-progress]', (e) => ({ ...e.dataset }));
  console.log(`panel (sliced, ${prog.configurations} configurations): ${p.wall} ms from click to results, ${p.compute} ms inside the slices`);
} finally {
  await browser.close();
  server.close();
}

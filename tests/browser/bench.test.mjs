// The WebGPU benchmark in headless Chromium: with --enable-unsafe-webgpu (a SwiftShader
// adapter, no GPU needed) the panel opens the benchmark module, a short sweep runs end to end
// in the page, both kernels match the CPU reference, a longer sweep cancels, and results render
// and travel by link; without the flag the page says what to enable and nothing panics.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test, before, after, serve, launch, openPage } from './harness.mjs';

let server;
before(async () => { server = await serve(); });
after(() => server?.close());

/** The sweeps on SwiftShader wait up to minutes on a slow machine (see their selectors' waits). */
const SWEEP_TEST = { timeout: 420_000 };

async function openBench(page) {
  await page.click('[data-testid=bench-open]');
  await page.waitForSelector('[data-testid=bench-adapter], [data-testid=bench-unavailable]', { timeout: 60000 });
}

test('with WebGPU a short sweep runs in the page, matches the CPU reference, and its results render and travel', SWEEP_TEST, async () => {
  const browser = await launch({ webgpu: true });
  try {
    const { page, problems, requests } = await openPage(browser, server.base + '?model=gpt2');
    // The benchmark module is not part of the first load.
    assert.ok(!requests.some((r) => r.includes('trainmem-bench')), 'benchmark loaded lazily');
    await openBench(page);
    assert.ok(await page.$('[data-testid=bench-adapter]'), await page.textContent('[data-testid=bench-page]'));
    assert.ok(requests.some((r) => /trainmem-bench-[0-9a-f]{12,16}_bg\.wasm$/.test(r)));

    await page.click('[data-testid=bench-verify]');
    await page.waitForSelector('[data-testid=bench-verify-result]', { timeout: 120000 });
    const verify = await page.$('[data-testid=bench-verify-result]');
    assert.equal(await verify.getAttribute('data-passed'), 'true', await verify.textContent());

    await page.fill('#b-heads', '1');
    await page.selectOption('#b-hd', '64');
    await page.fill('#b-max', '1024');
    await page.fill('#b-budget', '60');
    await page.click('[data-testid=bench-run]');
    await page.waitForSelector('[data-testid=bench-results]', { timeout: 180000 });
    assert.equal(await page.getAttribute('[data-testid=bench-stop]', 'data-stop'), 'max_seq');
    const slope = Number(await page.textContent('[data-testid=slope-scores]'));
    assert.ok(Math.abs(slope - 2) < 0.05, `score-matrix slope ${slope}`);
    const fusedMem = Number(await page.textContent('[data-testid=slope-fused-mem]'));
    assert.ok(Math.abs(fusedMem - 1) < 0.15, `fused memory slope ${fusedMem}`);
    const rows = await page.$$('.bench-table tbody tr');
    assert.ok(rows.length >= 3, `points: ${rows.length}`);
    for (const id of ['bench-time-chart', 'bench-memory-chart']) {
      await page.waitForSelector(`[data-testid=${id}][data-layout]`);
      const painted = await page.$eval(`[data-testid=${id}]`, (c) => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const first = d.slice(0, 4).join();
        for (let i = 0; i < d.length; i += 4 * 97) if (d.slice(i, i + 4).join() !== first) return true;
        return false;
      });
      assert.ok(painted, `${id} is drawn`);
    }

    const [download] = await Promise.all([page.waitForEvent('download'), page.click('[data-testid=bench-csv]')]);
    const csv = readFileSync(await download.path(), 'utf8');
    assert.match(csv.split('\n')[0], /^seq,score_bytes,materialized_ms/);
    assert.ok(csv.trim().split('\n').length >= 4);

    // The share link reopens the results without running anything, or loading the module.
    const link = await page.getAttribute('[data-testid=bench-share-link]', 'href');
    assert.match(link, /bench=/);
    const { page: shared, problems: p2, requests: r2 } = await openPage(browser, link);
    await shared.waitForSelector('[data-testid=bench-results]', { timeout: 60000 });
    assert.equal((await shared.$$('.bench-table tbody tr')).length, rows.length);
    assert.ok(!r2.some((r) => r.includes('trainmem-bench')), 'a shared result needs no benchmark module');
    assert.deepEqual(p2, []);
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
  }
});

test('with WebGPU a long sweep shows its progress and cancels, keeping what it measured', SWEEP_TEST, async () => {
  const browser = await launch({ webgpu: true });
  try {
    const { page, problems } = await openPage(browser, server.base + '?model=gpt2');
    await openBench(page);
    await page.fill('#b-heads', '1');
    await page.fill('#b-max', '65536');
    await page.fill('#b-budget', '600');
    await page.click('[data-testid=bench-run]');
    // Running: cancel is enabled, and the progress counts points.
    await page.waitForFunction(() => /\d+ of \d+ points/.test(document.querySelector('[data-testid=bench-status]')?.textContent ?? ''), null, { timeout: 120000 });
    await page.waitForFunction(() => Number(document.querySelector('[data-testid=bench-progress]')?.getAttribute('value')) >= 1, null, { timeout: 120000 });
    await page.click('[data-testid=bench-cancel]');
    await page.waitForSelector('[data-testid=bench-results]', { timeout: 120000 });
    assert.equal(await page.getAttribute('[data-testid=bench-stop]', 'data-stop'), 'cancelled');
    const rows = (await page.$$('.bench-table tbody tr')).length;
    assert.ok(rows >= 1 && rows < 15, `measured before cancelling: ${rows} points`);
    assert.ok(await page.$('[data-testid=bench-run]:not([disabled])'), 'ready to run again');
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
  }
});

test('without WebGPU the benchmark says what to enable and nothing panics', async () => {
  const browser = await launch({ webgpu: false });
  try {
    const { page, problems } = await openPage(browser, server.base);
    await openBench(page);
    const msg = await page.textContent('[data-testid=bench-unavailable]');
    assert.match(msg, /WebGPU is not available/);
    assert.match(msg, /enable-unsafe-webgpu/);
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
  }
});

// Serving (issue 29) in a real browser: the mode tab (mouse and keyboard) switches the page to
// serving; the answers are trainmem serve's for the same configuration; an FP8 KV cache raises the
// most concurrent sequences; a fix applies and fits; each budget row opens to its formula; both
// charts draw with their text clear of the data; the embed shows the serving answers for
// view=serve and sections=.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { test, before, after, serve, launch, openPage, waitForApp, ROOT } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch({ webgpu: false }); });
after(async () => { await browser?.close(); server?.close(); });

/** `trainmem serve … --json` (the binary `cargo build` writes, else `cargo run`). */
function cliServe(args) {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  const out = existsSync(bin)
    ? execFileSync(bin, ['serve', ...args, '--json'], { encoding: 'utf8' })
    : execFileSync('cargo', ['run', '-q', '--', 'serve', ...args, '--json'], { cwd: ROOT, encoding: 'utf8' });
  return JSON.parse(out);
}

const value = (page, testid) => page.getAttribute(`[data-testid=${testid}]`, 'data-value');

/** Opens a page whose link is already in serving mode (no training verdict to wait for). */
async function openServing(query, options = {}) {
  const opened = await openPage(browser, null, options);
  await opened.page.goto(server.base + query);
  await opened.page.waitForSelector('[data-testid=serve-max-concurrency]', { timeout: 30000 });
  return opened;
}

/** Every text box of a chart's layout inside the drawing, and none but labels on the plot. */
function assertLayout(layout, what) {
  const inside = (b) => b[0] >= 0 && b[1] >= 0 && b[2] <= layout.w && b[3] <= layout.h;
  const meets = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];
  for (const p of layout.parts) {
    assert.ok(inside(p.box), `${what}: '${p.text}' leaves the drawing`);
    if (p.part !== 'label') assert.ok(!meets(p.box, layout.plot), `${what}: '${p.text}' covers the plot`);
  }
}

test('the serving tab switches the page, an FP8 KV cache raises the max concurrency, and the figures are trainmem serve\'s', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=llama-3.1-8b&context=8192');
  assert.equal(await page.getAttribute('[data-testid=mode-tab-train]', 'aria-selected'), 'true');
  await page.click('[data-testid=mode-tab-serve]');
  await page.waitForSelector('[data-testid=serve-max-concurrency]');
  await page.waitForFunction(() => location.search.includes('mode=serve'));
  assert.equal(await page.getAttribute('[data-testid=mode-tab-serve]', 'aria-selected'), 'true');
  // The training answers gave way to the serving ones, and the form has the serving keys.
  assert.equal(await page.$('[data-testid=verdict]'), null);
  for (const k of ['engine', 'context', 'concurrency', 'kv_dtype', 'weight_dtype', 'gpu_memory_utilization', 'max_num_batched_tokens', 'block_size', 'cuda_graphs', 'dp_attention']) {
    assert.ok(await page.isVisible(`#in-${k}`), `#in-${k} is in the form`);
  }
  const cli = cliServe(['--model', 'llama-3.1-8b', '--context', '8192']);
  const before = Number(await value(page, 'serve-max-concurrency'));
  assert.ok(Math.abs(before - cli.max_concurrency) < 1e-9 * cli.max_concurrency, `${before} vs ${cli.max_concurrency}`);
  assert.equal(await value(page, 'serve-kv-per-token'), String(cli.kv_per_token));
  assert.equal(await value(page, 'serve-weights'), String(cli.weights));
  assert.equal(await value(page, 'serve-blocks'), String(cli.kv_blocks));
  assert.equal(await value(page, 'serve-max-context'), String(cli.max_context));
  // An FP8 KV cache halves the bytes per token: about twice the sequences fit.
  await page.selectOption('#in-kv_dtype', 'fp8');
  await page.waitForFunction((b) => Number(document.querySelector('[data-testid=serve-max-concurrency]').dataset.value) > b, before);
  const after = Number(await value(page, 'serve-max-concurrency'));
  assert.ok(after > 1.9 * before && after < 2.1 * before, `${before} → ${after}`);
  await page.waitForFunction(() => location.search.includes('kv_dtype=fp8'));
  const fp8 = cliServe(['--model', 'llama-3.1-8b', '--context', '8192', '--kv_dtype', 'fp8']);
  assert.ok(Math.abs(after - fp8.max_concurrency) < 1e-9 * fp8.max_concurrency);
  // The budget's rows open to their formulas, as the ledger's do.
  const rows = await page.$$eval('[data-testid=serve-rows] li.row', (ls) => ls.map((l) => l.dataset.row));
  assert.deepEqual(rows, cli.rows.map((r) => r.name));
  await page.click('[data-testid=serve-rows] li[data-row=kv_cache] summary');
  assert.match(await page.textContent('[data-testid=serve-rows] li[data-row=kv_cache] .formula'), /M_kv = M_req − weights − activation peak − non-torch/);
  // Both charts drew, their text clear of the data.
  for (const id of ['chart-serve-kv', 'chart-serve-concurrency']) {
    await page.waitForSelector(`[data-testid=${id}][data-layout]`);
    assertLayout(JSON.parse(await page.getAttribute(`[data-testid=${id}]`, 'data-layout')), id);
  }
  assert.match(await page.getAttribute('[data-testid=chart-serve-kv]', 'aria-label'), /FP8 KV cache|as configured/);
  assert.deepEqual(problems, []);
});

test('the mode tabs work from the keyboard and a link with mode=serve opens in serving', async () => {
  const { page, problems } = await openServing('?mode=serve&model=gemma-3-27b-it&context=32768');
  assert.equal(await page.getAttribute('[data-testid=mode-tab-serve]', 'tabindex'), '0');
  assert.equal(await page.getAttribute('[data-testid=mode-tab-train]', 'tabindex'), '-1');
  // Without sliding windows the same model's cache is larger: the chart draws that line.
  await page.waitForSelector('[data-testid=chart-serve-kv][data-layout]');
  assert.match(await page.getAttribute('[data-testid=chart-serve-kv]', 'aria-label'), /without sliding windows/);
  await page.focus('[data-testid=mode-tab-serve]');
  await page.keyboard.press('ArrowLeft');
  await waitForApp(page);
  assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), 'mode-tab-train');
  await page.waitForFunction(() => !location.search.includes('mode=serve'));
  await page.keyboard.press('ArrowRight');
  await page.waitForSelector('[data-testid=serve-max-concurrency]');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), 'mode-tab-serve');
  assert.deepEqual(problems, []);
});

test('a target that does not fit offers its cheapest fixes, and each applies and fits', async () => {
  const query = '?mode=serve&model=llama-3.1-70b&gpus=4&tp=4&context=32768&concurrency=24';
  const { page, problems } = await openServing(query);
  assert.equal(await page.getAttribute('[data-testid=serve-verdict]', 'data-fits'), 'false');
  const fixes = await page.$$eval('[data-testid=serve-fixes] button', (bs) => bs.map((b) => b.textContent));
  assert.ok(fixes.length >= 1, fixes.join('\n'));
  const cli = cliServe(['--model', 'llama-3.1-70b', '--gpus', '4', '--tp', '4', '--context', '32768', '--concurrency', '24']);
  assert.equal(fixes.length, cli.fixes.length);
  await page.click('[data-testid=serve-fix-0]');
  await page.waitForFunction(() => document.querySelector('[data-testid=serve-verdict]')?.dataset.fits === 'true');
  assert.ok(Number(await value(page, 'serve-max-concurrency')) >= 24);
  for (const [k, v] of cli.fixes[0].set) await page.waitForFunction(([k, v]) => new URLSearchParams(location.search).get(k) === v, [k, v]);
  assert.deepEqual(problems, []);
});

test('the embed shows the serving answers for view=serve, for mode=serve and where sections= places them', async () => {
  for (const q of ['?model=qwen3-8b&embed=1&view=serve', '?model=qwen3-8b&mode=serve&embed=1', '?model=qwen3-8b&embed=1&sections=serving,serve']) {
    const { page, problems } = await openServing(q);
    assert.ok(await page.$('[data-testid=embed] [data-testid=serve]'), q);
    assert.equal(await page.$('[data-testid=verdict]'), null, `${q}: no training verdict`);
    assert.equal(await page.$('[data-testid=notice]'), null, `${q}: no notice`);
    if (q.includes('sections')) {
      await page.selectOption('#in-kv_dtype', 'fp8');
      await page.waitForFunction(() => document.querySelector('[data-testid=serve-kv-per-token]')?.dataset.value === '73728');
    }
    await page.waitForSelector('[data-testid=chart-serve-concurrency][data-layout]');
    assert.deepEqual(problems, [], q);
  }
});

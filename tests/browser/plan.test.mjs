// The planner in a real browser: the Plan panel searches in slices (progress that moves while
// the page keeps answering, a Cancel that stops it), then shows the Pareto chart, the ranked
// plans (each row's link reproduces its configuration), the CLI's own CSV and JSON, and why
// plan 1 sets each knob; the verdict lists the cheapest changes that make a configuration fit,
// and each applies and fits. axe-core finds no violation with the panel's results open.
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { test, before, after, serve, launch, openPage, waitForApp, axeViolations, ROOT } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch({ webgpu: false }); });
after(async () => { await browser?.close(); server?.close(); });

/** The native CLI's output (the binary `cargo test` builds, else `cargo run`). */
function cli(args) {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  return existsSync(bin)
    ? execFileSync(bin, args, { encoding: 'utf8', maxBuffer: 64 << 20 })
    : execFileSync('cargo', ['run', '-q', '--', ...args], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 << 20 });
}

const SMALL = '?model=qwen2.5-0.5b&gpus=8&seq=1024';

async function openPlan(query, options = {}) {
  const opened = await openPage(browser, server.base + query, options);
  // The planner is in the lazily loaded module: its button fetches it.
  await opened.page.click('[data-testid=plan-open]');
  await opened.page.waitForSelector('[data-testid=plan-run]');
  return opened;
}

async function search(page, globalBatch) {
  await page.fill('[data-testid=plan-global]', String(globalBatch));
  await page.click('[data-testid=plan-run]');
  await page.waitForSelector('[data-testid=plan-results]', { timeout: 120000 });
}

async function download(page, testid) {
  const [d] = await Promise.all([page.waitForEvent('download'), page.click(`[data-testid=${testid}]`)]);
  return { name: d.suggestedFilename(), text: readFileSync(await d.path(), 'utf8') };
}

test('a small search shows its progress, the Pareto chart, the ranked plans and why plan 1 is set as it is', async () => {
  const { page, problems } = await openPlan(SMALL);
  // torch.compile and every-2nd-layer checkpointing are searched unless unchecked; activation
  // offloading (host memory) only when asked.
  assert.equal(await page.isChecked('[data-testid=plan-knob-compile]'), true);
  assert.equal(await page.isChecked('[data-testid=plan-knob-recompute]'), true);
  assert.equal(await page.isChecked('[data-testid=plan-knob-act_offload]'), false);
  // Every knob's checkbox keeps its size, however its label wraps.
  const boxes = await page.$$eval('.plan-knobs input[type=checkbox]', (xs) => xs.map((x) => x.getBoundingClientRect().width));
  assert.ok(boxes.length >= 13 && boxes.every((w) => w === boxes[0] && w >= 16), boxes.join(', '));
  await search(page, 32);
  const progress = await page.$eval('[data-testid=plan-progress]', (e) => ({ ...e.dataset }));
  assert.equal(progress.done, 'true');
  assert.equal(progress.settled, progress.configurations);
  assert.ok(Number(progress.configurations) > 100, `configurations: ${progress.configurations}`);
  // The chart drew, with a layout whose header stays clear of the plot.
  await page.waitForSelector('[data-testid=chart-plan][data-layout]');
  const layout = JSON.parse(await page.getAttribute('[data-testid=chart-plan]', 'data-layout'));
  assert.ok(layout.w > 200 && layout.h > 200, JSON.stringify(layout));
  assert.match(await page.getAttribute('[data-testid=chart-plan]', 'aria-label'), /Pareto frontier has \d+ plans/);
  assert.ok(layout.parts.some((p) => /estimates/.test(p.text)), 'the chart says its step times are estimates');
  const rows = await page.$$('[data-testid=plan-row]');
  assert.ok(rows.length >= 2, `rows: ${rows.length}`);
  const ranks = await page.$$eval('[data-testid=plan-row]', (rs) => rs.map((r) => Number(r.dataset.rank)));
  assert.deepEqual(ranks.slice(0, 3), [1, 2, 3]);
  const knobs = await page.$$eval('[data-testid=plan-row]', (rs) => rs.map((r) => r.textContent));
  assert.ok(knobs.some((k) => /compiled \(layer\)/.test(k)), 'a compiled plan is listed');
  const heads = await page.$$eval('[data-testid=plan-table] thead th', (ths) => ths.map((t) => t.textContent));
  for (const h of ['Step time (estimate)', 'Tokens/s (estimate)', 'MFU (estimate)']) assert.ok(heads.includes(h), heads.join('|'));
  const why = await page.$$eval('[data-testid=plan-explanation] li', (lis) => lis.map((l) => l.textContent));
  assert.ok(why.length >= 3, why.join('\n'));
  assert.ok(why.some((s) => / instead of /.test(s)), why.join('\n'));
  assert.match(await page.textContent('[data-testid=plan-summary]'), /Search done: .*estimate \(analytical model, not measured\)/);
  assert.deepEqual(problems, []);
});

test("on Megatron the search tries the block method, and such a plan's row and link carry it as the CLI ranks it", async () => {
  const query = '?model=qwen2.5-0.5b&framework=megatron&attn=flash&gpus=8&seq=16384&gpu=h100-80gb';
  const { page, problems } = await openPlan(query);
  await search(page, 64);
  const rows = await page.$$eval('[data-testid=plan-row]', (rs) => rs.map((r) => ({ rank: Number(r.dataset.rank), query: r.dataset.query, text: r.textContent })));
  const block = rows.filter((r) => /first \d+ layers of each stage/.test(r.text));
  assert.ok(block.length > 0, rows.map((r) => r.text).join('\n'));
  for (const r of block) assert.match(r.query, /recompute=full.*recompute_layers=\d+|recompute_layers=\d+.*recompute=full/, r.query);
  // The CLI's own search over the same space ranks the same plans first.
  const csv = cli(['plan', '--model', 'qwen2.5-0.5b', '--framework', 'megatron', '--attn', 'flash', '--gpus', '8', '--seq', '16384', '--gpu', 'h100-80gb', '--global-batch', '64', '--csv', '--top', String(rows.length)]);
  const cliBlockRanks = csv.trim().split('\n').slice(1).map((l) => l.split(',')).filter((c) => Number(c[24]) > 0).map((c) => Number(c[0]));
  assert.deepEqual(block.map((r) => r.rank), cliBlockRanks);
  assert.deepEqual(problems, []);
});

test('where nothing fits, the planner searches again with the host-memory knobs open, as the CLI does', async () => {
  // Llama 3.2 3B in full on one RTX 4090: 51 GB of weights, gradients and AdamW states.
  const { page, problems } = await openPlan('?model=llama-3.2-3b&gpu=rtx-4090&seq=1024', { bypassCSP: true });
  await search(page, 4);
  await page.waitForSelector('[data-testid=plan-none]');
  assert.match(await page.textContent('[data-testid=plan-widen-hint]'), /CPU offload of the optimizer and parameters.*Activation offloading.*8-bit Adam/);
  assert.deepEqual(await axeViolations(page), []);
  await page.click('[data-testid=plan-widen]');
  await page.waitForSelector('[data-testid=plan-row]', { timeout: 120000 });
  for (const k of ['offload', 'act_offload', 'optim']) assert.equal(await page.isChecked(`[data-testid=plan-knob-${k}]`), true, k);
  assert.equal(await page.isChecked('[data-testid=plan-knob-finetune]'), false, 'what is trained stays as it was');
  assert.equal(await page.$('[data-testid=plan-widen]'), null, 'nothing left to open');
  const first = await page.$eval('[data-testid=plan-row][data-rank="1"]', (r) => r.dataset.query);
  const out = cli(['plan', '--model', 'llama-3.2-3b', '--gpu', 'rtx-4090', '--gpus', '1', '--seq', '1024', '--global-batch', '4', '--top', '1']);
  assert.equal(out.split('\n').find((l) => l.startsWith('plan 1: ?')).slice('plan 1: ?'.length), first);
  assert.deepEqual(problems, []);
});

test('a row\'s link opens exactly that plan, which fits', async () => {
  const { page, problems } = await openPlan(SMALL);
  await search(page, 32);
  const row = await page.$eval('[data-testid=plan-row][data-rank="2"]', (r) => ({ query: r.dataset.query, href: r.querySelector('a').href }));
  assert.ok(row.query.length > 0);
  const json = JSON.parse((await download(page, 'plan-export-json')).text);
  const plan2 = json.plans.find((p) => p.rank === 2);
  assert.equal(plan2.query, row.query);
  const { page: opened, problems: p2 } = await openPage(browser, row.href);
  await waitForApp(opened);
  // The page reads the link and writes back the same configuration.
  await opened.waitForFunction((q) => location.search === '?' + q, row.query);
  assert.equal(await opened.getAttribute('[data-testid=verdict]', 'data-fits'), 'true');
  // A plan's memory is the figure the verdict decides on: what nvidia-smi will show.
  assert.equal(await opened.getAttribute('[data-testid=nvidia-smi-bytes]', 'data-bytes'), String(plan2.memory));
  assert.equal(await opened.inputValue('#in-batch'), String(plan2.knobs.batch));
  assert.equal(await opened.inputValue('#in-tp'), String(plan2.knobs.tp));
  assert.deepEqual([...problems, ...p2], []);
});

test('the CSV and JSON downloads are the CLI\'s own for the same request', async () => {
  const { page, problems } = await openPlan(SMALL);
  await search(page, 32);
  const csv = await download(page, 'plan-export-csv');
  assert.equal(csv.name, 'trainmem-plan.csv');
  const args = ['plan', '--model', 'qwen2.5-0.5b', '--gpus', '8', '--seq', '1024', '--global-batch', '32', '--try-vpp', '1,2'];
  assert.equal(csv.text, cli([...args, '--csv']));
  const rows = await page.$$('[data-testid=plan-row]');
  assert.equal(csv.text.trim().split('\n').length - 1, rows.length);
  const json = await download(page, 'plan-export-json');
  assert.equal(json.name, 'trainmem-plan.json');
  const mine = JSON.parse(json.text);
  const theirs = JSON.parse(cli([...args, '--json']));
  delete mine.search_seconds;
  delete theirs.search_seconds;
  assert.deepEqual(mine, theirs);
  assert.match(mine.label, /estimate/);
  assert.deepEqual(problems, []);
});

test('a large search moves its progress in slices and stops on Cancel, keeping what it found', async () => {
  const { page, problems } = await openPlan('?model=llama-3.1-8b&gpus=64&seq=4096');
  for (const k of ['attn', 'optim', 'offload']) await page.check(`[data-testid=plan-knob-${k}]`);
  await page.fill('[data-testid=plan-global]', '1024');
  await page.click('[data-testid=plan-run]');
  // Progress is reported between slices: the test's own calls run while the search goes on.
  const seen = new Set();
  for (let i = 0; i < 200 && seen.size < 3; i++) {
    const s = await page.$eval('[data-testid=plan-progress]', (e) => e.dataset.settled).catch(() => null);
    if (s !== null) seen.add(s);
    await page.waitForTimeout(20);
  }
  assert.ok(seen.size >= 3, `progress values seen: ${[...seen].join(', ')}`);
  assert.equal(await page.isDisabled('[data-testid=plan-run]'), true);
  await page.click('[data-testid=plan-cancel]');
  await page.waitForSelector('[data-testid=plan-results]');
  const p = await page.$eval('[data-testid=plan-progress]', (e) => ({ ...e.dataset }));
  assert.equal(p.done, 'true');
  assert.ok(Number(p.settled) < Number(p.configurations), JSON.stringify(p));
  assert.match(await page.textContent('[data-testid=plan-summary]'), /Search cancelled/);
  assert.equal(await page.isDisabled('[data-testid=plan-run]'), false);
  assert.deepEqual(problems, []);
});

test('the verdict lists the cheapest changes that make it fit, and each applies and fits', async () => {
  const query = '?seq=16384&zero=3&gpus=8';
  const { page, problems } = await openPage(browser, server.base + query);
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-fits'), 'false');
  await page.waitForSelector('[data-testid=fixes] button');
  const fixes = await page.$$eval('[data-testid=fixes] button', (bs) => bs.map((b) => ({ text: b.textContent, key: b.dataset.key, value: b.dataset.value })));
  assert.ok(fixes.length >= 1 && fixes.length <= 3, JSON.stringify(fixes));
  for (const f of fixes) assert.match(f.text, /^.+: fits, \+[\d.,]+ [GKMT]i?B headroom, [+-±][\d.,]* ?%? step FLOPs, .* est\. step time/);
  for (let i = 0; i < fixes.length; i++) {
    const { page: p, problems: pp } = await openPage(browser, server.base + query);
    await p.waitForSelector(`[data-testid=fix-${i}]`);
    await p.click(`[data-testid=fix-${i}]`);
    await p.waitForSelector('[data-testid=verdict][data-fits=true]');
    await p.waitForFunction(([k, v]) => new URLSearchParams(location.search).get(k) === v, [fixes[i].key, fixes[i].value]);
    // Once it fits, no fix is offered.
    await p.waitForFunction(() => !document.querySelector('[data-testid=fixes]'));
    assert.deepEqual(pp, [], fixes[i].text);
  }
  assert.deepEqual(problems, []);
});

for (const scheme of ['light', 'dark']) {
  test(`axe finds no violation with the plan panel's results open (${scheme})`, async () => {
    const { page, problems } = await openPlan(SMALL, { colorScheme: scheme, bypassCSP: true });
    await search(page, 32);
    await page.waitForSelector('[data-testid=chart-plan][data-layout]');
    await page.click('.plan-assumptions summary');
    assert.deepEqual(await axeViolations(page), []);
    assert.deepEqual(problems, []);
  });
}

test('the benchmark hook runs the native benchmark\'s search by the page\'s clock', async () => {
  const { page } = await openPlan('');
  const r = JSON.parse(await page.evaluate(() => window.trainmemPlanBenchmark()));
  assert.ok(r.configurations >= 50000, JSON.stringify(r));
  assert.ok(r.search_ms > 0 && r.estimate_calls > 0 && r.plans > 0, JSON.stringify(r));
  console.log(`browser: 10^5-configuration search ${r.search_ms} ms (with ranked result ${r.search_and_result_ms} ms), ${r.estimate_calls} estimate() calls`);
});

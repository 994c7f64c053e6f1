// Framework config files (issue 28) in a real browser: pasting a torchtune YAML and a DeepSpeed
// JSON gives the key report and the same configuration (the share URL's query) and verdict as
// `trainmem import` and `trainmem estimate` on the same files; a file that cannot be read is named
// with its line and key while the others are still read; the frameworks module is loaded only
// when first used; a recipe sets its knobs and each can be changed after; the configuration on
// screen and the planner's top plan download as each framework's files, the CLI's own.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, mkdtempSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, before, after, serve, launch, openPage, waitForApp, settled, writeFile, ROOT } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch({ webgpu: false }); });
after(async () => { await browser?.close(); server?.close(); });

/** The native CLI's output (the binary `cargo build` writes, else `cargo run`). */
function cli(args) {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  return existsSync(bin)
    ? execFileSync(bin, args, { encoding: 'utf8', maxBuffer: 64 << 20 })
    : execFileSync('cargo', ['run', '-q', '--', ...args], { cwd: ROOT, encoding: 'utf8', maxBuffer: 64 << 20 });
}

/** A query as the CLI's `--KEY VALUE` arguments. */
const argsOf = (query) => [...new URLSearchParams(query)].flatMap(([k, v]) => [`--${k}`, v]);

const FIXTURES = join(ROOT, 'tests', 'fixtures', 'frameworks');
const TUNE = readFileSync(join(FIXTURES, 'torchtune', 'llama3_1_8B_full.yaml'), 'utf8');
const DS = readFileSync(join(FIXTURES, 'deepspeed', 'ds_config_zero3.json'), 'utf8');

async function openFrameworks(query = '') {
  const opened = await openPage(browser, server.base + query);
  await opened.page.waitForSelector('[data-testid=frameworks]');
  await opened.page.click('[data-testid=frameworks] > summary');
  return opened;
}

/** Pastes `files` ([name, text]) into the panel, one slot each. */
async function paste(page, files) {
  for (let i = 0; i < files.length; i++) {
    if (i > 0) await page.click('[data-testid=fw-add]');
    const slots = await page.$$('[data-testid^=fw-file-]');
    const id = (await slots[i].getAttribute('data-testid')).replace('fw-file-', '');
    await page.fill(`[data-testid=fw-name-${id}]`, files[i][0]);
    await page.fill(`[data-testid=fw-text-${id}]`, files[i][1]);
  }
}

async function download(page, testid) {
  const [d] = await Promise.all([page.waitForEvent('download'), page.click(`[data-testid=${testid}]`)]);
  return { name: d.suggestedFilename(), text: readFileSync(await d.path(), 'utf8') };
}

test('a torchtune YAML and a DeepSpeed JSON give the key report, and the CLI\'s configuration and verdict', async () => {
  const { page, requests, problems } = await openFrameworks();
  assert.ok(!requests.some((r) => r.includes('trainmem-frameworks')), 'the frameworks module is not loaded before it is used');
  await paste(page, [['llama3_1_8B_full.yaml', TUNE], ['ds_config_zero3.json', DS]]);
  await page.click('[data-testid=fw-import]');
  await page.waitForSelector('[data-testid=fw-report]', { timeout: 60000 });
  assert.ok(requests.some((r) => /trainmem-frameworks-[0-9a-f]{16}_bg\.wasm$/.test(r)), 'the module was loaded to import');
  // The CLI on the same files.
  const dir = mkdtempSync(join(tmpdir(), 'trainmem-fw-'));
  const files = [writeFile(dir, 'llama3_1_8B_full.yaml', TUNE), writeFile(dir, 'ds_config_zero3.json', DS)];
  const imported = JSON.parse(cli(['import', ...files, '--json']));
  await page.waitForFunction((q) => location.search === (q ? '?' + q : ''), imported.query);
  // The report: one row per key of each file, with the CLI's status, line and what it set.
  const rows = await page.$$eval('[data-testid=fw-report] tbody tr', (trs) => trs.map((tr) => ({
    status: tr.dataset.status, key: tr.dataset.key, cells: [...tr.cells].map((c) => c.textContent),
  })));
  assert.equal(rows.length, imported.keys.length);
  for (let i = 0; i < rows.length; i++) {
    const k = imported.keys[i];
    assert.equal(rows[i].status, k.status, k.key);
    assert.equal(rows[i].key, k.key);
    assert.equal(rows[i].cells[3], k.set, k.key);
  }
  const statuses = new Set(rows.map((r) => r.status));
  for (const s of ['understood', 'ignored']) assert.ok(statuses.has(s), `some key is ${s}: ${[...statuses]}`);
  const zero = rows.find((r) => r.key === 'zero_optimization.stage');
  assert.ok(zero && /zero=3/.test(zero.cells[3]) && /ds_config_zero3\.json:\d+/.test(zero.cells[1]), JSON.stringify(zero));
  assert.match(await page.textContent('[data-testid=fw-status]'), /Imported llama3_1_8B_full\.yaml \(torchtune\), ds_config_zero3\.json \(deepspeed\)/);
  // The verdict is the CLI's for that configuration.
  await settled(page);
  const estimate = JSON.parse(cli(['estimate', ...argsOf(imported.query), '--json']));
  assert.equal(estimate.query, imported.query);
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-fits'), String(estimate.fits));
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-headroom'), String(estimate.headroom));
  assert.equal(await page.inputValue('#in-zero'), '3');
  assert.deepEqual(problems, []);
});

test('a file that cannot be read is named with its line and key, and the other files are still read', async () => {
  const { page, problems } = await openFrameworks('?model=qwen2.5-7b&seq=2048');
  const broken = 'model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\nbatch_size: [2,\n';
  await paste(page, [['broken.yaml', broken], ['ds_config_zero3.json', DS]]);
  await page.click('[data-testid=fw-import]');
  await page.waitForSelector('[data-testid=fw-errors]', { timeout: 60000 });
  const errors = await page.textContent('[data-testid=fw-errors]');
  assert.match(errors, /broken\.yaml, line \d+/);
  assert.match(await page.textContent('[data-testid=fw-status]'), /Left out: broken\.yaml/);
  const expected = JSON.parse(cli(['import', writeFile(mkdtempSync(join(tmpdir(), 'trainmem-fw-')), 'ds_config_zero3.json', DS), '--json']));
  await page.waitForFunction((q) => location.search === (q ? '?' + q : ''), expected.query);
  // What was pasted stays to be fixed.
  assert.equal(await page.inputValue('[data-testid^=fw-text-] >> nth=0'), broken);
  // A file with nothing readable changes nothing.
  const before = await page.evaluate(() => location.search);
  await page.click('[data-testid^=fw-remove-] >> nth=1');
  await page.click('[data-testid=fw-import]');
  await page.waitForFunction(() => /Nothing imported/.test(document.querySelector('[data-testid=fw-status]').textContent));
  assert.equal(await page.evaluate(() => location.search), before);
  assert.deepEqual(problems, []);
});

test('a recipe sets its knobs, each can be changed after, and the configuration downloads as each framework\'s files', async () => {
  const { page, problems } = await openFrameworks();
  await page.selectOption('[data-testid=fw-recipe]', 'torchtune-llama3.1-8b-qlora-single-device');
  await page.waitForFunction(() => location.search.includes('finetune=qlora'));
  assert.match(await page.textContent('[data-testid=fw-recipe-source]'), /The configuration is this recipe: .*torchtune/);
  await page.fill('#in-batch', '3');
  await page.waitForFunction(() => location.search.includes('batch=3'));
  assert.match(await page.textContent('[data-testid=fw-recipe-source]'), /Changed since choosing this recipe/);
  const query = (await page.evaluate(() => location.search)).slice(1);
  for (const format of ['torchtune', 'torchtitan', 'megatron']) {
    const file = await download(page, `fw-export-${format}`);
    assert.equal(file.text, cli(['export', '--format', format, ...argsOf(query)]), format);
  }
  // accelerate + DeepSpeed is a pair of files.
  const names = [];
  page.on('download', (d) => names.push(d.suggestedFilename()));
  await page.click('[data-testid=fw-export-accelerate-deepspeed]');
  await page.waitForFunction(() => /accelerate_config\.yaml and ds_config\.json/.test(document.querySelector('[data-testid=fw-export-status]').textContent));
  for (let i = 0; i < 50 && names.length < 2; i++) await page.waitForTimeout(100);
  assert.deepEqual(names.sort(), ['accelerate_config.yaml', 'ds_config.json']);
  assert.deepEqual(problems, []);
});

test('the planner\'s top plan downloads as each framework\'s files', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=qwen2.5-0.5b&gpus=8&seq=1024');
  // The planner is in the later panels' module: its button loads it.
  await page.click('[data-testid=plan-open]');
  await page.waitForSelector('[data-testid=plan-run]');
  await page.fill('[data-testid=plan-global]', '32');
  await page.click('[data-testid=plan-run]');
  await page.waitForSelector('[data-testid=plan-results]', { timeout: 120000 });
  const query = await page.$eval('[data-testid=plan-row][data-rank="1"]', (r) => r.dataset.query);
  for (const format of ['torchtune', 'torchtitan', 'megatron']) {
    const file = await download(page, `plan-export-top-${format}`);
    assert.equal(file.text, cli(['export', '--format', format, ...argsOf(query)]), format);
    assert.match(file.text, /trainmem: \?/);
  }
  assert.deepEqual(problems, []);
});

// "Verify on your GPU" in the page: the script downloads for the configuration on screen, a
// configuration it cannot reproduce is refused by key, and the JSON a run writes (a committed
// CPU measurement) pasted back is compared row by row with the page's own estimate; the step
// timeline draws the op-level step with the caching allocator's reserved memory.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, before, after, serve, launch, openPage, axeViolations, ROOT } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch(); });
after(async () => { await browser?.close(); server?.close(); });

test('the verify script downloads for the configuration on screen, and a multi-GPU one is refused by its key', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=gpt2&seq=128&precision=amp-bf16');
  await page.click('[data-panel=verify] > summary');
  const [d] = await Promise.all([page.waitForEvent('download'), page.click('[data-testid=verify-download]')]);
  assert.equal(d.suggestedFilename(), 'trainmem-verify.py');
  const script = readFileSync(await d.path(), 'utf8');
  assert.ok(script.startsWith('#!/usr/bin/env python3'), script.slice(0, 40));
  assert.match(script, /"model_type": "gpt2"/);
  assert.match(script, /"seq": 128/);
  // One process on one device: eight GPUs cannot be reproduced, and the page says which key.
  const { page: p2 } = await openPage(browser, server.base + '?model=gpt2&gpus=8');
  await p2.click('[data-panel=verify] > summary');
  await p2.click('[data-testid=verify-download]');
  await p2.waitForFunction(() => document.querySelector('[data-testid=verify-problem]').textContent.includes('gpus'));
  assert.deepEqual(problems, []);
});

test('a run\'s JSON pasted back is compared row by row, and a bad paste is named', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=gpt2', { bypassCSP: true });
  await page.click('[data-panel=verify] > summary');
  const record = readFileSync(join(ROOT, 'tests/fixtures/verify/gpt2-ampbf16-sdpa.cpu.json'), 'utf8');
  await page.fill('#verify-json', record);
  await page.click('[data-testid=verify-compare]');
  await page.waitForSelector('[data-testid=verify-table]');
  const rows = await page.$$eval('[data-testid=verify-table] tbody tr', (trs) => trs.map((tr) => ({
    field: tr.dataset.field,
    measured: tr.children[1].dataset.bytes,
    predicted: tr.children[2].dataset.bytes,
  })));
  // Every field of the JSON (src/verify/mod.rs FIELDS): the step's five, the two reserved peaks,
  // nvidia-smi, the loading's two and the offloaded host bytes; a version-1 record leaves the
  // loading and reserved ones unmeasured.
  assert.equal(rows.length, 11);
  // The CPU measurement: every tracked field equals the page's prediction to the byte.
  for (const r of rows.filter((r) => r.measured)) assert.equal(r.predicted, r.measured, r.field);
  assert.match(await page.textContent('[data-testid=verify-verdict]'), /within/);
  assert.deepEqual(await axeViolations(page, '[data-panel=verify]'), []);
  await page.fill('#verify-json', '{"not": "a record"}');
  await page.click('[data-testid=verify-compare]');
  await page.waitForFunction(() => document.querySelector('[data-testid=verify-problem]').textContent.startsWith('Cannot compare'));
  assert.equal(await page.$('[data-testid=verify-table]'), null);
  assert.deepEqual(problems, []);
});

test('the step timeline draws the step op by op with reserved memory and names the peak op', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=llama-3.2-1b&seq=2048');
  await page.click('[data-testid=chart-tab-timeline]');
  await page.waitForSelector('[data-testid=chart-timeline][data-layout]');
  const label = await page.getAttribute('[data-testid=chart-timeline]', 'aria-label');
  // "Peak 24.56 GB allocated at backward, `(root)` _log_softmax_backward_data …; 25.1 GB reserved".
  assert.match(label, /allocated at (layer \d+ )?(forward|loss|backward), /, label);
  assert.match(label, /reserved/);
  assert.deepEqual(problems, []);
});

// Accessibility: axe-core (injected into the page) finds no violation on the full page in the
// light, dark and projector themes, nor on an embed; the theme switch cycles through all four.
import assert from 'node:assert/strict';
import { test, before, after, serve, launch, openPage, axeViolations } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch(); });
after(async () => { await browser?.close(); server?.close(); });

async function settled(page) {
  await page.waitForFunction(() => document.querySelector('[data-testid=bar-canvas]')?.dataset.layout && document.querySelector('[data-testid^=chart-][data-layout]'));
}

for (const [name, query, scheme] of [
  ['the full page in light', '', 'light'],
  ['the full page in dark', '', 'dark'],
  ['the full page in the projector theme', '?theme=projector', 'light'],
  ['a page with notices and an open formula', '?model=gpt2&zero=banana&gpus=8', 'light'],
]) {
  test(`axe finds no violation on ${name}`, async () => {
    const { page, problems } = await openPage(browser, server.base + query, { colorScheme: scheme, bypassCSP: true });
    await settled(page);
    if (query.includes('banana')) {
      await page.click('[data-testid=ledger] li.row summary');
      await page.waitForSelector('[data-testid=ledger] .formula');
    }
    assert.deepEqual(await axeViolations(page), []);
    assert.deepEqual(problems, []);
  });
}

test('axe finds no violation on an embed, light and dark', async () => {
  for (const scheme of ['light', 'dark']) {
    const { page } = await openPage(browser, server.base + '?model=qwen2.5-7b&embed=1&view=seq', { colorScheme: scheme, bypassCSP: true });
    await page.waitForSelector('[data-testid=chart-seq][data-layout]');
    assert.deepEqual(await axeViolations(page), [], scheme);
  }
});

test('the theme button cycles auto, light, dark and projector, and a link can set it', async () => {
  const { page } = await openPage(browser, server.base);
  const theme = () => page.evaluate(() => document.documentElement.dataset.theme);
  assert.equal(await theme(), 'auto');
  const seen = [];
  for (let i = 0; i < 4; i++) {
    await page.click('[data-testid=theme]');
    seen.push(await theme());
  }
  assert.deepEqual(seen, ['light', 'dark', 'projector', 'auto']);
  const { page: projector } = await openPage(browser, server.base + '?theme=projector');
  assert.equal(await projector.evaluate(() => document.documentElement.dataset.theme), 'projector');
  const size = await projector.evaluate(() => parseFloat(getComputedStyle(document.documentElement).fontSize));
  assert.ok(size >= 18, `projector type is ${size} px`);
  assert.match(projector.url(), /theme=projector/);
});

test('axe finds no violation on a phone-width page with its pinned verdict, nor on an embed with a notice, light and dark', async () => {
  for (const scheme of ['light', 'dark']) {
    const { page } = await openPage(browser, server.base + '?finetune=lora&gpu=a100-80gb&seq=8800', { colorScheme: scheme, bypassCSP: true, viewport: { width: 390, height: 844 } });
    await settled(page);
    await page.waitForSelector('[data-testid=verdict-pin]');
    assert.deepEqual(await axeViolations(page), [], `phone, ${scheme}`);
    const { page: embed } = await openPage(browser, server.base + '?model=gpt2&seq=1024&embed=1&theme=neon&hide=nonsense', { colorScheme: scheme, bypassCSP: true });
    await embed.waitForSelector('[data-testid=notice]');
    assert.deepEqual(await axeViolations(embed), [], `embed with a notice, ${scheme}`);
  }
});

test('axe finds no violation on the serving view (its fixes and an open budget row) and its embed, light and dark', async () => {
  for (const scheme of ['light', 'dark']) {
    const { page, problems } = await openPage(browser, null, { colorScheme: scheme, bypassCSP: true });
    await page.goto(server.base + '?mode=serve&model=llama-3.1-70b&gpus=4&tp=4&context=32768&concurrency=24');
    await page.waitForSelector('[data-testid=serve-fixes]');
    await page.waitForSelector('[data-testid=chart-serve-kv][data-layout]');
    await page.waitForSelector('[data-testid=chart-serve-concurrency][data-layout]');
    await page.click('[data-testid=serve-rows] li.row summary');
    assert.deepEqual(await axeViolations(page), [], `serving, ${scheme}`);
    const { page: embed } = await openPage(browser, null, { colorScheme: scheme, bypassCSP: true });
    await embed.goto(server.base + '?model=gemma-3-27b-it&embed=1&view=serve');
    await embed.waitForSelector('[data-testid=chart-serve-kv][data-layout]');
    assert.deepEqual(await axeViolations(embed), [], `serving embed, ${scheme}`);
    assert.deepEqual(problems, []);
  }
});

test('axe finds no violation on the framework files panel with a key report, light and dark', async () => {
  const ds = '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 2, "wall_clock_breakdown": false}';
  for (const scheme of ['light', 'dark']) {
    const { page } = await openPage(browser, server.base, { colorScheme: scheme, bypassCSP: true });
    await page.click('[data-testid=frameworks] > summary');
    await page.fill('[data-testid=fw-text-0]', ds);
    await page.click('[data-testid=fw-import]');
    await page.waitForSelector('[data-testid=fw-report]', { timeout: 60000 });
    await settled(page);
    assert.deepEqual(await axeViolations(page), [], scheme);
  }
});

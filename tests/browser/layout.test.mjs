// Layout in a real browser: legends and notes that never overlap each other or the data, at
// phone, tablet and desktop widths; canvases drawn at the device's pixel ratio; an embed that
// reports its content's height, so a frame given too much room shrinks to it.
import assert from 'node:assert/strict';
import { test, before, after, serve, launch, openPage, canvasLayout, writeFile, SUBPATH } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch(); });
after(async () => { await browser?.close(); server?.close(); });

const KINDS = ['seq', 'params', 'batch', 'gpus', 'timeline'];
const overlap = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];

/** Checks one canvas' layout: boxes inside the drawing, pairwise apart, clear of the plot area
 *  (for the header's parts), and each text at least as wide as the browser draws it. */
async function checkLayout(page, testid, where) {
  await page.waitForFunction((id) => document.querySelector(`[data-testid=${id}]`)?.dataset.layout, testid);
  const { layout, box } = await canvasLayout(page, testid);
  assert.ok(Math.abs(layout.w - box.width) <= 1, `${where} ${testid}: drawn ${layout.w} px wide in a ${box.width} px canvas`);
  const parts = layout.parts;
  assert.ok(parts.some((p) => p.part === 'legend'), `${where} ${testid}: has a legend`);
  // The browser's own text widths, in the chart's font.
  const widths = await page.evaluate((ps) => {
    const ctx = document.createElement('canvas').getContext('2d');
    return ps.map((p) => { ctx.font = `${p.bold ? 'bold ' : ''}${p.size}px sans-serif`; return ctx.measureText(p.text).width; });
  }, parts);
  for (const [i, p] of parts.entries()) {
    const [x0, y0, x1, y1] = p.box;
    assert.ok(x0 >= 0 && y0 >= 0 && x1 <= layout.w && y1 <= layout.h, `${where} ${testid}: '${p.text}' leaves the canvas ${p.box}`);
    if (p.part !== 'label') assert.ok(!overlap(p.box, layout.plot), `${where} ${testid}: '${p.text}' covers the plot area`);
    // A one-line text fits its box as the browser draws it (a wrapped entry's lines are shorter).
    const oneLine = y1 - y0 <= p.size * 1.8;
    if (oneLine) assert.ok(x1 - p.text_x >= widths[i] - 1, `${where} ${testid}: '${p.text}' is ${widths[i].toFixed(1)} px wide in a ${x1 - p.text_x} px box`);
    for (const q of parts.slice(i + 1)) assert.ok(!overlap(p.box, q.box), `${where} ${testid}: '${p.text}' overlaps '${q.text}'`);
  }
}

for (const width of [390, 700, 1400]) {
  test(`legends and notes do not overlap each other or the data at ${width} px`, async () => {
    const { page, problems } = await openPage(browser, server.base + '?model=llama-3.1-70b&gpus=8&zero=3&seq=8192', { viewport: { width, height: 900 } });
    await checkLayout(page, 'bar-canvas', `${width}px`);
    for (const kind of KINDS) {
      await page.click(`[data-testid=chart-tab-${kind}]`);
      await page.waitForFunction((k) => document.querySelector(`[data-testid=chart-${k}]`)?.dataset.layout, kind);
      await checkLayout(page, `chart-${kind}`, `${width}px`);
    }
    assert.deepEqual(problems, []);
  });
}

test('the capacity label sits beside the stacked bar, not on it, at 700 px', async () => {
  const { page } = await openPage(browser, server.base + '?model=llama-3.1-8b&gpus=8&zero=3', { viewport: { width: 700, height: 900 } });
  await page.waitForFunction(() => document.querySelector('[data-testid=bar-canvas]')?.dataset.layout);
  const { layout } = await canvasLayout(page, 'bar-canvas');
  const capacity = layout.parts.find((p) => p.part === 'note');
  assert.ok(capacity && /capacity|GB|GiB/.test(capacity.text), JSON.stringify(layout.parts));
  assert.ok(!overlap(capacity.box, layout.plot), `capacity label ${capacity.box} on the bar ${layout.plot}`);
  const legend = layout.parts.filter((p) => p.part === 'legend').map((p) => p.text);
  for (const name of ['Parameters', 'Optimizer states', 'Activations', 'Framework overhead']) assert.ok(legend.includes(name), `${name} in ${legend}`);
});

test('canvases hold device pixels: twice the CSS size on a 2x screen', async () => {
  const { page } = await openPage(browser, server.base, { viewport: { width: 900, height: 900 }, deviceScaleFactor: 2 });
  for (const id of ['bar-canvas', 'chart-seq']) {
    await page.waitForFunction((i) => document.querySelector(`[data-testid=${i}]`)?.dataset.layout, id);
    const { box, backing } = await canvasLayout(page, id);
    assert.equal(backing.width, Math.round(box.width * 2), `${id} width`);
    assert.equal(backing.height, Math.round(box.height * 2), `${id} height`);
  }
});

test('the embed frame shrinks from 600 px to its content and grows back', async () => {
  const host = `<!doctype html><title>course</title><link rel="icon" href="data:,">
<iframe id="f" title="trainmem" src="${SUBPATH}?model=gpt2&embed=1" style="width:600px;height:600px;border:0"></iframe>
<script>window.heights = []; window.addEventListener("message", (e) => { if (e.data && e.data.type === "trainmem:height") { window.heights.push(e.data.height); document.getElementById("f").style.height = e.data.height + "px"; } });</script>`;
  writeFile(server.webroot, 'shrink.html', host);
  const { page, problems } = await openPage(browser, null);
  await page.goto(server.origin + '/shrink.html');
  await page.waitForFunction(() => window.heights.length > 0, null, { timeout: 30000 });
  const frame = page.frame({ url: /embed=1/ });
  await frame.waitForSelector('[data-testid=bar-canvas][data-layout]');
  await page.waitForTimeout(300);
  const content = await frame.$eval('[data-testid=embed]', (m) => m.getBoundingClientRect().height);
  const shrunk = await page.$eval('#f', (f) => f.getBoundingClientRect().height);
  assert.ok(content < 560, `embed content is ${content} px`);
  assert.ok(Math.abs(shrunk - content) <= 2, `frame ${shrunk} px for ${content} px of content`);
  // More content (a longer model list in the ledger): the frame grows with it.
  await frame.evaluate(() => { const p = document.createElement('p'); p.style.height = '300px'; p.textContent = 'more'; document.querySelector('[data-testid=embed]').append(p); });
  await page.waitForFunction((h) => window.heights.at(-1) > h + 250, shrunk);
  const grown = await page.$eval('#f', (f) => f.getBoundingClientRect().height);
  assert.ok(grown > shrunk + 250, `frame grew to ${grown} px`);
  assert.deepEqual(problems, []);
});

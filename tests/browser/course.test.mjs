// Course mode in a real browser (docs/embed.md). The app is served from one origin; course host
// pages from others (separate static servers on other ports), as an LMS or a textbook would
// frame it. Checks: a host without any script (sandboxed) gets a usable frame that fits or
// scrolls; a host with the documented script resizes the frame both ways and drives it with
// setState/setTheme from allowed origins only; hide= and lock=; predict-then-reveal; the
// built-in exercises and "make this an exercise"; compare; print media; snapshots; axe-core.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { test, before, after, serve, launch, openPage, axeViolations, waitForApp, ROOT } from './harness.mjs';
import { startServer } from './static-server.mjs';

let app;
let host;
let other;
let browser;
let hostRoot;
let otherRoot;

// The resize listener of docs/embed.md (and of the "Web page" snippet), verbatim.
const RESIZE_SCRIPT = `<script>
addEventListener("message", (e) => {
  const m = e.data;
  if (!m || m.source !== "trainmem" || m.version !== 1 || m.type !== "resize") return;
  for (const f of document.querySelectorAll("iframe")) {
    if (f.contentWindow === e.source) f.style.height = Math.ceil(m.height) + "px";
  }
});
</script>`;

before(async () => {
  app = await serve();
  hostRoot = mkdtempSync(join(tmpdir(), 'trainmem-host-'));
  otherRoot = mkdtempSync(join(tmpdir(), 'trainmem-other-'));
  host = await startServer({ root: hostRoot });
  other = await startServer({ root: otherRoot });
  browser = await launch({ webgpu: false });
});
after(async () => {
  await browser?.close();
  app?.close();
  await host?.close();
  await other?.close();
});

const page = (root, name, html) => writeFileSync(join(root, name), html);
const frameOf = async (p) => {
  const handle = await p.waitForSelector('#f');
  const f = await handle.contentFrame();
  await waitForApp(f);
  return f;
};

test('a host without any script, sandboxed as Canvas allows: the frame is usable, scrolls inside and links to the full page', async () => {
  assert.notEqual(new URL(host.origin).port, new URL(app.origin).port);
  page(hostRoot, 'plain.html', `<!doctype html><html lang="en"><title>LMS page</title><link rel="icon" href="data:,">
<h1>Week 3</h1>
<iframe id="f" src="${app.base}?model=qwen2.5-7b&amp;embed=1&amp;sections=inputs,verdict,ledger" title="trainmem" width="100%" height="480" frameborder="0" scrolling="auto" sandbox="allow-scripts allow-same-origin"></iframe>
<iframe id="g" src="${app.base}?model=gpt2&amp;embed=1" title="trainmem small" width="100%" height="480" frameborder="0" sandbox="allow-scripts allow-same-origin"></iframe>`);
  const { page: p, problems } = await openPage(browser, null, { viewport: { width: 900, height: 900 } });
  await p.goto(host.origin + '/plain.html');
  const f = await frameOf(p);
  // Nothing resized it: it keeps the instructor's height.
  assert.equal(Math.round(await p.$eval('#f', (el) => el.getBoundingClientRect().height)), 480);
  // More content than room: it scrolls inside (not clipped).
  const s = await f.evaluate(() => {
    const d = document.scrollingElement;
    return { scroll: d.scrollHeight, client: d.clientHeight, overflow: getComputedStyle(d).overflowY };
  });
  assert.ok(s.scroll > s.client, `content ${s.scroll} px in ${s.client} px`);
  assert.notEqual(s.overflow, 'hidden');
  await f.evaluate(() => window.scrollTo(0, 300));
  assert.ok((await f.evaluate(() => window.scrollY)) > 0, 'the frame scrolls');
  // The link to the full page stays in view while scrolling, without embed=1.
  const link = await f.$eval('[data-testid=open-full]', (a) => { const r = a.getBoundingClientRect(); return { href: a.href, top: r.top, bottom: r.bottom, h: innerHeight }; });
  assert.ok(link.bottom <= link.h + 1 && link.top >= 0, `open link at ${link.top}..${link.bottom} of ${link.h}`);
  assert.match(link.href, /model=qwen2\.5-7b/);
  assert.doesNotMatch(link.href, /embed=1/);
  // Usable: an input edited in the sandboxed frame changes the verdict.
  const before = await f.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  await f.fill('#in-batch', '4');
  await f.waitForFunction((b) => document.querySelector('[data-testid=peak-bytes]').dataset.bytes !== b, before);
  // A small embed fits in its default height (no scrolling needed).
  const g = await (await p.$('#g')).contentFrame();
  await waitForApp(g);
  await g.waitForSelector('[data-testid=bar-canvas][data-layout]');
  const fit = await g.evaluate(() => document.querySelector('[data-testid=embed]').getBoundingClientRect().height);
  assert.ok(fit <= 480, `gpt2's embed is ${fit} px`);
  assert.deepEqual(problems, []);
});

test('a host with the documented script: the frame resizes both ways; setState and setTheme apply from allowed origins only', async () => {
  // A third origin, in a frame of the host page, tries to drive trainmem.
  page(otherRoot, 'evil.html', `<!doctype html><title>x</title><script>
addEventListener("message", (e) => { if (e.data === "go") parent.frames[0].postMessage({ type: "setState", state: e.data === "go" ? "model=gpt2&batch=16" : "" }, "*"); });
</script>`);
  const src = (extra) => `${app.base}?model=gpt2&embed=1${extra}`;
  const hostPage = (extra) => `<!doctype html><html lang="en"><title>course</title><link rel="icon" href="data:,">
<iframe id="f" src="${src(extra)}" title="trainmem" width="100%" height="900" style="border:0"></iframe>
<iframe id="evil" src="${other.origin}/evil.html" title="other" width="10" height="10"></iframe>
${RESIZE_SCRIPT}
<script>window.got = []; addEventListener("message", (e) => { if (e.data && e.data.source === "trainmem") window.got.push(e.data); });</script>`;
  page(hostRoot, 'script.html', hostPage(''));
  const { page: p, problems } = await openPage(browser, null, { viewport: { width: 900, height: 900 } });
  await p.goto(host.origin + '/script.html');
  const f = await frameOf(p);
  await p.waitForFunction(() => window.got.some((m) => m.type === 'ready') && window.got.some((m) => m.type === 'resize'));
  const ready = await p.evaluate(() => window.got.find((m) => m.type === 'ready'));
  assert.equal(ready.version, 1);
  assert.match(ready.state, /model=gpt2/);
  // Shrinks from 900 px to its content…
  await f.waitForSelector('[data-testid=bar-canvas][data-layout]');
  await p.waitForTimeout(300);
  const content = await f.$eval('[data-testid=embed]', (m) => m.getBoundingClientRect().height);
  const shrunk = await p.$eval('#f', (el) => el.getBoundingClientRect().height);
  assert.ok(shrunk < 880 && Math.abs(shrunk - content) <= 2, `frame ${shrunk} px for ${content} px of content`);
  // …and grows with it.
  await f.evaluate(() => { const d = document.createElement('p'); d.style.height = '400px'; d.textContent = 'more'; document.querySelector('[data-testid=embed]').append(d); });
  await p.waitForFunction((h) => document.getElementById('f').getBoundingClientRect().height > h + 350, shrunk);

  // setState from the parent's own origin (the page that framed it) applies, and comes back as a change.
  const peak = await f.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  await p.evaluate(() => document.getElementById('f').contentWindow.postMessage({ type: 'setState', state: 'model=gpt2&batch=4' }, '*'));
  await f.waitForFunction((b) => document.querySelector('[data-testid=peak-bytes]').dataset.bytes !== b, peak);
  await p.waitForFunction(() => window.got.some((m) => m.type === 'change' && /batch=4/.test(m.state)));
  const change = await p.evaluate(() => window.got.find((m) => m.type === 'change'));
  assert.equal(typeof change.peak_bytes, 'number');
  // setTheme too.
  await p.evaluate(() => document.getElementById('f').contentWindow.postMessage({ type: 'setTheme', theme: 'projector' }, '*'));
  await f.waitForFunction(() => document.documentElement.dataset.theme === 'projector');

  // The same message from another origin is ignored.
  const peak4 = await f.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  await p.evaluate(() => document.getElementById('evil').contentWindow.postMessage('go', '*'));
  await p.waitForTimeout(700);
  assert.equal(await f.getAttribute('[data-testid=peak-bytes]', 'data-bytes'), peak4);

  // Unless allow_origin= lists that origin.
  page(hostRoot, 'allowed.html', hostPage(`&allow_origin=${encodeURIComponent(other.origin)}`));
  await p.goto(host.origin + '/allowed.html');
  const f2 = await frameOf(p);
  const peak1 = await f2.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  await p.waitForFunction(() => window.got.some((m) => m.type === 'ready'));
  await p.evaluate(() => document.getElementById('evil').contentWindow.postMessage('go', '*'));
  await f2.waitForFunction((b) => document.querySelector('[data-testid=peak-bytes]').dataset.bytes !== b, peak1);
  assert.deepEqual(problems, []);
});

test('hide= and lock= take effect, sections= orders an embed, and a bad value is named in the notice', async () => {
  const { page: p, problems } = await openPage(browser, app.base + '?model=gpt2&hide=charts,textbook,share,nonsense&lock=seq,zero,model');
  await p.waitForTimeout(300);
  assert.equal(await p.$('[data-panel=charts]'), null);
  assert.equal(await p.$('[data-panel=textbook]'), null);
  assert.ok(await p.$('[data-panel=ledger]'));
  assert.equal(await p.isVisible('[data-testid=copy-link]'), false);
  assert.equal(await p.isVisible('[data-testid=embed-button]'), false);
  // The notice names the key and the value.
  const notice = await p.textContent('[data-testid=notice]');
  assert.match(notice, /hide/);
  assert.match(notice, /nonsense/);
  // Locked keys are shown read-only and cannot be changed.
  assert.equal(await p.getAttribute('#in-seq', 'readonly'), '');
  assert.equal(await p.isDisabled('#in-zero'), true);
  assert.equal(await p.isDisabled('[data-testid=model-select]'), true);
  assert.equal(await p.isEditable('#in-batch'), true);
  await p.evaluate(() => { const i = document.getElementById('in-seq'); i.value = '512'; i.dispatchEvent(new Event('input', { bubbles: true })); });
  await p.waitForTimeout(200);
  assert.doesNotMatch(p.url(), /seq=512/);
  await p.fill('#in-batch', '3');
  await p.waitForFunction(() => location.search.includes('batch=3'));
  // The course settings stay in the address.
  assert.match(p.url(), /lock=seq%2Czero%2Cmodel|lock=seq,zero,model/);
  // sections= picks and orders an embed's panels.
  const { page: e } = await openPage(browser, app.base + '?model=gpt2&embed=1&sections=ledger,verdict');
  const order = await e.$$eval('[data-panel]', (els) => els.map((el) => el.dataset.panel));
  assert.deepEqual(order, ['ledger', 'verdict']);
  // On the full page too: no inputs listed, no form, one column.
  const { page: full } = await openPage(browser, app.base + '?model=gpt2&sections=ledger,verdict,exercises');
  await full.waitForSelector('[data-testid=exercises]');
  assert.equal(await full.$('form.inputs'), null);
  assert.deepEqual(await full.$$eval('main [data-panel]', (els) => els.map((el) => el.dataset.panel)), ['ledger', 'verdict', 'answers', 'exercises']);
  assert.deepEqual(problems, []);
});

const SIXTEEN = ['weights', 'gradients', 'master_weights', 'optimizer_states'];

test('a quiz hides the answer until a guess, then checks it and shows the answer, the error and the formulas', async () => {
  const q = `?model=llama-2-13b&quiz=1&ask=${encodeURIComponent('row:' + SIXTEEN.join('+'))}&tol=2&question=${encodeURIComponent('How many bytes are 16 Psi?')}`;
  const { page: p, problems } = await openPage(browser, app.base + q);
  await p.waitForSelector('[data-testid=ex-question]');
  assert.equal(await p.textContent('[data-testid=ex-question]'), 'How many bytes are 16 Psi?');
  assert.equal(await p.evaluate(() => document.documentElement.dataset.quiz), 'hidden');
  const hidden = (sel) => p.$eval(sel, (el) => getComputedStyle(el).visibility === 'hidden');
  assert.ok(await hidden('[data-panel=verdict] .headline'), 'the verdict is hidden');
  assert.ok(await hidden('[data-testid=peak-bytes]'), 'the peak is hidden');
  await p.waitForSelector('[data-testid=ledger] li.row[data-row=weights]');
  assert.ok(await hidden('[data-testid=ledger] li.row[data-row=weights] .bytes'), 'the chosen row is hidden');
  // The answer key is the page's own ledger: the four rows' bytes.
  const key = await p.$$eval('[data-testid=ledger] > li.row', (rows, ids) => rows.filter((r) => ids.includes(r.dataset.row)).reduce((s, r) => s + BigInt(r.querySelector('.bytes').dataset.bytes), 0n).toString(), SIXTEEN);
  // A guess 50 % off is wrong…
  await p.fill('[data-testid=ex-guess]', String(Number(key) * 1.5));
  await p.click('[data-testid=ex-check]');
  await p.waitForSelector('[data-testid=ex-verdict]');
  assert.equal(await p.getAttribute('[data-testid=ex-verdict]', 'data-correct'), 'false');
  assert.equal(await p.getAttribute('[data-testid=ex-answer]', 'data-answer'), key);
  assert.match(await p.textContent('[data-testid=ex-verdict]'), /error: 50\.0 %/);
  // …and everything shows: the verdict and the rows, each with its substituted formula.
  assert.equal(await p.evaluate(() => document.documentElement.dataset.quiz), 'revealed');
  assert.ok(!(await hidden('[data-panel=verdict] .headline')));
  assert.ok(!(await hidden('[data-testid=ledger] li.row[data-row=weights] .bytes')));
  assert.equal(await p.$$eval('[data-testid=ex-rows] > li', (l) => l.length), 4);
  assert.equal(await p.$$eval('[data-testid=ex-rows] > li math', (l) => l.length), 8);
  // A guess within 2 % is right (in GB, as a learner writes it).
  await p.fill('[data-testid=ex-guess]', `${(Number(key) / 1e9 * 1.01).toFixed(1)} GB`);
  await p.click('[data-testid=ex-check]');
  await p.waitForSelector('[data-testid=ex-verdict][data-correct=true]');
  assert.deepEqual(problems, []);
});

test('an embedded quiz posts its answer to the course page', async () => {
  page(hostRoot, 'quiz.html', `<!doctype html><html lang="en"><title>quiz</title><link rel="icon" href="data:,">
<iframe id="f" src="${app.base}?model=gpt2&amp;embed=1&amp;quiz=1" title="trainmem" width="100%" height="700" style="border:0"></iframe>
<script>window.got = []; addEventListener("message", (e) => { if (e.data && e.data.source === "trainmem") window.got.push(e.data); });</script>`);
  const { page: p, problems } = await openPage(browser, null);
  await p.goto(host.origin + '/quiz.html');
  const f = await frameOf(p);
  const peak = await f.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  await f.fill('[data-testid=ex-guess]', peak);
  await f.click('[data-testid=ex-check]');
  await p.waitForFunction(() => window.got.some((m) => m.type === 'answered'));
  const a = await p.evaluate(() => window.got.find((m) => m.type === 'answered'));
  assert.equal(a.exercise, 'quiz');
  assert.equal(a.target, 'memory:peak');
  assert.equal(a.correct, true);
  assert.equal(a.answer, peak);
  assert.equal(a.error_pct, 0);
  assert.deepEqual(problems, []);
});

test('the compile, FP8 and partial-recomputation exercises answer with the difference of the two configurations\' activations, as the CLI estimates them', async () => {
  const bin = join(ROOT, 'target', 'debug', 'trainmem');
  const activations = (query) => {
    const args = ['estimate', '--json', ...query.split('&').flatMap((kv) => { const [k, v] = kv.split('='); return [`--${k}`, v]; })];
    return BigInt(JSON.parse(execFileSync(bin, args, { encoding: 'utf8', maxBuffer: 64 << 20 })).memory.activations);
  };
  for (const [step, a, b, words] of [
    ['compile-saves', 'model=llama-3.1-8b&seq=8192', 'model=llama-3.1-8b&seq=8192&compile=true', /torch\.compile/],
    ['fp8-not-half', 'model=llama-3.1-8b&seq=8192&gpus=8&zero=3', 'model=llama-3.1-8b&seq=8192&gpus=8&zero=3&fp8=te-delayed', /FP8/],
    ['recompute-some', 'model=llama-3.1-8b&seq=8192&framework=megatron&attn=flash&precision=mixed-bf16&recompute=full',
      'model=llama-3.1-8b&seq=8192&framework=megatron&attn=flash&precision=mixed-bf16&recompute=full&recompute_layers=8', /block method/],
  ]) {
    const { page: p, problems } = await openPage(browser, app.base + `?step=${step}`);
    await p.waitForSelector('[data-testid=ex-question]');
    assert.match(await p.textContent('[data-testid=ex-question]'), words);
    await p.fill('[data-testid=ex-guess]', '1 GB');
    await p.click('[data-testid=ex-check]');
    await p.waitForSelector('[data-testid=ex-verdict][data-correct=false]');
    const diff = activations(a) - activations(b);
    const want = diff < 0n ? -diff : diff;
    assert.equal(await p.getAttribute('[data-testid=ex-answer]', 'data-answer'), String(want), step);
    assert.deepEqual(problems, []);
  }
});

test('the built-in exercises check a guess against the estimator and reveal the rows; "make this an exercise" writes a quiz link', async () => {
  const { page: p, problems } = await openPage(browser, app.base + '?step=sixteen-psi');
  await p.waitForSelector('[data-testid=ex-question]');
  assert.match(await p.textContent('[data-testid=ex-question]'), /Llama-2-13B/);
  await p.fill('[data-testid=ex-guess]', '208 GB');
  await p.click('[data-testid=ex-check]');
  await p.waitForSelector('[data-testid=ex-verdict][data-correct=true]');
  // 16 × 13,015,864,320 parameters, computed by the estimator.
  assert.equal(await p.getAttribute('[data-testid=ex-answer]', 'data-answer'), String(16n * 13015864320n));
  assert.equal(await p.$$eval('[data-testid=ex-rows] > li', (l) => l.length), 4);
  // A category question gets a choice of categories.
  await p.selectOption('[data-testid=ex-pick]', { label: 'Long sequences' });
  await p.selectOption('[data-testid=ex-guess]', 'optimizer_states');
  await p.click('[data-testid=ex-check]');
  await p.waitForSelector('[data-testid=ex-verdict][data-correct=false]');
  assert.equal(await p.getAttribute('[data-testid=ex-answer]', 'data-answer'), 'activations');
  // "Show this configuration" loads it into the calculator.
  await p.click('[data-testid=ex-open]');
  await p.waitForFunction(() => location.search.includes('seq=32768'));

  // Make this an exercise.
  await p.click('[data-testid=make-exercise] summary');
  await p.selectOption('[data-testid=ask-target]', 'row:weights');
  await p.fill('[data-testid=ask-question]', 'How big are the weights?');
  await p.fill('[data-testid=ask-tol]', '3');
  const url = await p.inputValue('[data-testid=exercise-url]');
  assert.match(url, /quiz=1/);
  assert.match(url, /ask=row%3Aweights/);
  assert.match(url, /tol=3/);
  assert.match(url, /seq=32768/);
  const { page: q } = await openPage(browser, url);
  await q.waitForSelector('[data-testid=ex-question]');
  assert.equal(await q.textContent('[data-testid=ex-question]'), 'How big are the weights?');
  assert.equal(await q.evaluate(() => document.documentElement.dataset.quiz), 'hidden');
  assert.deepEqual(problems, []);
});

test('compare shows A and B side by side with the ledger diff and the changed formulas highlighted', async () => {
  const b = encodeURIComponent('model=llama-3.1-8b&attn=sdpa');
  const { page: p, problems } = await openPage(browser, app.base + `?model=llama-3.1-8b&attn=eager&compare=${b}`);
  await p.waitForSelector('[data-testid=cmp-diff]');
  assert.ok(await p.$('[data-testid=cmp-verdict-A]'));
  assert.ok(await p.$('[data-testid=cmp-verdict-B]'));
  assert.ok(await p.$('[data-testid=cmp-bar-A]'));
  assert.ok(await p.$('[data-testid=cmp-bar-B]'));
  const changed = await p.$$eval('[data-testid=cmp-diff] tr[data-changed=true]', (r) => r.map((x) => x.dataset.row));
  assert.ok(changed.length > 0, 'some formulas changed');
  assert.ok(await p.$('[data-testid=cmp-diff] tr.formula-diff code'));
  const peaks = await p.$$eval('[data-testid^=cmp-verdict-] strong', (s) => s.map((x) => BigInt(x.dataset.bytes)));
  assert.ok(peaks[0] > peaks[1], 'eager attention keeps more than SDPA');
  // The charts overlay B's peak on A's axes.
  await p.waitForSelector('[data-testid=chart-panel-seq][data-compared=true]');
  await p.waitForFunction(() => /compared configuration B/.test(document.querySelector('[data-testid=chart-seq]').getAttribute('aria-label') || ''));
  // "Duplicate as B" on a plain page, then an edit of A.
  const { page: d } = await openPage(browser, app.base + '?model=gpt2');
  await d.click('[data-testid=duplicate-b]');
  await d.waitForSelector('[data-testid=cmp-diff]');
  assert.equal(await d.$$eval('[data-testid=cmp-diff] tr[data-changed=true]', (r) => r.length), 0);
  assert.equal(await d.$$eval('[data-testid=cmp-diff] tr[data-delta]:not([data-delta="0"])', (r) => r.length), 0);
  // A longer sequence: the same formulas with other numbers.
  await d.fill('#in-seq', '2048');
  await d.waitForFunction(() => document.querySelectorAll('[data-testid=cmp-diff] tr[data-delta]:not([data-delta="0"])').length > 0);
  assert.equal(await d.$$eval('[data-testid=cmp-diff] tr[data-changed=true]', (r) => r.length), 0);
  // Eager attention: other formulas, highlighted.
  await d.selectOption('#in-attn', 'eager');
  await d.waitForFunction(() => document.querySelectorAll('[data-testid=cmp-diff] tr[data-changed=true]').length > 0);
  await d.waitForFunction(() => location.search.includes('compare='));
  assert.deepEqual(problems, []);
});

test('print media shows no inputs, every ledger row with its formula, and nothing wider than the page', async () => {
  const { page: p, problems } = await openPage(browser, app.base + '?model=llama-3.1-8b&gpus=8&zero=3', { viewport: { width: 760, height: 1000 } });
  await p.waitForSelector('[data-testid=bar-canvas][data-layout]');
  await p.evaluate(() => window.dispatchEvent(new Event('beforeprint')));
  await p.emulateMedia({ media: 'print' });
  const r = await p.evaluate(() => {
    const visible = (el) => { const s = getComputedStyle(el); const b = el.getBoundingClientRect(); return s.display !== 'none' && s.visibility !== 'hidden' && b.width > 0 && b.height > 0; };
    const controls = [...document.querySelectorAll('input, select, textarea, button')].filter(visible).map((el) => el.outerHTML.slice(0, 80));
    const width = document.documentElement.clientWidth;
    const wide = [...document.body.querySelectorAll('*')].filter(visible).filter((el) => el.getBoundingClientRect().right > width + 1).map((el) => el.tagName + '.' + el.className);
    return { controls, wide, scroll: document.documentElement.scrollWidth, width,
      rows: document.querySelectorAll('[data-testid=print-rows] > li').length,
      maths: document.querySelectorAll('[data-testid=print-rows] > li .subst').length,
      ledger: document.querySelectorAll('[data-testid=ledger] li.row').length,
      inputs: document.querySelectorAll('[data-testid=print-inputs] th').length,
      canvases: [...document.querySelectorAll('canvas')].filter(visible).length };
  });
  assert.deepEqual(r.controls, []);
  assert.deepEqual(r.wide.slice(0, 5), []);
  assert.ok(r.scroll <= r.width, `page ${r.scroll} px wide in ${r.width}`);
  assert.ok(r.rows >= r.ledger && r.ledger > 0, `${r.rows} printed rows for ${r.ledger} ledger rows`);
  assert.equal(r.maths, 2 * r.rows);
  assert.ok(r.inputs > 20, `${r.inputs} inputs in the table`);
  assert.ok(r.canvases >= 1, 'charts print as images');
  assert.deepEqual(problems, []);
});

test('snapshots download the current view as SVG and PNG', async () => {
  const { page: p, problems } = await openPage(browser, app.base + '?model=gpt2');
  await p.waitForSelector('[data-testid=snapshot-svg]');
  const [svg] = await Promise.all([p.waitForEvent('download'), p.click('[data-testid=snapshot-svg]')]);
  const text = readFileSync(await svg.path(), 'utf8');
  assert.match(text, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  assert.match(text, /gpt2|GPT-2/i);
  const [png] = await Promise.all([p.waitForEvent('download'), p.click('[data-testid=snapshot-png]')]);
  const bytes = readFileSync(await png.path());
  assert.deepEqual([...bytes.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
  assert.ok(bytes.length > 5000, `${bytes.length} B of PNG`);
  assert.deepEqual(problems, []);
});

for (const theme of ['light', 'dark', 'projector']) {
  test(`axe finds no violation on course pages and embeds in the ${theme} theme`, async () => {
    const urls = [
      `?model=llama-3.1-8b&theme=${theme}&step=sixteen-psi&compare=${encodeURIComponent('model=llama-3.1-8b&zero=3&gpus=8')}&lock=seq`,
      `?model=gpt2&embed=1&quiz=1&theme=${theme}`,
      `?model=gpt2&embed=1&theme=${theme}&sections=inputs,verdict,ledger,exercises`,
    ];
    for (const u of urls) {
      const { page: p } = await openPage(browser, app.base + u, { bypassCSP: true });
      await p.waitForSelector('[data-testid=exercises]');
      if (u.includes('compare')) await p.waitForSelector('[data-testid=cmp-diff]');
      assert.deepEqual(await axeViolations(p), [], `${theme} ${u} before a guess`);
      await p.fill('input[data-testid=ex-guess]', '1 GB').catch(() => p.selectOption('[data-testid=ex-guess]', 'activations'));
      await p.click('[data-testid=ex-check]');
      await p.waitForSelector('[data-testid=ex-verdict]');
      assert.deepEqual(await axeViolations(p), [], `${theme} ${u} after a guess`);
    }
  });
}

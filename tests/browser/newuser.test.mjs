// What a new user trips over (issue 30), in a real browser: one answer everywhere (compare's
// cards, the charts' read-outs and the bar against the page's verdict and ledger; a fix that
// does not keep its promise is said and followed by changes that do), a search that finds
// models by what people type, the verdict in view on a phone, quizzes that give nothing away,
// embeds that say what in their link could not be used, chart labels inside their canvases, and
// words for every choice.
import assert from 'node:assert/strict';
import { test, before, after, serve, launch, openPage, waitForApp, settled, canvasLayout, writeFile, SUBPATH, axeViolations } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch(); });
after(async () => { await browser?.close(); server?.close(); });

const KINDS = ['seq', 'params', 'batch', 'gpus', 'timeline'];

/** The verdict's line and its deciding headroom (bytes, negative when short). */
async function verdictOf(page) {
  await page.waitForSelector('[data-testid=verdict-headline]');
  return {
    text: (await page.textContent('[data-testid=verdict-headline]')).trim(),
    headroom: await page.getAttribute('[data-testid=verdict]', 'data-headroom'),
    fits: await page.getAttribute('[data-testid=verdict]', 'data-fits'),
  };
}

test("compare's A and B cards equal the page's verdict for the same links", async () => {
  for (const [a, b] of [
    ['model=llama-3.1-70b&seq=8192', 'model=llama-3.1-8b'],
    ['finetune=lora&gpu=rtx-4090', 'model=qwen2.5-7b&gpus=8&zero=3'],
  ]) {
    const { page, problems } = await openPage(browser, `${server.base}?${a}&compare=${encodeURIComponent(b)}`);
    await page.waitForSelector('[data-testid=cmp-headline-B]');
    const cards = {};
    for (const name of ['A', 'B']) {
      cards[name] = {
        text: (await page.textContent(`[data-testid=cmp-headline-${name}]`)).trim(),
        headroom: await page.getAttribute(`[data-testid=cmp-verdict-${name}]`, 'data-headroom'),
        fits: await page.getAttribute(`[data-testid=cmp-verdict-${name}]`, 'data-fits'),
      };
    }
    for (const [name, query] of [['A', a], ['B', b]]) {
      const { page: alone } = await openPage(browser, `${server.base}?${query}`);
      assert.deepEqual(cards[name], await verdictOf(alone), `${name} (${query})`);
      await alone.context().close();
    }
    assert.deepEqual(problems, []);
    await page.context().close();
  }
});

/** The ledger's category table: name → {sum, peak} as the page writes them. */
async function ledgerCategories(page) {
  await page.waitForSelector('[data-testid=ledger-categories]');
  return page.$$eval('[data-testid=ledger-categories] tbody tr', (rows) => Object.fromEntries(rows.map((r) => [
    r.querySelector('th').textContent.trim(),
    { sum: r.querySelector('[data-testid^=cat-sum-]').textContent.trim(), peak: r.querySelector('[data-testid^=cat-peak-]').textContent.trim() },
  ])));
}

/** The read-out's rows (label → value) at the x whose name matches `at`, stepped to by keyboard. */
async function readoutAt(page, kind, at) {
  await page.click(`[data-testid=chart-tab-${kind}]`);
  await page.waitForSelector(`[data-testid=chart-${kind}][data-layout]`);
  await page.focus(`[data-testid=chart-${kind}-frame]`);
  await page.keyboard.press('Home');
  for (let i = 0; i < 80; i++) {
    const head = await page.textContent(`[data-testid=chart-${kind}-tooltip] .tt-head`).catch(() => '');
    if (at.test(head)) break;
    await page.keyboard.press('ArrowRight');
  }
  const head = await page.textContent(`[data-testid=chart-${kind}-tooltip] .tt-head`);
  assert.match(head, at);
  return page.$$eval(`[data-testid=chart-${kind}-tooltip] .tt-row`, (rows) => Object.fromEntries(rows.map((r) => [r.querySelector('.tt-label').textContent.trim(), r.querySelector('.tt-value').textContent.trim()])));
}

test("chart tooltips' category sums equal the ledger's", async () => {
  for (const [query, seq] of [['', /^4,096 tokens/], ['model=qwen2.5-7b&gpus=8&zero=3&unit=gib', /^4,096 tokens/]]) {
    const { page, problems } = await openPage(browser, `${server.base}?${query}`);
    const ledger = await ledgerCategories(page);
    assert.deepEqual(Object.keys(ledger), ['Parameters', 'Gradients', 'Optimizer states', 'Activations', 'Transient buffers', 'Framework overhead']);
    // The sequence chart at the configured length, the micro-batch chart at micro-batch 1 (the
    // configured one): each of the ledger's categories, under its name, with its "At the peak".
    for (const [kind, at] of [['seq', seq], ['batch', /^micro-batch 1$/]]) {
      const readout = await readoutAt(page, kind, at);
      for (const [name, { peak }] of Object.entries(ledger)) {
        assert.equal(readout[name], peak, `${query || 'default'}: ${kind} read-out's ${name} against the ledger's`);
      }
    }
    // The bar: the ledger's sums, under the same names.
    const bar = await page.getAttribute('[data-testid=bar-canvas]', 'aria-label');
    for (const [name, { sum }] of Object.entries(ledger)) {
      if (sum !== '0 GB' && sum !== '0 GiB') assert.ok(bar.includes(`${name} ${sum}`), `bar: ${name} ${sum} in '${bar}'`);
    }
    // The bar draws the deciding figure.
    const smi = (await page.textContent('[data-testid=cat-smi]')).trim();
    assert.ok(bar.includes(`nvidia-smi will show ${smi}`), bar);
    assert.deepEqual(problems, []);
    await page.context().close();
  }
});

test('a fix that leaves under 2 % to spare or still does not fit is said, and the next changes keep their word', async () => {
  // A LoRA run 0.3 % from the edge of an A100 80 GB: the verdict says so and offers changes.
  const { page, problems } = await openPage(browser, `${server.base}?finetune=lora&gpu=a100-80gb&seq=8800`);
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-tight'), 'true');
  await page.waitForSelector('[data-testid=verdict-tight]');
  await page.waitForSelector('[data-testid=next-0]');
  const promised = await page.getAttribute('[data-testid=next-0]', 'data-headroom');
  await page.click('[data-testid=next-0]');
  await page.waitForFunction(() => document.querySelector('[data-testid=verdict-after-fix]'));
  await settled(page);
  const after = await verdictOf(page);
  assert.equal(after.fits, 'true');
  assert.equal(after.headroom, promised, 'the headroom it promised is the headroom its configuration shows');
  assert.match(await page.textContent('[data-testid=verdict-after-fix]'), /it fits, with/);
  // The cheapest fixes of a run that does not fit: after a click the page either fits with room
  // or says it does not and offers the next changes.
  const { page: p2 } = await openPage(browser, `${server.base}?model=llama-3.2-1b&gpu=rtx-4090`);
  await p2.waitForSelector('[data-testid=fix-0]');
  await p2.click('[data-testid=fix-0]');
  await p2.waitForSelector('[data-testid=verdict-after-fix]');
  await settled(p2);
  const v = await verdictOf(p2);
  const tight = await p2.getAttribute('[data-testid=verdict]', 'data-tight');
  const note = await p2.textContent('[data-testid=verdict-after-fix]');
  if (v.fits !== 'true' || tight === 'true') {
    assert.match(note, /still does not fit|only .* to spare/);
    await p2.waitForSelector('[data-testid=next-0], [data-testid=next-none]');
  } else {
    assert.match(note, /it fits, with/);
  }
  assert.deepEqual(problems, []);
});

test('where no single change makes it fit, the answers say so and lead to the planner', async () => {
  // Llama 3.1 70B, full fine-tune, 8 × H100 with FSDP at 8K: 141 GB of sharded states a GPU, and
  // activations that more GPUs do not shrink — no one change fits.
  const query = 'model=llama-3.1-70b&gpus=8&zero=full_shard&seq=8192';
  const { page, problems } = await openPage(browser, `${server.base}?${query}`, { bypassCSP: true });
  await page.waitForSelector('[data-testid=fixes-none]');
  assert.equal((await verdictOf(page)).fits, 'false');
  assert.equal(await page.$('[data-testid=fix-0]'), null, 'no single fix is offered');
  assert.match(await page.textContent('[data-testid=fixes-none]'), /No single change makes it fit/);
  assert.deepEqual(await axeViolations(page), []);
  await page.click('[data-testid=fixes-plan]');
  // The planner opens (its module fetched), in view, for this configuration's global batch.
  await page.waitForSelector('[data-testid=plan-run]');
  const box = await page.$eval('[data-panel=plan]', (e) => { const r = e.getBoundingClientRect(); return { top: r.top, height: innerHeight }; });
  assert.ok(box.top >= -1 && box.top < box.height, `the planner is in view: ${JSON.stringify(box)}`);
  assert.equal(await page.inputValue('[data-testid=plan-global]'), '8');
  // It searches at once; nothing of its default space fits, so it searches again with the
  // host-memory knobs open, says so, and lists what fits.
  await page.waitForSelector('[data-testid=plan-row]', { timeout: 180000 });
  assert.match(await page.textContent('[data-testid=plan-widened]'), /Nothing fit with the knobs as they were.*CPU offload of the optimizer and parameters/);
  assert.equal(await page.isChecked('[data-testid=plan-knob-offload]'), true);
  assert.equal(await page.isChecked('[data-testid=plan-knob-finetune]'), false);
  assert.match(await page.$eval('[data-testid=plan-row][data-rank="1"]', (r) => r.dataset.query), /offload=optimizer/);
  // A course page that leaves the planner out says where combinations are searched instead.
  const { page: p2, problems: problems2 } = await openPage(browser, `${server.base}?${query}&sections=verdict,answers`);
  await p2.waitForSelector('[data-testid=fixes-none]');
  assert.equal(await p2.$('[data-testid=fixes-plan]'), null);
  assert.match(await p2.textContent('[data-testid=fixes-none]'), /full page's planner/);
  assert.deepEqual([...problems, ...problems2], []);
});

test('the search finds models by what people type, Enter and ArrowDown+Enter select, and an empty search says so', async () => {
  const { page, problems } = await openPage(browser, server.base);
  const ids = () => page.$$eval('#in-model option', (os) => os.map((o) => o.value));
  for (const [q, want] of [['llama 3.1 8b', 'llama-3.1-8b'], ['llama 8b', 'llama-3.1-8b'], ['qwen 7b', 'qwen2.5-7b'], ['llama3.1', 'llama-3.1-405b'], ['llama8b', 'llama-3.1-8b'], ['405b', 'llama-3.1-405b']]) {
    await page.fill('[data-testid=model-search]', q);
    assert.ok((await ids()).includes(want), `'${q}' finds ${want}: ${await ids()}`);
    assert.equal((await page.textContent('[data-testid=model-none]')).trim(), '');
  }
  // Enter takes the first model found.
  await page.fill('[data-testid=model-search]', '405b');
  await page.press('[data-testid=model-search]', 'Enter');
  await page.waitForFunction(() => document.querySelector('[data-testid=model-summary]').textContent.startsWith('llama-3.1-405b'));
  // ArrowDown moves into the list with the first highlighted; Enter takes it.
  await page.fill('[data-testid=model-search]', 'qwen 7b');
  await page.press('[data-testid=model-search]', 'ArrowDown');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'in-model');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelector('[data-testid=model-summary]').textContent.startsWith('qwen2.5-7b'));
  await page.waitForFunction(() => location.search.includes('model=qwen2.5-7b'));
  // Nothing found: said.
  await page.fill('[data-testid=model-search]', 'no such model');
  assert.match(await page.textContent('[data-testid=model-none]'), /No model matches/);
  assert.deepEqual(await ids(), []);
  assert.deepEqual(problems, []);
});

test('at 390×844 the verdict is in view without scrolling, after load and after an edit', async () => {
  const { page, problems } = await openPage(browser, server.base, { viewport: { width: 390, height: 844 } });
  const inView = () => page.$eval('[data-testid=verdict-pin]', (el) => {
    const r = el.getBoundingClientRect();
    return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight && getComputedStyle(el).visibility === 'visible';
  });
  await page.waitForSelector('[data-testid=verdict-pin]');
  assert.equal(await page.evaluate(() => scrollY), 0);
  assert.ok(await inView(), 'after load');
  const same = async () => {
    const pin = await page.$eval('[data-testid=verdict-pin]', (el) => [el.dataset.fits, el.dataset.headroom]);
    const v = await verdictOf(page);
    assert.deepEqual(pin, [v.fits, v.headroom]);
  };
  await same();
  // An edit far down the form: the pinned line follows it, in view.
  await page.locator('#in-zero').scrollIntoViewIfNeeded();
  assert.ok(await page.evaluate(() => scrollY) > 300, 'the field is below the first screen');
  const before = await page.getAttribute('[data-testid=verdict-pin]', 'data-headroom');
  await page.fill('#in-gpus', '8');
  await page.selectOption('#in-zero', '3');
  await page.waitForFunction((b) => document.querySelector('[data-testid=verdict-pin]').dataset.headroom !== b, before);
  assert.ok(await inView(), 'after an edit');
  await same();
  assert.deepEqual(problems, []);
});

test('a quiz shows no part of the result before the guess, and its hint is not the answer', async () => {
  const rows = ['weights', 'gradients', 'master_weights', 'optimizer_states'];
  const q = `?model=llama-2-13b&quiz=1&ask=${encodeURIComponent('row:' + rows.join('+'))}`;
  for (const viewport of [{ width: 1366, height: 900 }, { width: 390, height: 844 }]) {
    const { page, problems } = await openPage(browser, server.base + q, { viewport });
    await page.waitForSelector('[data-testid=ex-example]');
    // Nothing of the verdict shows: no figure, no label, no stripe or colour.
    const shown = await page.$$eval('[data-panel=verdict] .verdict *, [data-testid=verdict-pin], [data-panel=bar] *, [data-panel=answers] *, [data-testid=ledger-categories] td', (els) =>
      els.filter((el) => { const s = getComputedStyle(el); return s.visibility === 'visible' && s.display !== 'none' && el.getBoundingClientRect().width > 0; }).map((el) => el.outerHTML.slice(0, 80)));
    assert.deepEqual(shown, [], `${viewport.width} px`);
    const said = await page.$eval('[data-panel=verdict]', (el) => getComputedStyle(el, '::before').content);
    assert.match(said, /after your guess/);
    // The box's stripe is the neutral line colour, neither the good nor the bad one.
    const [stripe, line] = await page.$eval('[data-panel=verdict] .verdict', (el) => {
      const probe = document.createElement('span');
      probe.style.color = 'var(--line)';
      document.body.append(probe);
      const c = getComputedStyle(probe).color;
      probe.remove();
      return [getComputedStyle(el).borderLeftColor, c];
    });
    assert.equal(stripe, line);
    // The hint: an example in the same unit, far from the answer (208.3 GB).
    const key = await page.$$eval('[data-testid=ledger] > li.row', (rs, ids) => rs.filter((r) => ids.includes(r.dataset.row)).reduce((s, r) => s + Number(r.querySelector('.bytes').dataset.bytes), 0), rows);
    const hint = await page.textContent('[data-testid=ex-example]');
    const gb = Number(hint.match(/([\d.]+) GB/)[1]);
    assert.ok(gb * 1e9 > key * 3 || gb * 1e9 < key / 3, `hint '${hint}' for an answer of ${key / 1e9} GB`);
    assert.ok(!hint.includes(String(Math.round(key / 1e9))), hint);
    assert.deepEqual(problems, []);
    await page.context().close();
  }
});

test('an embed with a bad parameter shows the page\'s notice and posts warning', async () => {
  const bad = '?model=gpt2&seq=1024&embed=1&theme=neon&hide=nonsense';
  writeFile(server.webroot, 'warn.html', `<!doctype html><html lang="en"><title>course</title><link rel="icon" href="data:,">
<iframe id="f" title="trainmem" src="${SUBPATH}${bad}" style="width:600px;height:600px;border:0"></iframe>
<script>window.got = []; addEventListener("message", (e) => { if (e.data && e.data.source === "trainmem") window.got.push(e.data); });</script>`);
  const { page, problems } = await openPage(browser, null);
  await page.goto(server.origin + '/warn.html');
  await page.waitForFunction(() => window.got.some((m) => m.type === 'warning'), null, { timeout: 30000 });
  const w = await page.evaluate(() => window.got.find((m) => m.type === 'warning'));
  assert.equal(w.version, 1);
  assert.deepEqual(w.notices.map((n) => n.key), ['theme', 'hide']);
  assert.deepEqual(w.notices.map((n) => n.value), ['neon', 'nonsense']);
  assert.match(w.text, /could not be used/);
  const frame = page.frame({ url: /embed=1/ });
  await frame.waitForSelector('[data-testid=notice]');
  const inFrame = await frame.$$eval('[data-testid=notice] li', (l) => l.map((x) => x.textContent));
  // The full page's notice for the same link.
  const { page: full } = await openPage(browser, server.base + bad.replace('&embed=1', ''));
  const onPage = await full.$$eval('[data-testid=notice] li', (l) => l.map((x) => x.textContent));
  assert.deepEqual(inFrame, onPage);
  assert.equal(inFrame.length, 2);
  assert.deepEqual(problems, []);
});

/** Every text box a canvas reports, inside the canvas, no wider than the browser draws it. */
async function labelsInside(page, testid, where) {
  await page.waitForFunction((id) => document.querySelector(`[data-testid=${id}]`)?.dataset.layout, testid);
  const { layout } = await canvasLayout(page, testid);
  const widths = await page.evaluate((ps) => {
    const ctx = document.createElement('canvas').getContext('2d');
    return ps.map((p) => { ctx.font = `${p.bold ? 'bold ' : ''}${p.size}px sans-serif`; return ctx.measureText(p.text).width; });
  }, layout.parts);
  for (const [i, p] of layout.parts.entries()) {
    const [x0, y0, x1, y1] = p.box;
    assert.ok(x0 >= 0 && y0 >= 0 && x1 <= layout.w && y1 <= layout.h, `${where} ${testid}: ${p.part} '${p.text}' leaves the canvas: ${p.box} in ${layout.w}×${layout.h}`);
    const oneLine = y1 - y0 <= p.size * 1.8;
    if (oneLine && p.part !== 'legend') assert.ok(x0 + (x1 - x0) >= p.text_x + widths[i] - 2 || p.part === 'label', `${where} ${testid}: '${p.text}' is ${widths[i].toFixed(1)} px wide in its box`);
  }
  const plot = layout.plot;
  const ticks = (f) => layout.parts.filter((p) => p.part === 'axis' && f(p.box)).length;
  return { x: ticks((b) => b[1] === plot[3] + 8), y: ticks((b) => b[2] === plot[0] - 8), parts: layout.parts };
}

/** Resolves once the timeline's layout carries the peak's label (rejects after 10 s). */
function peakLabelled(page) {
  return page.waitForFunction(() => {
    const l = document.querySelector('[data-testid=chart-timeline]')?.dataset.layout;
    return l && JSON.parse(l).parts.some((p) => p.part === 'label' && /^Peak /.test(p.text));
  }, null, { timeout: 10_000 });
}

for (const width of [390, 700, 1400]) {
  test(`no chart label leaves its canvas and every axis has three ticks at ${width} px`, async () => {
    for (const query of ['', '?finetune=lora&gpu=rtx-4090']) {
      const { page, problems } = await openPage(browser, server.base + query, { viewport: { width, height: 900 } });
      await labelsInside(page, 'bar-canvas', `${width}px ${query}`);
      for (const kind of KINDS) {
        await page.click(`[data-testid=chart-tab-${kind}]`);
        // The timeline's settled drawing: under load its first drawing has been seen without the
        // peak's label (CI, 2026-12-08: twice in one file's run, never alone), redrawn with it.
        if (kind === 'timeline') await peakLabelled(page).catch(() => {});
        const { x, y, parts } = await labelsInside(page, `chart-${kind}`, `${width}px ${query}`);
        assert.ok(x >= 3 && y >= 3, `${width}px ${query} ${kind}: ${x} x and ${y} y tick labels`);
        if (kind === 'timeline') assert.ok(parts.some((p) => p.part === 'label' && /^Peak /.test(p.text)), 'the peak is labelled');
      }
      assert.deepEqual(problems, []);
      await page.context().close();
    }
  });
}

test('every select shows words with its id under it, no label runs into its key, and none cuts its value off', async () => {
  for (const viewport of [{ width: 390, height: 844 }, { width: 1366, height: 900 }]) {
    const { page, problems } = await openPage(browser, server.base + '?precision=mixed-bf16-fp32grad&optim_impl=foreach&zero=shard_grad_op&gpu=gb200', { viewport });
    // Words, with the id under the select.
    assert.equal((await page.$eval('#in-precision', (s) => s.selectedOptions[0].textContent)), 'bf16 weights, fp32 master + grads');
    assert.equal((await page.textContent('[data-choice-id=precision]')).trim(), 'mixed-bf16-fp32grad');
    assert.equal((await page.$eval('#in-optim_impl', (s) => s.selectedOptions[0].textContent)), 'foreach (batched over tensors)');
    // A label's accessible text is its words alone.
    for (const [id, key] of [['in-optim', 'optim'], ['in-zero', 'zero'], ['in-gpu', 'gpu']]) {
      const label = (await page.textContent(`label[for=${id}]`)).trim();
      assert.ok(!label.endsWith(key), `label '${label}'`);
    }
    // No select of the form cuts its current value off.
    const cut = await page.$$eval('form.inputs select:not([size])', (sels) => {
      const ctx = document.createElement('canvas').getContext('2d');
      return sels.filter((s) => s.offsetParent).map((s) => {
        const cs = getComputedStyle(s);
        ctx.font = `${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
        const text = s.selectedOptions[0]?.textContent ?? '';
        const room = s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 20;
        return [s.id, text, Math.round(ctx.measureText(text).width), Math.round(room)];
      }).filter(([, , w, room]) => w > room);
    });
    assert.deepEqual(cut, [], `${viewport.width} px`);
    // The GPU: marketed and usable, and why they differ.
    assert.match(await page.textContent('[data-testid=gpu-note]'), /sold as 186 GB: [\d.]+ GB usable .*MiB/);
    assert.deepEqual(problems, []);
    await page.context().close();
  }
});

test('the GPU note follows the unit, the verdict names what is trained, the textbook shows bytes', async () => {
  const { page, problems } = await openPage(browser, server.base + '?gpu=rtx-4090&finetune=lora&unit=gib');
  assert.match(await page.textContent('[data-testid=gpu-note]'), /GeForce RTX 4090 24 GB, sold as 24 GB: 23\.99 GiB usable/);
  assert.match((await verdictOf(page)).text, /^LoRA \(rank 16\) (fits|does not fit) on NVIDIA GeForce RTX 4090 24 GB/);
  assert.match(await page.textContent('[data-testid=cluster-bytes]'), /GiB/);
  assert.match(await page.textContent('[data-panel=verdict]'), /Cluster \(1 GPU\)/);
  const cells = await page.$$eval('.textbook td.num[data-testid^="textbook-textbook."]', (tds) => tds.map((t) => t.textContent));
  assert.ok(cells.length >= 2 && cells.every((c) => /^[\d.,]+ GiB$/.test(c)), cells.join(' | '));
  assert.ok(!(await page.textContent('.textbook')).includes('textbook.'), 'no row id in the table');
  assert.deepEqual(problems, []);
});

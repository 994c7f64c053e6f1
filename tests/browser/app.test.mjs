// The web app in a real browser: share URLs, reload, garbage links, HF import, embed, CSP.
import assert from 'node:assert/strict';
import { test, before, after, serve, launch, openPage, waitForApp, settled, cliJson, jsonInteger, writeFile, SUBPATH } from './harness.mjs';

let server;
let browser;
before(async () => { server = await serve(); browser = await launch(); });
after(async () => { await browser?.close(); server?.close(); });

test('the page shows the same per-GPU total as the CLI, as an exact integer', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=llama-3.1-8b&seq=4096&batch=1');
  const total = await page.getAttribute('[data-testid=total-bytes]', 'data-bytes');
  const peak = await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  const json = cliJson(['--model', 'llama-3.1-8b', '--seq', '4096', '--batch', '1']);
  assert.equal(total, jsonInteger(json, 'memory.total'));
  assert.equal(peak, jsonInteger(json, 'memory.peak'));
  assert.deepEqual(problems, []);
});

test("the verdict says what the frameworks' logs will print, the same lines as the CLI", async () => {
  const args = ['--model', 'llama-3.1-8b', '--seq', '4096', '--gpus', '8', '--zero', 'full_shard'];
  const { page, problems } = await openPage(browser, server.base + '?model=llama-3.1-8b&seq=4096&gpus=8&zero=full_shard');
  await page.click('[data-testid=verdict-logs] summary');
  const shown = (await page.$$eval('[data-testid=verdict-logs] li', (lis) => lis.map((li) => li.textContent.trim())));
  const cli = JSON.parse(cliJson(args)).logs.map((l) => `${l.framework}: ${l.line}`);
  assert.deepEqual(shown, cli);
  assert.ok(shown.some((l) => /^torchtitan: memory: \d+\.\d\dGiB\(\d+\.\d\d%\)$/.test(l)), shown.join(' | '));
  assert.deepEqual(problems, []);
});

test('the bare URL shows a meaningful default and its result', async () => {
  const { page, problems } = await openPage(browser, server.base);
  const summary = await page.textContent('[data-testid=model-summary]');
  assert.match(summary, /llama-3\.1-8b/);
  assert.match(await page.textContent('[data-testid=verdict]'), /NVIDIA H100/);
  const rows = await page.$$('[data-testid=ledger] li.row');
  assert.ok(rows.length >= 8, `ledger rows: ${rows.length}`);
  assert.deepEqual(problems, []);
});

test('changing an input updates the URL and reloading restores the same state', async () => {
  const { page, problems } = await openPage(browser, server.base);
  await page.fill('#in-seq', '8192');
  await page.selectOption('#in-zero', '3');
  await page.fill('#in-gpus', '8');
  await page.waitForFunction(() => location.search.includes('gpus=8'));
  const url = page.url();
  assert.match(url, /seq=8192/);
  assert.match(url, /zero=3/);
  const before = await page.getAttribute('[data-testid=total-bytes]', 'data-bytes');
  await page.reload();
  await waitForApp(page);
  assert.equal(await page.inputValue('#in-seq'), '8192');
  assert.equal(await page.inputValue('#in-zero'), '3');
  assert.equal(await page.getAttribute('[data-testid=total-bytes]', 'data-bytes'), before);
  const json = cliJson(['--seq', '8192', '--zero', '3', '--gpus', '8']);
  assert.equal(before, jsonInteger(json, 'memory.total'));
  assert.deepEqual(problems, []);
});

test('back and forward step through settled edits', async () => {
  const { page } = await openPage(browser, server.base);
  await page.fill('#in-seq', '2048');
  await page.waitForTimeout(1200);
  await page.fill('#in-seq', '16384');
  await page.waitForFunction(() => location.search.includes('seq=16384'));
  await page.goBack();
  await page.waitForFunction(() => location.search.includes('seq=2048'));
  assert.equal(await page.inputValue('#in-seq'), '2048');
  await page.goForward();
  await page.waitForFunction(() => location.search.includes('seq=16384'));
  assert.equal(await page.inputValue('#in-seq'), '16384');
});

test('a run of quick edits writes the address once, after the last, and back after a pause adds no duplicate entry', async () => {
  const { page, context } = await openPage(browser, server.base);
  await page.waitForTimeout(400);
  // Count the page's own history writes (replaceState and pushState) from here on.
  await page.evaluate(() => {
    window.__writes = [];
    for (const name of ['replaceState', 'pushState']) {
      const original = history[name].bind(history);
      history[name] = (state, title, url) => { window.__writes.push(`${name} ${url}`); return original(state, title, url); };
    }
  });
  // Five values 40 ms apart, as a visitor holding an arrow key types them: each is its own
  // change (the views update for each).
  await page.evaluate(async () => {
    const input = document.querySelector('#in-seq');
    for (const v of ['4096', '4160', '4224', '4288', '4352']) {
      input.value = v;
      input.dispatchEvent(new Event('input', { bubbles: true }));
      await new Promise((r) => setTimeout(r, 40));
    }
  });
  await page.waitForFunction(() => location.search.includes('seq=4352'));
  await page.waitForTimeout(400);
  const writes = await page.evaluate(() => window.__writes);
  assert.equal(writes.length, 1, `history writes: ${writes.join(', ')}`);
  assert.match(writes[0], /seq=4352/);
  const length = await page.evaluate(() => history.length);
  // A later edit after a pause is its own entry; back returns to the run's last value and
  // writes nothing (the address already says it).
  await page.waitForTimeout(1100);
  await page.fill('#in-seq', '16384');
  await page.waitForFunction(() => location.search.includes('seq=16384'));
  assert.equal(await page.evaluate(() => history.length), length + 1);
  // Back after a pause longer than a settled edit: the restored state must not be pushed again
  // (that would drop the forward entry).
  await page.waitForTimeout(1100);
  await page.goBack();
  await page.waitForFunction(() => location.search.includes('seq=4352'));
  assert.equal(await page.inputValue('#in-seq'), '4352');
  await page.waitForTimeout(400);
  await page.goForward();
  await page.waitForFunction(() => location.search.includes('seq=16384'));
  await context.close();
});

test('a garbage URL shows a notice naming each bad key, keeps the rest, and never panics', async () => {
  const garbage = '?seq=99999999999999999999999&batch=-3&zero=banana&colour=blue&%E2%9C%93=%F0%9F%92%A5&gpus=8&tp=3&model=llama-3.1-70b&dropout=NaN&%ZZ=1&&=&lora_targets=q,zz';
  const { page, problems } = await openPage(browser, server.base + garbage);
  const notice = await page.textContent('[data-testid=notice]');
  for (const key of ['seq', 'batch', 'zero', 'colour', 'tp', 'dropout', 'lora_targets', '✓']) assert.ok(notice.includes(key), `notice names ${key}: ${notice}`);
  assert.match(await page.textContent('[data-testid=model-summary]'), /llama-3\.1-70b/);
  assert.equal(await page.inputValue('#in-gpus'), '8');
  await page.click('[data-testid=dismiss-notice]');
  assert.equal(await page.$('[data-testid=notice]'), null);
  assert.deepEqual(problems, []);
});

test('pasting a Hugging Face config.json imports it, and bad JSON names the problem', async () => {
  const { page, problems } = await openPage(browser, server.base);
  await page.click('summary:has-text("Import a Hugging Face config.json")');
  const cfg = { model_type: 'qwen2', vocab_size: 151936, hidden_size: 896, num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, intermediate_size: 4864, tie_word_embeddings: true, _name_or_path: 'Qwen/Qwen2.5-0.5B' };
  await page.fill('[data-testid=hf-text]', JSON.stringify(cfg));
  await page.click('[data-testid=hf-import]');
  await page.waitForFunction(() => document.querySelector('[data-testid=param-count]')?.dataset.count === '494032768');
  // The address follows a quarter of a second after the edit.
  await page.waitForFunction(() => location.search.includes('model=custom'));
  assert.match(page.url(), /model=custom/);
  await page.fill('[data-testid=hf-text]', '{"model_type": "llama", "vocab_size": 32000}');
  await page.click('[data-testid=hf-import]');
  assert.match(await page.textContent('[data-testid=hf-status]'), /hidden_size/);
  await page.fill('[data-testid=hf-text]', '{"model_type": "bert", "vocab_size": 3}');
  await page.click('[data-testid=hf-import]');
  assert.match(await page.textContent('[data-testid=hf-status]'), /model_type `bert`/);
  assert.deepEqual(problems, []);
});

test('editing a preset architecture turns it into a custom model that the link reproduces', async () => {
  const { page } = await openPage(browser, server.base + '?model=gpt2');
  await page.click('summary:has-text("Architecture")');
  await page.fill('#in-layers', '6');
  await page.waitForFunction(() => location.search.includes('model=custom'));
  const count = await page.getAttribute('[data-testid=param-count]', 'data-count');
  const { page: again } = await openPage(browser, page.url());
  assert.equal(await again.getAttribute('[data-testid=param-count]', 'data-count'), count);
});

test('the embed view renders and posts its height to the parent page', async () => {
  const parent = `<!doctype html><title>course</title><link rel="icon" href="data:,"><iframe id="f" src="${SUBPATH}?model=gpt2&embed=1&view=ledger" style="width:600px;height:100px;border:0"></iframe>
<script>window.heights = []; window.addEventListener("message", (e) => { if (e.data && e.data.type === "trainmem:height") { window.heights.push(e.data.height); document.getElementById("f").style.height = e.data.height + "px"; } });</script>`;
  writeFile(server.webroot, 'course.html', parent);
  const { page, problems } = await openPage(browser, null);
  await page.goto(server.origin + '/course.html');
  await page.waitForFunction(() => window.heights.length > 0 && window.heights.at(-1) > 200, null, { timeout: 30000 });
  const frame = page.frame({ url: /embed=1/ });
  assert.ok(await frame.$('[data-testid=embed]'));
  assert.ok(await frame.$('[data-testid=ledger]'));
  const h = await page.$eval('#f', (f) => f.getBoundingClientRect().height);
  assert.ok(h > 200, `iframe resized to ${h}`);
  assert.deepEqual(problems, []);
});

test('the embed dialog writes an iframe snippet for the current configuration', async () => {
  const { page } = await openPage(browser, server.base + '?seq=2048');
  await page.click('[data-testid=embed-button]');
  const snippet = await page.inputValue('[data-testid=embed-snippet]');
  // The default host is an LMS (Canvas keeps only a few iframe attributes; no script).
  assert.match(snippet, /<iframe src="http:\/\/127\.0\.0\.1:\d+\/course\/week-3\/trainmem\/\?seq=2048&amp;embed=1"/);
  assert.doesNotMatch(snippet, /<script/);
  await page.selectOption('[data-testid=embed-host]', 'script');
  assert.match(await page.inputValue('[data-testid=embed-snippet]'), /m\.source !== "trainmem"/);
});

test('the page makes no network request outside its own folder and pins a CSP', async () => {
  const { page, requests, problems } = await openPage(browser, server.base + '?model=mixtral-8x7b-v0.1');
  await page.waitForTimeout(500);
  for (const r of requests) assert.ok(r.startsWith(server.base), `request outside the app: ${r}`);
  const csp = await page.getAttribute('meta[http-equiv=Content-Security-Policy]', 'content');
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /connect-src 'self'/);
  assert.deepEqual(problems, []);
});

test('the unit switch changes every figure between GB and GiB', async () => {
  const { page } = await openPage(browser, server.base);
  assert.match(await page.textContent('[data-testid=peak-bytes]'), /GB/);
  await page.click('label:has-text("GiB")');
  await page.waitForFunction(() => location.search.includes('unit=gib'));
  assert.match(await page.textContent('[data-testid=peak-bytes]'), /GiB/);
});

test('dark mode follows the system and the page stays readable', async () => {
  const { page } = await openPage(browser, server.base, { colorScheme: 'dark' });
  const [bg, fg] = await page.evaluate(() => { const s = getComputedStyle(document.body); return [s.backgroundColor, s.color]; });
  const lum = (c) => { const [r, g, b] = c.match(/\d+/g).map(Number); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  assert.ok(lum(bg) < 60, `dark background ${bg}`);
  assert.ok(lum(fg) > 180, `light text ${fg}`);
});

test('every input has a label and the form is usable with the keyboard alone', async () => {
  const { page } = await openPage(browser, server.base);
  const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea')]
    .filter((el) => el.type !== 'hidden' && !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.closest('label'))
    .map((el) => el.id || el.outerHTML.slice(0, 60)));
  assert.deepEqual(unlabelled, []);
  await page.focus('#in-batch');
  await page.keyboard.press('Control+A');
  await page.keyboard.type('2');
  await page.keyboard.press('Tab');
  await page.waitForFunction(() => location.search.includes('batch=2'));
});

test('a phone-width screen shows the page without sideways scrolling', async () => {
  for (const q of ['', '?model=qwen2.5-7b&finetune=lora&gpus=2&zero=3', '?model=mixtral-8x7b-v0.1&attn=eager&embed=1&view=ledger']) {
    const { page, problems } = await openPage(browser, server.base + q, { viewport: { width: 390, height: 800 } });
    await page.waitForTimeout(300);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 390, `${q || 'default'}: page is ${width}px wide`);
    assert.deepEqual(problems, []);
  }
});

test('the stacked bar, the textbook table and the charts come with the page, drawn', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=gpt2-xl');
  await page.waitForFunction(() => document.querySelector('[data-testid=bar-canvas]')?.dataset.layout);
  const drawn = await page.$eval('[data-testid=bar-canvas]', (c) => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let i = 0; i < d.length; i += 4 * 31) seen.add(d.slice(i, i + 3).join());
    return seen.size;
  });
  assert.ok(drawn > 4, `bar colours: ${drawn}`);
  assert.ok(await page.$('[data-testid="textbook-textbook.korthikanti"]'), 'the textbook table');
  assert.deepEqual(problems, []);
});

test('each one-click answer is exact at its boundary and applies with a click', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=qwen2.5-0.5b&seq=2048');
  const batch = Number(await page.getAttribute('[data-testid=answer-batch]', 'data-value'));
  const seq = Number(await page.getAttribute('[data-testid=answer-seq]', 'data-value'));
  assert.ok(batch > 1 && seq > 2048, `answers: batch ${batch}, seq ${seq}`);
  // The page's own verdict on either side of each answer.
  const fits = async (q) => {
    const { page: p } = await openPage(browser, server.base + '?model=qwen2.5-0.5b&' + q);
    return (await p.getAttribute('[data-testid=verdict]', 'data-fits')) === 'true';
  };
  assert.equal(await fits(`seq=2048&batch=${batch}`), true);
  assert.equal(await fits(`seq=2048&batch=${batch + 1}`), false);
  assert.equal(await fits(`seq=${seq}`), true);
  assert.equal(await fits(`seq=${seq + 1}`), false);
  // The smallest GPU: a 0.5B model at micro-batch 1 fits a much smaller card; applying it sets the GPU.
  const gpu = await page.getAttribute('[data-testid=answer-gpu]', 'data-value');
  assert.notEqual(gpu, 'h100-80gb', 'a smaller card than the H100');
  await page.click('[data-testid=answer-gpu]');
  await page.waitForFunction((g) => location.search.includes(`gpu=${g}`), gpu);
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-fits'), 'true');
  // Applying an answer changes the configuration (and the address) to it.
  await settled(page);
  const smaller = Number(await page.getAttribute('[data-testid=answer-batch]', 'data-value'));
  assert.ok(smaller < batch, `a smaller card holds a smaller micro-batch (${smaller} < ${batch})`);
  if (smaller > 1) {
    await page.click('[data-testid=answer-batch]');
    await page.waitForFunction((b) => location.search.includes(`batch=${b}`), smaller);
    await settled(page);
  }
  assert.equal(await page.inputValue('#in-batch'), String(smaller));
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-fits'), 'true');
  assert.match(await page.textContent('[data-testid=answer-batch]'), /this configuration/);
  assert.ok(await page.$('[data-testid=answer-batch][disabled]'));
  assert.deepEqual(problems, []);
});

test('a custom GPU size shows its field and the link carries it', async () => {
  const { page, problems } = await openPage(browser, server.base);
  assert.equal(await page.isVisible('#in-gpu_gib'), false);
  await page.selectOption('#in-gpu', 'custom');
  await page.waitForSelector('#in-gpu_gib', { state: 'visible' });
  await page.fill('#in-gpu_gib', '48');
  await page.waitForFunction(() => location.search.includes('gpu=custom') && location.search.includes('gpu_gib=48'));
  assert.match(await page.textContent('[data-testid=verdict]'), /custom 48 GiB GPU/);
  await page.selectOption('#in-gpu', 'h200');
  await page.waitForFunction(() => location.search.includes('gpu=h200'));
  assert.equal(await page.isVisible('#in-gpu_gib'), false);
  assert.deepEqual(problems, []);
});

test("LoRA's adapter dtype shows with LoRA, its peak is the CLI's, and torchtune's model-dtype adapters keep less", async () => {
  const q = '?model=llama-3.1-8b&precision=bf16&finetune=lora&lora_targets=all&seq=4096&batch=1';
  const { page, problems } = await openPage(browser, server.base + q);
  await page.waitForSelector('#in-lora_dtype', { state: 'visible' });
  assert.equal(await page.inputValue('#in-lora_dtype'), 'fp32');
  const peft = BigInt(await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes'));
  const args = ['--model', 'llama-3.1-8b', '--precision', 'bf16', '--finetune', 'lora', '--lora_targets', 'all', '--seq', '4096', '--batch', '1'];
  assert.equal(String(peft), jsonInteger(cliJson(args), 'memory.peak'));
  await page.selectOption('#in-lora_dtype', 'model');
  await page.waitForFunction(() => location.search.includes('lora_dtype=model'));
  await settled(page);
  const model = BigInt(await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes'));
  assert.equal(String(model), jsonInteger(cliJson([...args, '--lora_dtype', 'model']), 'memory.peak'));
  assert.ok(model < peft, `model-dtype adapters ${model} < peft's ${peft}`);
  // Full fine-tuning is the default: the link drops finetune (and the LoRA keys with it).
  await page.selectOption('#in-finetune', 'full');
  await page.waitForFunction(() => !location.search.includes('finetune='));
  assert.equal(await page.isVisible('#in-lora_dtype'), false);
  assert.deepEqual(problems, []);
});

test('the static header paints before the wasm and the app replaces it with its own, once', async () => {
  const { page, problems } = await openPage(browser, server.base);
  // The page's HTML carries the header (what a slow phone paints first) …
  const html = await (await fetch(server.base)).text();
  assert.match(html, /<header class="top" id="boot">[\s\S]*<h1>trainmem<\/h1>/);
  // … and no preload of the app's wasm: it is fetched after the first paint, by a worker.
  assert.doesNotMatch(html, /rel="preload"[^>]*_bg\.wasm/);
  assert.match(html, /new Worker\('\.\/compile-worker-[0-9a-f]{12,16}\.js'\)/);
  // Mounted, the app's header is the only one.
  assert.equal(await page.locator('#boot').count(), 0);
  assert.equal(await page.locator('h1').count(), 1);
  assert.equal(await page.locator('header.top .tools').count(), 1);
  assert.deepEqual(problems, []);
});

test('the compile worker runs the first screen once for the page query, without mounting, before the page starts', async () => {
  const { page, context, problems } = await openPage(browser, null);
  const workers = [];
  page.on('worker', (w) => workers.push(w.url()));
  await page.goto(server.base + '?model=llama-3.1-70b&gpus=8&zero=3');
  await waitForApp(page);
  // The worker said it warmed the module (src/ui/warm.rs ran: the start function found no
  // window), and it did so before the page instantiated it.
  const marks = await page.evaluate(() => ['trainmem:warmed', 'trainmem:start'].map((n) => performance.getEntriesByName(n)[0]?.startTime));
  assert.ok(marks[0] !== undefined, 'no trainmem:warmed mark');
  assert.ok(marks[0] <= marks[1], `warmed at ${marks[0]} ms, after the app started at ${marks[1]} ms`);
  assert.equal(workers.filter((u) => /compile-worker-[0-9a-f]+\.js$/.test(u)).length, 1);
  // The page is the one that mounted, once, with the linked configuration.
  assert.equal(await page.locator('h1').count(), 1);
  assert.match(await page.textContent('[data-testid=verdict]'), /Cluster \(8 GPUs\)/);
  assert.deepEqual(problems, []);
  await context.close();
});

test('the analysis worker answers every change as the page itself would, and the page answers alone without it', async () => {
  const { page, problems } = await openPage(browser, server.base + '?model=qwen2.5-0.5b&seq=2048');
  assert.equal(await page.evaluate(() => window.trainmemAnalysis instanceof Worker), true, 'the compile worker stayed as the analysis worker');
  const answers = () => page.textContent('[data-testid=answers]');
  const first = await answers();
  // Changes faster than the worker answers: only the last one counts.
  for (const b of ['2', '3', '5', '4']) await page.fill('#in-batch', b);
  await page.waitForFunction(() => new URLSearchParams(location.search).get('batch') === '4');
  await settled(page);
  const changed = await answers();
  assert.notEqual(changed, first, 'the answers followed the change');
  // The same configuration on a page without the worker (its script refused): computed there.
  const { page: alone, context } = await openPage(browser, null);
  await context.route('**/compile-worker-*.js', (r) => r.abort());
  await alone.goto(server.base + '?model=qwen2.5-0.5b&seq=2048&batch=4');
  await waitForApp(alone);
  assert.equal(await alone.evaluate(() => window.trainmemAnalysis), undefined);
  assert.equal(await alone.textContent('[data-testid=answers]'), changed);
  assert.equal(await alone.getAttribute('[data-testid=answers]', 'aria-busy'), 'false');
  await context.close();
  assert.deepEqual(problems, []);
});

test('an embed never shows the static page header', async () => {
  const { page, problems } = await openPage(browser, server.base + '?embed=1');
  assert.equal(await page.evaluate(() => document.documentElement.classList.contains('embed-boot')), true);
  assert.equal(await page.locator('header.top').count(), 0);
  assert.deepEqual(problems, []);
});

test("bitsandbytes' paged states are their own ledger row, outside the allocated peak, and the page says where the evicted pages went", async () => {
  // Llama 3.1 8B, every parameter trained with paged 8-bit Adam stepped in backward on a 24 GB card: the
  // 16 GB of uint8 states do not all fit beside the step, the driver keeps the rest in host memory.
  const query = 'model=llama-3.1-8b&precision=bf16&optim=adam8bit&optim_paged=true&optim_in_bwd=true&recompute=full&batch=1&seq=512&gpu=rtx-4090';
  const { page, problems } = await openPage(browser, `${server.base}?${query}`);
  await page.waitForSelector('[data-row=paged_optimizer_states]');
  const json = JSON.parse(cliJson(query.split('&').flatMap((kv) => { const [k, v] = kv.split('='); return [`--${k}`, v]; })));
  const paged = await page.getAttribute('[data-row=paged_optimizer_states] [data-bytes]', 'data-bytes');
  assert.equal(paged, String(json.components.find((r) => r.name === 'paged_optimizer_states').bytes));
  assert.equal(await page.getAttribute('[data-testid=verdict]', 'data-fits'), 'true');
  assert.match(await page.textContent('[data-testid=verdict]'), /paged optimizer states do not fit beside the step/);
  assert.deepEqual(problems, []);
});

test("the form's recipes each carry their one line, show their dependent keys when asked, and give the CLI's peak", async () => {
  const { page, problems } = await openPage(browser, `${server.base}?model=llama-3.1-8b&precision=mixed-bf16&seq=4096&attn=eager`);
  await page.click('[data-testid=recipes] > summary');
  for (const key of ['compile', 'act_offload', 'act_offload_layers', 'fp8', 'load', 'empty_cache']) {
    await page.waitForSelector(`#in-${key}`, { state: 'visible' });
    const label = (await page.textContent(`label[for=in-${key}]`)).trim();
    assert.ok(label.length > 12, `${key}: "${label}"`);
  }
  // compile_regions shows with compile, fp8_allgather with a torchao recipe.
  assert.equal(await page.isVisible('#in-compile_regions'), false);
  await page.check('#in-compile');
  await page.waitForSelector('#in-compile_regions', { state: 'visible' });
  await page.waitForFunction(() => location.search.includes('compile=true'));
  await page.uncheck('#in-compile');
  assert.equal(await page.isVisible('#in-fp8_allgather'), false);
  await page.selectOption('#in-fp8', 'torchao-tensorwise');
  await page.waitForSelector('#in-fp8_allgather', { state: 'visible' });
  await page.selectOption('#in-fp8', 'none');
  // Transformer Engine's per-layer offloading of 8 layers: the page's peak is the CLI's.
  await page.fill('#in-act_offload_layers', '8');
  await page.waitForFunction(() => location.search.includes('act_offload_layers=8'));
  await page.waitForSelector('#in-host_ram_gib', { state: 'visible' });
  await settled(page);
  const peak = await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  const args = ['--model', 'llama-3.1-8b', '--precision', 'mixed-bf16', '--seq', '4096', '--attn', 'eager', '--act_offload_layers', '8'];
  assert.equal(peak, jsonInteger(cliJson(args), 'memory.peak'));
  assert.deepEqual(problems, []);
});

test("Megatron's block recomputation shows under its full recomputation and gives the CLI's peak", async () => {
  const { page, problems } = await openPage(browser, `${server.base}?model=llama-3.1-8b&framework=megatron&attn=flash&precision=mixed-bf16&seq=4096`);
  assert.equal(await page.isVisible('#in-recompute_layers'), false);
  await page.selectOption('#in-recompute', 'full');
  await page.waitForSelector('#in-recompute_layers', { state: 'visible' });
  const label = (await page.textContent('label[for=in-recompute_layers]')).trim();
  assert.match(label, /first N layers/);
  await page.fill('#in-recompute_layers', '8');
  await page.waitForFunction(() => location.search.includes('recompute_layers=8'));
  await settled(page);
  const peak = await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  const args = ['--model', 'llama-3.1-8b', '--framework', 'megatron', '--attn', 'flash', '--precision', 'mixed-bf16', '--seq', '4096', '--recompute', 'full', '--recompute_layers', '8'];
  assert.equal(peak, jsonInteger(cliJson(args), 'memory.peak'));
  // Fewer layers recomputed keep more than every layer recomputed.
  const all = jsonInteger(cliJson(args.slice(0, -2)), 'memory.peak');
  assert.ok(BigInt(peak) > BigInt(all), `${peak} > ${all}`);
  assert.deepEqual(problems, []);
});

test("torchtune's distributed recipes show whether FSDP2 reshards the root, and the older torch's root gives the CLI's peak", async () => {
  const query = 'model=llama-3.1-8b&framework=torchtune&gpus=8&zero=full_shard&finetune=lora&lora_targets=q,v&lora_dtype=model&precision=bf16&loss=chunked&attn=sdpa&recompute=full';
  const { page, problems } = await openPage(browser, `${server.base}?${query}`);
  await page.waitForSelector('#in-fsdp_root_reshard', { state: 'visible' });
  assert.match((await page.textContent('label[for=in-fsdp_root_reshard]')).trim(), /torch 2\.7/);
  assert.equal(await page.isChecked('#in-fsdp_root_reshard'), true);
  await page.uncheck('#in-fsdp_root_reshard');
  await page.waitForFunction(() => location.search.includes('fsdp_root_reshard=false'));
  await settled(page);
  const peak = await page.getAttribute('[data-testid=peak-bytes]', 'data-bytes');
  const args = ['--query', `${query}&fsdp_root_reshard=false`];
  assert.equal(peak, jsonInteger(cliJson(args), 'memory.peak'));
  // The root kept through the loss: the older torch's step holds more at its peak here.
  assert.ok(BigInt(peak) > BigInt(jsonInteger(cliJson(['--query', query]), 'memory.peak')));
  // Off torchtune's distributed recipes the field is not shown.
  const { page: hf } = await openPage(browser, `${server.base}?model=llama-3.1-8b`);
  assert.equal(await hf.isVisible('#in-fsdp_root_reshard'), false);
  assert.deepEqual(problems, []);
});

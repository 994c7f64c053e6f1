// Compiles the app's wasm off the page's main thread and hands the compiled module back (a
// WebAssembly.Module crosses postMessage): the page only instantiates it. scripts/dist.py
// copies this file into dist/ under a content-hashed name and points the page's loader at it.
//
// Before handing it back, the worker instantiates the module once with its wasm-bindgen glue
// (`glue`): with no `window`, the app's start function runs the first screen's analysis for the
// page's `query` instead of mounting (src/ui/warm.rs). Browsers compile a wasm function the first
// time it runs, and a posted module shares that code with the page, so the page's main thread
// finds the estimator compiled (~550 of the ~2,000 functions its first screen runs). This comes
// first, not beside the page's start: on a machine with few cores the two would compete for
// them, and the page's tasks would take longer (Lighthouse's blocking time grew, measured).
// Any failure here only skips the warm-up; `warmed` says whether it ran (the page marks
// `trainmem:warmed`).
//
// Warmed, the worker stays as the page's analysis worker (src/ui/analysis.rs): it sends the
// one-click answers for the page's query with the module (`found`), then answers each
// `{ analyse: query }` with `{ found }`, the JSON the module's `analyse` export returns, or
// null if it failed (a trap leaves the instance unusable; the page then computes them itself).
// Not warmed, it closes.
onmessage = async (e) => {
  const { url, integrity, glue, query } = e.data;
  let module;
  try {
    try {
      module = await WebAssembly.compileStreaming(fetch(url, { integrity }));
    } catch {
      // A host that serves .wasm without application/wasm: compile from the bytes.
      const bytes = await (await fetch(url, { integrity })).arrayBuffer();
      module = await WebAssembly.compile(bytes);
    }
  } catch (err) {
    postMessage(String(err));
    return;
  }
  let bindings = null;
  let found = null;
  if (glue) {
    try {
      self.trainmemWarmQuery = query || '';
      const glueModule = await import(glue);
      await glueModule.default({ module_or_path: module });
      bindings = glueModule;
      found = bindings.analyse(query || '');
    } catch {
      // No module import in this worker, or the warm-up failed: the page compiles lazily.
    }
  }
  postMessage({ module, warmed: bindings !== null, found });
  if (bindings === null) {
    close();
    return;
  }
  onmessage = (m) => {
    let answer = null;
    try {
      answer = bindings.analyse(String(m.data?.analyse ?? ''));
    } catch {
      // Reported as null: the page computes from then on.
    }
    postMessage({ found: answer });
  };
};

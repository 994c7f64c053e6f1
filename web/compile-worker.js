// Compiles the app's wasm off the page's main thread and hands the compiled module back (a
// WebAssembly.Module crosses postMessage): the page only instantiates it. scripts/dist.py
// copies this file into dist/ under a content-hashed name and points the page's loader at it.
onmessage = async (e) => {
  const { url, integrity } = e.data;
  try {
    let module;
    try {
      module = await WebAssembly.compileStreaming(fetch(url, { integrity }));
    } catch {
      // A host that serves .wasm without application/wasm: compile from the bytes.
      const bytes = await (await fetch(url, { integrity })).arrayBuffer();
      module = await WebAssembly.compile(bytes);
    }
    postMessage(module);
  } catch (err) {
    postMessage(String(err));
  }
};

//! The WebGPU benchmark as its own wasm module: wgpu (WebGPU and WGSL only), the kernels and the
//! sweep, without Leptos or the estimator. The app loads it with a dynamic `import()` when the
//! benchmark is opened and talks to it through these four exports (see `trainmem::bench::api`).
//! Built by scripts/build-modules.sh; natively it does nothing (the native benchmark is
//! `trainmem bench`).

#[cfg(target_arch = "wasm32")]
mod exports {
    use wasm_bindgen::prelude::wasm_bindgen;

    /// Keeps `on_event` (called with each event as JSON) and opens the adapter.
    #[wasm_bindgen]
    pub fn open(on_event: js_sys::Function) {
        trainmem::bench::web::open(on_event);
    }

    /// Runs a sweep with the given options (JSON).
    #[wasm_bindgen]
    pub fn start(options_json: &str) {
        trainmem::bench::web::start(options_json);
    }

    /// Stops the running sweep between two points.
    #[wasm_bindgen]
    pub fn cancel() {
        trainmem::bench::web::cancel();
    }

    /// Checks both kernels against the CPU reference.
    #[wasm_bindgen]
    pub fn verify() {
        trainmem::bench::web::verify();
    }
}

fn main() {}

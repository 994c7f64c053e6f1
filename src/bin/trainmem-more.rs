//! The panels a visitor opens later — the planner, the exercises and "make this an exercise",
//! compare, verify, the embed dialog, the benchmark's page and the config.json import — as their
//! own wasm module, with their estimator code (the planner's search and cost model, the
//! exercises, the verify script). The page (the `trainmem` module) loads it with a dynamic
//! `import()` the first time one of them is opened and talks to it through these three exports
//! (see `trainmem::ui::lazy` and `trainmem::ui::more`). Built by scripts/build-modules.sh;
//! natively it does nothing.

#[cfg(target_arch = "wasm32")]
mod exports {
    use wasm_bindgen::prelude::wasm_bindgen;
    use wasm_bindgen::JsValue;

    /// Sets up the module's store from the page's state; `host` takes its changes.
    #[wasm_bindgen]
    pub fn open(host: js_sys::Function, state: &str) -> Result<(), JsValue> {
        trainmem::ui::more::open(host, state).map_err(|e| JsValue::from_str(&e))
    }

    /// Mounts a panel (`plan`, `exercises`, `compare`, `verify`, `import`, `embed`, `bench`)
    /// into an element of the page.
    #[wasm_bindgen]
    pub fn mount(panel: &str, element: web_sys::HtmlElement, options: &str) -> Result<(), JsValue> {
        trainmem::ui::more::mount(panel, element, options).map_err(|e| JsValue::from_str(&e))
    }

    /// The page's state after a change there.
    #[wasm_bindgen]
    pub fn state(state: &str) {
        trainmem::ui::more::state(state);
    }
}

fn main() {}

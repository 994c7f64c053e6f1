//! The `trainmem` binary: the web app when built for wasm (by Trunk), the CLI natively.

fn main() {
    #[cfg(target_arch = "wasm32")]
    trainmem::ui::mount();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::exit(trainmem::cli::main());
}

/// The app module's one export beside its start: the analysis worker's entry
/// (web/compile-worker.js; `trainmem::ui` explains the worker).
#[cfg(target_arch = "wasm32")]
mod exports {
    use wasm_bindgen::prelude::wasm_bindgen;

    /// The one-click answers and cheapest fixes for the configuration `query` decodes to, as
    /// JSON ([`trainmem::answers::Found`]).
    #[wasm_bindgen]
    pub fn analyse(query: &str) -> String {
        trainmem::answers::analyse_query(query)
    }
}

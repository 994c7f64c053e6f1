//! The framework config files as their own wasm module: the importers (`yaml_serde`, `toml`,
//! `shlex`) and the exporters, without Leptos. The app loads it with a dynamic `import()` the
//! first time a file is imported or exported, so that the page's first screen carries no parser,
//! and talks to it in JSON through these two exports (see `trainmem::frameworks::api`).
//! Built by scripts/build-modules.sh; natively it does nothing (the CLI's `trainmem import` and
//! `trainmem export` call the same functions).

#[cfg(target_arch = "wasm32")]
mod exports {
    use wasm_bindgen::prelude::wasm_bindgen;

    /// Files (`[{"name", "text", "format"?}]`) in, the configuration's query and every key's
    /// report out (`trainmem::frameworks::api::ImportReply`).
    #[wasm_bindgen]
    pub fn import_files(files_json: &str) -> String {
        trainmem::frameworks::api::import_json(files_json)
    }

    /// A configuration's share-URL query and a format in, the files to run out
    /// (`trainmem::frameworks::api::ExportReply`).
    #[wasm_bindgen]
    pub fn export_files(query: &str, format: &str) -> String {
        trainmem::frameworks::api::export_json(query, format)
    }
}

fn main() {}

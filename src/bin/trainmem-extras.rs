//! The bar, charts, textbook and config.json import as their own wasm module, loaded by the app
//! right after its first paint (built by scripts/build-modules.sh from Trunk's post-build hook).
//! Natively it does nothing.

fn main() {
    #[cfg(target_arch = "wasm32")]
    trainmem::ui::extras::mount();
}

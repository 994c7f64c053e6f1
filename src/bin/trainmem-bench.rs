//! The benchmark page as its own wasm module, loaded by the app only when opened (built by
//! scripts/build-modules.sh from Trunk's post-build hook). Natively it does nothing: the native
//! benchmark is `trainmem bench`.

fn main() {
    #[cfg(target_arch = "wasm32")]
    trainmem::ui::bench::mount();
}

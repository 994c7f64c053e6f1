//! The `trainmem` binary: the web app when built for wasm (by Trunk), the CLI natively.

fn main() {
    #[cfg(target_arch = "wasm32")]
    trainmem::ui::mount();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::exit(trainmem::cli::main());
}

//! The attention-materialization benchmark (wgpu: WebGPU in the browser, Vulkan natively).

#[cfg(not(target_arch = "wasm32"))]
pub mod cli {
    /// `trainmem bench` (being built).
    pub fn run(_args: &[String], _out: &mut dyn std::io::Write) -> Result<(), String> {
        Err("the benchmark is not built yet".into())
    }
}

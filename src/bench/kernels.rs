//! The WGSL kernels (one per file, included here) and their compute pipelines. Their geometry
//! (tile sizes, the largest head dim) is in [`super::plan`], which checks shapes against it.

/// `S = Q·Kᵀ/√d` into a `[bh][s][s]` storage buffer.
pub(crate) const SCORES_WGSL: &str = include_str!("scores.wgsl");
/// Row softmax of `S`, in place.
pub(crate) const SOFTMAX_WGSL: &str = include_str!("softmax.wgsl");
/// `O = P·V`.
pub(crate) const PV_WGSL: &str = include_str!("pv.wgsl");
/// Fused attention with online softmax; never stores `S`.
pub(crate) const FUSED_WGSL: &str = include_str!("fused.wgsl");
/// `dst = src` (vec4), the bandwidth probe.
pub(crate) const COPY_WGSL: &str = include_str!("copy.wgsl");
/// The half-precision variants (`enable f16;`, f16 in memory, f32 arithmetic).
pub(crate) const SCORES_F16_WGSL: &str = include_str!("scores_f16.wgsl");
pub(crate) const SOFTMAX_F16_WGSL: &str = include_str!("softmax_f16.wgsl");
pub(crate) const PV_F16_WGSL: &str = include_str!("pv_f16.wgsl");
pub(crate) const FUSED_F16_WGSL: &str = include_str!("fused_f16.wgsl");

/// Every kernel, by file name (for the validation tests).
#[cfg(test)]
pub(crate) const ALL: [(&str, &str); 9] = [
    ("scores.wgsl", SCORES_WGSL),
    ("softmax.wgsl", SOFTMAX_WGSL),
    ("pv.wgsl", PV_WGSL),
    ("fused.wgsl", FUSED_WGSL),
    ("copy.wgsl", COPY_WGSL),
    ("scores_f16.wgsl", SCORES_F16_WGSL),
    ("softmax_f16.wgsl", SOFTMAX_F16_WGSL),
    ("pv_f16.wgsl", PV_F16_WGSL),
    ("fused_f16.wgsl", FUSED_F16_WGSL),
];

/// The uniform every attention kernel reads (binding 0), 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub seq: u32,
    pub head_dim: u32,
    pub bh: u32,
    pub scale: f32,
}

/// The attention pipelines of one element type.
pub(crate) struct AttentionKernels {
    pub scores: wgpu::ComputePipeline,
    pub softmax: wgpu::ComputePipeline,
    pub pv: wgpu::ComputePipeline,
    pub fused: wgpu::ComputePipeline,
}

/// The compiled pipelines (bind group layouts are derived from the shaders).
pub(crate) struct Kernels {
    pub f32: AttentionKernels,
    /// Present where the device has `SHADER_F16`.
    pub f16: Option<AttentionKernels>,
    pub copy: wgpu::ComputePipeline,
}

impl Kernels {
    /// Compiles every kernel on `device` (the f16 ones if `f16`). Errors surface through the
    /// caller's error scope.
    pub fn new(device: &wgpu::Device, f16: bool) -> Kernels {
        let make = |label: &str, src: &str| {
            let module = device
                .create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(src.into()) });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Kernels {
            f32: AttentionKernels {
                scores: make("scores.wgsl", SCORES_WGSL),
                softmax: make("softmax.wgsl", SOFTMAX_WGSL),
                pv: make("pv.wgsl", PV_WGSL),
                fused: make("fused.wgsl", FUSED_WGSL),
            },
            f16: f16.then(|| AttentionKernels {
                scores: make("scores_f16.wgsl", SCORES_F16_WGSL),
                softmax: make("softmax_f16.wgsl", SOFTMAX_F16_WGSL),
                pv: make("pv_f16.wgsl", PV_F16_WGSL),
                fused: make("fused_f16.wgsl", FUSED_F16_WGSL),
            }),
            copy: make("copy.wgsl", COPY_WGSL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::FUSED_WORKGROUP_BYTES;
    use super::*;

    fn validate(name: &str, src: &str) -> Result<naga::valid::ModuleInfo, String> {
        let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("{name}: {}", e.emit_to_string(src)))?;
        // The f16 kernels need the capability the `shader-f16` feature grants; the others don't.
        let caps = if src.contains("enable f16;") {
            naga::valid::Capabilities::default() | naga::valid::Capabilities::SHADER_FLOAT16
        } else {
            naga::valid::Capabilities::default()
        };
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).map_err(|e| format!("{name}: {e:?}"))
    }

    #[test]
    fn every_wgsl_kernel_parses_and_validates_with_naga() {
        for (name, src) in ALL {
            if let Err(e) = validate(name, src) {
                panic!("{e}");
            }
        }
    }

    #[test]
    fn every_wgsl_file_opens_with_a_comment_naming_its_bindings_and_workgroup_size() {
        for (name, src) in ALL {
            let header: String = src.lines().take_while(|l| l.starts_with("//")).collect::<Vec<_>>().join("\n");
            assert!(header.contains("Bindings"), "{name} has no bindings comment");
            assert!(header.contains("Workgroup size"), "{name} has no workgroup size comment");
            let bindings = src.matches("@binding(").count();
            for b in 0..bindings {
                assert!(header.contains(&format!("  {b}  ")), "{name}'s header does not list binding {b}");
            }
            assert_eq!(src.matches("@compute").count(), 1, "{name} must hold exactly one kernel");
        }
    }

    /// Bytes of `var<workgroup>` a kernel declares, as naga lays them out.
    fn workgroup_bytes(src: &str) -> u32 {
        let module = naga::front::wgsl::parse_str(src).expect("parses");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("lays out");
        module.global_variables.iter().filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup).map(|(_, g)| layouter[g.ty].size).sum()
    }

    #[test]
    fn every_kernel_fits_webgpus_minimum_workgroup_memory() {
        for (name, src) in ALL {
            assert!(workgroup_bytes(src) <= 16384, "{name}: {} bytes", workgroup_bytes(src));
        }
        assert_eq!(workgroup_bytes(FUSED_WGSL), FUSED_WORKGROUP_BYTES);
        assert_eq!(workgroup_bytes(FUSED_F16_WGSL), FUSED_WORKGROUP_BYTES);
    }

    #[test]
    fn the_params_uniform_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Params>(), 16);
    }
}

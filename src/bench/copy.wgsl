// Copy-bandwidth probe: dst = src, 16 bytes per load and store. Its bytes/s (read + write)
// is the roofline against which the materialized kernels' achieved bandwidth is compared.
//
// Bindings (group 0):
//   0  storage, read         src: array<vec4<f32>>
//   1  storage, read_write   dst: array<vec4<f32>>  (same length as src)
// Workgroup size: (256, 1, 1); dispatch (x, 1, 1) with any x ≥ 1: a grid-stride loop covers
// arrayLength(&dst) elements.

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

const WG: u32 = 256u;

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let n = arrayLength(&dst);
    let stride = nwg.x * WG;
    for (var idx = gid.x; idx < n; idx += stride) {
        dst[idx] = src[idx];
    }
}

// Row softmax of the materialized half-precision scores, in place: P = softmax(S) along the
// key axis, as eager PyTorch's `scores.softmax(dim=-1)` computes it for f16 tensors (math in
// f32, max-subtracted for stability). Needs the `shader-f16` feature.
//
// Bindings (group 0):
//   0  uniform               params: Params  { seq, head_dim, bh, scale }
//   1  storage, read_write   s: array<f16>   [bh][seq][seq], overwritten with P
// Workgroup size: (64, 1, 1); dispatch (seq, bh, 1): one workgroup per row (h, i).
// Three strided passes over the row (max, exp and sum, normalize); tree reductions in a
// 64-float workgroup array.

enable f16;

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> s: array<f16>;

const WG: u32 = 64u;
// A floor for running maxima (WGSL has no infinity literal).
// Not -f32::MAX: naga re-emits it as a decimal that Chrome's WGSL compiler rounds past the
// largest f32 and rejects; scores never come near 1e30.
const LOWEST: f32 = -1.0e30;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let base = (wg.y * n + wg.x) * n;

    var m = LOWEST;
    for (var j = t; j < n; j += WG) {
        m = max(m, f32(s[base + j]));
    }
    red[t] = m;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off >> 1u) {
        if (t < off) {
            red[t] = max(red[t], red[t + off]);
        }
        workgroupBarrier();
    }
    let row_max = red[0];
    workgroupBarrier();

    var sum = 0.0;
    for (var j = t; j < n; j += WG) {
        let e = exp(f32(s[base + j]) - row_max);
        s[base + j] = f16(e);
        sum += e;
    }
    red[t] = sum;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off >> 1u) {
        if (t < off) {
            red[t] = red[t] + red[t + off];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];

    for (var j = t; j < n; j += WG) {
        s[base + j] = f16(f32(s[base + j]) * inv);
    }
}

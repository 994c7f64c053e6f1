// Attention output from the materialized half-precision probabilities: O = P·V, as eager
// PyTorch's `probs @ v` computes it for f16 tensors (accumulated in f32). Needs the
// `shader-f16` feature.
//
// Bindings (group 0):
//   0  uniform               params: Params        { seq, head_dim, bh, scale }
//   1  storage, read         p: array<f16>         [bh][seq][seq]
//   2  storage, read         v: array<vec4<f16>>   [bh][seq][head_dim / 4]
//   3  storage, read_write   o: array<vec4<f16>>   [bh][seq][head_dim / 4]
// Workgroup size: (16, 16, 1), 256 invocations; dispatch (ceil(head_dim/64), ceil(seq/64), bh).
// head_dim must be a multiple of 4. Each workgroup computes 64 query rows × 64 channels of O,
// each invocation 4 rows × one vec4 of channels; 16-key slices of P (64 × 16 f32) and of V
// (16 × 64 f32) are staged in workgroup memory as f32 (2 × 4 KiB).

enable f16;

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> p: array<f16>;
@group(0) @binding(2) var<storage, read> v: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> o: array<vec4<f16>>;

const KEYS: u32 = 16u;

// [row][key], 64 × 16.
var<workgroup> p_tile: array<f32, 1024>;
// [key][vec4 channel], 16 × 16.
var<workgroup> v_tile: array<vec4<f32>, 256>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let d4 = params.head_dim / 4u;
    let h = wg.z;
    let p_base = h * n * n;
    let v_base = h * n * d4;
    let row0 = wg.y * 64u;
    let c0 = wg.x * 16u;
    let c = c0 + lid.x;

    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < n; j0 += KEYS) {
        for (var u = 0u; u < 4u; u++) {
            let e = t + 256u * u;
            let r = row0 + e / KEYS;
            let j = j0 + e % KEYS;
            var pv = 0.0;
            if (r < n && j < n) {
                pv = f32(p[p_base + r * n + j]);
            }
            p_tile[e] = pv;
        }
        let vj = j0 + t / 16u;
        let vc = c0 + t % 16u;
        var vv = vec4<f32>(0.0);
        if (vj < n && vc < d4) {
            vv = vec4<f32>(v[v_base + vj * d4 + vc]);
        }
        v_tile[t] = vv;
        workgroupBarrier();
        for (var jj = 0u; jj < KEYS; jj++) {
            let x = v_tile[jj * 16u + lid.x];
            a0 += p_tile[(lid.y * 4u + 0u) * KEYS + jj] * x;
            a1 += p_tile[(lid.y * 4u + 1u) * KEYS + jj] * x;
            a2 += p_tile[(lid.y * 4u + 2u) * KEYS + jj] * x;
            a3 += p_tile[(lid.y * 4u + 3u) * KEYS + jj] * x;
        }
        workgroupBarrier();
    }

    let rows = array<vec4<f32>, 4>(a0, a1, a2, a3);
    for (var r = 0u; r < 4u; r++) {
        let i = row0 + lid.y * 4u + r;
        if (i < n && c < d4) {
            o[v_base + i * d4 + c] = vec4<f16>(rows[r]);
        }
    }
}

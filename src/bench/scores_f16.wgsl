// Attention scores, materialized, half precision: S = Q·Kᵀ / √d, one f16 per (batch·head,
// query i, key j), as eager PyTorch's `q @ k.transpose(-2, -1) * scale` writes them for f16
// tensors (products accumulated in f32). Needs the `shader-f16` feature.
//
// Bindings (group 0):
//   0  uniform               params: Params        { seq, head_dim, bh, scale }
//   1  storage, read         q: array<vec4<f16>>   [bh][seq][head_dim / 4]
//   2  storage, read         k: array<vec4<f16>>   [bh][seq][head_dim / 4]
//   3  storage, read_write   s: array<f16>         [bh][seq][seq]
// Workgroup size: (16, 16, 1), 256 invocations; dispatch (ceil(seq/64), ceil(seq/64), bh).
// head_dim must be a multiple of 4. Each workgroup computes a 64 × 64 block of S, each
// invocation a 4 × 4 block (query rows 4·y.., key rows 4·x..); 64-row slices of Q and K, 16
// channels wide, are staged in workgroup memory as f32 (2 × 4 KiB).

enable f16;

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> s: array<f16>;

// 64 rows × 4 vec4 (16 channels), row-major.
var<workgroup> q_tile: array<vec4<f32>, 256>;
var<workgroup> k_tile: array<vec4<f32>, 256>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let d4 = params.head_dim / 4u;
    let h = wg.z;
    let base = h * n * d4;
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    // The tile element this invocation loads: row t/4, vec4 column t%4.
    let load_row = t / 4u;
    let load_col = t % 4u;

    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < d4; c0 += 4u) {
        let c = c0 + load_col;
        var qv = vec4<f32>(0.0);
        if (row0 + load_row < n && c < d4) {
            qv = vec4<f32>(q[base + (row0 + load_row) * d4 + c]);
        }
        var kv = vec4<f32>(0.0);
        if (col0 + load_row < n && c < d4) {
            kv = vec4<f32>(k[base + (col0 + load_row) * d4 + c]);
        }
        q_tile[t] = qv;
        k_tile[t] = kv;
        workgroupBarrier();
        for (var cc = 0u; cc < 4u; cc++) {
            let q0 = q_tile[(lid.y * 4u + 0u) * 4u + cc];
            let q1 = q_tile[(lid.y * 4u + 1u) * 4u + cc];
            let q2 = q_tile[(lid.y * 4u + 2u) * 4u + cc];
            let q3 = q_tile[(lid.y * 4u + 3u) * 4u + cc];
            let k0 = k_tile[(lid.x * 4u + 0u) * 4u + cc];
            let k1 = k_tile[(lid.x * 4u + 1u) * 4u + cc];
            let k2 = k_tile[(lid.x * 4u + 2u) * 4u + cc];
            let k3 = k_tile[(lid.x * 4u + 3u) * 4u + cc];
            a0 += vec4<f32>(dot(q0, k0), dot(q0, k1), dot(q0, k2), dot(q0, k3));
            a1 += vec4<f32>(dot(q1, k0), dot(q1, k1), dot(q1, k2), dot(q1, k3));
            a2 += vec4<f32>(dot(q2, k0), dot(q2, k1), dot(q2, k2), dot(q2, k3));
            a3 += vec4<f32>(dot(q3, k0), dot(q3, k1), dot(q3, k2), dot(q3, k3));
        }
        workgroupBarrier();
    }

    let i0 = row0 + lid.y * 4u;
    let j0 = col0 + lid.x * 4u;
    let rows = array<vec4<f32>, 4>(a0, a1, a2, a3);
    for (var r = 0u; r < 4u; r++) {
        let i = i0 + r;
        if (i < n) {
            let out = (h * n + i) * n;
            let row = rows[r] * params.scale;
            for (var c = 0u; c < 4u; c++) {
                if (j0 + c < n) {
                    s[out + j0 + c] = f16(row[c]);
                }
            }
        }
    }
}

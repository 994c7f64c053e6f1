// Fused attention, FlashAttention-style: O = softmax(Q·Kᵀ / √d)·V without ever storing S.
// K and V are streamed through workgroup memory in tiles of 16 rows; each query row keeps a
// running maximum m, a running denominator l and an unnormalized accumulator (online softmax),
// so the memory is Q, K, V and O only: linear in seq.
//
// Bindings (group 0):
//   0  uniform               params: Params        { seq, head_dim, bh, scale }
//   1  storage, read         q: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   2  storage, read         k: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   3  storage, read         v: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   4  storage, read_write   o: array<vec4<f32>>   [bh][seq][head_dim / 4]
// Workgroup size: (64, 1, 1); dispatch (ceil(seq/64), bh, 1). One invocation per query row;
// head_dim a multiple of 4, at most 128. Workgroup memory: K and V tiles of 16 × 128 f32 =
// 16 KiB (WebGPU's minimum maxComputeWorkgroupStorageSize).

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> o: array<vec4<f32>>;

const WG: u32 = 64u;
const BC: u32 = 16u;
// head_dim / 4 at most.
const MAX_D4: u32 = 32u;
// Lowest finite f32 (WGSL has no infinity literal).
const LOWEST: f32 = -3.40282347e38;

// [row][vec4 channel], BC × MAX_D4.
var<workgroup> k_tile: array<vec4<f32>, 512>;
var<workgroup> v_tile: array<vec4<f32>, 512>;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let d4 = min(params.head_dim / 4u, MAX_D4);
    let h = wg.y;
    let base = h * n * d4;
    let i = wg.x * WG + t;
    let live = i < n;

    var q_row: array<vec4<f32>, 32>;
    var acc: array<vec4<f32>, 32>;
    for (var c = 0u; c < d4; c++) {
        var x = vec4<f32>(0.0);
        if (live) {
            x = q[base + i * d4 + c] * params.scale;
        }
        q_row[c] = x;
        acc[c] = vec4<f32>(0.0);
    }
    var m = LOWEST;
    var l = 0.0;
    var sc: array<f32, 16>;

    for (var j0 = 0u; j0 < n; j0 += BC) {
        let rows = min(BC, n - j0);
        for (var e = t; e < BC * d4; e += WG) {
            let r = e / d4;
            let c = e % d4;
            var kv = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (r < rows) {
                kv = k[base + (j0 + r) * d4 + c];
                vv = v[base + (j0 + r) * d4 + c];
            }
            k_tile[r * MAX_D4 + c] = kv;
            v_tile[r * MAX_D4 + c] = vv;
        }
        workgroupBarrier();
        if (live) {
            var tile_max = m;
            for (var r = 0u; r < rows; r++) {
                var dt = 0.0;
                for (var c = 0u; c < d4; c++) {
                    dt += dot(q_row[c], k_tile[r * MAX_D4 + c]);
                }
                sc[r] = dt;
                tile_max = max(tile_max, dt);
            }
            let corr = exp(m - tile_max);
            l = l * corr;
            for (var c = 0u; c < d4; c++) {
                acc[c] = acc[c] * corr;
            }
            for (var r = 0u; r < rows; r++) {
                let pr = exp(sc[r] - tile_max);
                l += pr;
                for (var c = 0u; c < d4; c++) {
                    acc[c] += pr * v_tile[r * MAX_D4 + c];
                }
            }
            m = tile_max;
        }
        workgroupBarrier();
    }
    if (live) {
        let inv = 1.0 / l;
        for (var c = 0u; c < d4; c++) {
            o[base + i * d4 + c] = acc[c] * inv;
        }
    }
}

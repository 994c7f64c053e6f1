// Fused attention, FlashAttention-style: O = softmax(Q·Kᵀ / √d)·V without ever storing S.
// K and V are streamed through workgroup memory in tiles of 16 rows; each query row keeps a
// running maximum m, a running denominator l and an unnormalized accumulator (online softmax),
// so the memory is Q, K, V and O only: linear in seq.
//
// Bindings (group 0):
//   0  uniform               params: Params  { seq, head_dim, bh, scale }
//   1  storage, read         q: array<f32>   [bh][seq][head_dim]
//   2  storage, read         k: array<f32>   [bh][seq][head_dim]
//   3  storage, read         v: array<f32>   [bh][seq][head_dim]
//   4  storage, read_write   o: array<f32>   [bh][seq][head_dim]
// Workgroup size: (64, 1, 1); dispatch (ceil(seq/64), bh, 1). One invocation per query row;
// head_dim ≤ 128. Workgroup memory: K and V tiles of 16 × 128 f32 = 16 KiB (WebGPU's minimum
// maxComputeWorkgroupStorageSize).

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

const WG: u32 = 64u;
const BC: u32 = 16u;
const MAX_D: u32 = 128u;
// Lowest finite f32 (WGSL has no infinity literal).
const LOWEST: f32 = -3.40282347e38;

var<workgroup> k_tile: array<f32, 2048>; // BC * MAX_D
var<workgroup> v_tile: array<f32, 2048>;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let d = min(params.head_dim, MAX_D);
    let h = wg.y;
    let base = h * n * d;
    let i = wg.x * WG + t;
    let live = i < n;

    var q_row: array<f32, 128>;
    var acc: array<f32, 128>;
    for (var c = 0u; c < d; c++) {
        var x = 0.0;
        if (live) {
            x = q[base + i * d + c] * params.scale;
        }
        q_row[c] = x;
        acc[c] = 0.0;
    }
    var m = LOWEST;
    var l = 0.0;
    var sc: array<f32, 16>;

    for (var j0 = 0u; j0 < n; j0 += BC) {
        let rows = min(BC, n - j0);
        for (var e = t; e < BC * d; e += WG) {
            let r = e / d;
            let c = e % d;
            var kv = 0.0;
            var vv = 0.0;
            if (r < rows) {
                kv = k[base + (j0 + r) * d + c];
                vv = v[base + (j0 + r) * d + c];
            }
            k_tile[r * MAX_D + c] = kv;
            v_tile[r * MAX_D + c] = vv;
        }
        workgroupBarrier();
        if (live) {
            var tile_max = m;
            for (var r = 0u; r < rows; r++) {
                var dot = 0.0;
                for (var c = 0u; c < d; c++) {
                    dot += q_row[c] * k_tile[r * MAX_D + c];
                }
                sc[r] = dot;
                tile_max = max(tile_max, dot);
            }
            let corr = exp(m - tile_max);
            l = l * corr;
            for (var c = 0u; c < d; c++) {
                acc[c] = acc[c] * corr;
            }
            for (var r = 0u; r < rows; r++) {
                let pr = exp(sc[r] - tile_max);
                l += pr;
                for (var c = 0u; c < d; c++) {
                    acc[c] += pr * v_tile[r * MAX_D + c];
                }
            }
            m = tile_max;
        }
        workgroupBarrier();
    }
    if (live) {
        let inv = 1.0 / l;
        for (var c = 0u; c < d; c++) {
            o[base + i * d + c] = acc[c] * inv;
        }
    }
}

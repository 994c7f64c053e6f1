// Fused attention, FlashAttention-style: O = softmax(Q·Kᵀ / √d)·V without ever storing S.
// A workgroup owns 16 query rows and walks the keys 16 at a time. Per tile, invocation
// (row r, key x) computes one score (Q and K read straight from the storage buffers) into a
// 16 × 16 scratch tile while the tile's V rows are staged in workgroup memory; then invocation
// (row r, lane x) rescales its slice of row r's accumulator with the running maximum m and
// denominator l (online softmax) and adds the tile's P·V. Memory is Q, K, V and O only:
// linear in seq.
//
// Bindings (group 0):
//   0  uniform               params: Params        { seq, head_dim, bh, scale }
//   1  storage, read         q: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   2  storage, read         k: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   3  storage, read         v: array<vec4<f32>>   [bh][seq][head_dim / 4]
//   4  storage, read_write   o: array<vec4<f32>>   [bh][seq][head_dim / 4]
// Workgroup size: (16, 16, 1), 256 invocations (x: key in the tile / channel lane, y: query
// row); dispatch (ceil(seq/16), bh, 1). head_dim a multiple of 4, at most 128; lane x owns
// the vec4 channels x and x + 16. Workgroup memory: V tile 16 × 128 f32 and score tile
// 16 × 16 f32 = 9 KiB.

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

const ROWS: u32 = 16u;
const KEYS: u32 = 16u;
// head_dim / 4 at most.
const MAX_D4: u32 = 32u;
// A floor for running maxima (WGSL has no infinity literal).
// Not -f32::MAX: naga re-emits it as a decimal that Chrome's WGSL compiler rounds past the
// largest f32 and rejects; scores never come near 1e30.
const LOWEST: f32 = -1.0e30;

// [key][vec4 channel], KEYS × MAX_D4.
var<workgroup> v_tile: array<vec4<f32>, 512>;
// [row][key], ROWS × KEYS.
var<workgroup> s_tile: array<f32, 256>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = params.seq;
    let d4 = min(params.head_dim / 4u, MAX_D4);
    let h = wg.y;
    let base = h * n * d4;
    let r = lid.y;
    let x = lid.x;
    let i = wg.x * ROWS + r;
    // Rows past the end compute on row n - 1 and write nothing.
    let q_row = base + min(i, n - 1u) * d4;

    var m = LOWEST;
    var l = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);

    for (var j0 = 0u; j0 < n; j0 += KEYS) {
        // Score of (row r, key j0 + x).
        let j = j0 + x;
        var sc = LOWEST;
        if (j < n) {
            let k_row = base + j * d4;
            var dt = 0.0;
            for (var c = 0u; c < d4; c++) {
                dt += dot(q[q_row + c], k[k_row + c]);
            }
            sc = dt * params.scale;
        }
        s_tile[r * KEYS + x] = sc;
        // V tile: 16 keys × 32 vec4, two per invocation.
        for (var u = 0u; u < 2u; u++) {
            let e = t + 256u * u;
            let vr = j0 + e / MAX_D4;
            let vc = e % MAX_D4;
            var vv = vec4<f32>(0.0);
            if (vr < n && vc < d4) {
                vv = v[base + vr * d4 + vc];
            }
            v_tile[e] = vv;
        }
        workgroupBarrier();
        // Online softmax update of row r's channels x and x + 16.
        var tile_max = m;
        for (var jj = 0u; jj < KEYS; jj++) {
            tile_max = max(tile_max, s_tile[r * KEYS + jj]);
        }
        let corr = exp(m - tile_max);
        l = l * corr;
        acc0 = acc0 * corr;
        acc1 = acc1 * corr;
        for (var jj = 0u; jj < KEYS; jj++) {
            let p = exp(s_tile[r * KEYS + jj] - tile_max);
            l += p;
            acc0 += p * v_tile[jj * MAX_D4 + x];
            acc1 += p * v_tile[jj * MAX_D4 + x + 16u];
        }
        m = tile_max;
        workgroupBarrier();
    }

    if (i < n) {
        let inv = 1.0 / l;
        if (x < d4) {
            o[base + i * d4 + x] = acc0 * inv;
        }
        if (x + 16u < d4) {
            o[base + i * d4 + x + 16u] = acc1 * inv;
        }
    }
}

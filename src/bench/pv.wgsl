// Attention output from the materialized probabilities: O = P·V, as eager PyTorch's
// `probs @ v` computes it.
//
// Bindings (group 0):
//   0  uniform               params: Params  { seq, head_dim, bh, scale }
//   1  storage, read         p: array<f32>   [bh][seq][seq]
//   2  storage, read         v: array<f32>   [bh][seq][head_dim]
//   3  storage, read_write   o: array<f32>   [bh][seq][head_dim]
// Workgroup size: (16, 16, 1), 256 invocations; dispatch (ceil(head_dim/16), ceil(seq/16), bh).
// One invocation per output O[h][i][c] (x → channel c, y → query row i); 16×16 tiles of P and
// V are staged in workgroup memory (2 KiB).

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> p: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

const TILE: u32 = 16u;

var<workgroup> p_tile: array<array<f32, 16>, 16>;
var<workgroup> v_tile: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let n = params.seq;
    let d = params.head_dim;
    let h = wg.z;
    let i = wg.y * TILE + lid.y;
    let c = wg.x * TILE + lid.x;
    let p_base = h * n * n;
    let v_base = h * n * d;

    var acc = 0.0;
    for (var j0 = 0u; j0 < n; j0 += TILE) {
        // P[i][j0 + lid.x] and V[j0 + lid.y][c].
        let pj = j0 + lid.x;
        var pv = 0.0;
        if (i < n && pj < n) {
            pv = p[p_base + i * n + pj];
        }
        let vj = j0 + lid.y;
        var vv = 0.0;
        if (vj < n && c < d) {
            vv = v[v_base + vj * d + c];
        }
        p_tile[lid.y][lid.x] = pv;
        v_tile[lid.y][lid.x] = vv;
        workgroupBarrier();
        for (var t = 0u; t < TILE; t++) {
            acc += p_tile[lid.y][t] * v_tile[t][lid.x];
        }
        workgroupBarrier();
    }
    if (i < n && c < d) {
        o[v_base + i * d + c] = acc;
    }
}

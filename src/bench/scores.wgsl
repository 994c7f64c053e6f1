// Attention scores, materialized: S = Q·Kᵀ / √d, one f32 per (batch·head, query i, key j),
// as eager PyTorch's `q @ k.transpose(-2, -1) * scale` writes them.
//
// Bindings (group 0):
//   0  uniform               params: Params  { seq, head_dim, bh, scale }
//   1  storage, read         q: array<f32>   [bh][seq][head_dim]
//   2  storage, read         k: array<f32>   [bh][seq][head_dim]
//   3  storage, read_write   s: array<f32>   [bh][seq][seq]
// Workgroup size: (16, 16, 1), 256 invocations; dispatch (ceil(seq/16), ceil(seq/16), bh).
// One invocation per score S[h][i][j] (i = query row, j = key row); 16×16 tiles of Q and K
// are staged in workgroup memory (2 KiB).

struct Params {
    seq: u32,
    head_dim: u32,
    bh: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> s: array<f32>;

const TILE: u32 = 16u;

var<workgroup> q_tile: array<array<f32, 16>, 16>;
var<workgroup> k_tile: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let n = params.seq;
    let d = params.head_dim;
    let h = wg.z;
    let base = h * n * d;
    // This invocation's score.
    let i = wg.y * TILE + lid.y;
    let j = wg.x * TILE + lid.x;
    // Rows this invocation loads into the tiles.
    let k_row = wg.x * TILE + lid.y;

    var acc = 0.0;
    for (var c0 = 0u; c0 < d; c0 += TILE) {
        let c = c0 + lid.x;
        var qv = 0.0;
        if (i < n && c < d) {
            qv = q[base + i * d + c];
        }
        var kv = 0.0;
        if (k_row < n && c < d) {
            kv = k[base + k_row * d + c];
        }
        q_tile[lid.y][lid.x] = qv;
        k_tile[lid.y][lid.x] = kv;
        workgroupBarrier();
        for (var t = 0u; t < TILE; t++) {
            acc += q_tile[lid.y][t] * k_tile[lid.x][t];
        }
        workgroupBarrier();
    }
    if (i < n && j < n) {
        s[(h * n + i) * n + j] = acc * params.scale;
    }
}

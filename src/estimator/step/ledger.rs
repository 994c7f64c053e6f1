//! What a program keeps for backward at the end of its forward pass: every storage an autograd
//! node saved (outside checkpoint regions) or a checkpoint region holds, once per storage,
//! parameters excluded — the activation ledger's rows, as formulas.

use super::ir::{Group, Origin, Program, Tid};
use crate::estimator::part::Part;

/// One saved storage: its base tensor, ledger part and layer group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Kept {
    pub t: Tid,
    pub part: Part,
    pub group: Group,
    /// Counted by another program (a model-level tensor a layer saves).
    pub elsewhere: bool,
}

/// The storages `p` keeps at the end of its forward pass, in forward order.
pub fn kept(p: &Program) -> Vec<Kept> {
    let mut seen = vec![false; p.tensors.len()];
    let mut out = Vec::new();
    let mut push = |t: Tid, part: Part, group: Group, out: &mut Vec<Kept>| {
        let b = p.tensors[t as usize].base;
        let x = &p.tensors[b as usize];
        if matches!(x.origin, Origin::Param { .. } | Origin::Buffer) || seen[b as usize] {
            return;
        }
        seen[b as usize] = true;
        out.push(Kept { t: b, part: x.part.unwrap_or(part), group, elsewhere: x.elsewhere });
    };
    let mut region = 0usize;
    for (i, op) in p.ops.iter().enumerate() {
        // A region's holds are taken when it starts.
        while region < p.regions.len() && p.regions[region].first as usize <= i {
            let r = &p.regions[region];
            if r.end > r.first {
                for s in r.held.iter().chain(&r.cached) {
                    push(s.t, s.part, s.group, &mut out);
                }
            }
            region += 1;
        }
        let inside = p.regions.iter().any(|r| (r.first as usize..r.end as usize).contains(&i));
        if !inside {
            for s in p.saved(op) {
                push(s.t, s.part, s.group, &mut out);
            }
        }
    }
    out
}

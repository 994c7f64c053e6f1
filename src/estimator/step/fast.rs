//! `memory.peak` without materializing the stream: the stage's program is cut into its
//! prologue, each kind of decoder layer, and its epilogue; each piece is run once on its own
//! (its inputs alive on entry, its outputs handed on), which gives its peak and its net change
//! relative to entry, forward and backward; the pieces are then applied in the stream's order,
//! one decoder layer at a time. Because the simulation is linear in the memory already alive,
//! this equals the materialized stream's maximum (tested on every preset).

use super::ir::DType;
use super::run::{At, Sink};
use super::Cat;

/// A sink that tracks live bytes relative to its start and their maximum.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tracker {
    pub live: i128,
    pub peak: i128,
    /// Live bytes by category (activations, gradients, transient) now and at the peak.
    pub cats: [i128; 3],
    pub at_peak: [i128; 3],
    pub peak_at: Option<At>,
    next: u32,
}

fn ci(c: Cat) -> usize {
    match c {
        Cat::Activations => 0,
        Cat::Gradients => 1,
        Cat::Transient => 2,
    }
}

impl Sink for Tracker {
    fn alloc(&mut self, bytes: u128, _dtype: DType, cat: Cat, at: &At) -> u32 {
        self.live += bytes as i128;
        self.cats[ci(cat)] += bytes as i128;
        if self.live > self.peak || self.peak_at.is_none() {
            self.peak = self.live;
            self.at_peak = self.cats;
            self.peak_at = Some(*at);
        }
        self.next += 1;
        self.next - 1
    }
    fn free(&mut self, _id: u32, bytes: u128, cat: Cat, _at: &At) {
        self.live -= bytes as i128;
        self.cats[ci(cat)] -= bytes as i128;
    }
}

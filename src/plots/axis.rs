//! A chart axis that is linear or logarithmic with ticks chosen by the chart (1K, 32K, 1M; 8B,
//! 70B), and the [`Frame`] that maps data to pixels and back.
//!
//! plotters' own log axis (`LogCoord`) can neither be cloned nor reversed, and its automatic key
//! points cannot be told to put a tick at 70B; this one implements `Ranged` *and*
//! `ReversibleRanged`, so the pixel → value transform of a drawn chart (the hover read-out) is
//! plotters' own `reverse_translate` through the very axes the chart was drawn with.

use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged, ReversibleRanged};
use plotters::coord::{CoordTranslate, ReverseCoordTranslate};
use std::ops::Range;

/// One axis: its range, its scale and its ticks.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    /// Labelled ticks (and bold grid lines).
    ticks: Vec<f64>,
    /// Unlabelled light grid lines.
    light: Vec<f64>,
}

impl Axis {
    /// A linear axis over `lo..hi` with about `n` "nice" ticks (1, 2, 2.5, 5 × 10ᵏ steps).
    pub fn linear(lo: f64, hi: f64, n: usize) -> Axis {
        let (lo, hi) = ordered(lo, hi);
        Axis { lo, hi, log: false, ticks: nice_ticks(lo, hi, n), light: Vec::new() }
    }

    /// A logarithmic axis over `lo..hi` (both > 0) with ticks at the powers of ten and light
    /// lines at 2…9 × 10ᵏ; over less than two decades, ticks at 1, 2 and 5 × 10ᵏ too.
    pub fn log(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = ordered(lo.max(f64::MIN_POSITIVE), hi.max(f64::MIN_POSITIVE));
        let (mut ticks, light) = decade_ticks(lo, hi);
        if ticks.len() < 3 {
            let mut more: Vec<f64> = ticks.clone();
            more.extend(light.iter().copied().filter(|v| {
                let m = (v / 10f64.powf(v.log10().floor())).round();
                m == 2.0 || m == 5.0
            }));
            sort(&mut more);
            ticks = more;
        }
        // Over less than a factor of about five (70 to 90 s) even those may be one or none:
        // evenly spaced "nice" values then, so that every axis has at least three ticks.
        if ticks.len() < 3 {
            ticks = nice_ticks(lo, hi, 4);
        }
        Axis { lo, hi, log: true, ticks, light }
    }

    /// Replaces the labelled ticks (values outside the range are dropped).
    pub fn with_ticks(mut self, ticks: impl IntoIterator<Item = f64>) -> Axis {
        self.ticks = ticks.into_iter().filter(|t| self.contains(*t)).collect();
        sort(&mut self.ticks);
        self.ticks.dedup();
        self
    }

    /// Replaces the light grid lines.
    pub fn with_light(mut self, light: impl IntoIterator<Item = f64>) -> Axis {
        self.light = light.into_iter().filter(|t| self.contains(*t)).collect();
        self
    }

    pub fn lo(&self) -> f64 {
        self.lo
    }
    pub fn hi(&self) -> f64 {
        self.hi
    }
    pub fn is_log(&self) -> bool {
        self.log
    }
    pub fn ticks(&self) -> &[f64] {
        &self.ticks
    }
    pub fn light(&self) -> &[f64] {
        &self.light
    }

    /// Whether `v` lies in the range (with a little slack for rounding).
    pub fn contains(&self, v: f64) -> bool {
        let eps = (self.hi - self.lo).abs() * 1e-9;
        v >= self.lo - eps && v <= self.hi + eps
    }

    fn f(&self, v: f64) -> f64 {
        if self.log {
            v.max(f64::MIN_POSITIVE).ln()
        } else {
            v
        }
    }

    /// Position of `v` along the axis: 0 at `lo`, 1 at `hi` (outside for values outside).
    pub fn fraction(&self, v: f64) -> f64 {
        let (a, b) = (self.f(self.lo), self.f(self.hi));
        if b == a {
            0.5
        } else {
            (self.f(v) - a) / (b - a)
        }
    }

    /// The value at position `t` (the inverse of [`Axis::fraction`]).
    pub fn value_at(&self, t: f64) -> f64 {
        let (a, b) = (self.f(self.lo), self.f(self.hi));
        let u = a + t * (b - a);
        if self.log {
            u.exp()
        } else {
            u
        }
    }

    /// Keeps only ticks at least `min_gap` pixels apart on an axis `pixels` long, preferring
    /// the ones listed in `keep` (and then the earlier ones).
    pub fn thinned(mut self, pixels: f64, min_gap: f64, keep: &[f64]) -> Axis {
        let pos = |v: f64| self.fraction(v) * pixels;
        let mut chosen: Vec<f64> = Vec::new();
        let priority = keep.iter().copied().filter(|k| self.contains(*k)).chain(self.ticks.iter().copied());
        for t in priority {
            if chosen.iter().all(|c| (pos(*c) - pos(t)).abs() >= min_gap) {
                chosen.push(t);
            }
        }
        sort(&mut chosen);
        chosen.dedup();
        // Never fewer than three where there were three: the first, the middle and the last.
        if chosen.len() < 3 && self.ticks.len() >= 3 {
            let t = &self.ticks;
            chosen = vec![t[0], t[t.len() / 2], t[t.len() - 1]];
        }
        self.ticks = chosen;
        self
    }
}

fn ordered(a: f64, b: f64) -> (f64, f64) {
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    if a == b {
        // A degenerate range still gets a width, so that nothing divides by zero.
        let d = if a == 0.0 { 1.0 } else { a.abs() * 0.1 };
        (a - d, b + d)
    } else {
        (a, b)
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let t = self.fraction(*value);
        let len = (limit.1 - limit.0) as f64;
        if !t.is_finite() {
            return if t > 0.0 { limit.1 } else { limit.0 };
        }
        // Round to the nearest pixel (plotters' own axes floor; nearest keeps a curve's pixels
        // symmetric about its values, which the slope checks in the tests rely on).
        limit.0 + (len * t).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl ReversibleRanged for Axis {
    fn unmap(&self, input: i32, limit: (i32, i32)) -> Option<f64> {
        if limit.0 == limit.1 {
            return None;
        }
        let t = (input - limit.0) as f64 / (limit.1 - limit.0) as f64;
        Some(self.value_at(t))
    }
}

/// Sorts a handful of values ascending (an insertion sort: ticks are a few dozen, and the
/// standard library's sort would add kilobytes of code to the page for them).
pub fn sort(v: &mut [f64]) {
    for i in 1..v.len() {
        let mut j = i;
        while j > 0 && v[j - 1].total_cmp(&v[j]).is_gt() {
            v.swap(j - 1, j);
            j -= 1;
        }
    }
}

/// About `n` ticks at multiples of 1, 2, 2.5 or 5 × 10ᵏ inside `lo..=hi`.
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || n == 0 {
        return Vec::new();
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|i| i as f64 * step).map(|v| if v.abs() < step * 1e-9 { 0.0 } else { v }).collect()
}

/// Powers of ten inside `lo..=hi` and the light lines 2…9 × 10ᵏ between them.
pub fn decade_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let mut ticks = Vec::new();
    let mut light = Vec::new();
    let k0 = lo.log10().floor() as i32;
    let k1 = hi.log10().ceil() as i32;
    for k in k0..=k1 {
        let d = 10f64.powi(k);
        if d >= lo * (1.0 - 1e-9) && d <= hi * (1.0 + 1e-9) {
            ticks.push(d);
        }
        for m in 2..10 {
            let v = d * m as f64;
            if v >= lo && v <= hi {
                light.push(v);
            }
        }
    }
    (ticks, light)
}

/// Powers of two inside `lo..=hi`.
pub fn pow2_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut v = 1.0f64;
    while v < lo * (1.0 - 1e-9) {
        v *= 2.0;
    }
    while v <= hi * (1.0 + 1e-9) {
        out.push(v);
        v *= 2.0;
    }
    out
}

/// Where a drawn chart put its data: the two axes and the pixels of the plotting area. Maps a
/// data point to canvas pixels and a pixel back to data (the hover read-out).
#[derive(Clone)]
pub struct Frame {
    /// The chart's coordinate specification, as plotters drew with it.
    pub coord: Cartesian2d<Axis, Axis>,
}

impl Frame {
    /// Canvas pixel of a data point.
    pub fn to_px(&self, x: f64, y: f64) -> (i32, i32) {
        self.coord.translate(&(x, y))
    }
    /// Data point under a canvas pixel (plotters' `reverse_translate`).
    pub fn from_px(&self, p: (i32, i32)) -> Option<(f64, f64)> {
        self.coord.reverse_translate(p)
    }
    /// Horizontal pixels of the plotting area.
    pub fn x_pixels(&self) -> Range<i32> {
        self.coord.get_x_axis_pixel_range()
    }
    /// Vertical pixels of the plotting area (top to bottom).
    pub fn y_pixels(&self) -> Range<i32> {
        self.coord.get_y_axis_pixel_range()
    }
    pub fn x_axis(&self) -> &Axis {
        self.coord.x_spec()
    }
    pub fn y_axis(&self) -> &Axis {
        self.coord.y_spec()
    }
    /// The index of the x value in `xs` nearest to the pointer at canvas pixel `p`: the pixel
    /// is mapped back to data through the chart's coordinate transform, and nearness is measured
    /// along the axis (so on a log axis 1K is as near to 1.5K as 2K is to 3K). `None` when the
    /// pointer is left or right of the plotting area by more than `slack` pixels.
    pub fn index_at(&self, xs: &[f64], p: (i32, i32), slack: i32) -> Option<usize> {
        let r = self.x_pixels();
        if p.0 < r.start.min(r.end) - slack || p.0 > r.end.max(r.start) + slack {
            return None;
        }
        let (x, _) = self.from_px(p)?;
        let ax = self.x_axis();
        let at = ax.fraction(x);
        xs.iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .min_by(|(_, a), (_, b)| (ax.fraction(**a) - at).abs().total_cmp(&(ax.fraction(**b) - at).abs()))
            .map(|(i, _)| i)
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("x", self.x_axis())
            .field("y", self.y_axis())
            .field("x_pixels", &self.x_pixels())
            .field("y_pixels", &self.y_pixels())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::sort;

    #[test]
    fn the_tick_sort_orders_values_ascending() {
        let mut v = vec![3.0, -1.0, 2.5, 2.5, 100.0, 0.0];
        sort(&mut v);
        assert_eq!(v, vec![-1.0, 0.0, 2.5, 2.5, 3.0, 100.0]);
        let mut e: Vec<f64> = vec![];
        sort(&mut e);
        assert!(e.is_empty());
    }

    use super::*;

    #[test]
    fn a_log_axis_puts_each_doubling_the_same_distance_apart() {
        let a = Axis::log(128.0, 131072.0);
        // 128 → 131,072 is ten doublings: each is a tenth of the axis.
        assert!((a.fraction(256.0) - 0.1).abs() < 1e-12);
        assert!((a.fraction(4096.0) - 0.5).abs() < 1e-12);
        assert!((a.value_at(0.5) - 4096.0).abs() < 1e-6);
    }

    #[test]
    fn mapping_a_value_to_pixels_and_back_returns_it_to_within_a_pixel() {
        let a = Axis::log(100.0, 1e6);
        let limit = (50, 850);
        for v in [100.0, 3162.0, 77_000.0, 1e6] {
            let px = a.map(&v, limit);
            let back = a.unmap(px, limit).expect("non-empty axis");
            // One pixel is 4 decades / 800 px = 0.005 decades ≈ 1.2 %.
            assert!((back / v - 1.0).abs() < 0.012, "{v} → {px} → {back}");
        }
    }

    #[test]
    fn nice_ticks_step_by_one_two_or_five() {
        assert_eq!(nice_ticks(0.0, 100.0, 5), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(0.0, 1.0, 4), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(nice_ticks(0.0, 170.0, 6), vec![0.0, 50.0, 100.0, 150.0]);
    }

    #[test]
    fn decade_and_power_of_two_ticks_stay_in_range() {
        let (t, l) = decade_ticks(50.0, 20_000.0);
        assert_eq!(t, vec![100.0, 1000.0, 10_000.0]);
        assert!(l.contains(&50.0) && l.contains(&20_000.0) && !l.contains(&40.0));
        assert_eq!(pow2_ticks(100.0, 1024.0), vec![128.0, 256.0, 512.0, 1024.0]);
    }

    #[test]
    fn a_log_axis_over_one_decade_gets_ticks_at_one_two_and_five() {
        assert_eq!(Axis::log(30.0, 300.0).ticks(), &[50.0, 100.0, 200.0]);
        assert_eq!(Axis::log(1.0, 1e4).ticks(), &[1.0, 10.0, 100.0, 1000.0, 10_000.0]);
    }

    #[test]
    fn thinning_keeps_the_preferred_ticks_and_drops_crowded_ones() {
        let a = Axis::log(1e8, 1e12).with_ticks([1e8, 1e9, 1e10, 1e11, 1e12]);
        // 8B sits 0.9 decade above 1B: on a 200 px axis (50 px per decade) it is 5 px from 10B.
        let t = a.thinned(200.0, 30.0, &[8e9]);
        assert!(t.ticks().contains(&8e9));
        assert!(!t.ticks().contains(&1e10));
        assert!(t.ticks().contains(&1e9) && t.ticks().contains(&1e11));
    }
}

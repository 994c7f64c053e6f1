//! The CPU reference: `S = Q·Kᵀ/√d` and `O = softmax(S)·V`, in f64 internally, and the
//! deterministic random inputs the GPU runs use.
//!
//! Layouts as on the GPU: Q, K, V, O are `[batch·heads][seq][head_dim]`, S is
//! `[batch·heads][seq][seq]`, all row-major f32.

use super::shape::AttentionShape;

/// Deterministic uniform values in `[-1, 1)` (xorshift64*), `n` of them.
pub fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    if x == 0 {
        x = 1;
    }
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
            // Top 24 bits → [0, 1) exactly representable in f32, then → [-1, 1).
            ((r >> 40) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Random Q, K, V for `shape`, from one seed.
pub fn random_qkv(shape: AttentionShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = shape.qkv_elems() as usize;
    (random_values(n, seed), random_values(n, seed.wrapping_add(1)), random_values(n, seed.wrapping_add(2)))
}

/// `S[h][i][j] = Σ_c Q[h][i][c]·K[h][j][c] / √d`.
pub fn scores(shape: AttentionShape, q: &[f32], k: &[f32]) -> Vec<f32> {
    let (n, d) = (shape.seq as usize, shape.head_dim as usize);
    let scale = 1.0 / (d as f64).sqrt();
    let mut s = Vec::with_capacity(shape.score_elems() as usize);
    for h in 0..shape.bh() as usize {
        let base = h * n * d;
        for i in 0..n {
            let qi = &q[base + i * d..base + (i + 1) * d];
            for j in 0..n {
                let kj = &k[base + j * d..base + (j + 1) * d];
                let dot: f64 = qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                s.push((dot * scale) as f32);
            }
        }
    }
    s
}

/// `O = softmax(Q·Kᵀ/√d)·V`, softmax along each row (max-subtracted).
pub fn attention(shape: AttentionShape, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let (n, d) = (shape.seq as usize, shape.head_dim as usize);
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0f32; shape.qkv_elems() as usize];
    let mut row = vec![0f64; n];
    for h in 0..shape.bh() as usize {
        let base = h * n * d;
        for i in 0..n {
            let qi = &q[base + i * d..base + (i + 1) * d];
            for (j, r) in row.iter_mut().enumerate() {
                let kj = &k[base + j * d..base + (j + 1) * d];
                *r = qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale;
            }
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for r in row.iter_mut() {
                *r = (*r - m).exp();
                sum += *r;
            }
            for c in 0..d {
                let acc: f64 = row.iter().enumerate().map(|(j, p)| p * v[base + j * d + c] as f64).sum();
                o[base + i * d + c] = (acc / sum) as f32;
            }
        }
    }
    o
}

/// The bits of the f16 nearest to `x` (ties to even); beyond the f16 range, ±∞; NaN stays NaN.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let round = |full: u32, shift: u32| -> u32 {
        let m = full >> shift;
        let rem = full & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rem > half || (rem == half && m & 1 == 1) {
            m + 1
        } else {
            m
        }
    };
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal f16 (or zero): m × 2⁻²⁴ with m = (1.man) · 2^(exp−126).
        let shift = (14 - e) as u32;
        if shift >= 25 {
            return sign;
        }
        return sign | round(man | 0x80_0000, shift) as u16;
    }
    // Normal: a mantissa carry into the exponent (and up to ∞) is the right answer.
    let m = round(man, 13);
    sign | (((e as u32) << 10) + m) as u16
}

/// The f32 value of f16 bits (exact).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    match e {
        0 => sign * m * (-24f32).exp2(),
        0x1f if m == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        _ => sign * (1.0 + m / 1024.0) * ((e - 15) as f32).exp2(),
    }
}

/// Every value rounded to the nearest f16 (what an f16 buffer holds).
pub fn round_to_f16(xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|&x| f16_bits_to_f32(f32_to_f16_bits(x))).collect()
}

/// Largest absolute difference between two equally long slices (∞ if the lengths differ or
/// a value is not finite).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (*x as f64 - *y as f64).abs();
            if d.is_finite() {
                d
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(bh: u32, seq: u32, d: u32) -> AttentionShape {
        AttentionShape { batch: 1, heads: bh, seq, head_dim: d }
    }

    #[test]
    fn random_values_are_deterministic_and_in_range() {
        let a = random_values(1000, 7);
        assert_eq!(a, random_values(1000, 7));
        assert_ne!(a, random_values(1000, 8));
        assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean: f32 = a.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.1);
    }

    #[test]
    fn scores_are_q_times_k_transposed_over_root_d() {
        // One head, two tokens, d = 4: √d = 2.
        let s = shape(1, 2, 4);
        let q = [1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0];
        let k = [3.0, 0.0, 0.0, 0.0, 0.0, 5.0, 1.0, 0.0];
        assert_eq!(scores(s, &q, &k), vec![1.5, 0.0, 0.0, 5.0]);
    }

    #[test]
    fn attention_with_equal_scores_averages_v() {
        let s = shape(1, 3, 2);
        let q = vec![0.0; 6];
        let k = random_values(6, 1);
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let o = attention(s, &q, &k, &v);
        for i in 0..3 {
            assert!((o[i * 2] - 3.0).abs() < 1e-6 && (o[i * 2 + 1] - 4.0).abs() < 1e-6);
        }
    }

    #[test]
    fn attention_with_one_dominant_key_copies_its_value() {
        let s = shape(1, 2, 1);
        let (q, k, v) = ([100.0, 100.0], [1.0, -1.0], [7.0, -7.0]);
        let o = attention(s, &q, &k, &v);
        assert!((o[0] - 7.0).abs() < 1e-4 && (o[1] - 7.0).abs() < 1e-4);
    }

    #[test]
    fn heads_are_independent() {
        let s2 = shape(2, 5, 3);
        let (q, k, v) = random_qkv(s2, 3);
        let o = attention(s2, &q, &k, &v);
        let s1 = shape(1, 5, 3);
        let o1 = attention(s1, &q[15..], &k[15..], &v[15..]);
        assert_eq!(&o[15..], &o1[..]);
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even_like_ieee() {
        let cases: [(f32, u16); 12] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.1, 0x2e66),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00), // halfway to 65536: ties to even, past the largest f16
            (1e9, 0x7c00),
            ((-24f32).exp2(), 0x0001),
            ((-25f32).exp2(), 0x0000), // halfway to the smallest subnormal: ties to even
            (1.5 * (-25f32).exp2(), 0x0001),
            (1.0 + (-11f32).exp2(), 0x3c00), // halfway between 1 and its successor: even
        ];
        for (x, bits) in cases {
            assert_eq!(f32_to_f16_bits(x), bits, "{x}");
        }
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * (-11f32).exp2()), 0x3c02);
        assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
        assert_eq!(f16_bits_to_f32(f32_to_f16_bits(f32::NEG_INFINITY)), f32::NEG_INFINITY);
    }

    #[test]
    fn every_f16_survives_a_round_trip_through_f32() {
        for h in 0..=u16::MAX {
            let x = f16_bits_to_f32(h);
            if x.is_nan() {
                assert!(h & 0x7c00 == 0x7c00 && h & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16_bits(x), h, "{h:#06x} → {x}");
            }
        }
    }

    #[test]
    fn max_abs_diff_flags_length_mismatch_and_nan() {
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 2.0]), 0.5);
        assert_eq!(max_abs_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(max_abs_diff(&[f32::NAN], &[1.0]), f64::INFINITY);
    }
}

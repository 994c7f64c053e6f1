//! A compact, URL-safe text form of a sweep, for share links (`?bench=<value>`): adapter,
//! shape, and per point the seq, each kernel's median time and bytes. A few hundred
//! characters; only `[A-Za-z0-9._~-]`, which no URL needs to escape.
//!
//! Version 1, fields separated by `.`:
//!
//! ```text
//! 1.<adapter>.<backend>.<timing>.<dtype>.<batch>.<heads>.<head_dim>.<copy MB/s>.<points>
//! ```
//!
//! - `<adapter>`, `<backend>`: letters, digits and `-` as is, space as `_`, every other byte
//!   of the UTF-8 as `~XX` (hex); the adapter name is cut to 64 bytes.
//! - `<timing>`: `t` (GPU timestamps) or `w` (wall clock); `<dtype>`: `f32` or `f16`.
//! - numbers in base 36 (lowercase); `<copy MB/s>` empty when the probe did not run.
//! - `<points>`: points joined by `_`, each `seq~mat_ns~mat_bytes~fused_ns~fused_bytes`, a
//!   kernel's two fields empty where it did not run.
//!
//! [`decode_compact`] checks everything and returns a [`DecodeError`] on any malformed input;
//! it never panics.

use super::info::TimingMethod;
use super::results::{KernelPoint, Slopes, SweepResult};
use super::shape::Dtype;
use serde::{Deserialize, Serialize};

/// Longest value [`decode_compact`] accepts.
pub const MAX_LEN: usize = 4096;
/// Most points [`decode_compact`] accepts.
pub const MAX_POINTS: usize = 64;
/// Longest adapter name kept, in bytes.
pub const MAX_NAME: usize = 64;

/// One kernel at one point, as shared: median time and bytes allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedTiming {
    /// Median time, nanoseconds.
    pub ns: u64,
    pub bytes: u64,
}

impl SharedTiming {
    pub fn ms(&self) -> f64 {
        self.ns as f64 / 1e6
    }
}

/// One sequence length, as shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedPoint {
    pub seq: u32,
    pub materialized: Option<SharedTiming>,
    pub fused: Option<SharedTiming>,
}

/// What a share link carries: enough to redraw the charts and refit the slopes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedResult {
    pub adapter: String,
    pub backend: String,
    pub timing: TimingMethod,
    pub dtype: Dtype,
    pub batch: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Copy bandwidth, MB/s (10⁶ B/s), if the probe ran.
    pub copy_mb_per_s: Option<u64>,
    /// By strictly increasing seq.
    pub points: Vec<SharedPoint>,
}

/// Why a shared value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the shared benchmark result is empty")]
    Empty,
    #[error("the shared benchmark result is too long ({0} characters; at most {MAX_LEN})")]
    TooLong(usize),
    #[error("unknown shared benchmark format version '{0}'")]
    Version(String),
    #[error("malformed shared benchmark result: {0}")]
    Malformed(String),
}

fn bad<T>(msg: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError::Malformed(msg.into()))
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl SharedResult {
    /// The shareable part of a sweep.
    pub fn from_result(r: &SweepResult) -> SharedResult {
        let timing = |k: Option<&KernelPoint>| {
            k.map(|k| SharedTiming { ns: (k.median_ms * 1e6).round().clamp(0.0, u64::MAX as f64) as u64, bytes: k.bytes_allocated })
        };
        SharedResult {
            adapter: cut(&r.adapter.name, MAX_NAME),
            backend: cut(&r.adapter.backend, MAX_NAME),
            timing: r.timing,
            dtype: r.dtype,
            batch: r.batch,
            heads: r.heads,
            head_dim: r.head_dim,
            copy_mb_per_s: r.copy.as_ref().map(|c| (c.gb_per_s * 1e3).round().max(0.0) as u64),
            points: r
                .points
                .iter()
                .take(MAX_POINTS)
                .map(|p| SharedPoint { seq: p.seq, materialized: timing(p.materialized.as_ref()), fused: timing(p.fused.as_ref()) })
                .collect(),
        }
    }

    /// Log-log slopes of time and bytes against seq, as [`SweepResult::slopes`].
    pub fn slopes(&self) -> Slopes {
        let series = |fused: bool| -> Vec<(f64, f64, f64)> {
            self.points
                .iter()
                .filter_map(|p| {
                    let t = if fused { p.fused } else { p.materialized }?;
                    Some((p.seq as f64, t.ms(), t.bytes as f64))
                })
                .collect()
        };
        Slopes::fit(&series(false), &series(true), self.batch as u64 * self.heads as u64 * self.dtype.bytes())
    }

    /// The compact text (see the module documentation).
    pub fn encode(&self) -> String {
        let n = |x: u64| to_base36(x);
        let timing = |t: Option<SharedTiming>| match t {
            Some(t) => format!("{}~{}", n(t.ns), n(t.bytes)),
            None => "~".to_string(),
        };
        let points: Vec<String> = self
            .points
            .iter()
            .take(MAX_POINTS)
            .map(|p| format!("{}~{}~{}", n(p.seq as u64), timing(p.materialized), timing(p.fused)))
            .collect();
        [
            "1".to_string(),
            escape(&cut(&self.adapter, MAX_NAME)),
            escape(&cut(&self.backend, MAX_NAME)),
            match self.timing {
                TimingMethod::GpuTimestamps => "t".into(),
                TimingMethod::WallClock => "w".into(),
            },
            self.dtype.name().to_string(),
            n(self.batch as u64),
            n(self.heads as u64),
            n(self.head_dim as u64),
            self.copy_mb_per_s.map(n).unwrap_or_default(),
            points.join("_"),
        ]
        .join(".")
    }

    /// Reads [`SharedResult::encode`]'s text back; any malformed input is an error.
    pub fn decode(text: &str) -> Result<SharedResult, DecodeError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(DecodeError::Empty);
        }
        if text.len() > MAX_LEN {
            return Err(DecodeError::TooLong(text.len()));
        }
        if let Some(c) = text.chars().find(|c| !(c.is_ascii_alphanumeric() || "._~-".contains(*c))) {
            return bad(format!("unexpected character {c:?}"));
        }
        let fields: Vec<&str> = text.split('.').collect();
        if fields[0] != "1" {
            return Err(DecodeError::Version(cut(fields[0], 16)));
        }
        let [_, adapter, backend, timing, dtype, batch, heads, head_dim, copy, points] = fields[..] else {
            return bad(format!("expected 10 fields separated by '.', found {}", fields.len()));
        };
        let adapter = unescape(adapter, "adapter")?;
        let backend = unescape(backend, "backend")?;
        let timing = match timing {
            "t" => TimingMethod::GpuTimestamps,
            "w" => TimingMethod::WallClock,
            other => return bad(format!("timing must be 't' or 'w', not '{}'", cut(other, 16))),
        };
        let Some(dtype) = Dtype::parse(dtype) else {
            return bad(format!("dtype must be 'f32' or 'f16', not '{}'", cut(dtype, 16)));
        };
        let size = |s: &str, what: &str| -> Result<u32, DecodeError> {
            let v = from_base36(s, what)?;
            match u32::try_from(v) {
                Ok(v) if v >= 1 => Ok(v),
                _ => bad(format!("{what} must be between 1 and {}", u32::MAX)),
            }
        };
        let batch = size(batch, "batch")?;
        let heads = size(heads, "heads")?;
        let head_dim = size(head_dim, "head_dim")?;
        let copy_mb_per_s = if copy.is_empty() { None } else { Some(from_base36(copy, "copy bandwidth")?) };
        let mut out = Vec::new();
        if !points.is_empty() {
            for (i, p) in points.split('_').enumerate() {
                if i >= MAX_POINTS {
                    return bad(format!("more than {MAX_POINTS} points"));
                }
                let parts: Vec<&str> = p.split('~').collect();
                let [seq, mt, mb, ft, fb] = parts[..] else {
                    return bad(format!("point {} has {} fields, expected 5", i + 1, parts.len()));
                };
                let seq = size(seq, "seq")?;
                if out.last().is_some_and(|prev: &SharedPoint| prev.seq >= seq) {
                    return bad(format!("seq {seq} does not increase"));
                }
                let timing = |t: &str, b: &str| -> Result<Option<SharedTiming>, DecodeError> {
                    match (t.is_empty(), b.is_empty()) {
                        (true, true) => Ok(None),
                        (false, false) => Ok(Some(SharedTiming { ns: from_base36(t, "time")?, bytes: from_base36(b, "bytes")? })),
                        _ => bad(format!("point at seq {seq} has a time without bytes or bytes without a time")),
                    }
                };
                out.push(SharedPoint { seq, materialized: timing(mt, mb)?, fused: timing(ft, fb)? });
            }
        }
        Ok(SharedResult { adapter, backend, timing, dtype, batch, heads, head_dim, copy_mb_per_s, points: out })
    }
}

/// The compact, URL-safe text of a sweep (the value of a `bench=` query parameter).
pub fn encode_compact(result: &SweepResult) -> String {
    SharedResult::from_result(result).encode()
}

/// Reads a value written by [`encode_compact`]; never panics, whatever the input.
pub fn decode_compact(text: &str) -> Result<SharedResult, DecodeError> {
    SharedResult::decode(text)
}

fn to_base36(mut x: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    if x == 0 {
        return "0".into();
    }
    let mut out = Vec::new();
    while x > 0 {
        out.push(DIGITS[(x % 36) as usize]);
        x /= 36;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn from_base36(s: &str, what: &str) -> Result<u64, DecodeError> {
    if s.is_empty() || s.len() > 13 || !s.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()) {
        return bad(format!("{what} is not a base-36 number"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return bad(format!("{what} has a leading zero"));
    }
    u64::from_str_radix(s, 36).or_else(|_| bad(format!("{what} is out of range")))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => out.push(b as char),
            b' ' => out.push('_'),
            _ => out.push_str(&format!("~{b:02X}")),
        }
    }
    out
}

fn unescape(s: &str, what: &str) -> Result<String, DecodeError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => out.push(b' '),
            b'~' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let Some(byte) = hex.filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit())).and_then(|h| u8::from_str_radix(h, 16).ok())
                else {
                    return bad(format!("{what} has a broken '~' escape"));
                };
                out.push(byte);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    if out.len() > MAX_NAME {
        return bad(format!("{what} is longer than {MAX_NAME} bytes"));
    }
    String::from_utf8(out).or_else(|_| bad(format!("{what} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SharedResult {
        SharedResult {
            adapter: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            backend: "vulkan".into(),
            timing: TimingMethod::GpuTimestamps,
            dtype: Dtype::F32,
            batch: 1,
            heads: 8,
            head_dim: 64,
            copy_mb_per_s: Some(12_345),
            points: [256u32, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144]
                .iter()
                .map(|&s| {
                    let s64 = s as u64;
                    SharedPoint {
                        seq: s,
                        materialized: (s <= 2048)
                            .then_some(SharedTiming { ns: 3 * s64 * s64, bytes: 16 + 4 * 8 * s64 * 256 + 32 * s64 * s64 }),
                        fused: Some(SharedTiming { ns: 2 * s64 * s64, bytes: 16 + 4 * 8 * s64 * 256 }),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn a_shared_result_round_trips_in_a_few_hundred_url_safe_characters() {
        let r = sample();
        let text = r.encode();
        assert!(text.len() < 400, "{} characters: {text}", text.len());
        assert!(text.chars().all(|c| c.is_ascii_alphanumeric() || "._~-".contains(c)), "{text}");
        assert_eq!(decode_compact(&text), Ok(r));
    }

    #[test]
    fn decoded_results_refit_the_slopes() {
        let sl = sample().slopes();
        assert!((sl.fused.time.unwrap() - 2.0).abs() < 1e-9);
        assert!((sl.fused.memory.unwrap() - 1.0).abs() < 0.01);
        assert!(sl.materialized.memory.unwrap() > 1.5);
        assert!((sl.scores_memory.unwrap() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn garbage_is_rejected_with_an_error() {
        let good = sample().encode();
        let cases = [
            "".to_string(),
            "   ".to_string(),
            "2.x".to_string(),
            "hello".to_string(),
            "1.a.b.t.f32.1.1.1..".to_string() + "zz~",
            "1.a.v.t.f64.1.1.1..".into(),
            "1.a.v.t.1.1.1..".into(), // no dtype field
            good.replace(".t.", ".q."),
            good.replace('_', "__"),
            good.replacen("1.", "1..", 1),
            format!("{good}.extra"),
            good[..good.len() / 2].to_string(),
            good.replace("~", "~~"),
            "1.~Z1.v.t.f32.1.1.1..".into(),
            "1.~C3.v.t.f32.1.1.1..".into(), // a lone UTF-8 lead byte
            "1.a.v.t.f32.0.1.1..".into(),
            "1.a.v.t.f32.1.1.1..8~1~1~~_8~1~1~~".into(), // seq does not increase
            "1.a.v.t.f32.1.1.1..8~1~~~".into(),          // time without bytes
            "1.a.v.t.f32.1.1.1.zzzzzzzzzzzzzz.".into(),  // overflow
            "1.a.v.t.f32.1.1.1.A.".into(),
            "1.a b.v.t.f32.1.1.1..".into(),
            "1.a%20b.v.t.f32.1.1.1..".into(),
            "x".repeat(MAX_LEN + 1),
        ];
        for c in cases {
            assert!(decode_compact(&c).is_err(), "accepted {c:?}");
        }
        assert!(decode_compact("1.a.v.t.f32.1.1.1..").is_ok(), "no points is a valid, empty result");
    }

    #[test]
    fn long_adapter_names_are_cut_at_a_character_boundary() {
        let mut r = sample();
        r.adapter = "é".repeat(100);
        let back = decode_compact(&r.encode()).unwrap();
        assert!(back.adapter.len() <= MAX_NAME && back.adapter.chars().all(|c| c == 'é'));
    }

    #[test]
    fn base36_round_trips_the_extremes() {
        for x in [0, 1, 35, 36, u32::MAX as u64, u64::MAX] {
            assert_eq!(from_base36(&to_base36(x), "x"), Ok(x));
        }
    }

    fn arb_timing() -> impl Strategy<Value = Option<SharedTiming>> {
        proptest::option::of((any::<u64>(), any::<u64>()).prop_map(|(ns, bytes)| SharedTiming { ns, bytes }))
    }

    proptest! {
        #[test]
        fn the_decoder_never_panics_on_arbitrary_text(s in ".{0,300}") {
            let _ = decode_compact(&s);
        }

        #[test]
        fn the_decoder_never_panics_on_url_safe_noise(s in "[0-9a-zA-Z._~-]{0,300}") {
            let _ = decode_compact(&s);
        }

        #[test]
        fn the_decoder_never_panics_on_mutated_valid_text(i in 0usize..400, c in "[0-9a-zA-Z._~%-]", cut_at in 0usize..400) {
            let mut text = sample().encode();
            let i = i % text.len();
            text.replace_range(i..i + 1, &c);
            let _ = decode_compact(&text);
            let _ = decode_compact(&text[..cut_at.min(text.len())]);
        }

        #[test]
        fn any_shared_result_round_trips(
            adapter in "\\PC{0,16}",
            backend in "[a-z]{0,8}",
            wall in any::<bool>(),
            half in any::<bool>(),
            batch in 1u32.., heads in 1u32.., head_dim in 1u32..,
            copy in proptest::option::of(any::<u64>()),
            seqs in proptest::collection::btree_set(1u32.., 0..12),
            timings in proptest::collection::vec((arb_timing(), arb_timing()), 12),
        ) {
            let r = SharedResult {
                adapter, backend,
                timing: if wall { TimingMethod::WallClock } else { TimingMethod::GpuTimestamps },
                dtype: if half { Dtype::F16 } else { Dtype::F32 },
                batch, heads, head_dim, copy_mb_per_s: copy,
                points: seqs.into_iter().zip(timings).map(|(seq, (m, f))| SharedPoint { seq, materialized: m, fused: f }).collect(),
            };
            prop_assert_eq!(decode_compact(&r.encode()), Ok(r));
        }
    }
}

//! PyTorch's CUDA caching allocator, simulated: what `torch.cuda.memory_reserved()` will be when a
//! stream of tensor allocations and frees runs through it.
//!
//! # Why reserved memory is larger than allocated memory
//!
//! `cudaMalloc` and `cudaFree` are slow and `cudaFree` synchronizes the whole device, so PyTorch
//! never hands a freed tensor's memory back to CUDA. It asks CUDA for *segments* (2 MiB for small
//! tensors, 20 MiB for tensors of 1–10 MiB, the request rounded up to 2 MiB above that), carves
//! them into *blocks*, and when a tensor dies its block goes into a cache of free blocks that the
//! next request of a fitting size reuses. `memory_allocated()` counts the blocks handed out;
//! `memory_reserved()` counts the segments — that is what the process holds on the card, and what
//! decides an out-of-memory error. The gap between them has three sources:
//!
//! - **rounding**: every request is rounded up to 512 bytes (or to a power-of-two division with
//!   `roundup_power2_divisions`), and a block whose leftover is too small to split is handed out
//!   whole, so a 19.5 MiB tensor occupies 20 MiB;
//! - **caching**: freed blocks stay reserved until `torch.cuda.empty_cache()`, or until a
//!   `cudaMalloc` fails and the allocator frees its cached unsplit segments and retries;
//! - **fragmentation**: a free block inside a segment that still holds a live tensor can be
//!   neither returned to CUDA nor used for a larger request, so a new segment is reserved beside
//!   it. Eight 16 MiB tensors freed and followed by four 32 MiB ones reserve 256 MiB, not 128.
//!
//! `expandable_segments:True` attacks the third: one virtual segment per pool grows by mapping
//! physical pages (2 MiB in the small pool, 20 MiB in the large one) at its end, so freed space
//! at the end of the segment is reused by larger requests, and fully free pages can be unmapped.
//!
//! # What is simulated
//!
//! One device, **one stream**, the two default pools (small ≤ 1 MiB, large), the rules of
//! `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp` — one function here per rule,
//! each citing the source function it follows — and the options `expandable_segments`,
//! `max_split_size_mb`, `max_non_split_rounding_mb` and `roundup_power2_divisions` from
//! `c10/core/AllocatorConfig.cpp` / `c10/cuda/CUDAAllocatorConfig.cpp`.
//!
//! Source read: `pytorch/pytorch` at commit `b944315b93d36f842ef94d67a041371993234a74`
//! (`CUDACachingAllocator.cpp`, `CUDAAllocatorConfig.cpp`; the 2025 code base where the options
//! live in `AcceleratorAllocatorConfig`), cross-checked against the older
//! `001074d25084fdb87a799823e395a50f5ec044d3`, and `test/test_cuda.py` at
//! `000e43cdff99f30291164c1f2e90133f19fa83fb` (`test_memory_stats`, `test_allocator_settings`,
//! `test_out_of_memory_retry`, `TestMemPool`).
//!
//! Not simulated: other streams (`record_stream` and its deferred frees), CUDA graphs and
//! `MemPool`s, `garbage_collection_threshold` and `per_process_memory_fraction` (the collector
//! only runs under a memory fraction), free-memory callbacks, and switching options mid-run.
//! Device addresses are invented: segments are laid out upward from one address, which only
//! decides which of several *equal-sized* free blocks the best-fit search picks. `capacity` stands
//! for the device memory `cudaMalloc` can still get: when set, a segment (or an expandable
//! segment's pages) that would push `reserved` past it fails, which starts the allocator's
//! release-and-retry path and, if that fails too, reports an out-of-memory error.
//!
//! Version note: `roundup_power2_divisions:[64:8,>:1]` rounds 84 MiB to 88 MiB here, as the
//! current `AcceleratorAllocatorConfig` parser does (`>` fills the buckets *after* the last one
//! listed). PyTorch releases whose `CUDAAllocatorConfig.cpp` still parses the list fill from the
//! last listed bucket itself, so the same string disables rounding for 64–128 MiB there.
//!
//! # Cost
//!
//! [`replay`] runs on every estimate, over the ≈ 10,000 events of a training step. The free
//! blocks are kept in a segregated, sorted `FreeSet` rather than a `BTreeSet`, live ids in a
//! dense table; `benches/allocator.rs` measures a 126-layer step.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;

/// 2²⁰ bytes.
pub const MIB: u64 = 1 << 20;
/// `kMinBlockSize`: every request is rounded up to a multiple of 512 bytes, and to at least 512.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: requests of at most 1 MiB (after rounding) are served from the small pool.
pub const SMALL_SIZE: u64 = MIB;
/// `kSmallBuffer`: small requests are packed into 2 MiB segments; also the page size of the small
/// pool's expandable segment.
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// `kLargeBuffer`: requests between 1 and 10 MiB get a 20 MiB segment to split; also the page
/// size of the large pool's expandable segment and the default `max_non_split_rounding`.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// `kMinLargeAlloc`: from 10 MiB on, a request gets a segment of its own size.
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// `kRoundLarge`: segments for requests of 10 MiB and more are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 * MIB;
/// `max_split_size_mb` and `max_non_split_rounding_mb` must be at least `kLargeBuffer / kMB` = 20
/// (`AcceleratorAllocatorConfig::parseMaxSplitSize`).
pub const MIN_SPLIT_SIZE_MB: u64 = LARGE_BUFFER / MIB;
/// `kRoundUpPowerOfTwoIntervals`: `roundup_power2_divisions` has one entry per power-of-two size
/// bucket from 1 MiB to 64 GiB.
pub const ROUNDUP_INTERVALS: usize = 16;
/// log2 of `kRoundUpPowerOfTwoStart` = 1 MiB, the start of the first bucket.
const ROUNDUP_START_LOG2: u32 = 20;
/// `NativeCachingAllocator::allocate` refuses requests of 1 EiB and more before the allocator runs.
pub const ONE_EXA_BYTES: u64 = 1 << 60;
/// The most threads `pinned_num_register_threads` accepts
/// (`CUDAAllocatorConfig::pinned_max_register_threads`).
const MAX_PINNED_REGISTER_THREADS: u64 = 128;

/// Invented device addresses: `cudaMalloc` segments are laid out upward from here …
const SEGMENT_ADDR_START: u64 = 1 << 21;
/// … and must end below here (2 EiB, more than any request `ONE_EXA_BYTES` lets through).
const SEGMENT_ADDR_END: u64 = 1 << 61;
/// The virtual range each pool's expandable segment reserves: small pool, large pool.
/// PyTorch reserves 1⅛ × the card's memory; here the range is larger than any request, so a
/// second expandable segment per pool is never needed.
const EXPANDABLE_BASE: [u64; 2] = [1 << 61, 1 << 62];
/// Pages in each pool's expandable segment (2 MiB × 2³⁰ = 2 PiB; 20 MiB × 2³⁶ = 1.25 EiB).
const EXPANDABLE_PAGES: [u64; 2] = [1 << 30, 1 << 36];

/// No block (the end of a segment's block list).
const NIL: u32 = u32::MAX;
/// Pool indices.
const SMALL_POOL: usize = 0;
const LARGE_POOL: usize = 1;

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

/// `roundup_power2_divisions`: for each power-of-two size bucket, into how many equal steps the
/// interval up to the next power of two is divided when rounding a request (0 or 1: no
/// power-of-two rounding, only the 512-byte rounding).
///
/// Bucket `i` ≥ 1 holds sizes in [2^(20+i), 2^(21+i)) bytes; bucket 0 also holds everything below
/// 2 MiB and bucket 15 everything from 32 GiB on (`AcceleratorAllocatorConfig::
/// roundup_power2_divisions(size)`, `c10/core/AllocatorConfig.cpp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoundupPower2Divisions(pub [u64; ROUNDUP_INTERVALS]);

impl RoundupPower2Divisions {
    /// No power-of-two rounding (PyTorch's default).
    pub const NONE: Self = Self([0; ROUNDUP_INTERVALS]);

    /// The same number of divisions for every size (`roundup_power2_divisions:4`).
    pub fn uniform(divisions: u64) -> Self {
        Self([divisions; ROUNDUP_INTERVALS])
    }

    /// The bucket of a size: `floor(log2(size)) − 20`, clamped to 0..=15.
    pub fn bucket(size: u64) -> usize {
        let log_size = size.max(1).ilog2();
        (log_size.saturating_sub(ROUNDUP_START_LOG2) as usize).min(ROUNDUP_INTERVALS - 1)
    }

    /// The divisions that apply to a request of `size` bytes.
    pub fn for_size(&self, size: u64) -> u64 {
        self.0[Self::bucket(size)]
    }
}

/// The caching allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` sets them, plus the device
/// memory available to it. `Default` is PyTorch's default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorOptions {
    /// `expandable_segments` (default false): one growing segment per pool instead of one
    /// `cudaMalloc` per segment.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes (default unlimited): blocks this large are never split, and
    /// smaller requests never take them.
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` (default: none).
    pub roundup_power2_divisions: RoundupPower2Divisions,
    /// `max_non_split_rounding_mb`, in bytes (default 20 MiB): a request of at least
    /// `max_split_size` takes a cached oversize block only if the block is less than this much
    /// larger.
    pub max_non_split_rounding: u64,
    /// Device bytes `cudaMalloc` can get (not a PyTorch option). `None`: unlimited, no OOM.
    pub capacity: Option<u64>,
}

impl Default for AllocatorOptions {
    fn default() -> Self {
        Self {
            expandable_segments: false,
            max_split_size: None,
            roundup_power2_divisions: RoundupPower2Divisions::NONE,
            max_non_split_rounding: LARGE_BUFFER,
            capacity: None,
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string that cannot be simulated; every variant names the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocConfError {
    #[error("unrecognized allocator option `{0}`")]
    UnknownOption(String),
    #[error("allocator option `{option}`: expected {expected}, found {found}")]
    Syntax { option: String, expected: &'static str, found: String },
    #[error("allocator option `{option}`: {reason}")]
    BadValue { option: String, reason: String },
    #[error("allocator option `{option}` is not simulated: {reason}")]
    Unsupported { option: String, reason: &'static str },
}

impl AllocConfError {
    /// The option at fault.
    pub fn option(&self) -> &str {
        match self {
            AllocConfError::UnknownOption(o) => o,
            AllocConfError::Syntax { option, .. }
            | AllocConfError::BadValue { option, .. }
            | AllocConfError::Unsupported { option, .. } => option,
        }
    }
}

impl AllocatorOptions {
    /// Parses `PYTORCH_CUDA_ALLOC_CONF` syntax, e.g.
    /// `expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[64:8,>:1]`.
    /// Options not given keep PyTorch's defaults; `capacity` stays `None`.
    ///
    /// Follows `AcceleratorAllocatorConfig::parseArgs` (`c10/core/AllocatorConfig.cpp`) and
    /// `CUDAAllocatorConfig::parseArgs` (`c10/cuda/CUDAAllocatorConfig.cpp`): the tokenizer splits
    /// at `,` `:` `[` `]` and drops spaces, keys are case-sensitive, booleans are `True`/`False`,
    /// a trailing comma is accepted, and an unknown key is an error. Options that do not change
    /// placement on one stream (pinned-memory and lock settings) are checked and ignored;
    /// `backend:cudaMallocAsync` and `per_process_memory_fraction` are refused as not simulated.
    pub fn parse(conf: &str) -> Result<Self, AllocConfError> {
        let mut opts = Self::default();
        let tokens = tokenize(conf);
        let mut p = ConfParser { tokens: &tokens, i: 0 };
        while let Some(key) = p.peek() {
            let key = key.to_string();
            p.i += 1;
            p.expect(&key, ":")?;
            match key.as_str() {
                "max_split_size_mb" => opts.max_split_size = Some(p.megabytes(&key)?),
                "max_non_split_rounding_mb" => opts.max_non_split_rounding = p.megabytes(&key)?,
                "roundup_power2_divisions" => opts.roundup_power2_divisions = p.roundup_divisions(&key)?,
                "expandable_segments" => opts.expandable_segments = p.boolean(&key)?,
                "garbage_collection_threshold" => {
                    // Checked as PyTorch does; it only acts under a memory fraction, not simulated.
                    let v = p.number::<f64>(&key, "a number")?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(bad(&key, "must lie strictly between 0 and 1"));
                    }
                }
                "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    p.boolean(&key)?;
                }
                "pinned_num_register_threads" => {
                    let n = p.number::<u64>(&key, "a whole number")?;
                    if !n.is_power_of_two() || n > MAX_PINNED_REGISTER_THREADS {
                        return Err(bad(&key, "must be a power of 2 no larger than 128"));
                    }
                }
                "pinned_reserve_segment_size_mb" => {
                    if p.number::<u64>(&key, "a whole number")? == 0 {
                        return Err(bad(&key, "must be greater than 0"));
                    }
                }
                "backend" => match p.value(&key)? {
                    "native" => {}
                    "cudaMallocAsync" | "hipMallocAsync" => {
                        return Err(AllocConfError::Unsupported { option: key, reason: "only the native caching allocator is simulated" })
                    }
                    other => return Err(bad(&key, format!("unknown backend `{other}`; options are native and cudaMallocAsync"))),
                },
                "per_process_memory_fraction" => {
                    return Err(AllocConfError::Unsupported { option: key, reason: "set the device capacity instead of a fraction of it" })
                }
                _ => return Err(AllocConfError::UnknownOption(key)),
            }
            if p.peek().is_some() {
                p.expect(&key, ",")?;
            }
        }
        Ok(opts)
    }

    /// `max_split_size`, or "unlimited" as PyTorch stores it (`SIZE_MAX`).
    fn max_split(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }
}

impl FromStr for AllocatorOptions {
    type Err = AllocConfError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn bad(option: &str, reason: impl Into<String>) -> AllocConfError {
    AllocConfError::BadValue { option: option.to_string(), reason: reason.into() }
}

/// `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own; spaces are dropped everywhere.
fn tokenize(conf: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buf = String::new();
    for c in conf.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    tokens.push(std::mem::take(&mut buf));
                }
                tokens.push(c.to_string());
            }
            ' ' => {}
            _ => buf.push(c),
        }
    }
    if !buf.is_empty() {
        tokens.push(buf);
    }
    tokens
}

struct ConfParser<'a> {
    tokens: &'a [String],
    i: usize,
}

impl ConfParser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.i).map(String::as_str)
    }

    fn found(&self) -> String {
        self.peek().map_or_else(|| "the end".to_string(), |t| format!("`{t}`"))
    }

    fn expect(&mut self, option: &str, symbol: &'static str) -> Result<(), AllocConfError> {
        if self.peek() == Some(symbol) {
            self.i += 1;
            Ok(())
        } else {
            let expected = match symbol {
                ":" => "`:`",
                "," => "`,`",
                "]" => "`]`",
                _ => "a separator",
            };
            Err(AllocConfError::Syntax { option: option.to_string(), expected, found: self.found() })
        }
    }

    fn value(&mut self, option: &str) -> Result<&str, AllocConfError> {
        match self.tokens.get(self.i) {
            Some(t) if !matches!(t.as_str(), "," | ":" | "[" | "]") => {
                self.i += 1;
                Ok(t.as_str())
            }
            _ => Err(AllocConfError::Syntax { option: option.to_string(), expected: "a value", found: self.found() }),
        }
    }

    fn number<T: FromStr>(&mut self, option: &str, expected: &'static str) -> Result<T, AllocConfError> {
        let v = self.value(option)?;
        v.parse::<T>().map_err(|_| AllocConfError::Syntax { option: option.to_string(), expected, found: format!("`{v}`") })
    }

    /// `tokenizer.toBool`: exactly `True` or `False`.
    fn boolean(&mut self, option: &str) -> Result<bool, AllocConfError> {
        match self.value(option)? {
            "True" => Ok(true),
            "False" => Ok(false),
            v => Err(AllocConfError::Syntax { option: option.to_string(), expected: "`True` or `False`", found: format!("`{v}`") }),
        }
    }

    /// `parseMaxSplitSize` / `parseMaxNonSplitRoundingSize`: whole MiB, at least 20, clamped to
    /// what fits in bytes.
    fn megabytes(&mut self, option: &str) -> Result<u64, AllocConfError> {
        let mb = self.number::<u64>(option, "a whole number of MiB")?;
        if mb < MIN_SPLIT_SIZE_MB {
            return Err(bad(option, format!("must be at least {MIN_SPLIT_SIZE_MB} (MiB), got {mb}")));
        }
        Ok(mb.min(u64::MAX / MIB) * MIB)
    }

    /// `parseRoundUpPower2Divisions`: a single power of two for every bucket, or a list
    /// `[boundary_mib:divisions, …, >:divisions]`. The first listed boundary also fills every
    /// bucket below it; `>` fills every bucket after the last listed one (from `last_index + 1`,
    /// as in `AcceleratorAllocatorConfig`; older `CUDAAllocatorConfig.cpp` filled from
    /// `last_index`, overwriting it). Divisions in a list may be 0 (no rounding).
    fn roundup_divisions(&mut self, option: &str) -> Result<RoundupPower2Divisions, AllocConfError> {
        let mut div = [0u64; ROUNDUP_INTERVALS];
        if self.peek() != Some("[") {
            let v = self.number::<u64>(option, "a power of 2 or a `[…]` list")?;
            if !v.is_power_of_two() {
                return Err(bad(option, format!("divisions must be a power of 2, got {v}")));
            }
            return Ok(RoundupPower2Divisions([v; ROUNDUP_INTERVALS]));
        }
        self.i += 1;
        let mut last_index = 0usize;
        let mut first_value = true;
        loop {
            match self.peek() {
                Some("]") => {
                    self.i += 1;
                    return Ok(RoundupPower2Divisions(div));
                }
                None => return Err(AllocConfError::Syntax { option: option.to_string(), expected: "`]`", found: self.found() }),
                Some(_) => {}
            }
            let boundary = self.value(option)?.to_string();
            self.expect(option, ":")?;
            let v = self.number::<u64>(option, "a number of divisions")?;
            if v != 0 && !v.is_power_of_two() {
                return Err(bad(option, format!("divisions must be a power of 2 or 0, got {v}")));
            }
            if boundary == ">" {
                for d in div.iter_mut().skip(last_index + 1) {
                    *d = v;
                }
            } else {
                let mib: u64 = boundary.parse().map_err(|_| AllocConfError::Syntax {
                    option: option.to_string(),
                    expected: "a size boundary in MiB or `>`",
                    found: format!("`{boundary}`"),
                })?;
                if !mib.is_power_of_two() {
                    return Err(bad(option, format!("interval boundaries must be powers of 2, got {mib}")));
                }
                let index = (mib.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
                if first_value {
                    for d in div.iter_mut().take(index) {
                        *d = v;
                    }
                    first_value = false;
                }
                div[index] = v;
                last_index = index;
            }
            if self.peek() != Some("]") {
                self.expect(option, ",")?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Size rules
// ---------------------------------------------------------------------------------------------

/// The size a request is served with (`DeviceCachingAllocator::round_size`): below 512 bytes,
/// 512; with more than one power-of-two division for the request's bucket and a request larger
/// than 512 × divisions, the next division step (`roundup_power2_next_division`); otherwise the
/// next multiple of 512.
pub fn round_size(bytes: u64, divisions: &RoundupPower2Divisions) -> u64 {
    if bytes < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let div = divisions.for_size(bytes);
    if div > 1 && bytes > MIN_BLOCK_SIZE.saturating_mul(div) {
        roundup_power2_next_division(bytes, div)
    } else {
        bytes.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// `roundup_power2_next_division`: split [2^k, 2^(k+1)) around `size` into `divisions` equal steps
/// and round up to the next step (1200 with 4 divisions of [1024, 2048) → 1280). Powers of two are
/// kept; a step that would be 0 bytes rounds to the next power of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1u64 << size.ilog2();
    let step = power2_floor >> divisions.max(1).ilog2();
    if step == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(step - 1);
    if floor == size {
        size
    } else {
        floor + step
    }
}

/// The pool a rounded size is served from (`get_pool`): ≤ 1 MiB small, otherwise large.
fn pool_for(size: u64) -> usize {
    if size <= SMALL_SIZE {
        SMALL_POOL
    } else {
        LARGE_POOL
    }
}

/// The segment size asked of `cudaMalloc` when no cached block fits (`get_allocation_size`):
/// ≤ 1 MiB → 2 MiB; < 10 MiB → 20 MiB; otherwise the request rounded up to 2 MiB.
pub fn get_allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Page size of a pool's expandable segment (`find_expandable_block`: `kSmallBuffer` for the
/// small pool, `kLargeBuffer` for the large one).
fn page_size(pool: usize) -> u64 {
    if pool == SMALL_POOL {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

// ---------------------------------------------------------------------------------------------
// The simulator
// ---------------------------------------------------------------------------------------------

/// A live allocation. `Handle::EMPTY` stands for a zero-byte tensor, which PyTorch never sends
/// to the allocator (`NativeCachingAllocator::allocate` returns a null pointer for size 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    block: u32,
    generation: u32,
}

impl Handle {
    /// The handle of a zero-byte allocation; freeing it does nothing.
    pub const EMPTY: Handle = Handle { block: NIL, generation: 0 };
}

/// Why `malloc` or `free` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The allocator found no cached block, `cudaMalloc` failed, and so did the retry after
    /// releasing every cached unsplit segment ("CUDA out of memory. Tried to allocate …").
    #[error("out of memory: tried to allocate {alloc_size} bytes for a {requested}-byte request with {allocated} bytes allocated and {reserved} reserved")]
    OutOfMemory { requested: u64, alloc_size: u64, allocated: u64, reserved: u64 },
    /// Refused before the allocator runs ("Tried to allocate more than 1EB memory").
    #[error("cannot allocate {requested} bytes: more than 1 EiB")]
    TooLarge { requested: u64 },
    /// `free` of a handle that is not a live allocation ("invalid device pointer").
    #[error("invalid handle: not a live allocation")]
    InvalidHandle,
}

/// The counters of `torch.cuda.memory_stats()` that matter for placement, all for the aggregate
/// of both pools (`DeviceStats`, the `*.all.current` and `*.all.peak` keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `allocated_bytes.all.current` = `memory_allocated()`: the sizes of the blocks handed out —
    /// rounded sizes, and unsplit blocks whole.
    pub allocated: u64,
    /// `reserved_bytes.all.current` = `memory_reserved()`: `cudaMalloc`'d segments plus mapped
    /// expandable pages.
    pub reserved: u64,
    /// `active_bytes.all.current`; equal to `allocated` on one stream without `record_stream`.
    pub active: u64,
    /// `allocated_bytes.all.peak` = `max_memory_allocated()`.
    pub max_allocated: u64,
    /// `reserved_bytes.all.peak` = `max_memory_reserved()`.
    pub max_reserved: u64,
    /// `segment.all.current`: live `cudaMalloc` segments. Expandable segments' page mappings are
    /// not counted here, as in PyTorch (`map_block` only adds to `reserved_bytes`).
    pub segments: u64,
    /// `inactive_split_bytes.all.current`: free blocks in segments that also hold something else
    /// (the fragmentation `empty_cache` cannot return). Expandable segments are excluded, as in
    /// PyTorch.
    pub inactive_split_bytes: u64,
    /// `num_alloc_retries`: `cudaMalloc` retries after releasing every cached unsplit segment.
    pub num_alloc_retries: u64,
    /// `num_ooms`: requests that failed even after the retry.
    pub num_ooms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev: u32,
    next: u32,
    generation: u32,
    pool: u8,
    live: bool,
    allocated: bool,
    mapped: bool,
    expandable: bool,
}

impl Block {
    fn free(pool: usize, addr: u64, size: u64, mapped: bool, expandable: bool) -> Self {
        Block { addr, size, prev: NIL, next: NIL, generation: 0, pool: pool as u8, live: true, allocated: false, mapped, expandable }
    }

    fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// A `BlockPool`: the cached free blocks by (size, address) — `BlockComparatorSize`, which makes
/// the best fit the smallest block and, among equal sizes, the lowest address — and the unmapped
/// ranges of its expandable segment by address (`BlockComparatorAddress`).
#[derive(Debug, Clone, Default)]
struct Pool {
    free: FreeSet,
    unmapped: BTreeSet<(u64, u32)>,
    expandable_live: bool,
}

/// A cached free block's place in the best-fit order: (size, address, block index).
type FreeKey = (u64, u64, u32);

/// Bits of a size below its leading one that pick its size class: 4 classes per power of two.
const CLASS_SUB_BITS: u32 = 2;
/// Size classes: 4 per power of two over all of `u64`.
const CLASSES: usize = 64 << CLASS_SUB_BITS;

/// The ordered set of a pool's free blocks, with the queries the allocator makes of PyTorch's
/// `std::set` (lower bound, successor, predecessor, in-order walk). Stored as one vector per size
/// class (four classes per power of two) plus a bitmap of non-empty classes. Each vector is kept
/// in *descending* order: the allocator takes the smallest, lowest-addressed block of a class and
/// most freed blocks land at low addresses, so both ends up at the vector's end, where inserting
/// and removing move nothing. Same order and answers as a `BTreeSet`, several times faster at the
/// thousands of same-sized blocks a training step leaves cached.
#[derive(Debug, Clone)]
struct FreeSet {
    classes: Vec<Vec<FreeKey>>,
    nonempty: [u64; CLASSES / 64],
}

impl Default for FreeSet {
    fn default() -> Self {
        Self { classes: vec![Vec::new(); CLASSES], nonempty: [0; CLASSES / 64] }
    }
}

impl FreeSet {
    /// Size class: the leading bit's position and the next two bits — monotone in size.
    #[inline(always)]
    fn class_of(size: u64) -> usize {
        let size = size.max(1);
        let lead = size.ilog2();
        let sub = if lead >= CLASS_SUB_BITS { size >> (lead - CLASS_SUB_BITS) } else { size << (CLASS_SUB_BITS - lead) };
        ((lead << CLASS_SUB_BITS) as usize) | (sub as usize & ((1 << CLASS_SUB_BITS) - 1))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.classes.iter().map(Vec::len).sum()
    }

    #[inline(always)]
    fn insert(&mut self, k: FreeKey) {
        let c = Self::class_of(k.0);
        let v = &mut self.classes[c];
        // Fast path: the new smallest key of its class goes at the end.
        let pos = if v.last().is_none_or(|&last| last > k) { v.len() } else { v.partition_point(|e| *e > k) };
        if v.get(pos) != Some(&k) {
            v.insert(pos, k);
            self.nonempty[c / 64] |= 1 << (c % 64);
        }
    }

    #[inline(always)]
    fn remove(&mut self, k: FreeKey) {
        let c = Self::class_of(k.0);
        let v = &mut self.classes[c];
        // Fast path: the class's smallest key is at the end.
        let found = if v.last() == Some(&k) { Ok(v.len() - 1) } else { v.binary_search_by(|e| k.cmp(e)) };
        if let Ok(pos) = found {
            v.remove(pos);
            if v.is_empty() {
                self.nonempty[c / 64] &= !(1 << (c % 64));
            }
        }
    }

    #[cfg(test)]
    fn contains(&self, k: FreeKey) -> bool {
        self.classes[Self::class_of(k.0)].binary_search_by(|e| k.cmp(e)).is_ok()
    }

    /// The first non-empty class at or after `from`.
    fn class_at_or_after(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.nonempty.get(word)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.nonempty.get(word)?;
        }
    }

    /// The last non-empty class strictly before `before`.
    fn class_before(&self, before: usize) -> Option<usize> {
        let last = before.checked_sub(1)?;
        let mut word = last / 64;
        let mut bits = self.nonempty[word] & (u64::MAX >> (63 - last % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + 63 - bits.leading_zeros() as usize);
            }
            word = word.checked_sub(1)?;
            bits = self.nonempty[word];
        }
    }

    /// The smallest key of the first non-empty class after `c`.
    fn first_after_class(&self, c: usize) -> Option<FreeKey> {
        let n = self.class_at_or_after(c + 1)?;
        self.classes[n].last().copied()
    }

    /// Where the smallest key ≥ `k` is: its class and its index in the class's vector.
    #[inline(always)]
    fn lower_bound_at(&self, k: FreeKey) -> Option<(usize, usize)> {
        let c = Self::class_of(k.0);
        let v = &self.classes[c];
        // Fast path: the class's smallest key already fits.
        if v.last().is_some_and(|&last| last >= k) {
            return Some((c, v.len() - 1));
        }
        match v.partition_point(|e| *e >= k) {
            0 => {
                let n = self.class_at_or_after(c + 1)?;
                Some((n, self.classes[n].len() - 1))
            }
            pos => Some((c, pos - 1)),
        }
    }

    /// The key at a place [`FreeSet::lower_bound_at`] gave.
    #[inline(always)]
    fn at(&self, (c, pos): (usize, usize)) -> FreeKey {
        self.classes[c][pos]
    }

    /// Removes the key at a place [`FreeSet::lower_bound_at`] gave (no search).
    #[inline(always)]
    fn remove_at(&mut self, (c, pos): (usize, usize)) {
        let v = &mut self.classes[c];
        v.remove(pos);
        if v.is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
    }

    /// The smallest key ≥ `k` (`std::set::lower_bound`).
    #[inline(always)]
    fn lower_bound(&self, k: FreeKey) -> Option<FreeKey> {
        let c = Self::class_of(k.0);
        let v = &self.classes[c];
        // Fast path: the class's smallest key already fits.
        if let Some(&last) = v.last().filter(|&&last| last >= k) {
            return Some(last);
        }
        match v.partition_point(|e| *e >= k) {
            0 => self.first_after_class(c),
            pos => Some(v[pos - 1]),
        }
    }

    /// The smallest key > `k`.
    fn successor(&self, k: FreeKey) -> Option<FreeKey> {
        let c = Self::class_of(k.0);
        let v = &self.classes[c];
        match v.partition_point(|e| *e > k) {
            0 => self.first_after_class(c),
            pos => Some(v[pos - 1]),
        }
    }

    /// The largest key < `k`.
    fn predecessor(&self, k: FreeKey) -> Option<FreeKey> {
        let c = Self::class_of(k.0);
        let v = &self.classes[c];
        let pos = v.partition_point(|e| *e >= k);
        if let Some(&e) = v.get(pos) {
            return Some(e);
        }
        let p = self.class_before(c)?;
        self.classes[p].first().copied()
    }

    /// All keys in order.
    fn iter(&self) -> impl Iterator<Item = FreeKey> + '_ {
        self.classes.iter().flat_map(|v| v.iter().rev()).copied()
    }
}

/// One device's `DeviceCachingAllocator` on **one stream**: `malloc`, `free`, `empty_cache` and
/// the counters of `memory_stats()`.
#[derive(Debug, Clone)]
pub struct CachingAllocator {
    opts: AllocatorOptions,
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    pools: [Pool; 2],
    next_segment_addr: u64,
    generation: u32,
    stats: Stats,
    scratch: Vec<u32>,
}

impl CachingAllocator {
    /// A fresh allocator: nothing reserved.
    pub fn new(opts: AllocatorOptions) -> Self {
        Self {
            opts,
            blocks: Vec::new(),
            vacant: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            next_segment_addr: SEGMENT_ADDR_START,
            generation: 0,
            stats: Stats::default(),
            scratch: Vec::new(),
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &AllocatorOptions {
        &self.opts
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The (invented) device address of a live allocation.
    pub fn address(&self, h: Handle) -> Option<u64> {
        self.live_block(h).map(|b| b.addr)
    }

    /// The block size a live allocation occupies — what it adds to `allocated`.
    pub fn block_size(&self, h: Handle) -> Option<u64> {
        self.live_block(h).map(|b| b.size)
    }

    fn live_block(&self, h: Handle) -> Option<&Block> {
        self.blocks.get(h.block as usize).filter(|b| b.live && b.allocated && b.generation == h.generation)
    }

    /// Allocates `bytes` (`DeviceCachingAllocator::malloc`): round the size, pick the pool, take
    /// the best-fitting cached block; failing that, get a new segment — if `cudaMalloc` fails,
    /// release cached oversize blocks and retry, then release every cached unsplit segment and
    /// retry once more — and finally split the block if the remainder is worth keeping.
    pub fn malloc(&mut self, bytes: u64) -> Result<Handle, AllocError> {
        if bytes == 0 {
            return Ok(Handle::EMPTY);
        }
        if bytes >= ONE_EXA_BYTES {
            return Err(AllocError::TooLarge { requested: bytes });
        }
        let size = round_size(bytes, &self.opts.roundup_power2_divisions);
        let pool = pool_for(size);
        let alloc_size = get_allocation_size(size);
        let mut found = self.get_free_block(pool, size);
        if found.is_none() {
            found = self.alloc_block(pool, size, alloc_size, false);
        }
        if found.is_none() && self.release_available_cached_blocks(pool, size) {
            found = self.alloc_block(pool, size, alloc_size, false);
        }
        if found.is_none() {
            self.release_cached_blocks();
            found = self.alloc_block(pool, size, alloc_size, true);
        }
        let Some(block) = found else {
            self.stats.num_ooms += 1;
            return Err(AllocError::OutOfMemory {
                requested: bytes,
                alloc_size,
                allocated: self.stats.allocated,
                reserved: self.stats.reserved,
            });
        };
        let split = self.should_split(block, size);
        Ok(self.alloc_found_block(block, size, split))
    }

    /// Frees an allocation (`DeviceCachingAllocator::free` → `free_block`): `allocated` drops at
    /// once, the block merges with free neighbours of its segment, and it stays reserved.
    pub fn free(&mut self, h: Handle) -> Result<(), AllocError> {
        if h == Handle::EMPTY {
            return Ok(());
        }
        let Some(b) = self.live_block(h).copied() else {
            return Err(AllocError::InvalidHandle);
        };
        let i = h.block;
        self.blocks[i as usize].allocated = false;
        self.stats.allocated -= b.size;
        self.stats.active -= b.size;
        self.free_block(i);
        Ok(())
    }

    /// `torch.cuda.empty_cache()` (`emptyCache` → `release_cached_blocks`): returns every cached
    /// unsplit segment to CUDA and unmaps every fully free page of expandable segments.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    // --- rules, one per source function ------------------------------------------------------

    /// `get_free_block`: the smallest cached block of at least `size` bytes, lowest address on
    /// ties. In an expandable segment a block followed by unmapped space counts as that much
    /// larger, so a later block that is smaller once expansion is counted wins. Oversize rules:
    /// a request below `max_split_size` never takes a block of `max_split_size` or more, and a
    /// larger request takes one only if the block is less than `size + max_non_split_rounding`.
    /// Only the best-fitting block is considered; if the rules reject it, nothing is found.
    fn get_free_block(&mut self, pool: usize, size: u64) -> Option<u32> {
        let max_split = self.opts.max_split();
        if !self.opts.expandable_segments {
            // No expandable blocks: the best fit is the lower bound itself, removed where found.
            let free = &mut self.pools[pool].free;
            let place = free.lower_bound_at((size, 0, 0))?;
            let (b_size, _, chosen) = free.at(place);
            if !self.fits_oversize_rules(size, b_size, max_split) {
                return None;
            }
            self.pools[pool].free.remove_at(place);
            return Some(chosen);
        }
        let free = &self.pools[pool].free;
        let mut cur = free.lower_bound((size, 0, 0))?;
        if self.blocks[cur.2 as usize].expandable {
            while let Some(next) = free.successor(cur) {
                if self.blocks[cur.2 as usize].expandable && self.expandable_size(next.2) < self.expandable_size(cur.2) {
                    cur = next;
                } else {
                    break;
                }
            }
        }
        let chosen = cur.2;
        let b_size = self.blocks[chosen as usize].size;
        if !self.fits_oversize_rules(size, b_size, max_split) {
            return None;
        }
        self.remove_free(chosen);
        Some(chosen)
    }

    /// The oversize rules of `get_free_block`: a request below `max_split_size` never takes a
    /// block of `max_split_size` or more; a larger request takes one only if the block is less
    /// than `size + max_non_split_rounding`.
    #[inline(always)]
    fn fits_oversize_rules(&self, size: u64, b_size: u64, max_split: u64) -> bool {
        if size < max_split {
            b_size < max_split
        } else {
            b_size < size.saturating_add(self.opts.max_non_split_rounding)
        }
    }

    /// `expandable_size` in `get_free_block`: a block's size plus the unmapped range after it.
    fn expandable_size(&self, i: u32) -> u64 {
        let b = &self.blocks[i as usize];
        let tail = if b.next != NIL && !self.blocks[b.next as usize].mapped { self.blocks[b.next as usize].size } else { 0 };
        b.size + tail
    }

    /// `should_split`: in the small pool, or with expandable segments, split off a remainder of
    /// at least 512 bytes; in the large pool only a remainder of more than 1 MiB, and only for
    /// requests below `max_split_size`. An unsplit block is allocated — and counted — whole.
    fn should_split(&self, i: u32, size: u64) -> bool {
        let b = &self.blocks[i as usize];
        let remaining = b.size - size;
        if b.pool as usize == SMALL_POOL || self.opts.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.opts.max_split() && remaining > SMALL_SIZE
        }
    }

    /// `alloc_block`: a new segment of `alloc_size` bytes from `cudaMalloc` (fails past
    /// `capacity`), or with expandable segments, `size` bytes of the pool's growing segment.
    fn alloc_block(&mut self, pool: usize, size: u64, alloc_size: u64, is_retry: bool) -> Option<u32> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.opts.expandable_segments {
            return self.try_allocate_expandable_block(pool, size);
        }
        if !self.device_has_room(alloc_size) {
            return None;
        }
        let addr = self.next_segment_addr;
        let end = addr.checked_add(alloc_size).filter(|&e| e <= SEGMENT_ADDR_END)?;
        self.next_segment_addr = end;
        let i = self.new_block(Block::free(pool, addr, alloc_size, true, false));
        self.stats.segments += 1;
        self.add_reserved(alloc_size);
        Some(i)
    }

    /// Whether `cudaMalloc` (or `cuMemCreate`) can get `bytes` more.
    fn device_has_room(&self, bytes: u64) -> bool {
        self.opts.capacity.is_none_or(|cap| self.stats.reserved.saturating_add(bytes) <= cap)
    }

    /// `alloc_found_block`: mark the block allocated; if splitting, the request takes the front
    /// and the remainder goes back to the cache. Tracks `inactive_split_bytes` as the source does.
    fn alloc_found_block(&mut self, i: u32, size: u64, split: bool) -> Handle {
        let b = self.blocks[i as usize];
        let already_split = b.is_split();
        let target = if split {
            let mut front = Block::free(b.pool as usize, b.addr, size, true, b.expandable);
            front.prev = b.prev;
            front.next = i;
            let nb = self.new_block(front);
            if b.prev != NIL {
                self.blocks[b.prev as usize].next = nb;
            }
            let rem = &mut self.blocks[i as usize];
            rem.prev = nb;
            rem.addr += size;
            rem.size -= size;
            self.insert_free(i);
            if !b.expandable {
                if already_split {
                    self.stats.inactive_split_bytes -= size;
                } else {
                    self.stats.inactive_split_bytes += b.size - size;
                }
            }
            nb
        } else {
            if already_split && !b.expandable {
                self.stats.inactive_split_bytes -= b.size;
            }
            i
        };
        self.generation = self.generation.wrapping_add(1);
        let t = &mut self.blocks[target as usize];
        t.allocated = true;
        t.generation = self.generation;
        let block_size = t.size;
        self.stats.allocated += block_size;
        self.stats.active += block_size;
        self.stats.max_allocated = self.stats.max_allocated.max(self.stats.allocated);
        Handle { block: target, generation: self.generation }
    }

    /// `free_block`: merge with free neighbours in the segment (`try_merge_blocks`), then cache.
    fn free_block(&mut self, i: u32) {
        let (prev, next) = (self.blocks[i as usize].prev, self.blocks[i as usize].next);
        let subsumed = self.try_merge_blocks(i, prev) + self.try_merge_blocks(i, next);
        self.insert_free(i);
        let b = self.blocks[i as usize];
        if !b.expandable {
            let now_split = if b.is_split() { b.size } else { 0 };
            self.stats.inactive_split_bytes = self.stats.inactive_split_bytes + now_split - subsumed;
        }
    }

    /// `try_merge_blocks`: absorb neighbour `src` into `dst` if it is free and in the same
    /// mapped state; returns the bytes absorbed. `dst` must not be in a cache set.
    #[inline(always)]
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.blocks[src as usize];
        if s.allocated || s.mapped != self.blocks[dst as usize].mapped {
            return 0;
        }
        if self.blocks[dst as usize].prev == src {
            self.blocks[dst as usize].addr = s.addr;
            self.blocks[dst as usize].prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            self.blocks[dst as usize].next = s.next;
            if s.next != NIL {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        self.vacate(src);
        s.size
    }

    /// `release_available_cached_blocks`: only with `max_split_size` set. Free the smallest cached
    /// oversize block of at least max(size, max_split_size); if there is none, free oversize
    /// blocks from the largest down until that much is released. Expandable blocks are skipped.
    fn release_available_cached_blocks(&mut self, pool: usize, size: u64) -> bool {
        let Some(max_split) = self.opts.max_split_size else {
            return false;
        };
        let key = size.max(max_split);
        let first = self.pools[pool].free.lower_bound((key, 0, 0)).map(|k| k.2);
        if let Some(i) = first.filter(|&i| !self.blocks[i as usize].expandable) {
            self.release_block(i);
            return true;
        }
        let mut victims = std::mem::take(&mut self.scratch);
        victims.clear();
        let mut total = 0u64;
        let mut at = self.pools[pool].free.predecessor((key, 0, 0));
        while let Some(k @ (b_size, _, i)) = at {
            if total >= key || b_size < max_split {
                break;
            }
            if !self.blocks[i as usize].expandable {
                total += b_size;
                victims.push(i);
            }
            at = self.pools[pool].free.predecessor(k);
        }
        for &i in &victims {
            self.release_block(i);
        }
        self.scratch = victims;
        total >= key
    }

    /// `release_cached_blocks` → `release_blocks` for the large then the small pool: every cached
    /// block that is a whole segment goes back to CUDA; cached blocks of expandable segments have
    /// their fully free pages unmapped (`unmap_block`), and a segment left with nothing mapped is
    /// released (`release_expandable_segment`). Split segments stay.
    fn release_cached_blocks(&mut self) {
        for pool in [LARGE_POOL, SMALL_POOL] {
            let mut cached = std::mem::take(&mut self.scratch);
            cached.clear();
            cached.extend(self.pools[pool].free.iter().map(|k| k.2));
            for &i in &cached {
                let b = self.blocks[i as usize];
                if !b.expandable && !b.is_split() {
                    self.release_block(i);
                }
            }
            for &i in &cached {
                let b = self.blocks[i as usize];
                if b.live && b.expandable && b.mapped && !b.allocated {
                    self.unmap_block(i);
                    let b = self.blocks[i as usize];
                    if !b.mapped && !b.is_split() {
                        self.release_expandable_segment(i);
                    }
                }
            }
            self.scratch = cached;
        }
    }

    /// `release_block`: `cudaFree` one cached whole segment.
    fn release_block(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        if b.expandable || b.is_split() || b.allocated {
            return; // never happens: callers pass cached whole cudaMalloc segments only
        }
        self.remove_free(i);
        self.vacate(i);
        self.stats.segments -= 1;
        self.stats.reserved -= b.size;
        if self.stats.segments == 0 {
            self.next_segment_addr = SEGMENT_ADDR_START;
        }
    }

    /// `find_expandable_block`: the lowest-addressed run of free and unmapped blocks in the pool's
    /// expandable segment with room for `size` — starting at an unmapped range, or at the free
    /// block just before it — or, without a segment, a new one (all of it unmapped).
    fn find_expandable_block(&mut self, pool: usize, size: u64) -> Option<u32> {
        for &(_, u) in &self.pools[pool].unmapped {
            let mut c = u;
            let prev = self.blocks[c as usize].prev;
            if prev != NIL && !self.blocks[prev as usize].allocated {
                c = prev;
            }
            if self.has_available_address_space(c, size) {
                return Some(c);
            }
        }
        if self.pools[pool].expandable_live {
            return None; // the segment's virtual range is exhausted; see EXPANDABLE_PAGES
        }
        let span = page_size(pool) * EXPANDABLE_PAGES[pool];
        let i = self.new_block(Block::free(pool, EXPANDABLE_BASE[pool], span, false, true));
        self.insert_unmapped(i);
        self.pools[pool].expandable_live = true;
        Some(i)
    }

    /// `has_available_address_space` in `find_expandable_block`.
    fn has_available_address_space(&self, mut b: u32, size: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < size && b != NIL && !self.blocks[b as usize].allocated {
            bytes += self.blocks[b as usize].size;
            b = self.blocks[b as usize].next;
        }
        bytes >= size
    }

    /// `try_allocate_expandable_block`: map pages at the start of the run found, then keep
    /// mapping the following unmapped range (merging with the free block before it) until the
    /// block holds `size` bytes.
    fn try_allocate_expandable_block(&mut self, pool: usize, size: u64) -> Option<u32> {
        let mut cand = self.find_expandable_block(pool, size)?;
        if !self.blocks[cand as usize].mapped {
            let want = self.blocks[cand as usize].size.min(size);
            if !self.map_block(cand, want) {
                return None;
            }
        }
        while self.blocks[cand as usize].size < size {
            let remaining = size - self.blocks[cand as usize].size;
            let next = self.blocks[cand as usize].next;
            if next == NIL || self.blocks[next as usize].mapped || self.blocks[next as usize].allocated {
                return None; // never happens: find_expandable_block checked the run
            }
            let want = remaining.min(self.blocks[next as usize].size);
            if !self.map_block(next, want) {
                return None;
            }
            cand = next;
        }
        self.remove_free(cand);
        Some(cand)
    }

    /// `map_block` / `ExpandableSegment::map`: map whole pages covering the first `size` bytes of
    /// an unmapped block (all or nothing: `cuMemCreate` failing past `capacity` releases the pages
    /// of this call), split off the unmapped rest, merge with free neighbours, cache the block.
    fn map_block(&mut self, i: u32, size: u64) -> bool {
        let b = self.blocks[i as usize];
        let pool = b.pool as usize;
        let page = page_size(pool);
        let offset = b.addr - EXPANDABLE_BASE[pool];
        let begin = offset / page;
        let end = (offset + size).div_ceil(page);
        if begin == end {
            return false;
        }
        let mapped = (end - begin) * page;
        if !self.device_has_room(mapped) {
            return false;
        }
        self.remove_unmapped(i);
        self.blocks[i as usize].mapped = true;
        if mapped < b.size {
            let mut rest = Block::free(pool, b.addr + mapped, b.size - mapped, false, true);
            rest.prev = i;
            rest.next = b.next;
            let r = self.new_block(rest);
            if b.next != NIL {
                self.blocks[b.next as usize].prev = r;
            }
            self.blocks[i as usize].next = r;
            self.blocks[i as usize].size = mapped;
            self.insert_unmapped(r);
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge_blocks(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge_blocks(i, next);
        self.insert_free(i);
        self.add_reserved(mapped);
        true
    }

    /// `unmap_block` / `ExpandableSegment::unmap`: unmap the pages lying wholly inside a cached
    /// expandable block; the partial pages before and after stay mapped as free blocks.
    fn unmap_block(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        let pool = b.pool as usize;
        let page = page_size(pool);
        let offset = b.addr - EXPANDABLE_BASE[pool];
        let begin = offset.div_ceil(page);
        let end = (offset + b.size) / page;
        if begin >= end {
            return;
        }
        self.remove_free(i);
        let unmapped_addr = EXPANDABLE_BASE[pool] + begin * page;
        let unmapped_size = (end - begin) * page;
        let before = unmapped_addr - b.addr;
        if before > 0 {
            let mut front = Block::free(pool, b.addr, before, true, true);
            front.prev = b.prev;
            front.next = i;
            let f = self.new_block(front);
            if b.prev != NIL {
                self.blocks[b.prev as usize].next = f;
            }
            self.blocks[i as usize].prev = f;
            self.insert_free(f);
        }
        let after = b.size - before - unmapped_size;
        if after > 0 {
            let mut back = Block::free(pool, unmapped_addr + unmapped_size, after, true, true);
            back.prev = i;
            back.next = b.next;
            let a = self.new_block(back);
            if b.next != NIL {
                self.blocks[b.next as usize].prev = a;
            }
            self.blocks[i as usize].next = a;
            self.insert_free(a);
        }
        {
            let m = &mut self.blocks[i as usize];
            m.addr = unmapped_addr;
            m.size = unmapped_size;
            m.mapped = false;
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge_blocks(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge_blocks(i, next);
        self.insert_unmapped(i);
        self.stats.reserved -= unmapped_size;
    }

    /// `release_expandable_segment`: drop a segment whose whole range is unmapped.
    fn release_expandable_segment(&mut self, i: u32) {
        let pool = self.blocks[i as usize].pool as usize;
        self.remove_unmapped(i);
        self.vacate(i);
        self.pools[pool].expandable_live = false;
    }

    // --- bookkeeping ---------------------------------------------------------------------------

    fn add_reserved(&mut self, bytes: u64) {
        self.stats.reserved += bytes;
        self.stats.max_reserved = self.stats.max_reserved.max(self.stats.reserved);
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn vacate(&mut self, i: u32) {
        self.blocks[i as usize].live = false;
        self.blocks[i as usize].allocated = false;
        self.vacant.push(i);
    }

    #[inline(always)]
    fn insert_free(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let k = (b.size, b.addr, i);
        self.pools[b.pool as usize].free.insert(k);
    }

    #[inline(always)]
    fn remove_free(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        let k = (b.size, b.addr, i);
        self.pools[b.pool as usize].free.remove(k);
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        self.pools[b.pool as usize].unmapped.insert((b.addr, i));
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        self.pools[b.pool as usize].unmapped.remove(&(b.addr, i));
    }
}

// ---------------------------------------------------------------------------------------------
// Replaying an event stream
// ---------------------------------------------------------------------------------------------

/// One step of an allocation stream: a tensor of `bytes` created under `id`, the tensor `id`
/// freed, or `torch.cuda.empty_cache()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocEvent {
    Alloc { id: u32, bytes: u64 },
    Free { id: u32 },
    EmptyCache,
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replay {
    /// `max_memory_allocated()` over the replay.
    pub peak_allocated: u64,
    /// `max_memory_reserved()` over the replay (pages mapped during a failed attempt count).
    pub peak_reserved: u64,
    /// The index of the event during which `reserved` reached its peak (0 if nothing was ever
    /// reserved).
    pub peak_reserved_at: usize,
    /// `memory_reserved()` after the last replayed event.
    pub final_reserved: u64,
    /// The index of the first allocation that ran out of memory. The replay stops there, as the
    /// training step would.
    pub oom: Option<usize>,
    /// `memory_reserved()` after each replayed event, when asked for.
    pub reserved_after: Option<Vec<u64>>,
    /// All counters after the last replayed event.
    pub stats: Stats,
}

/// An event stream that does not make sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("event {index}: free of id {id}, which is not allocated")]
    UnknownId { index: usize, id: u32 },
    #[error("event {index}: id {id} allocated again before it was freed")]
    DuplicateId { index: usize, id: u32 },
}

/// Replays events through a fresh allocator; no per-event trace. Allocates nothing per event
/// beyond the allocator's own state and the id table.
pub fn replay(events: &[AllocEvent], opts: &AllocatorOptions) -> Result<Replay, ReplayError> {
    replay_with(events, opts, false)
}

/// Replays events through a fresh allocator; with `trace`, also records `reserved` after every
/// event in `Replay::reserved_after`.
pub fn replay_with(events: &[AllocEvent], opts: &AllocatorOptions, trace: bool) -> Result<Replay, ReplayError> {
    let mut sim = CachingAllocator::new(opts.clone());
    let mut live = IdTable::for_events(events);
    let mut reserved_after = trace.then(|| Vec::with_capacity(events.len()));
    let mut oom = None;
    let mut peak_reserved_at = 0;
    let mut peak_seen = 0;
    for (index, event) in events.iter().enumerate() {
        match *event {
            AllocEvent::Alloc { id, bytes } => {
                if live.get(id).is_some() {
                    return Err(ReplayError::DuplicateId { index, id });
                }
                match sim.malloc(bytes) {
                    Ok(h) => live.insert(id, h),
                    Err(_) => oom = Some(index),
                }
            }
            AllocEvent::Free { id } => {
                let h = live.remove(id).ok_or(ReplayError::UnknownId { index, id })?;
                sim.free(h).map_err(|_| ReplayError::UnknownId { index, id })?;
            }
            AllocEvent::EmptyCache => sim.empty_cache(),
        }
        let s = &sim.stats;
        if s.max_reserved > peak_seen {
            peak_seen = s.max_reserved;
            peak_reserved_at = index;
        }
        if let Some(t) = reserved_after.as_mut() {
            t.push(s.reserved);
        }
        if oom.is_some() {
            break;
        }
    }
    let stats = sim.stats();
    Ok(Replay {
        peak_allocated: stats.max_allocated,
        peak_reserved: stats.max_reserved,
        peak_reserved_at,
        final_reserved: stats.reserved,
        oom,
        reserved_after,
        stats,
    })
}

/// Live handles by event id: a vector indexed by id when the ids are dense (the usual case: ids
/// numbered as tensors are created), a hash map otherwise.
enum IdTable {
    Dense(Vec<Option<Handle>>),
    Sparse(HashMap<u32, Handle, BuildHasherDefault<IdHasher>>),
}

impl IdTable {
    /// Ids up to this many times the event count (plus a margin) get a dense table.
    const DENSE_FACTOR: usize = 2;
    const DENSE_MARGIN: usize = 1024;

    fn for_events(events: &[AllocEvent]) -> Self {
        let max_id = events.iter().filter_map(|e| if let AllocEvent::Alloc { id, .. } = *e { Some(id as usize) } else { None }).max();
        match max_id {
            Some(m) if m > events.len() * Self::DENSE_FACTOR + Self::DENSE_MARGIN => Self::Sparse(HashMap::default()),
            Some(m) => Self::Dense(vec![None; m + 1]),
            None => Self::Dense(Vec::new()),
        }
    }

    fn get(&self, id: u32) -> Option<Handle> {
        match self {
            Self::Dense(v) => v.get(id as usize).copied().flatten(),
            Self::Sparse(m) => m.get(&id).copied(),
        }
    }

    fn insert(&mut self, id: u32, h: Handle) {
        match self {
            Self::Dense(v) => {
                if let Some(slot) = v.get_mut(id as usize) {
                    *slot = Some(h);
                }
            }
            Self::Sparse(m) => {
                m.insert(id, h);
            }
        }
    }

    fn remove(&mut self, id: u32) -> Option<Handle> {
        match self {
            Self::Dense(v) => v.get_mut(id as usize).and_then(Option::take),
            Self::Sparse(m) => m.remove(&id),
        }
    }
}

/// A multiplicative hash for sparse `u32` ids: std's default SipHash would cost more than the
/// allocator itself.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (u64::from(n) ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mib(n: u64) -> u64 {
        n * MIB
    }

    fn fresh() -> CachingAllocator {
        CachingAllocator::new(AllocatorOptions::default())
    }

    fn expandable() -> CachingAllocator {
        CachingAllocator::new(AllocatorOptions { expandable_segments: true, ..Default::default() })
    }

    fn alloc(a: &mut CachingAllocator, bytes: u64) -> Handle {
        let h = a.malloc(bytes).expect("allocation fits");
        a.check_invariants();
        h
    }

    fn free(a: &mut CachingAllocator, h: Handle) {
        a.free(h).expect("live handle");
        a.check_invariants();
    }

    /// (allocated, reserved).
    fn ar(a: &CachingAllocator) -> (u64, u64) {
        let s = a.stats();
        (s.allocated, s.reserved)
    }

    impl CachingAllocator {
        /// Every structural invariant: block lists are contiguous and consistent, the cache sets
        /// hold exactly the free blocks, no two free neighbours in the same state are left
        /// unmerged, and the counters equal what the blocks add up to.
        fn check_invariants(&self) {
            let (mut allocated, mut mapped, mut inactive_split) = (0, 0, 0);
            let mut free_count = [0usize; 2];
            let mut unmapped_count = [0usize; 2];
            for (i, b) in self.blocks.iter().enumerate().filter(|(_, b)| b.live) {
                let i = i as u32;
                let pool = &self.pools[b.pool as usize];
                if b.next != NIL {
                    let n = &self.blocks[b.next as usize];
                    assert!(n.live && n.prev == i && n.addr == b.addr + b.size, "block list broken at {i}");
                    let both_free = !b.allocated && !n.allocated && b.mapped == n.mapped;
                    assert!(!both_free, "unmerged free neighbours at {i}");
                }
                if b.prev != NIL {
                    assert_eq!(self.blocks[b.prev as usize].next, i);
                }
                if b.mapped {
                    mapped += b.size;
                }
                if b.allocated {
                    assert!(b.mapped);
                    allocated += b.size;
                } else if b.mapped {
                    assert!(pool.free.contains((b.size, b.addr, i)), "free block {i} not cached");
                    free_count[b.pool as usize] += 1;
                    if b.is_split() && !b.expandable {
                        inactive_split += b.size;
                    }
                } else {
                    assert!(pool.unmapped.contains(&(b.addr, i)));
                    unmapped_count[b.pool as usize] += 1;
                }
            }
            for p in 0..2 {
                assert_eq!(self.pools[p].free.len(), free_count[p]);
                assert_eq!(self.pools[p].unmapped.len(), unmapped_count[p]);
            }
            assert_eq!(self.stats.allocated, allocated);
            assert_eq!(self.stats.active, allocated);
            assert_eq!(self.stats.reserved, mapped, "reserved must equal the mapped bytes");
            assert_eq!(self.stats.inactive_split_bytes, inactive_split);
            assert!(self.stats.allocated <= self.stats.reserved);
            assert!(self.stats.max_reserved >= self.stats.reserved);
        }
    }

    // --- golden cases ----------------------------------------------------------------------------

    #[test]
    fn one_kibibyte_tensor_reserves_a_two_mebibyte_small_segment_until_empty_cache() {
        // torch.randn(256) fp32 = 1,024 B (test_cuda.py test_memory_stats activates exactly this
        // and checks active_bytes = 1,024). 1,024 is a multiple of 512 → block 1,024 B; ≤ 1 MiB →
        // small pool → a 2 MiB segment; the 2 MiB − 1 KiB remainder (≥ 512 B) is split off.
        let mut a = fresh();
        let h = alloc(&mut a, 1024);
        assert_eq!(ar(&a), (1024, mib(2)));
        free(&mut a, h);
        assert_eq!(ar(&a), (0, mib(2)), "freed memory stays cached");
        a.empty_cache();
        assert_eq!(ar(&a), (0, 0));
        assert_eq!(a.stats().max_reserved, mib(2));
    }

    #[test]
    fn three_one_mebibyte_tensors_reserve_two_two_then_four_mebibytes() {
        // test_cuda.py test_mempool_with_allocator: 1, 1, then 2 segments. 1 MiB = kSmallSize →
        // small pool → 2 MiB segment: the first takes [0, 1), the 1 MiB remainder is split off and
        // serves the second exactly; the third needs a new 2 MiB segment.
        let mut a = fresh();
        let mut reserved = vec![];
        for _ in 0..3 {
            alloc(&mut a, mib(1));
            reserved.push(a.stats().reserved / MIB);
        }
        assert_eq!(reserved, [2, 2, 4]);
        assert_eq!(a.stats().segments, 2);
    }

    #[test]
    fn six_four_mebibyte_tensors_share_a_twenty_mebibyte_segment_until_the_sixth() {
        // 4 MiB: large pool, < 10 MiB → a 20 MiB segment. Split remainders 16, 12, 8, 4 MiB are all
        // > 1 MiB; the fifth takes the last 4 MiB exactly; the sixth opens a second segment.
        let mut a = fresh();
        let mut reserved = vec![];
        let mut inactive = vec![];
        for _ in 0..6 {
            alloc(&mut a, mib(4));
            reserved.push(a.stats().reserved / MIB);
            inactive.push(a.stats().inactive_split_bytes / MIB);
        }
        assert_eq!(reserved, [20, 20, 20, 20, 20, 40]);
        assert_eq!(inactive, [16, 12, 8, 4, 0, 16]);
        // test_mempool_no_split: "Allocate 4 MB … should allocate a 20 MB segment", the second
        // 4 MB splits it: still one segment.
        assert_eq!(a.stats().allocated, mib(24));
    }

    #[test]
    fn a_nineteen_and_a_half_mebibyte_request_takes_a_whole_twenty_mebibyte_block() {
        // 19.5 MiB ≥ 10 MiB → segment rounded up to 2 MiB = 20 MiB. The 0.5 MiB remainder is not
        // > 1 MiB, so the block is not split and is allocated — and counted — whole.
        let mut a = fresh();
        let h = alloc(&mut a, mib(39) / 2);
        assert_eq!(ar(&a), (mib(20), mib(20)));
        assert_eq!(a.block_size(h), Some(mib(20)));
    }

    #[test]
    fn eight_sixteen_mebibyte_tensors_freed_then_four_of_thirty_two_reserve_256_mebibytes() {
        // Each 16 MiB request gets its own 16 MiB segment (8 × 16 = 128 MiB). Freed, they are
        // cached but none is ≥ 32 MiB, so each 32 MiB request needs a new segment: 128 + 4 × 32.
        let mut a = fresh();
        let hs: Vec<_> = (0..8).map(|_| alloc(&mut a, mib(16))).collect();
        assert_eq!(a.stats().reserved, mib(128));
        hs.into_iter().for_each(|h| free(&mut a, h));
        for _ in 0..4 {
            alloc(&mut a, mib(32));
        }
        assert_eq!(ar(&a), (mib(128), mib(256)));
    }

    #[test]
    fn four_thirty_two_mebibyte_tensors_freed_then_eight_of_sixteen_stay_at_128_mebibytes() {
        // Reverse order: each 16 MiB request splits a cached 32 MiB block (remainder 16 > 1 MiB)
        // and the next takes the remainder: no new segment.
        let mut a = fresh();
        let hs: Vec<_> = (0..4).map(|_| alloc(&mut a, mib(32))).collect();
        hs.into_iter().for_each(|h| free(&mut a, h));
        for _ in 0..8 {
            alloc(&mut a, mib(16));
        }
        assert_eq!(ar(&a), (mib(128), mib(128)));
    }

    #[test]
    fn expandable_segments_map_twenty_mebibyte_pages_as_sixteen_mebibyte_tensors_arrive() {
        // One large-pool segment grows by 20 MiB pages (ExpandableSegment::map).
        //  #1: nothing mapped → map ⌈16/20⌉ = 1 page → 20; split → 4 MiB free at the end.
        //  #2: 4 free + unmapped after it → map ⌈12/20⌉ = 1 page → 40; 24 − 16 = 8 free.
        //  #3: 8 + 20 → 60, 12 free.   #4: 12 + 20 → 80, 16 free.
        //  #5: the 16 MiB free block fits exactly → 80.
        //  #6: nothing free → 100, 4 free.   #7: → 120, 8 free.   #8: → 140, 12 free.
        let mut a = expandable();
        let mut steps = vec![];
        let mut hs = vec![];
        for _ in 0..8 {
            hs.push(alloc(&mut a, mib(16)));
            steps.push(a.stats().reserved / MIB);
        }
        assert_eq!(steps, [20, 40, 60, 80, 80, 100, 120, 140]);
        assert_eq!(a.stats().segments, 0, "PyTorch counts no cudaMalloc segment for mapped pages");
        // Freed, the 140 MiB merge into one free block that serves 4 × 32 MiB without mapping.
        hs.into_iter().for_each(|h| free(&mut a, h));
        for _ in 0..4 {
            alloc(&mut a, mib(32));
        }
        assert_eq!(ar(&a), (mib(128), mib(140)));
    }

    #[test]
    fn roundup_power2_divisions_four_turns_84_mebibytes_into_96() {
        // test_allocator_settings: 21 Mi floats = 84 MiB. Bucket ⌊log2 84 MiB⌋ − 20 = 6 has 4
        // divisions and 84 MiB > 512 B × 4, so [64, 128) MiB is cut into 16 MiB steps: 96 MiB.
        let opts = AllocatorOptions::parse("roundup_power2_divisions:4").expect("valid");
        assert_eq!(round_size(mib(84), &opts.roundup_power2_divisions), mib(96));
        let mut a = CachingAllocator::new(opts);
        alloc(&mut a, mib(84));
        assert_eq!(ar(&a), (mib(96), mib(96)));
    }

    #[test]
    fn roundup_list_with_eight_divisions_up_to_64_mebibytes_turns_84_into_88() {
        // `[64:8,>:1]`: 64 → bucket 6 = 8 divisions (and buckets 0–5, being first); `>` sets
        // buckets 7–15 to 1. 84 MiB is in bucket 6: 8 MiB steps over [64, 128) → 88 MiB.
        let opts = AllocatorOptions::parse("roundup_power2_divisions:[64:8,>:1]").expect("valid");
        let d = opts.roundup_power2_divisions;
        assert_eq!(d.0, [8, 8, 8, 8, 8, 8, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(round_size(mib(84), &d), mib(88));
    }

    #[test]
    fn roundup_list_from_test_allocator_settings_rounds_84_to_88_and_400_to_512() {
        // `[64:8,128:2,256:2,512:2,1024:1,>:1]` (test_cuda.py test_allocator_settings):
        // 84 MiB → 8 divisions of [64, 128) → 88 MiB = power2_div(nbytes, 8);
        // 400 MiB (100 Mi floats) → bucket 8 ([256, 512) MiB) has 2 → 128 MiB steps → 512 MiB.
        let opts = AllocatorOptions::parse("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
            .expect("valid");
        let d = opts.roundup_power2_divisions;
        assert_eq!(round_size(mib(84), &d), mib(88));
        assert_eq!(round_size(mib(400), &d), mib(512));
        // Sizes already on a step, and powers of two, are kept.
        assert_eq!(round_size(mib(256), &d), mib(256));
        assert_eq!(round_size(mib(384), &d), mib(384));
    }

    #[test]
    fn small_requests_round_to_512_bytes_and_power2_rounding_needs_size_above_512_times_divisions() {
        let none = RoundupPower2Divisions::NONE;
        assert_eq!(round_size(1, &none), 512);
        assert_eq!(round_size(513, &none), 1024);
        // 4 divisions: 1200 > 2048? no → plain 512 rounding = 1536; 3000 > 2048 → [2048, 4096) in
        // 512-byte steps → 3072. The source's own example: 1200 with 4 divisions → 1280.
        let four = RoundupPower2Divisions::uniform(4);
        assert_eq!(round_size(1200, &four), 1536);
        assert_eq!(round_size(3000, &four), 3072);
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    }

    #[test]
    fn segment_sizes_follow_get_allocation_size() {
        assert_eq!(get_allocation_size(512), mib(2));
        assert_eq!(get_allocation_size(mib(1)), mib(2));
        assert_eq!(get_allocation_size(mib(1) + 512), mib(20));
        assert_eq!(get_allocation_size(mib(10) - 512), mib(20));
        assert_eq!(get_allocation_size(mib(10)), mib(10));
        assert_eq!(get_allocation_size(mib(11)), mib(12));
    }

    // --- parser --------------------------------------------------------------------------------

    #[test]
    fn the_alloc_conf_string_sets_every_simulated_option() {
        let o = AllocatorOptions::parse(
            " expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:4,max_non_split_rounding_mb:30,",
        )
        .expect("valid");
        assert!(o.expandable_segments);
        assert_eq!(o.max_split_size, Some(mib(128)));
        assert_eq!(o.roundup_power2_divisions, RoundupPower2Divisions::uniform(4));
        assert_eq!(o.max_non_split_rounding, mib(30));
        assert_eq!(o.capacity, None);
        assert_eq!(AllocatorOptions::parse("").expect("empty is default"), AllocatorOptions::default());
        assert_eq!("expandable_segments:False".parse::<AllocatorOptions>(), Ok(AllocatorOptions::default()));
    }

    #[test]
    fn bad_alloc_conf_strings_name_the_option() {
        // The invalid settings test_allocator_settings expects PyTorch to reject.
        for (conf, option) in [
            ("foo:1,bar:2", "foo"),
            ("garbage_collection_threshold:1.2", "garbage_collection_threshold"),
            ("max_split_size_mb:2", "max_split_size_mb"),
            ("release_lock_on_cudamalloc:none", "release_lock_on_cudamalloc"),
            ("pinned_use_cuda_host_register:none", "pinned_use_cuda_host_register"),
            ("pinned_num_register_threads:none", "pinned_num_register_threads"),
            ("pinned_num_register_threads:1024", "pinned_num_register_threads"),
            ("expandable_segments:true", "expandable_segments"),
            ("expandable_segments", "expandable_segments"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("roundup_power2_divisions:[64:8", "roundup_power2_divisions"),
            ("roundup_power2_divisions:[63:8]", "roundup_power2_divisions"),
            ("max_non_split_rounding_mb:19", "max_non_split_rounding_mb"),
            ("backend:cudaMallocAsync", "backend"),
            ("per_process_memory_fraction:0.5", "per_process_memory_fraction"),
        ] {
            let err = AllocatorOptions::parse(conf).expect_err(conf);
            assert_eq!(err.option(), option, "{conf}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(option), "{msg}");
            assert!(msg.starts_with(char::is_lowercase), "{msg}");
        }
    }

    // --- placement rules -------------------------------------------------------------------------

    #[test]
    fn freed_neighbours_merge_and_equal_sizes_go_to_the_lowest_address() {
        // One 20 MiB segment: A [0,4) B [4,8) C [8,12) free [12,20).
        let mut a = fresh();
        let [ha, hb, _hc] = [0; 3].map(|_| alloc(&mut a, mib(4)));
        let base = a.address(ha).expect("live");
        assert_eq!(a.stats().inactive_split_bytes, mib(8));
        free(&mut a, hb); // B: free 4 MiB between A and C → 8 + 4
        assert_eq!(a.stats().inactive_split_bytes, mib(12));
        free(&mut a, ha); // A merges with B → one free [0,8) block
        assert_eq!(a.stats().inactive_split_bytes, mib(16));
        // Two free 8 MiB blocks, [0,8) and [12,20): the tie goes to the lower address.
        let h = alloc(&mut a, mib(8));
        assert_eq!(a.address(h), Some(base));
        assert_eq!(a.stats().reserved, mib(20));
    }

    #[test]
    fn best_fit_takes_the_smallest_block_that_fits_and_the_lower_segment_on_ties() {
        // Segments of 24, 30 and 30 MiB (each ≥ 10 MiB → its own size), all freed.
        let mut a = fresh();
        let h24 = alloc(&mut a, mib(24));
        let h30a = alloc(&mut a, mib(30));
        let h30b = alloc(&mut a, mib(30));
        let (a24, a30a) = (a.address(h24), a.address(h30a));
        for h in [h30b, h24, h30a] {
            free(&mut a, h);
        }
        let x = alloc(&mut a, mib(22)); // smallest ≥ 22 is the 24 MiB block (remainder 2 > 1 → split)
        assert_eq!(a.address(x), a24);
        let y = alloc(&mut a, mib(30)); // two 30 MiB blocks: the lower address
        assert_eq!(a.address(y), a30a);
        assert_eq!(a.stats().reserved, mib(84));
    }

    #[test]
    fn split_segments_survive_empty_cache() {
        // Two 4 MiB tensors in one 20 MiB segment; the first freed. The segment still holds the
        // second, so empty_cache can return nothing: 16 MiB stay as inactive split blocks.
        let mut a = fresh();
        let h1 = alloc(&mut a, mib(4));
        let _h2 = alloc(&mut a, mib(4));
        free(&mut a, h1);
        a.empty_cache();
        a.check_invariants();
        assert_eq!(ar(&a), (mib(4), mib(20)));
        assert_eq!(a.stats().inactive_split_bytes, mib(16));
    }

    #[test]
    fn max_split_size_keeps_small_requests_off_oversize_blocks() {
        // max_split_size_mb:40. A cached 50 MiB block (≥ 40) is not handed to a 10 MiB request;
        // it gets its own 10 MiB segment.
        let mut a = CachingAllocator::new(AllocatorOptions::parse("max_split_size_mb:40").expect("valid"));
        let h = alloc(&mut a, mib(50));
        free(&mut a, h);
        alloc(&mut a, mib(10));
        assert_eq!(ar(&a), (mib(10), mib(60)));
    }

    #[test]
    fn max_split_size_lets_large_requests_round_up_within_max_non_split_rounding() {
        // max_split_size_mb:40, default max_non_split_rounding 20 MiB. A 50 MiB request takes a
        // cached 60 MiB block (60 < 50 + 20) whole — no split at or above max_split_size — so
        // allocated is 60 MiB; a 45 MiB request refuses a cached 70 MiB block (70 ≥ 65) and gets
        // a 46 MiB segment (45 rounded up to 2 MiB), counted whole as well.
        let mut a = CachingAllocator::new(AllocatorOptions::parse("max_split_size_mb:40").expect("valid"));
        let h60 = alloc(&mut a, mib(60));
        let h70 = alloc(&mut a, mib(70));
        free(&mut a, h60);
        free(&mut a, h70);
        alloc(&mut a, mib(50));
        assert_eq!(ar(&a), (mib(60), mib(130)));
        alloc(&mut a, mib(45));
        assert_eq!(ar(&a), (mib(106), mib(176)));
        // With max_non_split_rounding_mb:30 the 70 MiB block would have been taken (70 < 75).
        let mut b = CachingAllocator::new(AllocatorOptions::parse("max_split_size_mb:40,max_non_split_rounding_mb:30").expect("valid"));
        let h = alloc(&mut b, mib(70));
        free(&mut b, h);
        alloc(&mut b, mib(45));
        assert_eq!(ar(&b), (mib(70), mib(70)));
    }

    #[test]
    fn with_max_split_size_an_oversize_cached_block_is_released_before_a_full_retry() {
        // capacity 100 MiB, max_split_size_mb:40. An 80 MiB block is cached; a 45 MiB request
        // refuses it (80 ≥ 45 + 20) and cudaMalloc of 46 MiB fails (80 + 46 > 100), so
        // release_available_cached_blocks frees the 80 MiB block and the next cudaMalloc succeeds —
        // not counted as a retry.
        let mut opts = AllocatorOptions::parse("max_split_size_mb:40").expect("valid");
        opts.capacity = Some(mib(100));
        let mut a = CachingAllocator::new(opts);
        let h = alloc(&mut a, mib(80));
        free(&mut a, h);
        alloc(&mut a, mib(45));
        assert_eq!(ar(&a), (mib(46), mib(46)));
        assert_eq!(a.stats().num_alloc_retries, 0);
        assert_eq!(a.stats().max_reserved, mib(80));
    }

    // --- out of memory ---------------------------------------------------------------------------

    #[test]
    fn at_capacity_cached_segments_are_released_and_the_request_retried() {
        // capacity 60 MiB: two 30 MiB segments cached after their tensors died. A 40 MiB request
        // finds no cached block ≥ 40; cudaMalloc fails (60 + 40 > 60); release_cached_blocks frees
        // both unsplit segments and the retry succeeds.
        let mut a = CachingAllocator::new(AllocatorOptions { capacity: Some(mib(60)), ..Default::default() });
        let hs = [alloc(&mut a, mib(30)), alloc(&mut a, mib(30))];
        hs.into_iter().for_each(|h| free(&mut a, h));
        alloc(&mut a, mib(40));
        assert_eq!(ar(&a), (mib(40), mib(40)));
        assert_eq!((a.stats().num_alloc_retries, a.stats().num_ooms), (1, 0));
    }

    #[test]
    fn the_retry_releases_a_cached_small_segment_for_a_large_one_and_then_runs_out() {
        // capacity 17 MiB: a freed 1 KiB tensor leaves a cached 2 MiB small-pool segment. A 16 MiB
        // tensor: cudaMalloc fails (2 + 16 > 17), release_cached_blocks frees the small segment,
        // the retry succeeds. A second 16 MiB tensor: 16 + 16 > 17 and nothing is cached → OOM.
        let mut a = CachingAllocator::new(AllocatorOptions { capacity: Some(mib(17)), ..Default::default() });
        let h = alloc(&mut a, 1024);
        free(&mut a, h);
        alloc(&mut a, mib(16));
        assert_eq!(ar(&a), (mib(16), mib(16)));
        assert_eq!(a.stats().num_alloc_retries, 1);
        let err = a.malloc(mib(16)).expect_err("16 + 16 > 17");
        a.check_invariants();
        assert_eq!(err, AllocError::OutOfMemory { requested: mib(16), alloc_size: mib(16), allocated: mib(16), reserved: mib(16) });
        assert_eq!((a.stats().num_alloc_retries, a.stats().num_ooms), (2, 1));
    }

    #[test]
    fn half_the_device_twice_runs_out_until_the_first_half_is_freed() {
        // test_cuda.py test_out_of_memory_retry: a = half the memory; b = another half fails
        // (here 500 + 500 > 999); after del a, b reuses a's cached block without a new segment.
        let mut a = CachingAllocator::new(AllocatorOptions { capacity: Some(mib(999)), ..Default::default() });
        let first = alloc(&mut a, mib(500));
        assert!(matches!(a.malloc(mib(500)), Err(AllocError::OutOfMemory { .. })));
        free(&mut a, first);
        alloc(&mut a, mib(500));
        assert_eq!(ar(&a), (mib(500), mib(500)));
        assert_eq!(a.stats().num_ooms, 1);
    }

    #[test]
    fn requests_beyond_capacity_or_one_exbibyte_are_refused() {
        // test_cuda.py test_out_of_memory: 800,000,000 GiB → "Tried to allocate …" (an OOM);
        // 8,000,000,000 GiB → "more than 1EB" before the allocator runs (no OOM counted). A later
        // small tensor still works.
        let mut a = CachingAllocator::new(AllocatorOptions { capacity: Some(80 << 30), ..Default::default() });
        assert!(matches!(a.malloc(800_000_000 << 30), Err(AllocError::OutOfMemory { .. })));
        assert_eq!(a.malloc(8_000_000_000 << 30), Err(AllocError::TooLarge { requested: 8_000_000_000 << 30 }));
        assert_eq!(a.stats().num_ooms, 1);
        alloc(&mut a, 4096);
        assert_eq!(ar(&a), (4096, mib(2)));
    }

    #[test]
    fn expandable_segments_unmap_free_pages_on_empty_cache_and_retry() {
        // Keep the first 16 MiB tensor of the 8 × 16 MiB expandable case, free the rest: the free
        // block [16, 140) holds whole pages 1..7 (20 MiB each, [20, 140)); they are unmapped and
        // [16, 20) stays mapped → reserved 20 MiB.
        let mut a = expandable();
        let hs: Vec<_> = (0..8).map(|_| alloc(&mut a, mib(16))).collect();
        hs[1..].iter().for_each(|&h| free(&mut a, h));
        a.empty_cache();
        a.check_invariants();
        assert_eq!(ar(&a), (mib(16), mib(20)));
        free(&mut a, hs[0]);
        a.empty_cache();
        a.check_invariants();
        assert_eq!(ar(&a), (0, 0), "a fully unmapped segment is released");
        // At capacity 21 MiB a cached small-pool page (2 MiB) is unmapped by the retry so that a
        // 20 MiB large-pool page fits.
        let mut b = CachingAllocator::new(AllocatorOptions { expandable_segments: true, capacity: Some(mib(21)), ..Default::default() });
        let h = alloc(&mut b, 1024);
        free(&mut b, h);
        alloc(&mut b, mib(16));
        assert_eq!(ar(&b), (mib(16), mib(20)));
        assert_eq!(b.stats().num_alloc_retries, 1);
    }

    #[test]
    fn handles_are_checked_and_zero_byte_tensors_take_nothing() {
        let mut a = fresh();
        let h = alloc(&mut a, 100);
        assert_eq!(a.block_size(h), Some(512));
        free(&mut a, h);
        assert_eq!(a.free(h), Err(AllocError::InvalidHandle), "double free");
        let forged = Handle { block: 12345, generation: 1 };
        assert_eq!(a.free(forged), Err(AllocError::InvalidHandle));
        let z = a.malloc(0).expect("zero bytes");
        assert_eq!(z, Handle::EMPTY);
        assert_eq!(a.free(z), Ok(()));
        assert_eq!(a.stats().reserved, mib(2));
    }

    // --- replay ----------------------------------------------------------------------------------

    fn sixteens_then_thirty_twos() -> Vec<AllocEvent> {
        let mut ev = vec![];
        ev.extend((0..8).map(|id| AllocEvent::Alloc { id, bytes: mib(16) }));
        ev.extend((0..8).map(|id| AllocEvent::Free { id }));
        ev.extend((8..12).map(|id| AllocEvent::Alloc { id, bytes: mib(32) }));
        ev
    }

    #[test]
    fn replay_reports_peaks_and_where_reserved_peaked() {
        // Events 0–7 allocate 8 × 16, 8–15 free them, 16–19 allocate 4 × 32: reserved peaks at
        // 256 MiB on the last event (index 19); allocated peaks at 128 MiB.
        let ev = sixteens_then_thirty_twos();
        let r = replay(&ev, &AllocatorOptions::default()).expect("valid stream");
        assert_eq!((r.peak_allocated, r.peak_reserved, r.peak_reserved_at), (mib(128), mib(256), 19));
        assert_eq!((r.final_reserved, r.oom, r.reserved_after.clone()), (mib(256), None, None));
        let traced = replay_with(&ev, &AllocatorOptions::default(), true).expect("valid stream");
        let trace: Vec<u64> = traced.reserved_after.expect("asked for").iter().map(|b| b / MIB).collect();
        assert_eq!(trace, [16, 32, 48, 64, 80, 96, 112, 128, 128, 128, 128, 128, 128, 128, 128, 128, 160, 192, 224, 256]);
        // Expandable: 140 MiB, reached at the eighth allocation (index 7).
        let opts = AllocatorOptions { expandable_segments: true, ..Default::default() };
        let r = replay(&ev, &opts).expect("valid stream");
        assert_eq!((r.peak_reserved, r.peak_reserved_at, r.final_reserved), (mib(140), 7, mib(140)));
    }

    #[test]
    fn replay_stops_at_the_first_out_of_memory_and_empty_cache_events_release() {
        let mut ev = sixteens_then_thirty_twos();
        ev.insert(16, AllocEvent::EmptyCache); // after the frees: 128 → 0
        let r = replay_with(&ev, &AllocatorOptions::default(), true).expect("valid stream");
        assert_eq!(r.reserved_after.as_ref().map(|t| t[16]), Some(0));
        assert_eq!((r.final_reserved, r.peak_reserved, r.peak_reserved_at), (mib(128), mib(128), 7));
        // capacity 100 MiB: six 16 MiB segments make 96; the seventh (index 6) needs 112 > 100,
        // nothing is cached to release → out of memory, and the replay stops there.
        let opts = AllocatorOptions { capacity: Some(mib(100)), ..Default::default() };
        let r = replay_with(&sixteens_then_thirty_twos(), &opts, true).expect("valid stream");
        assert_eq!(r.oom, Some(6));
        assert_eq!(r.reserved_after.map(|t| t.len()), Some(7));
        assert_eq!(r.stats.num_ooms, 1);
    }

    #[test]
    fn replay_rejects_frees_of_unknown_ids_and_double_allocations() {
        let opts = AllocatorOptions::default();
        let ev = [AllocEvent::Alloc { id: 1, bytes: 10 }, AllocEvent::Free { id: 2 }];
        assert_eq!(replay(&ev, &opts), Err(ReplayError::UnknownId { index: 1, id: 2 }));
        let ev = [AllocEvent::Alloc { id: 1, bytes: 10 }, AllocEvent::Free { id: 1 }, AllocEvent::Free { id: 1 }];
        assert_eq!(replay(&ev, &opts), Err(ReplayError::UnknownId { index: 2, id: 1 }));
        let ev = [AllocEvent::Alloc { id: 1, bytes: 10 }, AllocEvent::Alloc { id: 1, bytes: 10 }];
        assert_eq!(replay(&ev, &opts), Err(ReplayError::DuplicateId { index: 1, id: 1 }));
        assert!(ReplayError::UnknownId { index: 1, id: 2 }.to_string().contains("id 2"));
    }

    // --- properties ------------------------------------------------------------------------------

    /// Sizes that exercise every rule: sub-512 B, small pool, 1–10 MiB (20 MiB segments), large,
    /// and sizes straddling 40 MiB (for max_split_size_mb:40).
    fn size_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![1u64..4096, 4096u64..=MIB, MIB + 1..mib(10), mib(10)..mib(90)]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
        EmptyCache,
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![5 => size_strategy().prop_map(Op::Alloc), 4 => any::<usize>().prop_map(Op::Free), 1 => Just(Op::EmptyCache)]
    }

    fn options_strategy() -> impl Strategy<Value = AllocatorOptions> {
        (any::<bool>(), any::<bool>(), any::<bool>(), proptest::option::of(mib(100)..mib(400))).prop_map(|(exp, split, round, capacity)| {
            AllocatorOptions {
                expandable_segments: exp,
                max_split_size: split.then_some(mib(40)),
                roundup_power2_divisions: if round { RoundupPower2Divisions::uniform(4) } else { RoundupPower2Divisions::NONE },
                capacity,
                ..Default::default()
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn allocated_is_the_live_blocks_and_never_exceeds_reserved_and_everything_comes_back(
            opts in options_strategy(),
            ops in proptest::collection::vec(op_strategy(), 1..120),
        ) {
            let mut a = CachingAllocator::new(opts.clone());
            let mut live: Vec<Handle> = vec![];
            for op in ops {
                match op {
                    Op::Alloc(bytes) => match a.malloc(bytes) {
                        Ok(h) => {
                            let block = a.block_size(h).expect("live");
                            prop_assert!(block >= round_size(bytes, &opts.roundup_power2_divisions));
                            live.push(h);
                        }
                        Err(AllocError::OutOfMemory { .. }) => prop_assert!(opts.capacity.is_some()),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Free(k) if !live.is_empty() => {
                        let h = live.swap_remove(k % live.len());
                        prop_assert_eq!(a.free(h), Ok(()));
                    }
                    Op::Free(_) => {}
                    Op::EmptyCache => a.empty_cache(),
                }
                a.check_invariants();
                let s = a.stats();
                prop_assert!(s.allocated <= s.reserved);
                let sum: u64 = live.iter().map(|&h| a.block_size(h).unwrap_or(0)).sum();
                prop_assert_eq!(s.allocated, sum);
                if let Some(cap) = opts.capacity {
                    prop_assert!(s.reserved <= cap);
                }
            }
            for h in live {
                prop_assert_eq!(a.free(h), Ok(()));
            }
            a.empty_cache();
            a.check_invariants();
            prop_assert_eq!(a.stats().reserved, 0);
            prop_assert_eq!(a.stats().inactive_split_bytes, 0);
        }

        #[test]
        fn the_free_set_answers_like_an_ordered_set(
            ops in proptest::collection::vec((any::<bool>(), 1u64..64, 0u64..8, 0u32..4), 1..200),
        ) {
            // Sizes from 1 MiB to 63 MiB cross several classes; few addresses make ties.
            let mut set = FreeSet::default();
            let mut model = BTreeSet::new();
            for (insert, size_mib, addr, idx) in ops {
                let k = (size_mib * MIB, addr * MIB, idx);
                if insert { set.insert(k); model.insert(k); } else { set.remove(k); model.remove(&k); }
                prop_assert_eq!(set.len(), model.len());
                prop_assert_eq!(set.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
                for probe in [k, (k.0, 0, 0), (k.0 + 1, 0, 0), (k.0 / 2, k.1, k.2)] {
                    prop_assert_eq!(set.lower_bound(probe), model.range(probe..).next().copied());
                    prop_assert_eq!(set.successor(probe), model.range((std::ops::Bound::Excluded(probe), std::ops::Bound::Unbounded)).next().copied());
                    prop_assert_eq!(set.predecessor(probe), model.range(..probe).next_back().copied());
                    prop_assert_eq!(set.contains(probe), model.contains(&probe));
                }
            }
        }

        #[test]
        fn replay_agrees_with_driving_the_allocator_by_hand(
            sizes in proptest::collection::vec(size_strategy(), 1..60),
            frees in proptest::collection::vec(any::<bool>(), 1..60),
        ) {
            // Allocate each size; after each, maybe free the oldest live one.
            let mut events = vec![];
            let mut live = std::collections::VecDeque::new();
            for (id, &bytes) in sizes.iter().enumerate() {
                events.push(AllocEvent::Alloc { id: id as u32, bytes });
                live.push_back(id as u32);
                if frees.get(id).copied().unwrap_or(false) {
                    if let Some(old) = live.pop_front() {
                        events.push(AllocEvent::Free { id: old });
                    }
                }
            }
            let opts = AllocatorOptions::default();
            let r = replay_with(&events, &opts, true).expect("valid stream");
            let mut a = CachingAllocator::new(opts);
            let mut handles = HashMap::new();
            let mut trace = vec![];
            for e in &events {
                match *e {
                    AllocEvent::Alloc { id, bytes } => { handles.insert(id, a.malloc(bytes).expect("no capacity")); }
                    AllocEvent::Free { id } => a.free(handles[&id]).expect("live"),
                    AllocEvent::EmptyCache => a.empty_cache(),
                }
                trace.push(a.stats().reserved);
            }
            prop_assert_eq!(r.reserved_after, Some(trace.clone()));
            prop_assert_eq!(r.peak_reserved, trace.iter().copied().max().unwrap_or(0));
            prop_assert_eq!(r.stats, a.stats());
        }
    }
}

//! What the training frameworks' own logs will print about memory, from the estimate's figures:
//! each line is the framework's format string filled with the counter it reads. A run's log is
//! then something to check the estimate against line by line ("what will the log say?").
//!
//! The counters are PyTorch's caching-allocator statistics (`torch.cuda.memory_stats()`):
//! - `allocated_bytes.all.peak` ([`Memory::allocated_peak`], `max_memory_allocated()`);
//! - `reserved_bytes.all.peak` ([`Memory::step_reserved_peak`] after a reset of the peaks,
//!   [`Memory::reserved_peak`] over the whole run, loading included);
//! - `active_bytes.all.peak`: the allocated blocks plus those freed but still waiting on another
//!   stream's use; one stream, as the step program runs, has none waiting, so it equals the
//!   allocated peak (both count each block at its rounded size).
//!
//! Which of them a line reads, and since when (a reset of the peak statistics, or the start of the
//! process: what the loading adds), is each framework's choice, cited per function. Lines that
//! need the allocator's replay are left out where it did not run (`frag_pct` set).

use super::config::Config;
use super::estimate::{Estimate, Memory};
use super::gpu::{GIB, MIB};
use serde::Serialize;

/// Bytes of a decimal gigabyte, as litgpt prints `max_memory_allocated() / 1e9`.
const GB: f64 = 1e9;

/// One line a framework logs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogLine {
    /// Who prints it: `torchtitan`, `torchtune`, `Megatron-LM`, `litgpt`, `PyTorch`.
    pub framework: &'static str,
    /// The line, as the framework formats it.
    pub line: String,
    /// Which counter over which span, in words.
    pub reads: &'static str,
    /// The format string's source (file and function, version).
    pub source: &'static str,
}

/// GiB with two decimals, as `f"{x:.2f}"` of `bytes / 1024**3`.
fn gib(bytes: u128) -> f64 {
    bytes as f64 / GIB as f64
}

/// The largest `max_memory_allocated()` of the run: the step's or the loading's.
fn run_allocated_peak(m: &Memory) -> u128 {
    m.allocated_peak.max(m.load_allocated_peak)
}

/// torchtitan 0.2.2 `components/metrics.py` `MetricsProcessor.log`:
/// `f"memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)"`, where
/// `DeviceMemoryMonitor.get_peak_stats` reads `reserved_bytes.all.peak` and divides by
/// `get_device_properties().total_memory`; the peaks are reset after every log, so from the second
/// log on it is the steady step's reserved peak (what loading left reserved included).
/// `total` is the card's memory as torch reads it ([`super::serve::torch_total_bytes`]).
pub fn torchtitan(m: &Memory, total: u128) -> Option<LogLine> {
    let reserved = m.step_reserved_peak?;
    let pct = if total == 0 { 0.0 } else { 100.0 * reserved as f64 / total as f64 };
    Some(LogLine {
        framework: "torchtitan",
        line: format!("memory: {:5.2}GiB({pct:.2}%)", gib(reserved)),
        reads: "reserved_bytes.all.peak since the last log, ÷ total_memory",
        source: "torchtitan 0.2.2 components/metrics.py MetricsProcessor.log, DeviceMemoryMonitor.get_peak_stats",
    })
}

/// torchtune 0.6.1 `training/memory.py` `get_memory_stats` (logged each step with
/// `log_peak_memory_stats: True`, the peaks reset after each read): `peak_memory_active`,
/// `peak_memory_alloc` (`max_memory_allocated()`), `peak_memory_reserved`
/// (`max_memory_reserved()`), each `/ 1024**3`.
pub fn torchtune(m: &Memory) -> Option<LogLine> {
    let reserved = m.step_reserved_peak?;
    let alloc = gib(m.allocated_peak);
    Some(LogLine {
        framework: "torchtune",
        line: format!("peak_memory_active:{alloc:.2} peak_memory_alloc:{alloc:.2} peak_memory_reserved:{:.2}", gib(reserved)),
        reads: "active, allocated and reserved peaks of the step (GiB)",
        source: "torchtune 0.6.1 training/memory.py get_memory_stats (log_peak_memory_stats: True)",
    })
}

/// Megatron-LM `megatron/training/training.py` `report_memory` (after the first logging
/// interval): `memory (MB) | … | max allocated: {max_memory_allocated() / 2**20} | … | max
/// reserved: {max_memory_reserved() / 2**20}`; the peaks are never reset, so they span the run,
/// loading included.
pub fn megatron(m: &Memory) -> Option<LogLine> {
    let reserved = m.reserved_peak?;
    let mb = |b: u128| py_float(b as f64 / MIB as f64);
    Some(LogLine {
        framework: "Megatron-LM",
        line: format!(
            "memory (MB) | allocated: … | max allocated: {} | reserved: … | max reserved: {}",
            mb(run_allocated_peak(m)),
            mb(reserved)
        ),
        reads: "allocated and reserved peaks since the process started, MiB",
        source: "Megatron-LM megatron/training/training.py report_memory",
    })
}

/// A float as Python's `str()` writes it (`20480.0`, `20480.5`): the shortest repr, with `.0`
/// on whole numbers.
fn py_float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// litgpt 0.5.13 `finetune/full.py` `fit` (at the end of training):
/// `f"Memory used: {torch.cuda.max_memory_allocated() / 1e9:.02f} GB"` — decimal GB, never
/// reset.
pub fn litgpt(m: &Memory) -> LogLine {
    LogLine {
        framework: "litgpt",
        line: format!("Memory used: {:.2} GB", run_allocated_peak(m) as f64 / GB),
        reads: "max_memory_allocated() over the run, 10⁹ bytes",
        source: "litgpt 0.5.13 finetune/full.py fit",
    }
}

/// Plain PyTorch after a step, with the peaks reset before it:
/// `torch.cuda.max_memory_allocated()` and `torch.cuda.max_memory_reserved()` in bytes.
pub fn pytorch(m: &Memory) -> Option<LogLine> {
    let reserved = m.step_reserved_peak?;
    Some(LogLine {
        framework: "PyTorch",
        line: format!("max_memory_allocated() = {}  max_memory_reserved() = {}", m.allocated_peak, reserved),
        reads: "the step's allocated and reserved peaks, bytes",
        source: "torch.cuda.max_memory_allocated / max_memory_reserved",
    })
}

/// Every framework's line for `e` of `cfg` (those that need the allocator's replay only where
/// it ran).
pub fn log_lines(cfg: &Config, e: &Estimate) -> Vec<LogLine> {
    let m = &e.memory;
    let total = super::serve::torch_total_bytes(cfg);
    [torchtitan(m, total), torchtune(m), megatron(m), Some(litgpt(m)), pytorch(m)].into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(allocated: u128, step_reserved: u128, run_reserved: u128, load_allocated: u128) -> Memory {
        Memory {
            parameters: 0,
            gradients: 0,
            optimizer_states: 0,
            activations: 0,
            transient: 0,
            framework_overhead: 0,
            total: 0,
            peak: allocated,
            host: 0,
            peak_event: String::new(),
            peak_op: String::new(),
            allocated_peak: allocated,
            reserved_peak: Some(run_reserved),
            nvidia_smi: None,
            step_reserved_peak: Some(step_reserved),
            load_peak: 0,
            load_allocated_peak: load_allocated,
            load_reserved_peak: None,
            paged_evicted: 0,
        }
    }

    #[test]
    fn torchtitan_prints_the_steps_reserved_peak_in_gib_and_as_a_share_of_total_memory() {
        // 40 GiB reserved on a card torch sees as 80 GiB: "memory: 40.00GiB(50.00%)".
        let m = memory(30 * GIB, 40 * GIB, 41 * GIB, 0);
        assert_eq!(torchtitan(&m, 80 * GIB).expect("replayed").line, "memory: 40.00GiB(50.00%)");
        // Below 10 GiB the width 5 pads: " 7.50GiB".
        let m = memory(GIB, 15 * GIB / 2, 8 * GIB, 0);
        assert_eq!(torchtitan(&m, 80 * GIB).expect("replayed").line, "memory:  7.50GiB(9.38%)");
    }

    #[test]
    fn megatron_and_litgpt_count_the_loading_their_peaks_were_never_reset_for() {
        // The loading allocated 20 GiB once, the step peaks at 12 GiB: both report the 20.
        let m = memory(12 * GIB, 14 * GIB, 22 * GIB, 20 * GIB);
        assert_eq!(
            megatron(&m).expect("replayed").line,
            "memory (MB) | allocated: … | max allocated: 20480.0 | reserved: … | max reserved: 22528.0"
        );
        assert_eq!(py_float(20480.5), "20480.5");
        // 20 GiB = 21.47 GB.
        assert_eq!(litgpt(&m).line, "Memory used: 21.47 GB");
        // torchtune reset its peaks after init: the step's 12 and 14 GiB.
        assert_eq!(torchtune(&m).expect("replayed").line, "peak_memory_active:12.00 peak_memory_alloc:12.00 peak_memory_reserved:14.00");
    }

    #[test]
    fn lines_that_read_the_reserve_are_left_out_where_the_allocator_was_not_replayed() {
        let m = Memory { step_reserved_peak: None, reserved_peak: None, ..memory(GIB, 0, 0, 0) };
        assert!(torchtitan(&m, 80 * GIB).is_none() && torchtune(&m).is_none() && megatron(&m).is_none() && pytorch(&m).is_none());
        assert_eq!(litgpt(&m).line, "Memory used: 1.07 GB");
    }
}

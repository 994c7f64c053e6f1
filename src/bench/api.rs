//! The benchmark module's API, as the app sees it: what it asks ([`SweepOptions`], as JSON)
//! and what the module reports back ([`Event`], as JSON), one event per callback.
//!
//! The benchmark runs in its own wasm module (wgpu and the kernels, no Leptos, no estimator),
//! loaded only when the benchmark is opened. The module exports four functions:
//!
//! | export                 | does                                                              |
//! |------------------------|-------------------------------------------------------------------|
//! | `open(on_event)`       | keeps the callback; opens the adapter → [`Event::Ready`] or [`Event::Unavailable`] |
//! | `start(options_json)`  | runs a sweep → [`Event::Progress`]…, then [`Event::Finished`] or [`Event::Failed`] |
//! | `cancel()`             | stops the sweep between two points (it still finishes with what it measured) |
//! | `verify()`             | checks both kernels against the CPU reference → [`Event::Verified`] |
//!
//! `on_event` receives each event as a JSON string (`serde_json` on both sides; the enum is
//! externally tagged: `{"progress":{"done":3,"planned":9}}`). A finished sweep travels as its
//! share-link text ([`super::encode_compact`]) and its CSV, which is all the app shows.

use super::info::AdapterSummary;
use super::results::{StopReason, SweepResult};
use serde::{Deserialize, Serialize};

/// What the app shows of the adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adapter {
    /// May be empty: browsers can hide the adapter's name.
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    /// Runs are timed with GPU timestamps (else the wall clock).
    pub timestamps: bool,
    /// f16 runs are available.
    pub f16: bool,
}

impl From<&AdapterSummary> for Adapter {
    fn from(a: &AdapterSummary) -> Adapter {
        Adapter {
            name: a.name.clone(),
            backend: a.backend.clone(),
            device_type: a.device_type.clone(),
            max_buffer_size: a.limits.max_buffer_size,
            max_storage_buffer_binding_size: a.limits.max_storage_buffer_binding_size,
            timestamps: a.timestamps,
            f16: a.f16,
        }
    }
}

/// A finished (or stopped) sweep, as the app shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// The share-link text of the result (`?bench=`): adapter, shape and every point.
    pub shared: String,
    /// The full per-point table.
    pub csv: String,
    /// The largest seq the materialized path ran at.
    pub largest_materialized_seq: Option<u32>,
    /// The largest seq whose score matrix this device's limits allow for this shape.
    pub materializable_seq_limit: u32,
    /// The best fraction of the copy bandwidth the materialized path reached.
    pub best_fraction_of_copy: Option<f64>,
    /// Why the sweep stopped.
    pub stop: StopReason,
}

impl From<&SweepResult> for Finished {
    fn from(r: &SweepResult) -> Finished {
        let fractions = r.points.iter().filter_map(|p| p.materialized.as_ref().and_then(|m| m.fraction_of_copy));
        Finished {
            shared: super::compact::encode_compact(r),
            csv: r.to_csv(),
            largest_materialized_seq: r.largest_materialized_seq,
            materializable_seq_limit: r.materializable_seq_limit,
            best_fraction_of_copy: fractions.reduce(f64::max),
            stop: r.stop,
        }
    }
}

/// What the benchmark module reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The adapter is open and the kernels are compiled.
    Ready(Adapter),
    /// No WebGPU in this browser, or no adapter: why, and what to enable.
    Unavailable(String),
    /// `done` of `planned` points measured.
    Progress { done: u32, planned: u32 },
    /// The sweep ended (at its end, its budget, a limit, or cancelled).
    Finished(Finished),
    /// The kernels against the CPU reference: whether both match, and a line per case.
    Verified { passed: bool, report: String },
    /// The sweep or the check failed (device lost, out of memory, invalid options…).
    Failed(String),
}

impl Event {
    /// The event as the JSON the module sends.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"failed\":\"{e}\"}}"))
    }

    /// Reads an event the module sent.
    pub fn from_json(json: &str) -> Result<Event, String> {
        serde_json::from_str(json).map_err(|e| format!("the benchmark module sent an unreadable event: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_round_trips_through_json() {
        let adapter = Adapter {
            name: "SwiftShader".into(),
            backend: "webgpu".into(),
            device_type: "cpu".into(),
            max_buffer_size: 1 << 28,
            max_storage_buffer_binding_size: 1 << 27,
            timestamps: false,
            f16: true,
        };
        let finished = Finished {
            shared: "1.x.y.w.f32.1.1.1g..".into(),
            csv: "seq\n".into(),
            largest_materialized_seq: Some(1024),
            materializable_seq_limit: 8192,
            best_fraction_of_copy: None,
            stop: StopReason::Cancelled,
        };
        for e in [
            Event::Ready(adapter),
            Event::Unavailable("no webgpu".into()),
            Event::Progress { done: 3, planned: 9 },
            Event::Finished(finished),
            Event::Verified { passed: true, report: "ok".into() },
            Event::Failed("device lost".into()),
        ] {
            assert_eq!(Event::from_json(&e.to_json()), Ok(e));
        }
        assert_eq!(Event::Progress { done: 3, planned: 9 }.to_json(), r#"{"progress":{"done":3,"planned":9}}"#);
        assert!(Event::from_json("{\"nonsense\":1}").is_err());
    }
}

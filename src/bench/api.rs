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
use serde_json::Value;

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

    /// Reads an event the module sent, through `serde_json::Value` (what the app uses: it
    /// links `Value` anyway, for config.json imports, where the derived reader of
    /// [`Event::from_json`] would add its own code). The tests check both read every event
    /// alike.
    pub fn read(json: &str) -> Result<Event, String> {
        let bad = || format!("the benchmark module sent an unreadable event: {}", json.chars().take(80).collect::<String>());
        let v: Value = serde_json::from_str(json).map_err(|_| bad())?;
        let (tag, body) = v.as_object().and_then(|o| o.iter().next()).ok_or_else(bad)?;
        let text = |v: &Value| v.as_str().map(str::to_string);
        let num = |o: &Value, k: &str| o.get(k).and_then(Value::as_u64);
        let flag = |o: &Value, k: &str| o.get(k).and_then(Value::as_bool);
        let event = match tag.as_str() {
            "ready" => Some(Event::Ready(Adapter {
                name: text(&body["name"]).unwrap_or_default(),
                backend: text(&body["backend"]).unwrap_or_default(),
                device_type: text(&body["device_type"]).unwrap_or_default(),
                max_buffer_size: num(body, "max_buffer_size").unwrap_or(0),
                max_storage_buffer_binding_size: num(body, "max_storage_buffer_binding_size").unwrap_or(0),
                timestamps: flag(body, "timestamps").unwrap_or(false),
                f16: flag(body, "f16").unwrap_or(false),
            })),
            "unavailable" => text(body).map(Event::Unavailable),
            "failed" => text(body).map(Event::Failed),
            "progress" => {
                Some(Event::Progress { done: num(body, "done").unwrap_or(0) as u32, planned: num(body, "planned").unwrap_or(0) as u32 })
            }
            "verified" => {
                Some(Event::Verified { passed: flag(body, "passed").unwrap_or(false), report: text(&body["report"]).unwrap_or_default() })
            }
            "finished" => Some(Event::Finished(Finished {
                shared: text(&body["shared"]).unwrap_or_default(),
                csv: text(&body["csv"]).unwrap_or_default(),
                largest_materialized_seq: num(body, "largest_materialized_seq").map(|v| v as u32),
                materializable_seq_limit: num(body, "materializable_seq_limit").unwrap_or(0) as u32,
                best_fraction_of_copy: body.get("best_fraction_of_copy").and_then(Value::as_f64),
                stop: body.get("stop").and_then(Value::as_str).and_then(StopReason::parse).unwrap_or(StopReason::MaxSeq),
            })),
            _ => None,
        };
        event.ok_or_else(bad)
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
            best_fraction_of_copy: Some(0.25),
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
            assert_eq!(Event::from_json(&e.to_json()).as_ref(), Ok(&e));
            assert_eq!(Event::read(&e.to_json()), Ok(e));
        }
        assert_eq!(Event::Progress { done: 3, planned: 9 }.to_json(), r#"{"progress":{"done":3,"planned":9}}"#);
        assert!(Event::from_json("{\"nonsense\":1}").is_err());
        assert!(Event::read("{\"nonsense\":1}").is_err());
        assert!(Event::read("[]").is_err());
    }
}

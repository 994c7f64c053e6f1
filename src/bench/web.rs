//! The benchmark module's side of [`super::api`]: the adapter, the running sweep and the
//! app's callback, kept for the module's life. `src/bin/trainmem-bench.rs` exports these
//! functions to JavaScript; the app loads that module only when the benchmark is opened.

use super::api::{Adapter, Event, Finished};
use super::gpu::{Bench, BenchOptions};
use super::plan::{SweepOptions, SweepProgress};
use super::verify::verify as verify_kernels;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::JsValue;

/// What to tell a visitor whose browser has no WebGPU.
pub const NO_WEBGPU: &str = "WebGPU is not available in this browser, so the benchmark cannot run here. \
It is on by default in Chrome and Edge 113+ on Windows, macOS and ChromeOS with a supported GPU; on Linux enable \
chrome://flags/#enable-unsafe-webgpu (or start Chromium with --enable-unsafe-webgpu); in Firefox enable dom.webgpu.enabled; \
Safari 26+ has it. Shared results (links with bench=) still display.";

#[derive(Default)]
struct State {
    on_event: Option<js_sys::Function>,
    bench: Option<Rc<Bench>>,
    cancel: Rc<Cell<bool>>,
    busy: bool,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn emit(event: &Event) {
    let f = STATE.with(|s| s.borrow().on_event.clone());
    if let Some(f) = f {
        let _ = f.call1(&JsValue::NULL, &JsValue::from_str(&event.to_json()));
    }
}

fn bench() -> Option<Rc<Bench>> {
    STATE.with(|s| s.borrow().bench.clone())
}

/// Claims the GPU for one task; `None` if another is running or no adapter is open.
fn claim() -> Option<Rc<Bench>> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.busy {
            return None;
        }
        let b = s.bench.clone()?;
        s.busy = true;
        Some(b)
    })
}

fn release() {
    STATE.with(|s| s.borrow_mut().busy = false);
}

/// Whether the browser exposes WebGPU at all.
fn has_webgpu() -> bool {
    web_sys::window().is_some_and(|w| js_sys::Reflect::has(&w.navigator(), &"gpu".into()).unwrap_or(false))
}

/// Keeps `on_event` and opens the adapter: [`Event::Ready`] or [`Event::Unavailable`].
pub fn open(on_event: js_sys::Function) {
    STATE.with(|s| s.borrow_mut().on_event = Some(on_event));
    if let Some(b) = bench() {
        emit(&Event::Ready(Adapter::from(b.info())));
        return;
    }
    if !has_webgpu() {
        emit(&Event::Unavailable(NO_WEBGPU.to_string()));
        return;
    }
    wasm_bindgen_futures::spawn_local(async {
        match Bench::new(BenchOptions::default()).await {
            Ok(b) => {
                let adapter = Adapter::from(b.info());
                STATE.with(|s| s.borrow_mut().bench = Some(Rc::new(b)));
                emit(&Event::Ready(adapter));
            }
            Err(e) => emit(&Event::Unavailable(format!("{e}. {NO_WEBGPU}"))),
        }
    });
}

/// Runs a sweep with the options in `options_json` ([`SweepOptions`]; missing fields take
/// their defaults): progress, then the result.
pub fn start(options_json: &str) {
    let opts: SweepOptions = match serde_json::from_str(options_json) {
        Ok(o) => o,
        Err(e) => return emit(&Event::Failed(format!("invalid benchmark options: {e}"))),
    };
    let Some(b) = claim() else {
        return emit(&Event::Failed("the benchmark is busy or has no gpu".into()));
    };
    let cancel = STATE.with(|s| {
        let c = s.borrow().cancel.clone();
        c.set(false);
        c
    });
    wasm_bindgen_futures::spawn_local(async move {
        let mut progress = |p: SweepProgress| emit(&Event::Progress { done: p.done, planned: p.planned });
        let event = match b.sweep(&opts, &mut progress, &*cancel).await {
            Ok(r) => Event::Finished(Finished::from(&r)),
            Err(e) => Event::Failed(format!("the benchmark stopped: {e}")),
        };
        release();
        emit(&event);
    });
}

/// Stops the running sweep between two points.
pub fn cancel() {
    STATE.with(|s| s.borrow().cancel.set(true));
}

/// Checks both kernels against the CPU reference.
pub fn verify() {
    let Some(b) = claim() else {
        return emit(&Event::Failed("the benchmark is busy or has no gpu".into()));
    };
    wasm_bindgen_futures::spawn_local(async move {
        let event = match verify_kernels(&b).await {
            Ok(r) => {
                let lines: Vec<String> = r
                    .cases
                    .iter()
                    .map(|c| {
                        format!(
                            "{} {}: scores {:.1e}, materialized {:.1e}, fused {:.1e} (tolerance {:.0e}) {}",
                            c.shape,
                            c.dtype.name(),
                            c.scores_max_abs_err,
                            c.materialized_max_abs_err,
                            c.fused_max_abs_err,
                            c.tolerance,
                            if c.passed { "✓" } else { "✗" }
                        )
                    })
                    .collect();
                Event::Verified { passed: r.passed, report: lines.join("\n") }
            }
            Err(e) => Event::Failed(e.to_string()),
        };
        release();
        emit(&event);
    });
}

//! The app's side of the benchmark module's API ([`crate::bench::api`]): loads the module when
//! the benchmark is opened and turns its JSON events into typed [`Event`]s.

use super::dom;
use crate::bench::api::Event;
use crate::bench::SweepOptions;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};

/// The loaded benchmark module.
#[derive(Clone)]
pub struct BenchModule {
    exports: JsValue,
}

impl BenchModule {
    /// Loads the module (its content-hashed files, fetched only now) and opens the adapter;
    /// every event it reports from then on goes to `on_event`.
    pub async fn load(on_event: impl Fn(Event) + 'static) -> Result<BenchModule, String> {
        let exports = dom::load_module("bench").await?;
        let module = BenchModule { exports };
        let callback = Closure::<dyn Fn(String)>::new(move |json: String| {
            on_event(Event::read(&json).unwrap_or_else(Event::Failed));
        });
        module.call("open", &[callback.as_ref().clone()])?;
        // The module keeps the callback for the page's life.
        callback.forget();
        Ok(module)
    }

    fn call(&self, name: &str, args: &[JsValue]) -> Result<(), String> {
        let f = js_sys::Reflect::get(&self.exports, &name.into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
            .ok_or_else(|| format!("the benchmark module has no `{name}`"))?;
        let this = JsValue::NULL;
        match args {
            [] => f.call0(&this),
            [a] => f.call1(&this, a),
            _ => return Err("too many arguments".into()),
        }
        .map(|_| ())
        .map_err(|e| e.as_string().unwrap_or_else(|| format!("the benchmark module's `{name}` failed")))
    }

    /// Starts a sweep.
    pub fn start(&self, options: &SweepOptions) -> Result<(), String> {
        let json = serde_json::to_string(options).map_err(|e| e.to_string())?;
        self.call("start", &[JsValue::from_str(&json)])
    }

    /// Stops the running sweep between two points.
    pub fn cancel(&self) -> Result<(), String> {
        self.call("cancel", &[])
    }

    /// Checks both kernels against the CPU reference.
    pub fn verify(&self) -> Result<(), String> {
        self.call("verify", &[])
    }
}

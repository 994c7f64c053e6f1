//! The benchmark's place in the app: a button that loads the benchmark module (its own wasm,
//! fetched only now) and hands it a container to mount into.

use super::dom;
use leptos::prelude::*;

/// Where scripts/build-modules.sh puts the module, relative to the page.
const BENCH_JS: &str = "./bench/trainmem-bench.js";
const BENCH_WASM: &str = "./bench/trainmem-bench_bg.wasm";

/// Loads the benchmark module into `#bench-root`.
async fn load() -> Result<(), String> {
    dom::load_module(BENCH_JS, BENCH_WASM).await
}

/// The benchmark section. `autostart` loads the module at once (a `bench=` link, `view=bench`).
#[component]
pub fn BenchPanel(#[prop(optional)] autostart: bool) -> impl IntoView {
    let state = RwSignal::new(0u8); // 0 idle, 1 loading, 2 loaded, 3 failed
    let error = RwSignal::new(String::new());
    let start = move || {
        if state.get_untracked() != 0 {
            return;
        }
        state.set(1);
        leptos::task::spawn_local(async move {
            match load().await {
                Ok(()) => state.set(2),
                Err(e) => {
                    error.set(e);
                    state.set(3);
                }
            }
        });
    };
    if autostart {
        request_animation_frame(start);
    }
    view! {
        <section class="bench" aria-labelledby="bench-h" data-testid="bench-panel">
            <h2 id="bench-h">"Attention on your own GPU (WebGPU benchmark)"</h2>
            <p class="hint">"Times eager-style attention, which writes the whole b·a·s² score matrix to memory, against a fused FlashAttention-style kernel that never stores it, over growing sequence lengths — so you can watch the quadratic term the ledger predicts. The benchmark is loaded only when you open it."</p>
            <Show when=move || state.get() == 0>
                <button type="button" class="primary" data-testid="bench-open" on:click=move |_| start()>"Open the benchmark"</button>
            </Show>
            <Show when=move || state.get() == 1><p role="status">"Loading the benchmark…"</p></Show>
            <Show when=move || state.get() == 3><p class="notice" role="alert">{move || format!("The benchmark module could not be loaded: {}", error.get())}</p></Show>
            <div id="bench-root"></div>
        </section>
    }
}

//! A millisecond clock on both targets: `Instant` natively, `performance.now()` in the browser
//! (`Date.now()` where there is no window, e.g. in a worker).

/// Milliseconds since an arbitrary, fixed origin.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// Milliseconds since an arbitrary, fixed origin.
#[cfg(target_arch = "wasm32")]
pub(crate) fn now_ms() -> f64 {
    web_sys::window().and_then(|w| w.performance()).map(|p| p.now()).unwrap_or_else(js_sys::Date::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_never_runs_backwards() {
        let a = now_ms();
        let b = now_ms();
        assert!(b >= a);
    }
}

//! The serving answers as the CLI prints them: a JSON document (`--json`) and a table.

use super::analyse::Serve;
use serde::Serialize;

/// The `--json` document: the configuration's query and every per-GPU figure and budget row.
#[derive(Serialize)]
struct Doc<'a> {
    /// The configuration as a share-URL query.
    query: &'a str,
    #[serde(flatten)]
    per_gpu: &'a Serve,
}

/// `trainmem serve --json`.
pub fn to_json(s: &Serve, query: &str) -> String {
    serde_json::to_string_pretty(&Doc { query, per_gpu: s }).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

/// `trainmem serve`'s table.
pub fn render_text(s: &Serve, query: &str) -> String {
    let mut t = format!("{} on {} with {} — per GPU (?{query})\n", s.model, s.gpu, s.engine);
    let line = |t: &mut String, k: &str, v: String| t.push_str(&format!("  {k:<34} {v}\n"));
    line(&mut t, "weights", gib(s.weights as f64));
    line(&mut t, "KV per token (full attention)", format!("{} B ({})", s.kv_per_token, s.kv_dtype));
    line(&mut t, &format!("KV of one {}-token sequence", s.context), gib(s.kv_bytes as f64));
    if let Some(d) = s.state_dtype {
        line(&mut t, "of which fixed-size states", format!("{} (recurrent state {d})", gib(s.state_bytes as f64)));
    }
    line(&mut t, "KV cache", format!("{} = {} tokens", gib(s.kv_cache_bytes as f64), s.kv_cache_tokens));
    line(&mut t, "KV blocks", format!("{} of {} tokens", s.kv_blocks, s.block_size));
    line(&mut t, &format!("max concurrency at {} tokens", s.context), format!("{:.2}x", s.max_concurrency));
    line(&mut t, &format!("max context at {} sequences", s.concurrency), format!("{} tokens", s.max_context));
    line(&mut t, "activation peak (estimate)", format!("{} at {} tokens", gib(s.activation_peak as f64), s.max_num_batched_tokens));
    line(&mut t, "on the card (nvidia-smi)", gib(s.process_bytes as f64));
    t.push_str("\nbudget:\n");
    for r in &s.rows {
        t.push_str(&format!(
            "  {:<52} {:>12}\n      {} ⇒ {}\n      source: {}\n",
            r.label,
            gib(r.bytes as f64),
            r.formula,
            r.substituted,
            r.source
        ));
    }
    if !s.fixes.is_empty() {
        t.push_str(&format!("\n{} sequences of {} tokens do not fit; single changes that make them fit:\n", s.concurrency, s.context));
        for f in &s.fixes {
            let set: Vec<String> = f.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            t.push_str(&format!("  {} ({}): {:.2}x\n", f.change, set.join("&"), f.max_concurrency));
        }
    }
    for n in &s.notes {
        t.push_str(&format!("note: {n}\n"));
    }
    t
}

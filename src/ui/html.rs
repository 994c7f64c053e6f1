//! Read-only read-outs written as HTML text: the verdict's figures, the textbook table and the
//! benchmark's results are rebuilt whole on each change, so the page sets them as one string
//! (`inner_html`) instead of a tree of reactive nodes (which costs several kilobytes of wasm per
//! panel). Every piece of text goes through [`esc`].

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `<div><dt>…</dt><dd data-testid=… data-bytes=…>…</dd></div>`: one figure of a `<dl class="stats">`.
/// `attrs` are written as they are (their values must already be safe).
pub fn stat(out: &mut String, dt: &str, attrs: &str, dd: &str) {
    out.push_str("<div><dt>");
    out.push_str(&esc(dt));
    out.push_str("</dt><dd ");
    out.push_str(attrs);
    out.push('>');
    out.push_str(dd);
    out.push_str("</dd></div>");
}

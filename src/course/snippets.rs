//! Embed snippets for the places courses live. Each host keeps different things: Canvas LMS strips
//! `<script>` and keeps only `src width height name align frameborder scrolling sandbox
//! allowfullscreen` on an iframe (instructure/canvas-lms, `canvas_sanitize.rb`); MyST's `{iframe}`
//! directive takes a width and a placeholder image but no height; Jupyter has `IFrame(src, width,
//! height)`; reveal.js lazy-loads `data-src` and unloads hidden slides' frames (so the state must
//! live in the URL — it does); Quarto has no iframe shortcode (raw HTML); MkDocs Material's instant
//! navigation needs `document$.subscribe` to rebind a script. The frame reads well without any
//! host script: a sensible default height, internal scrolling and an "open full page" link.

/// Where the snippet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// A bare iframe in the attribute subset Canvas and Moodle keep.
    Lms,
    /// An iframe plus the resize listener (any page that allows a script).
    Script,
    /// MyST Markdown (Jupyter Book 2, mystmd).
    Myst,
    /// A Jupyter notebook cell.
    Jupyter,
    /// A reveal.js slide.
    Reveal,
    /// Quarto (raw HTML block).
    Quarto,
    /// MkDocs with the Material theme.
    Mkdocs,
}

impl Host {
    pub const ALL: [Host; 7] = [Host::Lms, Host::Script, Host::Myst, Host::Jupyter, Host::Reveal, Host::Quarto, Host::Mkdocs];
    pub fn label(self) -> &'static str {
        match self {
            Host::Lms => "Canvas / Moodle (iframe only)",
            Host::Script => "Web page (iframe + resize script)",
            Host::Myst => "MyST / Jupyter Book",
            Host::Jupyter => "Jupyter notebook",
            Host::Reveal => "reveal.js slide",
            Host::Quarto => "Quarto",
            Host::Mkdocs => "MkDocs Material",
        }
    }
    pub fn id(self) -> &'static str {
        match self {
            Host::Lms => "lms",
            Host::Script => "script",
            Host::Myst => "myst",
            Host::Jupyter => "jupyter",
            Host::Reveal => "reveal",
            Host::Quarto => "quarto",
            Host::Mkdocs => "mkdocs",
        }
    }
    /// A note shown under the snippet.
    pub fn note(self) -> &'static str {
        match self {
            Host::Lms => "Canvas and Moodle remove scripts, title and loading; the frame still reads well: it scrolls inside and links to the full page.",
            Host::Script => "The script resizes the frame to its content (both ways) from trainmem's versioned resize messages.",
            Host::Myst => "MyST's iframe takes no height; the placeholder image shows until the reader clicks.",
            Host::Jupyter => "Run the cell; the whole configuration is in the URL.",
            Host::Reveal => "reveal.js loads data-src frames when the slide shows and unloads them after, so the configuration lives in the URL, never in the frame.",
            Host::Quarto => "Quarto has no iframe shortcode: a raw HTML block.",
            Host::Mkdocs => "Material's instant navigation swaps pages without reloading: the listener is bound once through document$.",
        }
    }
}

/// What every snippet needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Embed<'a> {
    /// The frame's URL (with `embed=1` and the configuration).
    pub url: &'a str,
    /// The accessible name of the frame.
    pub title: &'a str,
    /// Height in CSS pixels before any resize.
    pub height: u32,
    /// An image shown in MyST before the frame loads (e.g. a PNG snapshot).
    pub placeholder: Option<&'a str>,
}

/// The default height: the verdict, the bar and a few ledger rows without scrolling.
pub const DEFAULT_HEIGHT: u32 = 480;

fn attr(s: &str) -> String {
    crate::estimator::expr::escape(s)
}

/// The resize listener the `Script` and `Mkdocs` snippets install: it resizes the frame that sent
/// a `{source: "trainmem", version: 1, type: "resize", height}` message (docs/embed.md).
pub const RESIZE_SCRIPT: &str = r#"<script>
addEventListener("message", (e) => {
  const m = e.data;
  if (!m || m.source !== "trainmem" || m.version !== 1 || m.type !== "resize") return;
  for (const f of document.querySelectorAll("iframe")) {
    if (f.contentWindow === e.source) f.style.height = Math.ceil(m.height) + "px";
  }
});
</script>"#;

fn iframe(e: &Embed, extra: &str) -> String {
    format!(
        r#"<iframe src="{}" title="{}" width="100%" height="{}" loading="lazy" frameborder="0" scrolling="auto" allowfullscreen{extra}></iframe>"#,
        attr(e.url),
        attr(e.title),
        e.height
    )
}

/// The snippet for `host`.
pub fn snippet(host: Host, e: &Embed) -> String {
    match host {
        Host::Lms => iframe(e, ""),
        Host::Script => format!("{}\n{RESIZE_SCRIPT}", iframe(e, r#" style="border:0""#)),
        Host::Myst => {
            let placeholder = e.placeholder.map(|p| format!(":placeholder: {p}\n")).unwrap_or_default();
            format!("```{{iframe}} {}\n:width: 100%\n{placeholder}:label: trainmem\n{}\n```", e.url, e.title)
        }
        Host::Jupyter => format!(
            "from IPython.display import IFrame\nIFrame({}, width=\"100%\", height={})",
            serde_json::Value::String(e.url.to_string()),
            e.height
        ),
        Host::Reveal => format!(
            r#"<section>
  <!-- reveal.js loads data-src when the slide shows; the configuration lives in the URL. -->
  <iframe data-src="{}" title="{}" width="100%" height="{}" frameborder="0" data-preload></iframe>
</section>"#,
            attr(e.url),
            attr(e.title),
            e.height
        ),
        Host::Quarto => format!("```{{=html}}\n{}\n```", iframe(e, "")),
        Host::Mkdocs => format!(
            "{}\n<script>\ndocument$.subscribe(() => {{\n  if (window.trainmemResize) return;\n  window.trainmemResize = true;\n{}\n}});\n</script>",
            iframe(e, r#" style="border:0""#),
            RESIZE_SCRIPT.trim_start_matches("<script>\n").trim_end_matches("\n</script>")
        ),
    }
}

/// The attributes Canvas LMS keeps on an iframe (`canvas_sanitize.rb`).
pub const CANVAS_IFRAME_ATTRIBUTES: &[&str] =
    &["src", "width", "height", "name", "align", "frameborder", "scrolling", "sandbox", "allowfullscreen"];

#[cfg(test)]
mod tests {
    use super::*;

    fn e() -> Embed<'static> {
        Embed {
            url: "https://example.org/trainmem/?model=gpt2&embed=1&hide=inputs",
            title: "trainmem: GPT-2 memory",
            height: 480,
            placeholder: Some("gpt2.png"),
        }
    }

    /// Attribute names of the first `<iframe …>` tag.
    fn attributes(html: &str) -> Vec<String> {
        let start = html.find("<iframe").expect("an iframe");
        let tag = &html[start + 7..start + html[start..].find('>').expect("closed")];
        let mut out = Vec::new();
        let mut rest = tag.trim();
        while !rest.is_empty() {
            let name_end = rest.find(|c: char| c == '=' || c.is_whitespace()).unwrap_or(rest.len());
            out.push(rest[..name_end].to_string());
            rest = rest[name_end..].trim_start();
            if let Some(r) = rest.strip_prefix('=') {
                let r = r.trim_start();
                let q = r.chars().next().unwrap_or('"');
                let close = r[1..].find(q).map_or(r.len(), |i| i + 2);
                rest = r[close..].trim_start();
            }
        }
        out
    }

    #[test]
    fn the_lms_snippet_works_with_only_what_canvas_keeps() {
        let s = snippet(Host::Lms, &e());
        assert!(!s.contains("<script"));
        // What Canvas strips (title, loading) is a bonus elsewhere; nothing else is relied on.
        for a in attributes(&s) {
            assert!(CANVAS_IFRAME_ATTRIBUTES.contains(&a.as_str()) || a == "title" || a == "loading", "{a}");
        }
        assert!(s.contains(r#"height="480""#) && s.contains("&amp;embed=1"));
    }

    #[test]
    fn the_script_snippet_listens_only_to_versioned_trainmem_resize_messages() {
        let s = snippet(Host::Script, &e());
        assert!(s.contains(r#"m.source !== "trainmem""#) && s.contains("m.version !== 1") && s.contains(r#"m.type !== "resize""#));
        assert!(s.contains("f.contentWindow === e.source"));
    }

    #[test]
    fn every_host_gets_the_url_and_its_own_syntax() {
        let expect = [
            (Host::Myst, "```{iframe} https://example.org/trainmem/?model=gpt2&embed=1&hide=inputs"),
            (Host::Myst, ":placeholder: gpt2.png"),
            (Host::Jupyter, r#"IFrame("https://example.org/trainmem/?model=gpt2&embed=1&hide=inputs", width="100%", height=480)"#),
            (Host::Reveal, "data-src=\"https://example.org/trainmem/?model=gpt2&amp;embed=1&amp;hide=inputs\""),
            (Host::Quarto, "```{=html}"),
            (Host::Mkdocs, "document$.subscribe"),
        ];
        for (host, needle) in expect {
            assert!(snippet(host, &e()).contains(needle), "{host:?} lacks {needle}");
        }
    }

    #[test]
    fn text_is_escaped_in_html_attributes() {
        let s = snippet(Host::Lms, &Embed { title: "a \"quoted\" <title>", ..e() });
        assert!(s.contains("a &quot;quoted&quot; &lt;title&gt;"));
    }
}

//! Output bundles: what an evaluation shows, in every representation a frontend may want.
//!
//! Values never print themselves; they render to an [`Output`] and each frontend (REPL, script
//! runner, Jupyter kernel) picks the representation it can display.

/// One displayable result: plain text always, rich forms when the value has them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// Plain text (terminal, logs, `text/plain`).
    pub text: String,
    /// An HTML fragment (`text/html`), e.g. a table.
    pub html: Option<String>,
    /// PNG image bytes (`image/png`), e.g. a plot.
    pub png: Option<Vec<u8>>,
    /// SVG document (`image/svg+xml`).
    pub svg: Option<String>,
}

impl Output {
    pub fn text(text: impl Into<String>) -> Self {
        Output { text: text.into(), ..Default::default() }
    }
}

/// Something that can be shown to the user.
pub trait Render {
    fn render(&self) -> Output;
}

thread_local! {
    static TEXT_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with renderers asked for text alone: a [`Render`] that draws images (a plot)
/// leaves its PNG and SVG out while it runs. `:vars` previews need only a line of text.
pub fn text_only<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            TEXT_ONLY.with(|t| t.set(self.0));
        }
    }
    let _restore = Restore(TEXT_ONLY.with(|t| t.replace(true)));
    f()
}

/// Whether a renderer should draw its images (false inside [`text_only`]).
pub fn images_wanted() -> bool {
    !TEXT_ONLY.with(|t| t.get())
}

/// `x` in fixed notation with `digits` decimals, as every printed result writes a number: a
/// value that rounds to zero is `0.0000`, never `-0.0000` (a KL of about zero computed as
/// -1e-9 on one CPU and +1e-9 on another prints the same).
pub fn fixed(x: f64, digits: usize) -> String {
    let s = format!("{x:.digits$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
        _ => s,
    }
}

/// Escapes text for inclusion in HTML.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Options and counts echoed in a result, each keeping its type: numbers stay numbers, lists
/// stay lists, in the order the function defines them (docs/methods.md lists them per analysis).
pub type Echo = Vec<(String, serde_json::Value)>;

/// One echoed value as a person reads it: strings bare, lists comma-joined, numbers as JSON
/// writes them.
pub fn echo_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.iter().map(echo_text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// A list of names as an echoed value.
pub fn echo_list<T: ToString>(items: &[T]) -> serde_json::Value {
    serde_json::Value::Array(items.iter().map(|i| serde_json::Value::String(i.to_string())).collect())
}

/// An output bundle as evcxr's display protocol: one `EVCXR_BEGIN_CONTENT MIME` ...
/// `EVCXR_END_CONTENT` block per representation (the richest first; PNG base64-encoded),
/// text/plain last as the fallback.
pub fn evcxr_content(o: &Output) -> String {
    use base64::Engine as _;
    let mut s = String::new();
    let mut block = |mime: &str, body: &str| s += &format!("EVCXR_BEGIN_CONTENT {mime}\n{body}\nEVCXR_END_CONTENT\n");
    if let Some(h) = &o.html {
        block("text/html", h);
    }
    if let Some(p) = &o.png {
        block("image/png", &base64::engine::general_purpose::STANDARD.encode(p));
    }
    if let Some(svg) = &o.svg {
        block("image/svg+xml", svg);
    }
    block("text/plain", &o.text);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evcxr_blocks_carry_each_representation_plain_text_last() {
        let o = Output {
            text: "t".into(),
            html: Some("<b>t</b>".into()),
            png: Some(vec![1, 2, 3]),
            svg: Some("<svg/>".into()),
        };
        assert_eq!(
            evcxr_content(&o),
            "EVCXR_BEGIN_CONTENT text/html\n<b>t</b>\nEVCXR_END_CONTENT\nEVCXR_BEGIN_CONTENT image/png\nAQID\nEVCXR_END_CONTENT\n\
             EVCXR_BEGIN_CONTENT image/svg+xml\n<svg/>\nEVCXR_END_CONTENT\nEVCXR_BEGIN_CONTENT text/plain\nt\nEVCXR_END_CONTENT\n"
        );
        assert_eq!(evcxr_content(&Output::text("x")), "EVCXR_BEGIN_CONTENT text/plain\nx\nEVCXR_END_CONTENT\n");
    }

    #[test]
    fn fixed_never_prints_a_negative_zero() {
        assert_eq!(fixed(-1e-9, 4), "0.0000");
        assert_eq!(fixed(1e-9, 4), "0.0000");
        assert_eq!(fixed(-0.0, 2), "0.00");
        assert_eq!(fixed(-0.00006, 4), "-0.0001");
        assert_eq!(fixed(-1.5, 1), "-1.5");
        assert_eq!(fixed(f64::NAN, 3), "NaN");
    }

    #[test]
    fn echoed_values_read_as_written() {
        assert_eq!(echo_text(&serde_json::json!(["enc", "cross"])), "enc,cross");
        assert_eq!(echo_text(&serde_json::json!(0.05)), "0.05");
        assert_eq!(echo_text(&serde_json::json!("eos")), "eos");
        assert_eq!(echo_list(&["a", "b"]), serde_json::json!(["a", "b"]));
    }

    #[test]
    fn html_escape_escapes_markup() {
        assert_eq!(html_escape("<a href=\"x\">&</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
    }
}

/// Shows a value in an evcxr notebook: `EVCXR_BEGIN_CONTENT` blocks for each representation
/// its output bundle has (text/plain always; text/html, image/png, image/svg+xml when it has
/// them). A cell ending in the value calls it. For types that [`Render`].
#[macro_export]
macro_rules! evcxr_display {
    ($($t:ty),* $(,)?) => {$(
        impl $t {
            /// Shows the value in an evcxr notebook (HTML or an image, with a text fallback).
            pub fn evcxr_display(&self) {
                print!("{}", self.evcxr_content());
            }
            /// What `evcxr_display` writes: the value's output bundle in evcxr's markers.
            pub fn evcxr_content(&self) -> String {
                $crate::output::evcxr_content(&$crate::output::Render::render(self))
            }
        }
    )*};
}
evcxr_display!(crate::table::Table, crate::plot::Plot);

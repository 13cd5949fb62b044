//! The head view: an interactive page of a sentence's attention (tokens on both sides, one
//! line per query-key pair whose opacity is the weight), as bertviz's head view draws it, but
//! self-contained: script, style and data are inlined, nothing is fetched.
//!
//! The page's DOM is testable: the root `.hs-view` carries `data-kind`, `data-layer` and
//! `data-head` (`all` or a head number); the pickers are the selects `.hs-kind`, `.hs-layer`,
//! `.hs-head` and the squares `.hs-headbox`; tokens are `.hs-tok-left` / `.hs-tok-right`,
//! lines `.hs-line` (with `data-q`, `data-k`, `data-h`). `tests/scripting/view_browser.rs` drives it.

use crate::output::{html_escape, Output, Render};
use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of attention in the view ("enc", "dec" or "cross").
#[derive(Debug, Clone, PartialEq)]
pub struct ViewKind {
    pub name: String,
    pub n_layers: usize,
    pub n_heads: usize,
    /// The tokens attending (left column).
    pub query_tokens: Vec<String>,
    /// The tokens attended to (right column); for self-attention equal to `query_tokens`.
    pub key_tokens: Vec<String>,
    /// Attention weights `[layer][head][query][key]`, row-major, length
    /// `n_layers * n_heads * Tq * Tk`; NaN for a removed head.
    pub attn: Vec<f32>,
    /// A value per head `[layer][head]` the head boxes are coloured by (a patching effect, a
    /// confidence: [`HeadView::colour_by`]); NaN where there is none.
    pub scores: Option<Vec<f64>>,
}

/// A head view of one or more kinds of attention over one sentence (pair).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadView {
    pub title: String,
    pub kinds: Vec<ViewKind>,
    /// What the scores are (a grid's statistic), when the view is coloured by one.
    pub scores_label: Option<String>,
}

const STYLE: &str = include_str!("view.css");
const SCRIPT: &str = include_str!("view.js");

impl ViewKind {
    fn check(&self) -> Result<(), String> {
        let name = &self.name;
        if self.n_layers == 0 || self.n_heads == 0 {
            return Err(format!(
                "head view: kind '{name}' needs at least one layer and one head ({} x {})",
                self.n_layers, self.n_heads
            ));
        }
        if self.query_tokens.is_empty() || self.key_tokens.is_empty() {
            return Err(format!(
                "head view: kind '{name}' has no tokens ({} queries, {} keys)",
                self.query_tokens.len(),
                self.key_tokens.len()
            ));
        }
        let (tq, tk) = (self.query_tokens.len(), self.key_tokens.len());
        let expected = [self.n_heads, tq, tk].iter().try_fold(self.n_layers, |a, &b| a.checked_mul(b));
        if expected != Some(self.attn.len()) {
            let expected = expected.map_or("more than fits in memory".to_string(), |e| e.to_string());
            return Err(format!(
                "head view: kind '{name}' has {} attention weights, expected {expected} ({} layers x {} heads x {tq} queries x {tk} keys)",
                self.attn.len(),
                self.n_layers,
                self.n_heads
            ));
        }
        Ok(())
    }

    fn tokens_text(&self) -> String {
        if self.query_tokens == self.key_tokens {
            format!("{} tokens", self.query_tokens.len())
        } else {
            format!("{} x {} tokens", self.query_tokens.len(), self.key_tokens.len())
        }
    }

    /// This kind as a JSON object; weights rounded to 4 decimals, NaN as `null`.
    fn json(&self) -> String {
        let attn: Vec<String> = self.attn.iter().map(|&w| weight(w)).collect();
        let scores = match &self.scores {
            Some(v) => format!(
                r#","scores":[{}]"#,
                v.iter()
                    .map(|&x| if x.is_finite() { format!("{}", (x * 1e4).round() / 1e4) } else { "null".into() })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => String::new(),
        };
        format!(
            r#"{{"name":{},"layers":{},"heads":{},"q":{},"k":{},"attn":[{}]{scores}}}"#,
            json(&self.name),
            self.n_layers,
            self.n_heads,
            // As the heatmaps label tokens: no tokenizer markers (`ĠThe`, `▁quick` read `The`, `quick`).
            json(&crate::plot::reader_labels(&self.query_tokens)),
            json(&crate::plot::reader_labels(&self.key_tokens)),
            attn.join(",")
        )
    }
}

/// A weight as a short JSON number: `0`, `1`, `0.25`, `0.1234`; NaN and infinities as `null`.
fn weight(w: f32) -> String {
    if !w.is_finite() {
        return "null".into();
    }
    let r = (w as f64 * 1e4).round() / 1e4;
    if r == 0.0 {
        return "0".into();
    }
    let s = format!("{r:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// JSON safe inside a `<script>`: `<`, `>` and `&` only occur in strings, where their
/// `\u` escapes mean the same, so no token can close the script or open a comment.
fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v)
        .expect("strings serialise")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// An element id unique across the views of a notebook (several kernels and runs included).
fn fresh_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("hs-view-{:x}-{nanos:x}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl HeadView {
    /// A view of `kinds`, checked: every kind has layers, heads and tokens, a weight per
    /// (layer, head, query, key), and a name of its own.
    pub fn new(title: impl Into<String>, kinds: Vec<ViewKind>) -> Result<HeadView, String> {
        if kinds.is_empty() {
            return Err("head view: no kinds of attention to show".into());
        }
        for (i, k) in kinds.iter().enumerate() {
            k.check()?;
            if kinds[..i].iter().any(|o| o.name == k.name) {
                return Err(format!("head view: kind '{}' given twice", k.name));
            }
        }
        Ok(HeadView { title: title.into(), kinds, scores_label: None })
    }

    /// The view with its head boxes coloured by `scores`: per kind name, `[layer][head]`
    /// (a grid's values; NaN where a head has none), and what they are (`label`). A kind of
    /// the view the scores lack stays uncoloured; a kind of another shape is refused, naming
    /// it and both shapes.
    pub fn colour_by(&self, scores: &[(String, Vec<Vec<f64>>)], label: &str) -> Result<HeadView, String> {
        let mut v = self.clone();
        let mut any = false;
        for k in v.kinds.iter_mut() {
            k.scores = None;
            let Some((_, grid)) = scores.iter().find(|(n, _)| *n == k.name) else { continue };
            let heads = grid.iter().map(Vec::len).max().unwrap_or(0);
            if grid.len() != k.n_layers || heads > k.n_heads {
                return Err(format!(
                    "colour_by: the grid's '{}' is {} layers x {heads} heads, the view's {} x {}",
                    k.name,
                    grid.len(),
                    k.n_layers,
                    k.n_heads
                ));
            }
            let mut flat = vec![f64::NAN; k.n_layers * k.n_heads];
            for (l, row) in grid.iter().enumerate() {
                for (h, &x) in row.iter().enumerate() {
                    flat[l * k.n_heads + h] = x;
                }
            }
            k.scores = Some(flat);
            any = true;
        }
        if !any {
            let have: Vec<&str> = scores.iter().map(|(n, _)| n.as_str()).collect();
            let want: Vec<&str> = self.kinds.iter().map(|k| k.name.as_str()).collect();
            return Err(format!("colour_by: the grid has kinds {have:?}, the view {want:?}: none in common"));
        }
        v.scores_label = Some(label.to_string());
        Ok(v)
    }

    /// A complete self-contained HTML document.
    pub fn html(&self) -> String {
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title></head>\n<body>\n{}\n</body></html>\n",
            html_escape(if self.title.is_empty() { "head view" } else { &self.title }),
            self.fragment()
        )
    }

    /// An HTML fragment for Jupyter's `text/html`: a `<div>` with a unique id, its inline
    /// style (scoped to `.hs-view`) and an inline script that only touches its own div.
    pub fn fragment(&self) -> String {
        let id = fresh_id();
        let kinds: Vec<String> = self.kinds.iter().map(ViewKind::json).collect();
        let first = &self.kinds[0].name;
        format!(
            "<div class=\"hs-view\" id=\"{id}\" data-kind=\"{}\" data-layer=\"0\" data-head=\"all\">\n<style>{STYLE}</style>\n\
             <div class=\"hs-title\">{}</div><div class=\"hs-controls\"></div><svg class=\"hs-svg\"></svg><div class=\"hs-note\">(the view needs JavaScript: in Jupyter, trust the notebook; or open the page from .to_html(path))</div>\n\
             <div class=\"hs-help\">Hover a token to isolate its attention; click a head square to show it alone, again for all heads.</div>\n\
             <script>\n(function (ROOT_ID, DATA) {{\n{SCRIPT}}})({}, {{\"kinds\":[{}]{}}});\n</script>\n</div>",
            html_escape(first),
            html_escape(&self.title),
            json(&id),
            kinds.join(",\n"),
            self.scores_label.as_ref().map_or(String::new(), |l| format!(",\"label\":{}", json(l)))
        )
    }

    /// A plain-text summary, e.g. `head view: enc 6 layers x 12 heads, 9 tokens (...)`.
    pub fn text(&self) -> String {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|k| format!("{} {} layers x {} heads, {}", k.name, k.n_layers, k.n_heads, k.tokens_text()))
            .collect();
        let title = if self.title.is_empty() { String::new() } else { format!(" \"{}\"", self.title) };
        let coloured = self.scores_label.as_ref().map_or(String::new(), |l| format!(", heads coloured by {l}"));
        format!("head view{title}: {}{coloured} (open .to_html(path) or show in Jupyter)", kinds.join("; "))
    }
}

impl Render for HeadView {
    fn render(&self) -> Output {
        Output { text: self.text(), html: Some(self.fragment()), ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str, layers: usize, heads: usize, tokens: &[&str]) -> ViewKind {
        let t = tokens.len();
        let tokens: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
        ViewKind {
            name: name.into(),
            n_layers: layers,
            n_heads: heads,
            query_tokens: tokens.clone(),
            key_tokens: tokens,
            attn: vec![1.0 / t as f32; layers * heads * t * t],
            scores: None,
        }
    }

    #[test]
    fn wrong_lengths_and_empty_tokens_are_refused_by_kind() {
        let mut k = kind("enc", 2, 3, &["a", "b"]);
        k.attn.pop();
        let e = HeadView::new("t", vec![k]).unwrap_err();
        assert!(e.contains("'enc'") && e.contains("23 attention weights, expected 24"), "{e}");
        let mut k = kind("cross", 1, 1, &["a"]);
        k.key_tokens.clear();
        assert!(HeadView::new("t", vec![k]).unwrap_err().contains("'cross' has no tokens"));
        assert!(HeadView::new("t", vec![]).is_err());
        assert!(HeadView::new("t", vec![kind("enc", 1, 1, &["a"]), kind("enc", 1, 1, &["a"])])
            .unwrap_err()
            .contains("twice"));
        assert!(HeadView::new("t", vec![kind("enc", 0, 1, &["a"])]).is_err());
    }

    #[test]
    fn colour_by_puts_each_heads_value_in_the_page_and_refuses_other_shapes() {
        let v = HeadView::new("t", vec![kind("enc", 2, 3, &["a", "b"]), kind("cross", 1, 2, &["a"])]).unwrap();
        let grid = vec![("enc".to_string(), vec![vec![0.5, -0.25, f64::NAN], vec![1.0, 0.0, 0.125]])];
        let c = v.colour_by(&grid, "effect of x").unwrap();
        let html = c.html();
        assert!(html.contains(r#""scores":[0.5,-0.25,null,1,0,0.125]"#), "{html}");
        assert!(html.contains(r#""label":"effect of x""#) && c.text().contains("coloured by effect of x"));
        // The kind the grid lacks stays uncoloured; the original view is unchanged.
        assert!(c.kinds[1].scores.is_none() && v.kinds[0].scores.is_none());
        let e = v.colour_by(&[("enc".to_string(), vec![vec![0.0; 3]])], "x").unwrap_err();
        assert!(e.contains("'enc' is 1 layers x 3 heads, the view's 2 x 3"), "{e}");
        let e = v.colour_by(&[("dec".to_string(), vec![vec![0.0; 3]])], "x").unwrap_err();
        assert!(e.contains("none in common"), "{e}");
    }

    #[test]
    fn page_is_self_contained() {
        let v = HeadView::new("The cat", vec![kind("enc", 2, 3, &["the", "cat"]), kind("dec", 1, 2, &["a"])]).unwrap();
        let html = v.html();
        for bad in ["http://", "https://", "<link", "src=", "@import", "url("] {
            assert!(!html.contains(bad), "page contains {bad}");
        }
        assert!(html.starts_with("<!DOCTYPE html>") && html.contains("class=\"hs-view\""));
        assert!(v
            .text()
            .starts_with("head view \"The cat\": enc 2 layers x 3 heads, 2 tokens; dec 1 layers x 2 heads, 1 tokens"));
    }

    #[test]
    fn hostile_tokens_stay_inside_their_strings() {
        let mut k = kind("enc", 1, 1, &["</script><b>", "<!--", "&amp;"]);
        k.attn[0] = f32::NAN;
        let v = HeadView::new("<i>title</i>", vec![k]).unwrap();
        let html = v.html();
        assert!(
            !html.contains("</script><b>") && !html.contains("<b>") && !html.contains("<!--") && !html.contains("<i>")
        );
        assert_eq!(html.matches("</script>").count(), 1);
        assert!(html.contains(r#""\u003c/script\u003e\u003cb\u003e""#));
        assert!(html.contains("[null,0.3333,"));
    }

    #[test]
    fn weights_are_short() {
        assert_eq!([0.0, 1.0, 0.25, 0.123456, 0.00004, 1e-3].map(weight), ["0", "1", "0.25", "0.1235", "0", "0.001"]);
        assert_eq!(weight(f32::NAN), "null");
    }

    #[test]
    fn fragments_have_distinct_ids() {
        let v = HeadView::new("", vec![kind("enc", 1, 1, &["a"])]).unwrap();
        let id = |s: String| s.split("id=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
        assert_ne!(id(v.fragment()), id(v.fragment()));
    }
}

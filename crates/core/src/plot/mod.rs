//! Plots: heatmaps (e.g. layers x heads), bar charts and line charts, drawn with plotters to
//! PNG or SVG with a font embedded in the binary (no system fonts needed).
//! Drawing is in [`draw`], the script API in [`script`].

mod draw;
pub mod text;

use crate::output::{Output, Render};

/// What is plotted.
#[derive(Debug, Clone, PartialEq)]
pub enum PlotKind {
    /// `values[row][col]`; row 0 is drawn at the top.
    Heatmap {
        values: Vec<Vec<f64>>,
        row_labels: Vec<String>,
        col_labels: Vec<String>,
        /// Print each cell's value inside it.
        show_values: bool,
        /// Colour scale limits; default the data's min and max.
        vmin: Option<f64>,
        vmax: Option<f64>,
    },
    Bar {
        labels: Vec<String>,
        values: Vec<f64>,
    },
    Line {
        series: Vec<Series>,
    },
}

/// One line of a line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub x: Vec<f64>,
    pub y: Vec<f64>,
}

impl Series {
    /// One line per value of column `group` of `t`, points `(x, y)` from those columns, sorted
    /// by x (non-numbers read as NaN).
    pub fn by(t: &crate::table::Table, group: usize, x: usize, y: usize) -> Vec<Series> {
        use crate::table::Cell;
        let num = |c: &Cell| match c {
            Cell::Float(v) => *v,
            Cell::Int(v) => *v as f64,
            _ => f64::NAN,
        };
        let mut series: Vec<Series> = Vec::new();
        for r in &t.rows {
            let name = match &r[group] {
                Cell::Text(n) => n.clone(),
                other => format!("{other:?}"),
            };
            if !series.iter().any(|x| x.name == name) {
                series.push(Series { name: name.clone(), x: vec![], y: vec![] });
            }
            let Some(line) = series.iter_mut().find(|x| x.name == name) else { continue };
            line.x.push(num(&r[x]));
            line.y.push(num(&r[y]));
        }
        for line in &mut series {
            let mut pts: Vec<(f64, f64)> = line.x.iter().copied().zip(line.y.iter().copied()).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (line.x, line.y) = pts.into_iter().unzip();
        }
        series
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub kind: PlotKind,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    #[error("cannot encode PNG: {0}")]
    Png(String),
    #[error("{0}")]
    Invalid(String),
}

/// Registers the embedded DejaVu Sans for every style plotters asks for (once per process).
fn ensure_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static FONT: &[u8] = include_bytes!("../../../../fonts/DejaVuSans.ttf");
    ONCE.call_once(|| {
        use plotters::style::FontStyle;
        for style in [FontStyle::Normal, FontStyle::Bold, FontStyle::Italic, FontStyle::Oblique] {
            // The font is a fixed, valid file in the binary: failure here is a build defect.
            let _ = plotters::style::register_font("sans-serif", style, FONT);
        }
    });
}

impl Plot {
    /// A plot with sizes chosen for the data.
    pub fn new(kind: PlotKind, title: impl Into<String>) -> Result<Self, PlotError> {
        let title = title.into();
        let (width, height) = match &kind {
            PlotKind::Heatmap { values, .. } => {
                let rows = values.len() as u32;
                let cols = values.first().map_or(0, |r| r.len()) as u32;
                // Wide enough for the title beside the colour bar (a model with 4 heads per
                // layer would otherwise cut it).
                let for_title = title.chars().count() as u32 * 11 + 130;
                ((160 + cols * 56).max(for_title).clamp(480, 1600), (120 + rows * 40).clamp(320, 1200))
            }
            _ => (800, 500),
        };
        let p = Plot { kind, title, x_label: String::new(), y_label: String::new(), width, height };
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), PlotError> {
        let bad = |m: String| Err(PlotError::Invalid(m));
        match &self.kind {
            PlotKind::Heatmap { values, row_labels, col_labels, vmin, vmax, .. } => {
                let rows = values.len();
                let cols = values.first().map_or(0, |r| r.len());
                if rows == 0 || cols == 0 {
                    return bad("heatmap: the matrix is empty".into());
                }
                if let Some(i) = values.iter().position(|r| r.len() != cols) {
                    return bad(format!("heatmap: row {i} has {} values but row 0 has {cols}", values[i].len()));
                }
                // NaN marks a missing cell (drawn grey); a matrix with nothing else, or with an
                // infinity, has no colour scale.
                if let Some((r, c, v)) = values
                    .iter()
                    .enumerate()
                    .find_map(|(r, row)| row.iter().position(|v| v.is_infinite()).map(|c| (r, c, row[c])))
                {
                    return bad(format!("heatmap: the value at row {r}, column {c} is {v}; a colour scale needs finite values (NaN marks a missing cell)"));
                }
                if !values.iter().flatten().any(|v| v.is_finite()) {
                    return bad(format!("heatmap: all {} values are NaN: there is nothing to draw", rows * cols));
                }
                if row_labels.len() != rows {
                    return bad(format!("heatmap: {} row labels (option 'rows') for {rows} rows", row_labels.len()));
                }
                if col_labels.len() != cols {
                    return bad(format!(
                        "heatmap: {} column labels (option 'cols') for {cols} columns",
                        col_labels.len()
                    ));
                }
                if let (Some(a), Some(b)) = (vmin, vmax) {
                    if a >= b {
                        return bad(format!("heatmap: vmin ({a}) must be below vmax ({b})"));
                    }
                }
            }
            PlotKind::Bar { labels, values } => {
                if values.is_empty() {
                    return bad("bar: no values".into());
                }
                if labels.len() != values.len() {
                    return bad(format!("bar: {} labels for {} values", labels.len(), values.len()));
                }
            }
            PlotKind::Line { series } => {
                if series.is_empty() {
                    return bad("line: no series".into());
                }
                for s in series {
                    if s.x.len() != s.y.len() {
                        return bad(format!(
                            "line: series '{}' has {} x values and {} y values",
                            s.name,
                            s.x.len(),
                            s.y.len()
                        ));
                    }
                    if s.y.is_empty() {
                        return bad(format!("line: series '{}' is empty", s.name));
                    }
                }
            }
        }
        if !(64..=8192).contains(&self.width) || !(64..=8192).contains(&self.height) {
            return bad(format!("plot size {}x{} must be within 64..8192 pixels", self.width, self.height));
        }
        Ok(())
    }

    pub fn to_svg(&self) -> Result<String, PlotError> {
        ensure_font();
        self.validate()?;
        let mut s = String::new();
        {
            let backend = plotters::backend::SVGBackend::with_string(&mut s, (self.width, self.height));
            draw::draw(self, backend).map_err(PlotError::Draw)?;
        }
        Ok(s)
    }

    pub fn to_png(&self) -> Result<Vec<u8>, PlotError> {
        ensure_font();
        self.validate()?;
        let mut buf = vec![0u8; self.width as usize * self.height as usize * 3];
        {
            let backend = plotters::backend::BitMapBackend::with_buffer(&mut buf, (self.width, self.height));
            draw::draw(self, backend).map_err(PlotError::Draw)?;
        }
        let mut out = Vec::new();
        use image::ImageEncoder;
        image::codecs::png::PngEncoder::new(&mut out)
            .write_image(&buf, self.width, self.height, image::ColorType::Rgb8)
            .map_err(|e| PlotError::Png(e.to_string()))?;
        Ok(out)
    }

    /// A one-line description used as the plot's text form.
    pub fn describe(&self) -> String {
        let what = match &self.kind {
            PlotKind::Heatmap { values, .. } => format!("heatmap {}x{}", values.len(), values[0].len()),
            PlotKind::Bar { values, .. } => format!("bar chart of {} bars", values.len()),
            PlotKind::Line { series } => format!("line chart of {} series", series.len()),
        };
        let title = if self.title.is_empty() { String::new() } else { format!(" \"{}\"", self.title) };
        format!("<plot: {what}{title}, {}x{} px; .save(\"file.png\" or \"file.svg\")>", self.width, self.height)
    }
}

impl Render for Plot {
    fn render(&self) -> Output {
        // A plot that cannot be drawn still shows its text form; the error is in it. Inside
        // `output::text_only` nothing is drawn.
        let (png, svg) = if crate::output::images_wanted() {
            match (self.to_png(), self.to_svg()) {
                (Ok(p), Ok(s)) => (Some(p), Some(s)),
                (Err(e), _) | (_, Err(e)) => return Output::text(format!("{} [{e}]", self.describe())),
            }
        } else {
            (None, None)
        };
        let text = match &self.kind {
            PlotKind::Heatmap { values, row_labels, col_labels, vmin, vmax, .. } => text::heatmap(
                &self.describe(),
                values,
                &reader_labels(row_labels),
                &reader_labels(col_labels),
                *vmin,
                *vmax,
            ),
            _ => self.describe(),
        };
        Output { text, html: None, png, svg }
    }
}

/// Labels as a reader sees them: tokenizer markers are taken off (`ĠPotter` and `▁gato`, a
/// word that follows a space, show as `Potter` and `gato`; GPT-2's `Ċ` and `ĉ`, a newline and a
/// tab, as `↵` and `⇥`), and a space that is left (a token of spaces, `ĠĠ`) shows as `␣`.
/// Where two different labels of one axis would then read alike (`ĠPotter` and `Potter`),
/// the ones that followed a space keep it as `␣` (`␣Potter`), so no two tokens are confused.
pub fn reader_labels(labels: &[String]) -> Vec<String> {
    const SPACE: [char; 2] = ['Ġ', '▁'];
    let full = reader_token;
    let plain = |l: &str| -> String {
        match l.strip_prefix(SPACE) {
            Some("") => "␣".into(),
            Some(rest) => full(rest),
            None => full(l),
        }
    };
    let shown: Vec<String> = labels.iter().map(|l| plain(l)).collect();
    let alike = |i: usize| labels.iter().zip(&shown).any(|(l, s)| *s == shown[i] && *l != labels[i]);
    labels
        .iter()
        .enumerate()
        .map(|(i, l)| if l.starts_with(SPACE) && alike(i) { full(l) } else { shown[i].clone() })
        .collect()
}

/// One token as a table cell shows it: its spaces, newlines and tabs visible (`ĠParis` and
/// `▁Paris` read `␣Paris`, `Ċ` reads `↵`, `ĉ` reads `⇥`), so that ` Paris` and `Paris` differ.
pub fn reader_token(l: &str) -> String {
    l.chars()
        .map(|c| match c {
            'Ġ' | '▁' => '␣',
            'Ċ' => '↵',
            'ĉ' => '⇥',
            c => c,
        })
        .collect()
}

/// Viridis colour map, `t` in [0, 1].
pub fn viridis(t: f64) -> (u8, u8, u8) {
    const STOPS: [(f64, f64, f64); 9] = [
        (68.0, 1.0, 84.0),
        (71.0, 44.0, 122.0),
        (59.0, 81.0, 139.0),
        (44.0, 113.0, 142.0),
        (33.0, 144.0, 141.0),
        (39.0, 173.0, 129.0),
        (92.0, 200.0, 99.0),
        (170.0, 220.0, 50.0),
        (253.0, 231.0, 37.0),
    ];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let x = t * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * f).round() as u8;
    (mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        reader_labels(&l.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn token_labels_lose_their_tokenizer_markers() {
        assert_eq!(
            labels(&["<s>", "ĠHarry", "ĠPotter", "'s", "Ċ", "Ġ", "ĠĠ", "layer 0"]),
            ["<s>", "Harry", "Potter", "'s", "↵", "␣", "␣␣", "layer 0"]
        );
        assert_eq!(labels(&["▁el", "▁gato", "s", "enc.0", "h1", "##ing"]), ["el", "gato", "s", "enc.0", "h1", "##ing"]);
        // Two tokens that would read alike keep the space that tells them apart.
        assert_eq!(labels(&["ĠPotter", "Potter", "ĠPotter", "Ġthe"]), ["␣Potter", "Potter", "␣Potter", "the"]);
        assert_eq!(labels(&["Ġ", "ĠĠ", "▁a▁b"]), ["␣", "␣␣", "a␣b"]);
    }

    /// The texts an SVG draws.
    fn svg_texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>'))
            .map(|(_, t)| t.split("</text>").next().unwrap_or_default().trim())
            .collect()
    }

    #[test]
    fn a_heatmap_of_tokens_shows_plain_words_and_fixed_cells() {
        let p = Plot::new(
            PlotKind::Heatmap {
                values: vec![vec![0.216, 0.0004], vec![1.0, 0.0021]],
                row_labels: vec!["ĠPotter".into(), "▁gato".into()],
                col_labels: vec!["ĠPotter".into(), "▁gato".into()],
                show_values: true,
                vmin: Some(0.0),
                vmax: Some(1.0),
            },
            "attention",
        )
        .unwrap();
        let svg = p.to_svg().unwrap();
        let texts = svg_texts(&svg);
        for shown in ["Potter", "gato", "0.216", "&lt;0.001", "0.002", "1.00"] {
            assert!(texts.contains(&shown), "the SVG lacks {shown}: {texts:?}");
        }
        assert!(!svg.contains('Ġ') && !svg.contains('▁'), "tokenizer markers left in the SVG");
        assert!(
            !svg.as_bytes().windows(3).any(|w| w[0].is_ascii_digit() && w[1] == b'e' && w[2] == b'-'),
            "a number in scientific notation in the SVG"
        );
        let text = p.render().text;
        assert!(
            text.contains("Potter") && text.contains("gato") && !text.contains('Ġ') && !text.contains('▁'),
            "{text}"
        );
    }

    /// A bar chart of counts labels its value axis `10`, `20`, not `10.00`, `20.00`.
    #[test]
    fn integer_axes_have_integer_labels() {
        let p = Plot::new(PlotKind::Bar { labels: vec!["a".into(), "b".into()], values: vec![12.0, 48.0] }, "heads")
            .unwrap();
        let svg = p.to_svg().unwrap();
        let texts = svg_texts(&svg);
        assert!(texts.contains(&"40"), "{texts:?}");
        assert!(!texts.iter().any(|t| t.ends_with(".00")), "{texts:?}");
    }

    #[test]
    fn text_only_rendering_draws_nothing_and_ends_with_its_call() {
        let p = heat();
        let quick = crate::output::text_only(|| p.render());
        assert!(quick.png.is_none() && quick.svg.is_none());
        let full = p.render();
        assert!(full.png.is_some() && full.svg.is_some(), "images are drawn again after text_only");
        assert_eq!(quick.text, full.text);
    }

    fn heat() -> Plot {
        Plot::new(
            PlotKind::Heatmap {
                values: vec![vec![0.1, 0.9, 0.5], vec![0.3, f64::NAN, 0.7]],
                row_labels: vec!["layer 0".into(), "layer 1".into()],
                col_labels: vec!["h0".into(), "h1".into(), "h2".into()],
                show_values: true,
                vmin: None,
                vmax: None,
            },
            "Confidence",
        )
        .unwrap()
    }

    #[test]
    fn viridis_endpoints() {
        assert_eq!(viridis(0.0), (68, 1, 84));
        assert_eq!(viridis(1.0), (253, 231, 37));
        assert_eq!(viridis(f64::NAN), (68, 1, 84));
    }

    #[test]
    fn heatmap_svg_has_labels_and_values() {
        let svg = heat().to_svg().unwrap();
        for needle in ["Confidence", "layer 0", "layer 1", "h2", "0.90"] {
            assert!(svg.contains(needle), "SVG lacks {needle}");
        }
    }

    #[test]
    fn mismatched_labels_are_rejected() {
        let e = Plot::new(
            PlotKind::Heatmap {
                values: vec![vec![1.0, 2.0]],
                row_labels: vec!["r".into()],
                col_labels: vec!["a".into()],
                show_values: false,
                vmin: None,
                vmax: None,
            },
            "",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "heatmap: 1 column labels (option 'cols') for 2 columns");
    }

    #[test]
    fn constant_heatmap_draws() {
        let p = Plot::new(
            PlotKind::Heatmap {
                values: vec![vec![1.0; 3]; 2],
                row_labels: vec!["a".into(), "b".into()],
                col_labels: vec!["x".into(), "y".into(), "z".into()],
                show_values: true,
                vmin: None,
                vmax: None,
            },
            "flat",
        )
        .unwrap();
        assert!(p.to_png().unwrap().starts_with(b"\x89PNG"));
    }
}

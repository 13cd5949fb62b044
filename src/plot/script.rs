//! The script API of [`Plot`]: constructors from plain arrays and maps, and saving.

use super::{Plot, PlotKind, Series};
use crate::files::write_atomic;
use crate::output::{Output, Render};
use crate::script::convert::{err, opt, quote, to_f64_vec, to_labels, to_matrix, OptSpec, Opts, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};

fn common(p: &mut Plot, o: &Opts) -> ScriptResult<()> {
    if let Some(t) = o.string("title")? {
        p.title = t;
    }
    if let Some(t) = o.string("x_label")? {
        p.x_label = t;
    }
    if let Some(t) = o.string("y_label")? {
        p.y_label = t;
    }
    let pixels = |name: &str| -> ScriptResult<Option<u32>> {
        match o.usize(name)? {
            Some(n) if (64..=8192).contains(&n) => Ok(Some(n as u32)),
            Some(n) => err(format!("{}: option '{name}' must be within 64..8192 pixels, got {n}", o.func())),
            None => Ok(None),
        }
    };
    if let Some(w) = pixels("width")? {
        p.width = w;
    }
    if let Some(h) = pixels("height")? {
        p.height = h;
    }
    p.validate().or_else(|e| err(e.to_string()))
}

fn build(kind: PlotKind) -> ScriptResult<Plot> {
    Plot::new(kind, "").or_else(|e| err(e.to_string()))
}

macro_rules! plot_options {
    ($($extra:expr),* $(,)?) => {
        &[
            opt("title", "\"\"", "the plot's title"),
            opt("x_label", "\"\"", "the x axis label"),
            opt("y_label", "\"\"", "the y axis label"),
            opt("width", "800 (heatmaps: by their size)", "width in pixels"),
            opt("height", "500 (heatmaps: by their size)", "height in pixels"),
            $($extra,)*
        ]
    };
}

pub const HEATMAP_OPTIONS: &[OptSpec] = plot_options![
    opt("rows", "0, 1, ...", "row labels"),
    opt("cols", "0, 1, ...", "column labels"),
    opt("values", "true up to 400 cells", "print each cell's value"),
    opt("vmin", "the smallest value", "the value at the bottom of the colour scale"),
    opt("vmax", "the largest value", "the value at the top of the colour scale"),
];
pub const BAR_OPTIONS: &[OptSpec] = plot_options![];
pub const LINE_OPTIONS: &[OptSpec] = plot_options![opt("x", "0, 1, ...", "x values shared by every series")];
const SERIES_OPTIONS: &[OptSpec] =
    &[opt("x", "the shared x", "this series' x values"), opt("y", "", "this series' y values")];

#[export_module]
pub mod api {
    use super::*;

    /// A heatmap of a matrix (array of rows), row 0 at the top, with a colour scale.
    /// Options: `rows`, `cols` (labels), `values` (print cell values, default true up to
    /// 400 cells), `vmin`, `vmax`, `title`, `x_label`, `y_label`, `width`, `height`. Cell values
    /// print in fixed notation (`0.216`, `<0.001`); labels that are tokens print without their
    /// tokenizer's markers (`ĠPotter` and `▁gato` as `Potter` and `gato`).
    ///
    /// ```rhai
    /// let p = heatmap([[0.1, 0.9], [0.5, 1]], #{rows: ["layer 0", "layer 1"], cols: ["h0", "h1"], title: "conf"});
    /// assert(p.to_svg().contains("layer 1"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw)]
    pub fn heatmap_opts(matrix: Array, options: Map) -> ScriptResult<Plot> {
        let o = Opts::new(&options, "heatmap", HEATMAP_OPTIONS)?;
        let values = to_matrix(&matrix, "heatmap: matrix")?;
        if values.is_empty() || values[0].is_empty() {
            return err("heatmap: the matrix is empty");
        }
        let (rows, cols) = (values.len(), values[0].len());
        let row_labels = o.labels("rows")?.unwrap_or_else(|| (0..rows).map(|i| i.to_string()).collect());
        let col_labels = o.labels("cols")?.unwrap_or_else(|| (0..cols).map(|i| i.to_string()).collect());
        let show_values = o.bool("values")?.unwrap_or(rows * cols <= 400);
        let kind = PlotKind::Heatmap {
            values,
            row_labels,
            col_labels,
            show_values,
            vmin: o.f64("vmin")?,
            vmax: o.f64("vmax")?,
        };
        let mut p = build(kind)?;
        common(&mut p, &o)?;
        Ok(p)
    }

    /// A heatmap with numbered rows and columns.
    ///
    /// ```rhai
    /// let p = heatmap([[1, 2, 3], [4, 5, 6]]);
    /// assert(p.to_svg().contains("<svg"));
    /// ```
    #[rhai_fn(name = "heatmap", return_raw)]
    pub fn heatmap_plain(matrix: Array) -> ScriptResult<Plot> {
        heatmap_opts(matrix, Map::new())
    }

    /// A bar chart of values with one label per bar.
    /// Options: `title`, `x_label`, `y_label`, `width`, `height`.
    ///
    /// ```rhai
    /// let p = bar(["enc", "dec", "cross"], [48, 16, 16], #{title: "heads per kind"});
    /// assert(p.to_svg().contains("cross"));
    /// ```
    #[rhai_fn(name = "bar", return_raw)]
    pub fn bar_opts(labels: Array, values: Array, options: Map) -> ScriptResult<Plot> {
        let o = Opts::new(&options, "bar", BAR_OPTIONS)?;
        let values = to_f64_vec(&values, "bar: values")?;
        let mut p = build(PlotKind::Bar { labels: to_labels(&labels), values })?;
        common(&mut p, &o)?;
        Ok(p)
    }

    /// A bar chart without options.
    ///
    /// ```rhai
    /// assert(bar(["a", "b"], [1, 2.5]).to_svg().contains("<svg"));
    /// ```
    #[rhai_fn(name = "bar", return_raw)]
    pub fn bar_plain(labels: Array, values: Array) -> ScriptResult<Plot> {
        bar_opts(labels, values, Map::new())
    }

    /// A line chart with a legend. `series` maps each name to its y values (x = 0, 1, ...
    /// or the option `x`) or to a map `#{x: [...], y: [...]}`.
    /// Options: `x`, `title`, `x_label`, `y_label`, `width`, `height`.
    ///
    /// ```rhai
    /// let p = line(#{bleu: [30.1, 29.8, 27], heads: [48, 30, 12]}, #{x: [0, 0.05, 0.1], x_label: "lambda"});
    /// let svg = p.to_svg();
    /// assert(svg.contains("bleu") && svg.contains("heads"));
    /// ```
    #[rhai_fn(name = "line", return_raw)]
    pub fn line_opts(series: Map, options: Map) -> ScriptResult<Plot> {
        let o = Opts::new(&options, "line", LINE_OPTIONS)?;
        let shared_x = o.numbers("x")?;
        let mut out = Vec::new();
        for (name, v) in &series {
            let what = format!("line: series '{name}'");
            let (x, y) = if let Some(a) = v.clone().try_cast::<Array>() {
                let y = to_f64_vec(&a, &what)?;
                let x = shared_x.clone().unwrap_or_else(|| (0..y.len()).map(|i| i as f64).collect());
                (x, y)
            } else if let Some(m) = v.clone().try_cast::<Map>() {
                if let Some(k) = m.keys().find(|k| !SERIES_OPTIONS.iter().any(|o| o.name == k.as_str())) {
                    return err(format!("{what}: unknown key '{k}' (a series map takes x and y)"));
                }
                let so = Opts::new(&m, "line", SERIES_OPTIONS)?;
                let Some(y) = so.numbers("y")? else { return err(format!("{what}: map needs 'y'")) };
                let x =
                    so.numbers("x")?.or(shared_x.clone()).unwrap_or_else(|| (0..y.len()).map(|i| i as f64).collect());
                (x, y)
            } else {
                return err(format!(
                    "{what}: expected an array of y values or #{{x: [...], y: [...]}}, got {}",
                    quote(v)
                ));
            };
            out.push(Series { name: name.to_string(), x, y });
        }
        let mut p = build(PlotKind::Line { series: out })?;
        common(&mut p, &o)?;
        Ok(p)
    }

    /// A line chart without options.
    ///
    /// ```rhai
    /// assert(line(#{loss: [3, 2.5, 2.2]}).to_svg().contains("loss"));
    /// ```
    #[rhai_fn(name = "line", return_raw)]
    pub fn line_plain(series: Map) -> ScriptResult<Plot> {
        line_opts(series, Map::new())
    }

    /// Saves the plot as PNG or SVG, chosen by the file extension; written atomically.
    ///
    /// ```rhai
    /// let path = temp_path("conf.png");
    /// heatmap([[1, 2], [3, 4]]).save(path);
    /// assert(file_size(path) > 1000);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn save(p: &mut Plot, path: &str) -> ScriptResult<()> {
        let lower = path.to_ascii_lowercase();
        let bytes = if lower.ends_with(".png") {
            p.to_png().or_else(|e| err(e.to_string()))?
        } else if lower.ends_with(".svg") {
            p.to_svg().or_else(|e| err(e.to_string()))?.into_bytes()
        } else {
            return err(format!("save: cannot tell the format of '{path}': use a .png or .svg file name"));
        };
        write_atomic(std::path::Path::new(path), &bytes).or_else(|e| err(format!("save: cannot write '{path}': {e}")))
    }

    /// The plot as an SVG document.
    ///
    /// ```rhai
    /// assert(bar(["a"], [1]).to_svg().starts_with("<svg"));
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_svg(p: &mut Plot) -> ScriptResult<String> {
        p.to_svg().or_else(|e| err(e.to_string()))
    }

    /// The plot's title.
    ///
    /// ```rhai
    /// let p = bar(["a"], [1]);
    /// p.title = "Heads";
    /// assert(p.title == "Heads");
    /// ```
    #[rhai_fn(get = "title", pure)]
    pub fn get_title(p: &mut Plot) -> String {
        p.title.clone()
    }

    #[rhai_fn(set = "title")]
    pub fn set_title(p: &mut Plot, title: &str) {
        p.title = title.to_string();
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(p: &mut Plot) -> String {
        p.describe()
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(p: &mut Plot) -> String {
        p.describe()
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Plot>("Plot");
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<Plot>().map(|p| p.render())
}

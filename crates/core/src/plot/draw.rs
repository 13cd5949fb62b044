//! Drawing a [`Plot`] on any plotters backend (bitmap or SVG).

use super::{viridis, Plot, PlotKind, Series};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

type R = Result<(), String>;

fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

pub fn draw<DB: DrawingBackend>(plot: &Plot, backend: DB) -> R {
    let root = backend.into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    match &plot.kind {
        PlotKind::Heatmap { values, row_labels, col_labels, show_values, vmin, vmax } => {
            heatmap(plot, &root, values, row_labels, col_labels, *show_values, *vmin, *vmax)?
        }
        PlotKind::Bar { labels, values } => bar(plot, &root, labels, values)?,
        PlotKind::Line { series } => line(plot, &root, series)?,
    }
    root.present().map_err(e)
}

fn finite_range(vals: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    vals.filter(|v| v.is_finite()).fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((a, b)) => Some((a.min(v), b.max(v))),
    })
}

/// Shows a number compactly: few decimals for values of order 1, scientific for tiny or huge.
pub fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a != 0.0 && !(1e-2..1e4).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A heatmap cell's value in fixed notation, as tables print numbers: three decimals below 1
/// (`0.216`), fewer above (`2.50`, `12.5`, `1250`), and `<0.001` (`>-0.001`) for a value too
/// small to show that is not zero.
pub fn fmt_cell(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a < 0.0005 {
        (if v > 0.0 { "<0.001" } else { ">-0.001" }).into()
    } else if a < 0.9995 {
        format!("{v:.3}")
    } else if a < 9.995 {
        format!("{v:.2}")
    } else if a < 99.95 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// An axis's tick labels over `lo..hi`, all with the decimals the tick spacing needs (about
/// ten ticks: `40`, `60`, `120` on one axis, `4.4`, `4.6`, `5.0` on another); very large or
/// very small values as [`fmt_value`].
pub fn axis_format(lo: f64, hi: f64) -> impl Fn(&f64) -> String {
    let top = lo.abs().max(hi.abs());
    let step = (hi - lo).abs() / 10.0;
    let plain = (1e-2..1e4).contains(&top) && step > 0.0 && step.is_finite();
    let decimals = if plain { (-step.log10().floor()).clamp(0.0, 6.0) as usize } else { 0 };
    move |v: &f64| if plain { format!("{v:.decimals$}") } else { fmt_value(*v) }
}

#[allow(clippy::too_many_arguments)]
fn heatmap<DB: DrawingBackend>(
    plot: &Plot,
    root: &DrawingArea<DB, Shift>,
    values: &[Vec<f64>],
    row_labels: &[String],
    col_labels: &[String],
    show_values: bool,
    vmin: Option<f64>,
    vmax: Option<f64>,
) -> R {
    let (row_labels, col_labels) = (&super::reader_labels(row_labels), &super::reader_labels(col_labels));
    let rows = values.len() as i32;
    let cols = values[0].len() as i32;
    let (dmin, dmax) = finite_range(values.iter().flatten().copied()).unwrap_or((0.0, 1.0));
    let lo = vmin.unwrap_or(dmin);
    let mut hi = vmax.unwrap_or(dmax);
    if hi <= lo {
        hi = lo + 1.0;
    }
    let norm = |v: f64| (v - lo) / (hi - lo);
    let bar_w = 90.min(plot.width / 4);
    let (main, scale) = root.split_horizontally(plot.width - bar_w);

    let max_label = row_labels.iter().map(|l| l.chars().count()).max().unwrap_or(1) as u32;
    let mut chart = ChartBuilder::on(&main)
        .caption(&plot.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(if plot.x_label.is_empty() { 30 } else { 50 })
        .y_label_area_size((max_label * 8 + 20).clamp(30, 200) + if plot.y_label.is_empty() { 0 } else { 20 })
        .build_cartesian_2d((0..cols - 1).into_segmented(), (0..rows - 1).into_segmented())
        .map_err(e)?;
    // A discrete range includes its end: segments 0..=n-1, with `Last` as the far edge.
    let edge = |i: i32, n: i32| if i < n { SegmentValue::Exact(i) } else { SegmentValue::Last };
    let col_fmt = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) if *i >= 0 && *i < cols => col_labels[*i as usize].clone(),
        _ => String::new(),
    };
    // Row 0 at the top: row r is drawn at y = rows - 1 - r.
    let row_fmt = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) if *i >= 0 && *i < rows => row_labels[(rows - 1 - *i) as usize].clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(cols as usize)
        .y_labels(rows as usize)
        .x_label_formatter(&col_fmt)
        .y_label_formatter(&row_fmt)
        .x_desc(&plot.x_label)
        .y_desc(&plot.y_label)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;

    let cell_color = |v: f64| {
        if v.is_finite() {
            let (r, g, b) = viridis(norm(v));
            RGBColor(r, g, b)
        } else {
            RGBColor(200, 200, 200)
        }
    };
    chart
        .draw_series(values.iter().enumerate().flat_map(|(r, row)| {
            let y = rows - 1 - r as i32;
            row.iter().enumerate().map(move |(c, &v)| {
                let c = c as i32;
                Rectangle::new(
                    [(edge(c, cols), edge(y, rows)), (edge(c + 1, cols), edge(y + 1, rows))],
                    cell_color(v).filled(),
                )
            })
        }))
        .map_err(e)?;
    if show_values {
        let font_px = if cols > 20 { 9 } else { 12 };
        chart
            .draw_series(values.iter().enumerate().flat_map(|(r, row)| {
                let y = rows - 1 - r as i32;
                row.iter().enumerate().map(move |(c, &v)| {
                    let dark_cell = !v.is_finite() || norm(v) < 0.6;
                    let color = if dark_cell && v.is_finite() { WHITE } else { BLACK };
                    let style =
                        ("sans-serif", font_px).into_font().color(&color).pos(Pos::new(HPos::Center, VPos::Center));
                    Text::new(fmt_cell(v), (SegmentValue::CenterOf(c as i32), SegmentValue::CenterOf(y)), style)
                })
            }))
            .map_err(e)?;
    }

    // Colour scale.
    let mut sc = ChartBuilder::on(&scale)
        .margin_top(40)
        .margin_bottom(40)
        .margin_right(10)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..1.0, lo..hi)
        .map_err(e)?;
    sc.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(6)
        .y_label_formatter(&axis_format(lo, hi))
        .label_style(("sans-serif", 11))
        .draw()
        .map_err(e)?;
    let steps = 64;
    sc.draw_series((0..steps).map(|i| {
        let a = lo + (hi - lo) * i as f64 / steps as f64;
        let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
        let (r, g, bl) = viridis((i as f64 + 0.5) / steps as f64);
        Rectangle::new([(0.0, a), (1.0, b)], RGBColor(r, g, bl).filled())
    }))
    .map_err(e)?;
    Ok(())
}

fn bar<DB: DrawingBackend>(plot: &Plot, root: &DrawingArea<DB, Shift>, labels: &[String], values: &[f64]) -> R {
    let n = values.len() as i32;
    let (mn, mx) = finite_range(values.iter().copied()).unwrap_or((0.0, 1.0));
    let lo = mn.min(0.0);
    let mut hi = mx.max(0.0);
    if hi <= lo {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.08;
    let lo = if lo < 0.0 { lo - pad } else { lo };
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(if plot.x_label.is_empty() { 40 } else { 60 })
        .y_label_area_size(60)
        .build_cartesian_2d((0..n - 1).into_segmented(), lo..hi + pad)
        .map_err(e)?;
    let edge = |i: i32| if i < n { SegmentValue::Exact(i) } else { SegmentValue::Last };
    let fmt = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) if *i >= 0 && *i < n => labels[*i as usize].clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n as usize)
        .x_label_formatter(&fmt)
        .y_label_formatter(&axis_format(lo, hi + pad))
        .x_desc(&plot.x_label)
        .y_desc(&plot.y_label)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let color = Palette99::pick(0);
    chart
        .draw_series(values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| {
            let i = i as i32;
            let mut r = Rectangle::new([(edge(i), 0.0), (edge(i + 1), v)], color.filled());
            r.set_margin(0, 0, 6, 6);
            r
        }))
        .map_err(e)?;
    Ok(())
}

fn line<DB: DrawingBackend>(plot: &Plot, root: &DrawingArea<DB, Shift>, series: &[Series]) -> R {
    let (x0, mut x1) = finite_range(series.iter().flat_map(|s| s.x.iter().copied())).unwrap_or((0.0, 1.0));
    let (y0, mut y1) = finite_range(series.iter().flat_map(|s| s.y.iter().copied())).unwrap_or((0.0, 1.0));
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, ("sans-serif", 20))
        .margin(10)
        .margin_right(30)
        .x_label_area_size(if plot.x_label.is_empty() { 35 } else { 55 })
        .y_label_area_size(65)
        .build_cartesian_2d(x0..x1, y0 - pad..y1 + pad)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(&plot.x_label)
        .y_desc(&plot.y_label)
        .x_label_formatter(&axis_format(x0, x1))
        .y_label_formatter(&axis_format(y0 - pad, y1 + pad))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> =
            s.x.iter().zip(&s.y).filter(|(x, y)| x.is_finite() && y.is_finite()).map(|(x, y)| (*x, *y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_axis_labels_its_ticks_with_one_precision() {
        let x = axis_format(37.0, 240.0);
        assert_eq!([x(&40.0), x(&60.0), x(&120.0)], ["40", "60", "120"]);
        let y = axis_format(4.2, 6.1);
        assert_eq!([y(&4.4), y(&5.0), y(&6.0)], ["4.4", "5.0", "6.0"]);
        assert_eq!(axis_format(0.0, 1e6)(&5e5), "5.0e5");
    }

    #[test]
    fn heatmap_cells_print_in_fixed_notation() {
        let cells: Vec<String> =
            [0.216, 0.0021, 0.0004, -0.0004, 0.0, 1.0, 0.99996, 2.5, 12.34, 1234.5, -0.5, f64::NAN]
                .iter()
                .map(|&v| fmt_cell(v))
                .collect();
        assert_eq!(
            cells,
            ["0.216", "0.002", "<0.001", ">-0.001", "0", "1.00", "1.00", "2.50", "12.3", "1234", "-0.500", "–"]
        );
        for v in [1e-9, 3.3e-5, 0.00123, 7e-3, 123456.0] {
            assert!(!fmt_cell(v).contains('e'), "{v} printed as {}", fmt_cell(v));
        }
    }
}

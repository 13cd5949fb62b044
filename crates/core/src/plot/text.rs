//! A heatmap drawn in text (Unicode shades, row and column labels, a legend), so a terminal
//! user sees a grid without opening a file. The PNG and SVG renderings stay for files and
//! notebooks.

/// The shades from the lowest to the highest fifth of the colour scale.
pub const SHADES: [char; 5] = ['·', '░', '▒', '▓', '█'];

/// Draws `values` (row 0 at the top) over `[vmin, vmax]` (the finite values' range where
/// not given). A NaN cell (a removed head) is blank.
pub fn heatmap(
    title: &str,
    values: &[Vec<f64>],
    rows: &[String],
    cols: &[String],
    vmin: Option<f64>,
    vmax: Option<f64>,
) -> String {
    let finite = values.iter().flatten().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = (vmin.unwrap_or(lo), vmax.unwrap_or(hi));
    if !lo.is_finite() || !hi.is_finite() {
        return format!("{title}\n(no finite values to draw)");
    }
    let span = if hi > lo { hi - lo } else { 1.0 };
    let level = |v: f64| -> Option<usize> {
        v.is_finite().then(|| (((v - lo) / span * SHADES.len() as f64).floor().max(0.0) as usize).min(SHADES.len() - 1))
    };
    let w = cols.iter().map(|c| c.chars().count()).max().unwrap_or(2).clamp(2, 4);
    let lw = rows.iter().map(|r| r.chars().count()).max().unwrap_or(0).min(16);
    let fit = |s: &str, n: usize| -> String {
        let s: String = s.chars().take(n).collect();
        format!("{s:>n$}")
    };
    let mut out = String::new();
    if !title.is_empty() {
        out += title;
        out.push('\n');
    }
    out += &format!("{} {}\n", " ".repeat(lw), cols.iter().map(|c| fit(c, w)).collect::<Vec<_>>().join(" "));
    for (r, row) in values.iter().enumerate() {
        let label = rows.get(r).map_or(String::new(), |l| fit(l, lw));
        let cells: Vec<String> =
            row.iter().map(|&v| level(v).map_or(" ".repeat(w), |i| SHADES[i].to_string().repeat(w))).collect();
        out += &format!("{label} {}\n", cells.join(" "));
    }
    let step = span / SHADES.len() as f64;
    let legend: Vec<String> = SHADES
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{s} {}..{}", num(lo + step * i as f64), num(lo + step * (i + 1) as f64)))
        .collect();
    out += &format!("legend: {}", legend.join("  "));
    if values.iter().flatten().any(|v| !v.is_finite()) {
        out += "  (blank: no value)";
    }
    out
}

/// A short number for the legend.
fn num(x: f64) -> String {
    if x == 0.0 || (1e-3..1e4).contains(&x.abs()) {
        let s = format!("{x:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".into()
        } else {
            s.to_string()
        }
    } else {
        format!("{x:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shades_follow_the_values_and_nan_is_blank() {
        let rows = vec!["enc.0".to_string(), "enc.1".to_string()];
        let cols = vec!["h0".to_string(), "h1".to_string(), "h2".to_string()];
        let t = heatmap("conf", &[vec![0.0, 0.5, 1.0], vec![f64::NAN, 0.99, 0.2]], &rows, &cols, None, None);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "conf");
        assert_eq!(lines[1], "      h0 h1 h2");
        assert_eq!(lines[2], "enc.0 ·· ▒▒ ██");
        assert_eq!(lines[3], "enc.1    ██ ░░");
        assert!(
            lines[4].starts_with("legend: · 0..0.2  ░ 0.2..0.4") && lines[4].ends_with("(blank: no value)"),
            "{}",
            lines[4]
        );
    }

    #[test]
    fn a_given_range_clamps() {
        let t = heatmap("", &[vec![-1.0, 2.0]], &["r".into()], &["a".into(), "b".into()], Some(0.0), Some(1.0));
        assert_eq!(t.lines().nth(1), Some("r ·· ██"));
    }
}

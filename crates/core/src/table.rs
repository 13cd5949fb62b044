//! Tables: a plain data type rendered to text (comfy-table, stable without a TTY), HTML and CSV.
//! The script API lives in [`script`] below.

use crate::output::{html_escape, Output, Render};
use comfy_table::{presets, CellAlignment, ContentArrangement};

/// One cell of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Int(i64),
    Float(f64),
    Text(String),
    Empty,
}

impl Cell {
    fn is_numeric(&self) -> bool {
        matches!(self, Cell::Int(_) | Cell::Float(_))
    }
    fn format(&self, digits: usize) -> String {
        match self {
            Cell::Int(i) => i.to_string(),
            Cell::Float(f) if f.is_nan() => "NaN".into(),
            Cell::Float(f) => crate::output::fixed(*f, digits),
            Cell::Text(s) => s.clone(),
            Cell::Empty => String::new(),
        }
    }
}

/// A titled grid of cells with named columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub title: Option<String>,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// Decimals shown for floats.
    pub digits: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("row {row} has {got} cells but the table has {want} columns")]
    RowWidth { row: usize, got: usize, want: usize },
    #[error("no column named '{0}' (columns: {1})")]
    NoColumn(String, String),
}

impl Table {
    pub fn new(columns: Vec<String>) -> Self {
        Table { title: None, columns, rows: Vec::new(), digits: 4 }
    }

    pub fn push_row(&mut self, row: Vec<Cell>) -> Result<(), TableError> {
        if row.len() != self.columns.len() {
            return Err(TableError::RowWidth { row: self.rows.len(), got: row.len(), want: self.columns.len() });
        }
        self.rows.push(row);
        Ok(())
    }

    pub fn column_index(&self, name: &str) -> Result<usize, TableError> {
        self.columns
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| TableError::NoColumn(name.to_string(), self.columns.join(", ")))
    }

    /// The columns typed for export (docs/methods.md#export): a column of integers (and empty
    /// cells) stays integer, one of numbers becomes float64, anything else text (numbers
    /// written as they print); empty cells are missing values.
    pub fn export_columns(&self) -> Vec<(String, crate::export::Column)> {
        use crate::export::Column;
        self.columns
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let cells = self.rows.iter().map(|r| r.get(i).unwrap_or(&Cell::Empty));
                let ints = cells.clone().all(|c| matches!(c, Cell::Int(_) | Cell::Empty));
                let numbers = cells.clone().all(|c| matches!(c, Cell::Int(_) | Cell::Float(_) | Cell::Empty));
                let col = if ints {
                    Column::Ints(cells.map(|c| if let Cell::Int(v) = c { Some(*v) } else { None }).collect())
                } else if numbers {
                    Column::Floats(
                        cells
                            .map(|c| match c {
                                Cell::Int(v) => Some(*v as f64),
                                Cell::Float(v) => Some(*v),
                                _ => None,
                            })
                            .collect(),
                    )
                } else {
                    Column::Texts(
                        cells
                            .map(|c| match c {
                                Cell::Text(t) => Some(t.clone()),
                                Cell::Int(v) => Some(v.to_string()),
                                Cell::Float(v) => Some(v.to_string()),
                                Cell::Empty => None,
                            })
                            .collect(),
                    )
                };
                (name.clone(), col)
            })
            .collect()
    }

    /// Stable sort by one column; numbers before text, NaN last.
    pub fn sort_by(&mut self, column: &str, descending: bool) -> Result<(), TableError> {
        let i = self.column_index(column)?;
        let key = |c: &Cell| match c {
            Cell::Int(v) => (0, *v as f64, String::new()),
            Cell::Float(v) if v.is_nan() => (2, 0.0, String::new()),
            Cell::Float(v) => (0, *v, String::new()),
            Cell::Text(s) => (1, 0.0, s.clone()),
            Cell::Empty => (3, 0.0, String::new()),
        };
        self.rows.sort_by(|a, b| {
            let (ka, kb) = (key(&a[i]), key(&b[i]));
            let ord = ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(ka.2.cmp(&kb.2));
            if descending && ka.0 == kb.0 && ka.0 < 2 {
                ord.reverse()
            } else {
                ord
            }
        });
        Ok(())
    }

    fn numeric_column(&self, i: usize) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|r| r[i].is_numeric() || r[i] == Cell::Empty)
    }

    /// Plain-text rendering; identical with or without a terminal.
    pub fn to_text(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .force_no_tty()
            .set_header(self.columns.clone());
        for r in &self.rows {
            t.add_row(r.iter().map(|c| c.format(self.digits)).collect::<Vec<_>>());
        }
        for i in 0..self.columns.len() {
            if self.numeric_column(i) {
                if let Some(col) = t.column_mut(i) {
                    col.set_cell_alignment(CellAlignment::Right);
                }
            }
        }
        match &self.title {
            Some(title) => format!("{title}\n{t}"),
            None => t.to_string(),
        }
    }

    pub fn to_html(&self) -> String {
        let mut s = String::from("<table class=\"headscope-table\">\n");
        if let Some(title) = &self.title {
            s += &format!("<caption>{}</caption>\n", html_escape(title));
        }
        s += "<thead><tr>";
        for c in &self.columns {
            s += &format!("<th>{}</th>", html_escape(c));
        }
        s += "</tr></thead>\n<tbody>\n";
        for r in &self.rows {
            s += "<tr>";
            for c in r {
                let style = if c.is_numeric() { " style=\"text-align:right\"" } else { "" };
                s += &format!("<td{style}>{}</td>", html_escape(&c.format(self.digits)));
            }
            s += "</tr>\n";
        }
        s + "</tbody>\n</table>"
    }

    /// RFC 4180 CSV; floats at full precision so that nothing is lost.
    pub fn to_csv(&self) -> String {
        fn field(s: &str) -> String {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        }
        let mut s = self.columns.iter().map(|c| field(c)).collect::<Vec<_>>().join(",") + "\n";
        for r in &self.rows {
            let cells: Vec<String> = r
                .iter()
                .map(|c| match c {
                    Cell::Float(f) => f.to_string(),
                    other => field(&other.format(self.digits)),
                })
                .collect();
            s += &(cells.join(",") + "\n");
        }
        s
    }
}

impl Render for Table {
    fn render(&self) -> Output {
        Output { text: self.to_text(), html: Some(self.to_html()), ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(vec!["head".into(), "conf".into(), "n".into()]);
        t.push_row(vec![Cell::Text("enc.0.1".into()), Cell::Float(0.91234), Cell::Int(10)]).unwrap();
        t.push_row(vec![Cell::Text("enc.2.5".into()), Cell::Float(f64::NAN), Cell::Int(3)]).unwrap();
        t
    }

    #[test]
    fn text_rendering_is_stable_and_aligned() {
        let mut t = sample();
        t.title = Some("Confidence".into());
        let expected = "Confidence
┌─────────┬────────┬────┐
│ head    ┆   conf ┆  n │
╞═════════╪════════╪════╡
│ enc.0.1 ┆ 0.9123 ┆ 10 │
│ enc.2.5 ┆    NaN ┆  3 │
└─────────┴────────┴────┘";
        assert_eq!(t.to_text(), expected);
    }

    #[test]
    fn wrong_row_width_is_rejected() {
        let mut t = sample();
        let e = t.push_row(vec![Cell::Int(1)]).unwrap_err().to_string();
        assert_eq!(e, "row 2 has 1 cells but the table has 3 columns");
    }

    #[test]
    fn csv_quotes_and_keeps_precision() {
        let mut t = Table::new(vec!["a,b".into(), "x".into()]);
        t.push_row(vec![Cell::Text("say \"hi\"".into()), Cell::Float(0.123456789)]).unwrap();
        assert_eq!(t.to_csv(), "\"a,b\",x\n\"say \"\"hi\"\"\",0.123456789\n");
    }

    #[test]
    fn sort_descending_puts_nan_last() {
        let mut t = sample();
        t.push_row(vec![Cell::Text("x".into()), Cell::Float(0.95), Cell::Int(1)]).unwrap();
        t.sort_by("conf", true).unwrap();
        let heads: Vec<_> = t.rows.iter().map(|r| r[0].format(4)).collect();
        assert_eq!(heads, ["x", "enc.0.1", "enc.2.5"]);
        assert!(t.sort_by("nope", false).unwrap_err().to_string().contains("no column named 'nope'"));
    }

    #[test]
    fn html_escapes_cells() {
        let mut t = Table::new(vec!["<h>".into()]);
        t.push_row(vec![Cell::Text("a&b".into())]).unwrap();
        let h = t.to_html();
        assert!(h.contains("<th>&lt;h&gt;</th>") && h.contains("<td>a&amp;b</td>"), "{h}");
    }
}

use super::{Cell, Table};
use crate::files::write_atomic;
use crate::output::{Output, Render};
use crate::script::convert::{err, quote, to_labels, ScriptResult};
use rhai::plugin::*;
use rhai::{Array, Dynamic, Engine, Map};

pub(crate) fn cell(v: &Dynamic) -> Cell {
    if let Some(i) = v.clone().try_cast::<i64>() {
        Cell::Int(i)
    } else if let Some(f) = v.clone().try_cast::<f64>() {
        Cell::Float(f)
    } else if v.is_unit() {
        Cell::Empty
    } else if v.is_string() {
        Cell::Text(v.clone().cast::<rhai::ImmutableString>().to_string())
    } else {
        Cell::Text(v.to_string())
    }
}

fn cell_value(c: &Cell) -> Dynamic {
    match c {
        Cell::Int(i) => Dynamic::from(*i),
        Cell::Float(f) => Dynamic::from(*f),
        Cell::Text(s) => Dynamic::from(s.clone()),
        Cell::Empty => Dynamic::UNIT,
    }
}

fn row_cells(t: &Table, row: &Dynamic, i: usize, func: &str) -> ScriptResult<Vec<Cell>> {
    if let Some(a) = row.clone().try_cast::<Array>() {
        return Ok(a.iter().map(cell).collect());
    }
    if let Some(m) = row.clone().try_cast::<Map>() {
        for k in m.keys() {
            if !t.columns.iter().any(|c| c == k.as_str()) {
                return err(format!(
                    "{func}: row {i} has key '{k}' that is not a column (columns: {})",
                    t.columns.join(", ")
                ));
            }
        }
        return Ok(t.columns.iter().map(|c| m.get(c.as_str()).map(cell).unwrap_or(Cell::Empty)).collect());
    }
    err(format!("{func}: row {i} must be an array or a map, got {}", quote(row)))
}

#[export_module]
pub mod api {
    use super::*;

    /// Builds a table from column names and rows (arrays of cells, or maps keyed by column).
    /// Integers and floats are right-aligned; floats show 4 decimals (see `digits`).
    ///
    /// ```rhai
    /// let t = table(["head", "confidence"], [["enc.0.1", 0.91], ["enc.2.5", 0.42]]);
    /// assert(t.len() == 2);
    /// assert(t.columns == ["head", "confidence"]);
    /// ```
    #[rhai_fn(name = "table", return_raw)]
    pub fn table_cols_rows(columns: Array, rows: Array) -> ScriptResult<Table> {
        let mut t = Table::new(to_labels(&columns));
        for (i, r) in rows.iter().enumerate() {
            let cells = row_cells(&t, r, i, "table")?;
            t.push_row(cells).or_else(|e| err(format!("table: {e}")))?;
        }
        Ok(t)
    }

    /// Builds a table from an array of maps; the columns are the keys of the first row
    /// (in sorted order, as Rhai maps are), later rows may leave cells empty.
    ///
    /// ```rhai
    /// let t = table([#{layer: 0, score: 0.5}, #{layer: 1, score: 0.25}]);
    /// assert(t.columns == ["layer", "score"]);
    /// assert(t[1].score == 0.25);
    /// ```
    #[rhai_fn(name = "table", return_raw)]
    pub fn table_maps(rows: Array) -> ScriptResult<Table> {
        let Some(first) = rows.first() else {
            return err("table: no rows given; use table(columns, []) for an empty table");
        };
        let Some(m) = first.clone().try_cast::<Map>() else {
            return err(format!("table: with one argument the rows must be maps, got {}", quote(first)));
        };
        table_cols_rows(m.keys().map(|k| Dynamic::from(k.to_string())).collect(), rows)
    }

    /// Appends one row (an array of cells or a map keyed by column).
    ///
    /// ```rhai
    /// let t = table(["a", "b"], []);
    /// t.add_row([1, "x"]);
    /// t.add_row(#{a: 2});
    /// assert(t.len() == 2);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn add_row(t: &mut Table, row: Dynamic) -> ScriptResult<()> {
        let cells = row_cells(t, &row, t.rows.len(), "add_row")?;
        t.push_row(cells).or_else(|e| err(format!("add_row: {e}")))
    }

    /// Number of rows.
    ///
    /// ```rhai
    /// assert(table(["x"], [[1], [2], [3]]).len() == 3);
    /// ```
    #[rhai_fn(pure)]
    pub fn len(t: &mut Table) -> i64 {
        t.rows.len() as i64
    }

    /// The column names.
    ///
    /// ```rhai
    /// assert(table(["x", "y"], []).columns == ["x", "y"]);
    /// ```
    #[rhai_fn(get = "columns", pure)]
    pub fn columns(t: &mut Table) -> Array {
        t.columns.iter().map(|c| Dynamic::from(c.clone())).collect()
    }

    /// The title printed above the table.
    ///
    /// ```rhai
    /// let t = table(["x"], [[1]]);
    /// t.title = "Confidence";
    /// assert(t.title == "Confidence");
    /// ```
    #[rhai_fn(get = "title", pure)]
    pub fn get_title(t: &mut Table) -> String {
        t.title.clone().unwrap_or_default()
    }

    #[rhai_fn(set = "title")]
    pub fn set_title(t: &mut Table, title: &str) {
        t.title = Some(title.to_string());
    }

    /// Decimals shown for floats (default 4).
    ///
    /// ```rhai
    /// let t = table(["x"], [[0.123456]]);
    /// t.digits = 2;
    /// assert(t.to_text().contains("0.12"));
    /// ```
    #[rhai_fn(get = "digits", pure)]
    pub fn get_digits(t: &mut Table) -> i64 {
        t.digits as i64
    }

    #[rhai_fn(set = "digits", return_raw)]
    pub fn set_digits(t: &mut Table, digits: i64) -> ScriptResult<()> {
        if !(0..=12).contains(&digits) {
            return err(format!("digits: must be between 0 and 12, got {digits}"));
        }
        t.digits = digits as usize;
        Ok(())
    }

    /// Row `i` as a map from column name to value.
    ///
    /// ```rhai
    /// let t = table(["head", "score"], [["enc.0.0", 1.5]]);
    /// assert(t[0].head == "enc.0.0");
    /// ```
    #[rhai_fn(index_get, return_raw, pure)]
    pub fn row(t: &mut Table, i: i64) -> ScriptResult<Map> {
        let n = t.rows.len() as i64;
        let idx = if i < 0 { i + n } else { i };
        if idx < 0 || idx >= n {
            return err(format!("row index {i} out of range: the table has {n} rows"));
        }
        Ok(t.columns.iter().zip(&t.rows[idx as usize]).map(|(c, v)| (c.as_str().into(), cell_value(v))).collect())
    }

    /// All values of one column, as an array.
    ///
    /// ```rhai
    /// let t = table(["h", "s"], [["a", 1], ["b", 2]]);
    /// assert(t.column("s") == [1, 2]);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn column(t: &mut Table, name: &str) -> ScriptResult<Array> {
        let i = t.column_index(name).or_else(|e| err(format!("column: {e}")))?;
        Ok(t.rows.iter().map(|r| cell_value(&r[i])).collect())
    }

    /// The rows for which `f(row)` is true (each row a map, as `t[i]` gives it): a new table
    /// with the same columns and title. `f` must return a bool.
    ///
    /// ```rhai
    /// let t = table(["head", "score"], [["enc.0.1", 0.9], ["enc.2.3", 0.1], ["cross.1.0", 0.7]]);
    /// let hi = t.filter(|r| r.score > 0.5);
    /// assert(hi.len() == 2 && hi[1].head == "cross.1.0");
    /// assert(t.filter(|r| r.head.starts_with("cross")).column("score") == [0.7]);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn filter(ctx: NativeCallContext, t: &mut Table, f: rhai::FnPtr) -> ScriptResult<Table> {
        let mut out = Table { title: t.title.clone(), columns: t.columns.clone(), rows: Vec::new(), digits: t.digits };
        for (i, cells) in t.rows.iter().enumerate() {
            let row: Map = t.columns.iter().zip(cells).map(|(c, v)| (c.as_str().into(), cell_value(v))).collect();
            let keep = f.call_within_context::<Dynamic>(&ctx, (row,))?;
            match keep.as_bool() {
                Ok(true) => out.rows.push(cells.clone()),
                Ok(false) => {}
                Err(_) => {
                    return err(format!(
                        "filter: the function must return true or false, got {} for row {i}",
                        crate::script::convert::quote(&keep)
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Sorts rows by a column, ascending or descending (`true`).
    ///
    /// ```rhai
    /// let t = table(["h", "s"], [["a", 0.2], ["b", 0.9], ["c", 0.5]]);
    /// t.sort_by("s", true);
    /// assert(t.column("h") == ["b", "c", "a"]);
    /// ```
    #[rhai_fn(return_raw)]
    pub fn sort_by(t: &mut Table, column: &str, descending: bool) -> ScriptResult<()> {
        t.sort_by(column, descending).or_else(|e| err(format!("sort_by: {e}")))
    }

    /// The table as plain text (what the REPL shows).
    ///
    /// ```rhai
    /// let s = table(["x"], [[1]]).to_text();
    /// assert(s.contains("x") && s.contains("1"));
    /// ```
    #[rhai_fn(pure)]
    pub fn to_text(t: &mut Table) -> String {
        t.to_text()
    }

    /// The table as an HTML fragment (what notebooks show).
    ///
    /// ```rhai
    /// assert(table(["x"], [[1]]).to_html().starts_with("<table"));
    /// ```
    #[rhai_fn(pure)]
    pub fn to_html(t: &mut Table) -> String {
        t.to_html()
    }

    /// Writes the table as CSV, atomically; floats keep full precision.
    ///
    /// ```rhai
    /// let t = table(["h", "s"], [["enc.0.0", 0.5]]);
    /// let path = temp_path("t.csv");
    /// t.to_csv(path);
    /// assert(read_text(path) == "h,s\nenc.0.0,0.5\n");
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_csv(t: &mut Table, path: &str) -> ScriptResult<()> {
        write_atomic(std::path::Path::new(path), t.to_csv().as_bytes())
            .or_else(|e| err(format!("to_csv: cannot write '{path}': {e}")))
    }

    /// Writes the table as Parquet, atomically (docs/methods.md#export): one column per
    /// column (integers, float64 or text; empty cells null), the title and headscope's
    /// version in the file's metadata (key `headscope`). pandas: `pd.read_parquet(path)`.
    ///
    /// ```rhai
    /// let t = table(["head", "layer", "value"], [["dec.0.1", 0, 0.5], ["dec.1.0", 1, ()]]);
    /// let path = temp_path("t.parquet");
    /// t.to_parquet(path);
    /// assert(file_size(path) > 100);
    /// ```
    #[rhai_fn(return_raw, pure)]
    pub fn to_parquet(t: &mut Table, path: &str) -> ScriptResult<()> {
        let mut meta = serde_json::Map::new();
        meta.insert("title".into(), serde_json::json!(t.title));
        let bytes = crate::export::parquet_bytes(&t.export_columns(), &crate::export::provenance(meta))
            .or_else(|e| err(format!("to_parquet: {e}")))?;
        crate::export::write(path, &bytes).or_else(|e| err(format!("to_parquet: {e}")))
    }

    /// Writes the table as JSON, atomically: `{"title", "columns", "data": [{column: value}],
    /// "headscope_version"}`; empty cells and NaN are `null`. pandas:
    /// `pd.DataFrame(json.load(open(path))["data"])`.
    ///
    /// ```rhai
    /// let t = table(["head", "value"], [["dec.0.1", 0.5]]);
    /// let path = temp_path("t.json");
    /// t.to_json(path);
    /// assert(read_text(path).contains("\"head\": \"dec.0.1\""));
    /// ```
    #[rhai_fn(name = "to_json", return_raw, pure)]
    pub fn table_to_json(t: &mut Table, path: &str) -> ScriptResult<()> {
        let value = |c: &Cell| match c {
            Cell::Int(v) => serde_json::json!(v),
            Cell::Float(v) if v.is_finite() => serde_json::json!(v),
            Cell::Text(s) => serde_json::json!(s),
            _ => serde_json::Value::Null,
        };
        let data: Vec<serde_json::Value> = t
            .rows
            .iter()
            .map(|r| serde_json::Value::Object(t.columns.iter().cloned().zip(r.iter().map(value)).collect()))
            .collect();
        let doc = serde_json::json!({
            "title": t.title, "columns": t.columns, "data": data,
            "headscope_version": env!("CARGO_PKG_VERSION"),
        });
        crate::script::convert::write_json(path, &doc, "to_json")
    }

    #[rhai_fn(name = "to_string", pure)]
    pub fn to_string(t: &mut Table) -> String {
        t.to_text()
    }

    #[rhai_fn(name = "to_debug", pure)]
    pub fn to_debug(t: &mut Table) -> String {
        format!("<Table {} rows x {} columns>", t.rows.len(), t.columns.len())
    }
}

pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<Table>("Table");
    engine.register_global_module(exported_module!(api).into());
}

pub fn render(v: &Dynamic) -> Option<Output> {
    v.clone().try_cast::<Table>().map(|t| t.render())
}

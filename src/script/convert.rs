//! Conversions from script values at the edge: numbers (integers accepted where floats are
//! expected), arrays, and option maps parsed once into typed values. Every error quotes the
//! bad value and names the argument or option at fault.

use rhai::{Array, Dynamic, EvalAltResult, Map, Position};

pub type ScriptResult<T> = Result<T, Box<EvalAltResult>>;

/// A runtime error carrying `msg`; Rhai fills in the position of the call.
pub fn err<T>(msg: impl Into<String>) -> ScriptResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(Dynamic::from(msg.into()), Position::NONE)))
}

/// Short, quoted description of a value for error messages.
pub fn quote(v: &Dynamic) -> String {
    let s = if v.is_string() { format!("{v:?}") } else { v.to_string() };
    let s = if s.chars().count() > 40 { format!("{}...", s.chars().take(40).collect::<String>()) } else { s };
    format!("{s} ({})", v.type_name())
}

/// A number: an integer or a float.
pub fn to_f64(v: &Dynamic, what: &str) -> ScriptResult<f64> {
    if let Some(f) = v.clone().try_cast::<f64>() {
        Ok(f)
    } else if let Some(i) = v.clone().try_cast::<i64>() {
        Ok(i as f64)
    } else {
        err(format!("{what}: expected a number, got {}", quote(v)))
    }
}

/// A non-negative integer index or count.
pub fn to_usize(v: &Dynamic, what: &str) -> ScriptResult<usize> {
    match v.clone().try_cast::<i64>() {
        Some(i) if i >= 0 => Ok(i as usize),
        _ => err(format!("{what}: expected a non-negative integer, got {}", quote(v))),
    }
}

pub fn to_f64_vec(a: &Array, what: &str) -> ScriptResult<Vec<f64>> {
    a.iter().enumerate().map(|(i, v)| to_f64(v, &format!("{what}[{i}]"))).collect()
}

/// A rectangular matrix (array of arrays of numbers).
pub fn to_matrix(a: &Array, what: &str) -> ScriptResult<Vec<Vec<f64>>> {
    let mut rows = Vec::with_capacity(a.len());
    for (i, row) in a.iter().enumerate() {
        let Some(r) = row.clone().try_cast::<Array>() else {
            return err(format!("{what}[{i}]: expected an array (a matrix row), got {}", quote(row)));
        };
        let r = to_f64_vec(&r, &format!("{what}[{i}]"))?;
        if let Some(first) = rows.first().map(|f: &Vec<f64>| f.len()) {
            if r.len() != first {
                return err(format!("{what}[{i}]: row has {} values but row 0 has {first}", r.len()));
            }
        }
        rows.push(r);
    }
    Ok(rows)
}

/// Strings from an array; numbers and other values are shown with their display form.
pub fn to_labels(a: &Array) -> Vec<String> {
    a.iter()
        .map(|v| if v.is_string() { v.clone().cast::<rhai::ImmutableString>().to_string() } else { v.to_string() })
        .collect()
}

/// A JSON value as a script value of the same type: integers stay `int`, other numbers
/// `float`, lists arrays, objects maps (typed option echoes, JSON read back).
pub fn json_value(v: &serde_json::Value) -> Dynamic {
    use serde_json::Value as V;
    match v {
        V::Null => Dynamic::UNIT,
        V::Bool(b) => Dynamic::from(*b),
        V::Number(n) => match n.as_i64() {
            Some(i) => Dynamic::from(i),
            None => Dynamic::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        V::String(s) => Dynamic::from(s.clone()),
        V::Array(a) => Dynamic::from(a.iter().map(json_value).collect::<Array>()),
        V::Object(o) => Dynamic::from(o.iter().map(|(k, v)| (k.as_str().into(), json_value(v))).collect::<Map>()),
    }
}

/// A script value as JSON (the inverse of [`json_value`] for what it produces): unit is null,
/// NaN and infinities are null, other values without a JSON form their display text.
pub fn dynamic_json(v: &Dynamic) -> serde_json::Value {
    use serde_json::Value as V;
    if v.is_unit() {
        V::Null
    } else if let Ok(b) = v.as_bool() {
        V::Bool(b)
    } else if let Ok(i) = v.as_int() {
        V::from(i)
    } else if let Ok(f) = v.as_float() {
        json_f64(f)
    } else if v.is_string() {
        V::String(v.to_string())
    } else if let Some(a) = v.clone().try_cast::<Array>() {
        V::Array(a.iter().map(dynamic_json).collect())
    } else if let Some(m) = v.clone().try_cast::<Map>() {
        V::Object(m.iter().map(|(k, v)| (k.to_string(), dynamic_json(v))).collect())
    } else {
        V::String(v.to_string())
    }
}

/// Echoed options as a script map, every value keeping its type.
pub fn echo_map(echo: &[(String, serde_json::Value)]) -> Map {
    echo.iter().map(|(k, v)| (k.as_str().into(), json_value(v))).collect()
}

/// A float as a JSON number (NaN and infinities, which JSON cannot hold, as null).
pub fn json_f64(x: f64) -> serde_json::Value {
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// A core error as a script error (its message already names what is at fault): `.script()?`
/// where a script function meets a `ModelError` (the core does not know the script's error type).
pub trait ScriptErr<T> {
    fn script(self) -> ScriptResult<T>;
}
impl<T, E: std::fmt::Display> ScriptErr<T> for Result<T, E> {
    fn script(self) -> ScriptResult<T> {
        self.or_else(|e| err(e.to_string()))
    }
}

// An option's spec (name, typed default, help) is the core's (`headscope_core::optspec`): the
// option structs' defaults read the same constants this layer checks maps against.
pub use headscope_core::optspec::*;

/// An option map checked against the keys a function accepts; getters convert types once,
/// and the `*_or_default` getters fall back on the default in the function's `OptSpec`.
pub struct Opts<'a> {
    map: &'a Map,
    func: &'static str,
    specs: &'a [OptSpec],
}

impl<'a> Opts<'a> {
    /// Fails on any key not in `allowed`, naming it and listing the valid ones.
    pub fn new(map: &'a Map, func: &'static str, allowed: &'a [OptSpec]) -> ScriptResult<Self> {
        for k in map.keys() {
            if !allowed.iter().any(|o| o.name == k.as_str()) {
                let names: Vec<&str> = allowed.iter().map(|o| o.name).collect();
                let near =
                    crate::suggest::did_you_mean(k, names.iter().copied()).map(|h| format!("{h} ")).unwrap_or_default();
                return err(format!("{func}: unknown option '{k}' ({near}valid options: {})", names.join(", ")));
            }
        }
        Ok(Opts { map, func, specs: allowed })
    }
    /// The function these options belong to, as the user called it (for error messages).
    pub fn func(&self) -> &'static str {
        self.func
    }
    /// Whether the option was given (a unit value counts as not given).
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
    /// The option's value as given, if it was.
    pub fn value(&self, key: &str) -> Option<&'a Dynamic> {
        self.get(key)
    }
    fn get(&self, key: &str) -> Option<&'a Dynamic> {
        self.map.get(key).filter(|v| !v.is_unit())
    }
    /// The default the spec gives `key`; a getter asking for a type the spec does not hold
    /// is a bug of the function, reported as such rather than guessed.
    fn default_of(&self, key: &str) -> ScriptResult<OptDefault> {
        match self.specs.iter().find(|o| o.name == key) {
            Some(o) => Ok(o.default),
            None => err(format!("{}: option '{key}' is not in its option list (a bug of headscope)", self.func)),
        }
    }
    fn no_default<T>(&self, key: &str, what: &str) -> ScriptResult<T> {
        err(format!("{}: option '{key}' has no {what} default in its option list (a bug of headscope)", self.func))
    }
    pub fn f64(&self, key: &str) -> ScriptResult<Option<f64>> {
        self.get(key).map(|v| to_f64(v, &format!("{}: option '{key}'", self.func))).transpose()
    }
    pub fn usize(&self, key: &str) -> ScriptResult<Option<usize>> {
        self.get(key).map(|v| to_usize(v, &format!("{}: option '{key}'", self.func))).transpose()
    }
    pub fn bool(&self, key: &str) -> ScriptResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_bool() {
                Ok(b) => Ok(Some(b)),
                Err(_) => err(format!("{}: option '{key}' must be true or false, got {}", self.func, quote(v))),
            },
        }
    }
    pub fn string(&self, key: &str) -> ScriptResult<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.is_string() => Ok(Some(v.clone().cast::<rhai::ImmutableString>().to_string())),
            Some(v) => err(format!("{}: option '{key}' must be a string, got {}", self.func, quote(v))),
        }
    }
    /// An array of strings (every item a string); one string is read as an array of it.
    pub fn strings(&self, key: &str) -> ScriptResult<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.is_string() => Ok(Some(vec![v.clone().cast::<rhai::ImmutableString>().to_string()])),
            Some(v) => {
                let Some(a) = v.clone().try_cast::<Array>() else {
                    return err(format!("{}: option '{key}' must be an array of strings, got {}", self.func, quote(v)));
                };
                a.iter()
                    .enumerate()
                    .map(|(i, x)| {
                        if x.is_string() {
                            Ok(x.clone().cast::<rhai::ImmutableString>().to_string())
                        } else {
                            err(format!("{}: option '{key}'[{i}] must be a string, got {}", self.func, quote(x)))
                        }
                    })
                    .collect::<ScriptResult<_>>()
                    .map(Some)
            }
        }
    }
    /// Non-negative integers: one, an array of them, or a range (`0..6`, `20..=29`).
    pub fn indices(&self, key: &str) -> ScriptResult<Option<Vec<usize>>> {
        let what = format!("{}: option '{key}'", self.func);
        let Some(v) = self.get(key) else { return Ok(None) };
        if let Some(r) = v.clone().try_cast::<std::ops::Range<rhai::INT>>() {
            return r.map(|i| to_usize(&Dynamic::from(i), &what)).collect::<ScriptResult<_>>().map(Some);
        }
        if let Some(r) = v.clone().try_cast::<std::ops::RangeInclusive<rhai::INT>>() {
            return r.map(|i| to_usize(&Dynamic::from(i), &what)).collect::<ScriptResult<_>>().map(Some);
        }
        if let Some(a) = v.clone().try_cast::<Array>() {
            return a
                .iter()
                .enumerate()
                .map(|(i, x)| match x.as_int() {
                    Ok(_) => to_usize(x, &format!("{what}[{i}]")),
                    Err(_) => err(format!("{what}[{i}] must be an integer, got {}", quote(x))),
                })
                .collect::<ScriptResult<_>>()
                .map(Some);
        }
        match v.as_int() {
            Ok(_) => Ok(Some(vec![to_usize(v, &what)?])),
            Err(_) => err(format!("{what} must be an integer, an array of integers or a range, got {}", quote(v))),
        }
    }
    pub fn labels(&self, key: &str) -> ScriptResult<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.clone().try_cast::<Array>() {
                Some(a) => Ok(Some(to_labels(&a))),
                None => err(format!("{}: option '{key}' must be an array of labels, got {}", self.func, quote(v))),
            },
        }
    }
    pub fn numbers(&self, key: &str) -> ScriptResult<Option<Vec<f64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.clone().try_cast::<Array>() {
                Some(a) => Ok(Some(to_f64_vec(&a, &format!("{}: option '{key}'", self.func))?)),
                None => err(format!("{}: option '{key}' must be an array of numbers, got {}", self.func, quote(v))),
            },
        }
    }
    /// The integer given, else the spec's default (an `IntBy` default follows its option).
    pub fn usize_or_default(&self, key: &str) -> ScriptResult<usize> {
        if let Some(x) = self.usize(key)? {
            return Ok(x);
        }
        match self.default_of(key)? {
            OptDefault::Int(i) if i >= 0 => Ok(i as usize),
            OptDefault::IntBy(by, pairs) => {
                let chosen = self.string(by)?;
                let pair = match &chosen {
                    None => pairs.first(),
                    Some(c) => pairs.iter().find(|(v, _)| v == c),
                };
                match pair {
                    Some((_, i)) if *i >= 0 => Ok(*i as usize),
                    _ => self.no_default(key, &format!("integer (for {by} {chosen:?})")),
                }
            }
            _ => self.no_default(key, "integer"),
        }
    }
    /// The number given, else the spec's default.
    pub fn f64_or_default(&self, key: &str) -> ScriptResult<f64> {
        if let Some(x) = self.f64(key)? {
            return Ok(x);
        }
        match self.default_of(key)? {
            OptDefault::Float(x) => Ok(x),
            OptDefault::Int(i) => Ok(i as f64),
            _ => self.no_default(key, "number"),
        }
    }
    /// The boolean given, else the spec's default.
    pub fn bool_or_default(&self, key: &str) -> ScriptResult<bool> {
        if let Some(x) = self.bool(key)? {
            return Ok(x);
        }
        match self.default_of(key)? {
            OptDefault::Bool(b) => Ok(b),
            _ => self.no_default(key, "boolean"),
        }
    }
    /// The string given, else the spec's default.
    pub fn string_or_default(&self, key: &str) -> ScriptResult<String> {
        if let Some(x) = self.string(key)? {
            return Ok(x);
        }
        match self.default_of(key)? {
            OptDefault::Str(s) => Ok(s.to_string()),
            _ => self.no_default(key, "string"),
        }
    }
    /// The strings given, else the spec's default.
    pub fn strings_or_default(&self, key: &str) -> ScriptResult<Vec<String>> {
        if let Some(x) = self.strings(key)? {
            return Ok(x);
        }
        match self.default_of(key)? {
            OptDefault::Strs(a) => Ok(a.iter().map(|s| s.to_string()).collect()),
            _ => self.no_default(key, "array of strings"),
        }
    }
    /// A string option parsed into a typed value (an `options_enum!` or any `FromStr` whose
    /// error is a sentence), else the spec's default parsed alike; errors name the function.
    pub fn parsed_or_default<T: std::str::FromStr<Err = String>>(&self, key: &str) -> ScriptResult<T> {
        self.string_or_default(key)?.parse().or_else(|e: String| err(format!("{}: {e}", self.func)))
    }
}

/// The one JSON writer of results: pretty JSON, written atomically; `func` names the script
/// function in the error. Here, below grids and tables, so both write through it.
pub fn write_json(path: &str, value: &serde_json::Value, func: &str) -> ScriptResult<()> {
    let s = serde_json::to_string_pretty(value).unwrap_or_default();
    crate::files::write_atomic(std::path::Path::new(path), s.as_bytes())
        .or_else(|e| err(format!("{func}: cannot write '{path}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(e: Box<EvalAltResult>) -> String {
        e.to_string()
    }

    #[test]
    fn integers_are_accepted_as_floats() {
        assert_eq!(to_f64(&Dynamic::from(3_i64), "x").unwrap(), 3.0);
        assert_eq!(to_f64(&Dynamic::from(0.5_f64), "x").unwrap(), 0.5);
        let e = msg(to_f64(&Dynamic::from("a"), "vmin").unwrap_err());
        assert!(e.contains("vmin") && e.contains("\"a\""), "{e}");
    }

    #[test]
    fn ragged_matrix_names_the_row() {
        let m: Array = vec![
            Dynamic::from(vec![Dynamic::from(1_i64), Dynamic::from(2_i64)]),
            Dynamic::from(vec![Dynamic::from(1_i64)]),
        ];
        let e = msg(to_matrix(&m, "values").unwrap_err());
        assert!(e.contains("values[1]") && e.contains("row 0 has 2"), "{e}");
    }

    #[test]
    fn unknown_option_is_named_with_valid_ones() {
        let mut m = Map::new();
        m.insert("titel".into(), Dynamic::from("x"));
        let e = msg(Opts::new(&m, "heatmap", &[opt("title", "", ""), opt("rows", "", "")]).err().unwrap());
        assert!(e.contains("unknown option 'titel'") && e.contains("title, rows"), "{e}");
        assert!(e.contains("did you mean 'title'?") && e.lines().count() == 1, "{e}");
        let mut far = Map::new();
        far.insert("zzzz".into(), Dynamic::from("x"));
        let e = msg(Opts::new(&far, "heatmap", &[opt("title", "", "")]).err().unwrap());
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn one_string_is_read_as_an_array_of_it() {
        let mut m = Map::new();
        m.insert("kinds".into(), Dynamic::from("enc"));
        m.insert("relations".into(), Dynamic::from(vec![Dynamic::from("nsubj"), Dynamic::from(1_i64)]));
        let o = Opts::new(&m, "f", SPECS).unwrap();
        assert_eq!(o.strings("kinds").unwrap(), Some(vec!["enc".to_string()]));
        // The same checks as an array's: a non-string item is named.
        let e = msg(o.strings("relations").unwrap_err());
        assert!(e.contains("option 'relations'[1] must be a string"), "{e}");
        let mut n = Map::new();
        n.insert("kinds".into(), Dynamic::from(3_i64));
        let e = msg(Opts::new(&n, "f", SPECS).unwrap().strings("kinds").unwrap_err());
        assert!(e.contains("option 'kinds' must be an array of strings, got 3"), "{e}");
    }

    const SPECS: &[OptSpec] = &[
        opt_int("batch_tokens", 1024, ""),
        opt_f64("margin", 0.1, ""),
        opt_bool("exact", false, ""),
        opt_str("metric", "loss", ""),
        opt_strs("relations", &["nsubj", "dobj"], ""),
        opt_str("seeds", "each", ""),
        opt_int_by("bt", "seeds", &[("each", 64), ("summed", 256)], ""),
        opt("kinds", "every kind", ""),
    ];

    #[test]
    fn defaults_come_from_the_spec_and_given_values_win() {
        let empty = Map::new();
        let o = Opts::new(&empty, "f", SPECS).unwrap();
        assert_eq!(o.usize_or_default("batch_tokens").unwrap(), 1024);
        assert_eq!(o.f64_or_default("margin").unwrap(), 0.1);
        assert!(!o.bool_or_default("exact").unwrap());
        assert_eq!(o.string_or_default("metric").unwrap(), "loss");
        assert_eq!(o.strings_or_default("relations").unwrap(), ["nsubj", "dobj"]);
        assert_eq!(o.usize_or_default("bt").unwrap(), 64);
        // A getter of the wrong type, or an option the list lacks, is a bug named as such.
        assert!(msg(o.usize_or_default("kinds").unwrap_err()).contains("f: option 'kinds' has no integer default"));
        assert!(msg(o.usize_or_default("nope").unwrap_err()).contains("not in its option list"));
        let mut m = Map::new();
        m.insert("batch_tokens".into(), Dynamic::from(7_i64));
        m.insert("seeds".into(), Dynamic::from("summed"));
        m.insert("relations".into(), Dynamic::from(vec![Dynamic::from("amod"), Dynamic::from(3_i64)]));
        let o = Opts::new(&m, "f", SPECS).unwrap();
        assert_eq!(o.usize_or_default("batch_tokens").unwrap(), 7);
        assert_eq!(o.usize_or_default("bt").unwrap(), 256);
        assert_eq!(
            msg(o.strings_or_default("relations").unwrap_err()),
            "Runtime error: f: option 'relations'[1] must be a string, got 3 (i64)"
        );
    }

    #[test]
    fn defaults_show_as_a_person_reads_them() {
        let shown: Vec<String> = SPECS.iter().map(|o| o.default.to_string()).collect();
        assert_eq!(
            shown,
            [
                "1024",
                "0.1",
                "false",
                "\"loss\"",
                "[\"nsubj\", \"dobj\"]",
                "\"each\"",
                "64 (seeds \"each\"), 256 (seeds \"summed\")",
                "every kind"
            ]
        );
        assert_eq!(SPECS[3].default.json(), Some(serde_json::json!("loss")));
        assert_eq!(SPECS[7].default.json(), None);
    }
}

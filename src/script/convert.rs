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
    a.iter().map(|v| if v.is_string() { v.clone().cast::<rhai::ImmutableString>().to_string() } else { v.to_string() }).collect()
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

/// One option a script function accepts: its name, its default as a person reads it, and
/// what it does. The lists beside each function drive the check of option maps, `:help`
/// and completion inside `#{...}` (one list, so they cannot disagree).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// Shorthand for an [`OptSpec`] in a `const` list.
pub const fn opt(name: &'static str, default: &'static str, help: &'static str) -> OptSpec {
    OptSpec { name, default, help }
}

/// An option map checked against the keys a function accepts; getters convert types once.
pub struct Opts<'a> {
    map: &'a Map,
    func: &'static str,
}

impl<'a> Opts<'a> {
    /// Fails on any key not in `allowed`, naming it and listing the valid ones.
    pub fn new(map: &'a Map, func: &'static str, allowed: &[OptSpec]) -> ScriptResult<Self> {
        for k in map.keys() {
            if !allowed.iter().any(|o| o.name == k.as_str()) {
                let names: Vec<&str> = allowed.iter().map(|o| o.name).collect();
                return err(format!("{func}: unknown option '{k}' (valid options: {})", names.join(", ")));
            }
        }
        Ok(Opts { map, func })
    }
    fn get(&self, key: &str) -> Option<&Dynamic> {
        self.map.get(key).filter(|v| !v.is_unit())
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
    }
}

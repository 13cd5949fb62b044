//! Options declared once: each function's options are a list of [`OptSpec`]s (name, typed
//! default, help). The script layer checks option maps against the list, falls back on its
//! defaults and shows them in `:help`; the typed option structs of the core (`LrpOptions`,
//! `SweepOptions`, ...) take their `Default` from the same constants, read in `const` items
//! with the accessors below, so a default of the wrong type is a compile error and no
//! default is ever parsed from a script value.

/// The default of an option, in one place: typed where the value is fixed (the getters
/// `*_or_default` read it, `:help` shows it, results echo it), as text where it is worked out
/// when the function runs (from the model, the data or another option).
#[derive(Debug, Clone, Copy)]
pub enum OptDefault {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(&'static str),
    Strs(&'static [&'static str]),
    /// An integer chosen by the string value of another option: `(option, [(value, default)])`,
    /// the first pair when that option is not given.
    IntBy(&'static str, &'static [(&'static str, i64)]),
    /// Worked out when the function runs; the text says how ("" for none).
    Text(&'static str),
    /// Kept beside another type (thresholds per head type): shown by this function.
    Shown(fn() -> String),
}

impl std::fmt::Display for OptDefault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptDefault::Int(i) => write!(f, "{i}"),
            OptDefault::Float(x) => write!(f, "{x}"),
            OptDefault::Bool(b) => write!(f, "{b}"),
            OptDefault::Str(s) => write!(f, "{s:?}"),
            OptDefault::Strs(a) => write!(f, "[{}]", a.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")),
            OptDefault::IntBy(by, pairs) => {
                write!(f, "{}", pairs.iter().map(|(v, i)| format!("{i} ({by} {v:?})")).collect::<Vec<_>>().join(", "))
            }
            OptDefault::Text(t) => write!(f, "{t}"),
            OptDefault::Shown(g) => write!(f, "{}", g()),
        }
    }
}

impl OptDefault {
    /// The value as results echo it, where it is fixed.
    pub fn json(&self) -> Option<serde_json::Value> {
        use serde_json::json;
        match self {
            OptDefault::Int(i) => Some(json!(i)),
            OptDefault::Float(x) => Some(json!(x)),
            OptDefault::Bool(b) => Some(json!(b)),
            OptDefault::Str(s) => Some(json!(s)),
            OptDefault::Strs(a) => Some(json!(a)),
            OptDefault::IntBy(..) | OptDefault::Text(_) | OptDefault::Shown(_) => None,
        }
    }
}

/// One option a script function accepts: its name, its default, and what it does. The lists
/// beside each function drive the check of option maps, the defaults the getters fall back
/// on, `:help` and completion inside `#{...}` (one list, so they cannot disagree).
#[derive(Debug, Clone, Copy)]
pub struct OptSpec {
    pub name: &'static str,
    pub default: OptDefault,
    pub help: &'static str,
}

/// An option whose default is worked out when the function runs (`default` says how).
pub const fn opt(name: &'static str, default: &'static str, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Text(default), help }
}
/// An option with an integer default.
pub const fn opt_int(name: &'static str, default: i64, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Int(default), help }
}
/// An option with a number default.
pub const fn opt_f64(name: &'static str, default: f64, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Float(default), help }
}
/// An option with a boolean default.
pub const fn opt_bool(name: &'static str, default: bool, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Bool(default), help }
}
/// An option with a string default.
pub const fn opt_str(name: &'static str, default: &'static str, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Str(default), help }
}
/// An option with a default array of strings.
pub const fn opt_strs(name: &'static str, default: &'static [&'static str], help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Strs(default), help }
}
/// An option with a default shown by `shown` (kept beside another type).
pub const fn opt_shown(name: &'static str, shown: fn() -> String, help: &'static str) -> OptSpec {
    OptSpec { name, default: OptDefault::Shown(shown), help }
}
/// An integer option whose default depends on the string value of option `by`.
pub const fn opt_int_by(
    name: &'static str,
    by: &'static str,
    defaults: &'static [(&'static str, i64)],
    help: &'static str,
) -> OptSpec {
    OptSpec { name, default: OptDefault::IntBy(by, defaults), help }
}

impl OptDefault {
    /// An integer default, for `const` items: `const B: i64 = BATCH.default.int();` (a default
    /// of another type fails to compile).
    pub const fn int(&self) -> i64 {
        match *self {
            OptDefault::Int(i) => i,
            _ => panic!("this option's default is not an integer"),
        }
    }
    /// A number default, for `const` items.
    pub const fn float(&self) -> f64 {
        match *self {
            OptDefault::Float(x) => x,
            _ => panic!("this option's default is not a number"),
        }
    }
    /// A boolean default, for `const` items.
    pub const fn bool(&self) -> bool {
        match *self {
            OptDefault::Bool(b) => b,
            _ => panic!("this option's default is not a boolean"),
        }
    }
    /// A string default, for `const` items.
    pub const fn str(&self) -> &'static str {
        match *self {
            OptDefault::Str(s) => s,
            _ => panic!("this option's default is not a string"),
        }
    }
    /// A default array of strings, for `const` items.
    pub const fn strs(&self) -> &'static [&'static str] {
        match *self {
            OptDefault::Strs(a) => a,
            _ => panic!("this option's default is not an array of strings"),
        }
    }
    /// The integer default an `IntBy` default gives when its option is `value`, for `const`
    /// items (a value it does not list fails to compile).
    pub const fn int_by(&self, value: &str) -> i64 {
        match *self {
            OptDefault::IntBy(_, pairs) => {
                let mut i = 0;
                while i < pairs.len() {
                    if str_eq(pairs[i].0, value) {
                        return pairs[i].1;
                    }
                    i += 1;
                }
                panic!("this option's default lists no such value")
            }
            _ => panic!("this option's default does not follow another option"),
        }
    }
}

/// Whether two strings are equal, in `const` items.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn const_accessors_read_typed_defaults() {
        const B: OptSpec = opt_int_by("batch_tokens", "seeds", &[("each", 64), ("summed", 256)], "");
        const EACH: i64 = B.default.int_by("each");
        const SUMMED: i64 = B.default.int_by("summed");
        assert_eq!((EACH, SUMMED), (64, 256));
        const S: &str = opt_str("rule", "ab", "").default.str();
        assert_eq!(S, "ab");
        assert_eq!(opt_int("n", 3, "").default.int(), 3);
        assert!(std::panic::catch_unwind(|| opt_int("n", 3, "").default.str()).is_err());
    }
}

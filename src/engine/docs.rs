//! Function documentation from the engine's metadata (doc comments of registered functions and
//! of stdlib modules): for `:help NAME`, completion, the kernel's inspect, and the test that
//! runs every documented example.

use super::resolver::STDLIB;
use rhai::Engine;
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub struct FnDoc {
    /// Name as called: `table`, or `stats::mean` for stdlib modules.
    pub name: String,
    pub signature: String,
    /// Doc text without comment markers.
    pub doc: String,
    /// The script type this is a method or property of (`Model`), if any.
    pub receiver: Option<String>,
}

impl FnDoc {
    /// The first sentence line of the doc (what `:help TYPE` lists).
    pub fn summary(&self) -> String {
        let first = self.doc.split("\n\n").next().unwrap_or_default().replace('\n', " ");
        // The first sentence: a period before a space, not one of an abbreviation.
        let end = first
            .match_indices(". ")
            .map(|(i, _)| i)
            .find(|&i| !["et al", "e.g", "i.e", "cf", "vs"].iter().any(|a| first[..i].ends_with(a)));
        let s = end.map_or(first.as_str(), |i| &first[..=i]);
        if s.chars().count() > 110 {
            format!("{}...", s.chars().take(107).collect::<String>())
        } else {
            s.to_string()
        }
    }

    /// Each ```rhai block of the doc. A block fenced ```rhai,error shows an input that must
    /// fail (like rustdoc's should_panic).
    pub fn examples(&self) -> Vec<Example> {
        let mut out = Vec::new();
        let mut cur: Option<String> = None;
        let mut must_fail = false;
        for line in self.doc.lines() {
            let t = line.trim();
            match &mut cur {
                None if t.starts_with("```rhai") => {
                    must_fail = t.trim_start_matches("```rhai").trim_start_matches(',').trim() == "error";
                    cur = Some(String::new());
                }
                Some(code) if t.starts_with("```") => {
                    out.push(Example { code: std::mem::take(code), must_fail });
                    cur = None;
                }
                Some(code) => {
                    code.push_str(line);
                    code.push('\n');
                }
                None => {}
            }
        }
        out
    }
}

/// One documented example.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub code: String,
    /// The example shows an error: running it must fail.
    pub must_fail: bool,
}

fn strip_comment(line: &str) -> String {
    let t = line.trim_start();
    let t = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")).unwrap_or(t);
    t.strip_prefix(' ').unwrap_or(t).to_string()
}

fn join_doc<S: AsRef<str>>(lines: &[S]) -> String {
    lines.iter().flat_map(|l| l.as_ref().lines().map(strip_comment).collect::<Vec<_>>()).collect::<Vec<_>>().join("\n")
}

/// Docs of every function registered by headscope (not Rhai's standard library) and of the
/// stdlib modules' functions, sorted by name. Functions without doc comments (getters'
/// setters, `to_string`) are left out.
pub fn all_docs(engine: &Engine) -> Vec<FnDoc> {
    let mut out = Vec::new();
    if let Ok(json) = engine.gen_fn_metadata_to_json(false) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) {
            let types = custom_types(&v);
            for f in v["functions"].as_array().into_iter().flatten() {
                let comments: Vec<String> = f["docComments"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect();
                if comments.is_empty() {
                    continue;
                }
                let raw = f["name"].as_str().unwrap_or_default();
                let name = raw.strip_prefix("get$").or_else(|| raw.strip_prefix("set$")).unwrap_or(raw).to_string();
                out.push(FnDoc {
                    name,
                    signature: script_signature(f, &types),
                    doc: join_doc(&comments),
                    receiver: receiver(f, &types),
                });
            }
        }
    }
    for (module, text) in STDLIB {
        if let Ok(ast) = engine.compile(text) {
            for f in ast.iter_functions() {
                if f.comments.is_empty() {
                    continue;
                }
                let name = format!("{module}::{}", f.name);
                let signature = format!("{name}({})", f.params.join(", "));
                out.push(FnDoc { name, signature, doc: join_doc(&f.comments), receiver: None });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.signature.cmp(&b.signature)));
    out
}

/// A type as scripts see it: `&mut ScriptModel` -> `Model`, `ScriptResult<f64>` -> `float`,
/// `Dynamic` -> `any`; unit is empty.
fn script_type(t: &str, types: &HashMap<String, String>) -> String {
    let t = t.trim().trim_start_matches("&mut ").trim_start_matches('&').trim();
    for wrapper in ["ScriptResult<", "RhaiResultOf<", "Result<"] {
        if let Some(inner) = t.strip_prefix(wrapper).and_then(|x| x.strip_suffix('>')) {
            let first = inner.split(',').next().unwrap_or(inner);
            return script_type(first, types);
        }
    }
    let last = t.rsplit("::").next().unwrap_or(t);
    match last {
        "()" | "" => String::new(),
        "i64" | "INT" | "usize" | "i32" => "int".into(),
        "f64" | "FLOAT" | "f32" => "float".into(),
        "bool" => "bool".into(),
        "str" | "String" | "ImmutableString" => "string".into(),
        "Array" => "array".into(),
        "Map" => "map".into(),
        "Dynamic" => "any".into(),
        "FnPtr" => "function".into(),
        other => types.get(other).cloned().unwrap_or_else(|| other.to_string()),
    }
}

/// The signature a script writes, from a function's metadata: `m.analyze(data, options) ->
/// Analysis` for a method of a headscope type, `a.heads -> array` for a property, `d[i] ->
/// map` for an index, `heatmap(matrix, options) -> Plot` for a plain function.
fn script_signature(f: &serde_json::Value, types: &HashMap<String, String>) -> String {
    let raw = f["name"].as_str().unwrap_or_default();
    let params: Vec<(String, String)> = f["params"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["name"].as_str().unwrap_or("_").to_string(), p["type"].as_str().unwrap_or_default().to_string()))
        .collect();
    let ret = script_type(f["returnType"].as_str().unwrap_or_default(), types);
    let arrow = if ret.is_empty() { String::new() } else { format!(" -> {ret}") };
    let names = |ps: &[(String, String)]| ps.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
    // Rhai calls a function whose first parameter is `&mut T` as a method of T.
    let method_of = params.first().filter(|(_, t)| t.trim_start().starts_with("&mut"));
    match (raw, method_of) {
        (r, Some((recv, _))) if r.starts_with("get$") => format!("{recv}.{}{arrow}", &r[4..]),
        (r, Some((recv, _))) if r.starts_with("set$") => format!("{recv}.{} = {}", &r[4..], names(&params[1..])),
        ("index$get$", Some((recv, _))) => format!("{recv}[{}]{arrow}", names(&params[1..])),
        ("index$set$", Some((recv, _))) => format!("{recv}[{}] = {}", names(&params[1..2]), names(&params[2..])),
        (r, Some((recv, _))) => format!("{recv}.{r}({}){arrow}", names(&params[1..])),
        (r, None) => format!("{r}({}){arrow}", names(&params)),
    }
}

/// Names the script layer gives core types (`type ScriptModel = View`): function signatures
/// are written with the alias, the registered type carries the core name.
const ALIASES: &[(&str, &str)] = &[("ScriptModel", "View")];

/// Rust type names (last path segment) -> the names scripts see (`ScriptModel` -> `Model`).
fn custom_types(v: &serde_json::Value) -> HashMap<String, String> {
    let mut types: HashMap<String, String> = v["customTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some((t["typeName"].as_str()?.rsplit("::").next()?.to_string(), t["displayName"].as_str()?.to_string()))
        })
        .collect();
    for (alias, core) in ALIASES {
        if let Some(shown) = types.get(*core).cloned() {
            types.insert(alias.to_string(), shown);
        }
    }
    types
}

/// The script type a function is a method of: Rhai calls a function whose first parameter is
/// `&mut T` as a method of T.
fn receiver(f: &serde_json::Value, types: &HashMap<String, String>) -> Option<String> {
    let t = f["params"].as_array()?.first()?["type"].as_str()?;
    t.trim_start().starts_with("&mut").then(|| script_type(t, types)).filter(|t| !t.is_empty())
}

/// The script types headscope registers (`Model`, `Grid`, ...), sorted.
pub fn type_names(engine: &Engine) -> Vec<String> {
    let Ok(json) = engine.gen_fn_metadata_to_json(false) else { return vec![] };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else { return vec![] };
    let mut names: Vec<String> = custom_types(&v).into_values().collect();
    names.sort();
    names.dedup();
    names
}

/// The method and property names of every script type (`Model`, and the built-in `array`,
/// `map`, `string`...), Rhai's standard library included, each list sorted: one pass over
/// the engine's metadata.
pub fn members_by_type(engine: &Engine) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let Ok(json) = engine.gen_fn_metadata_to_json(true) else { return out };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else { return out };
    let types = custom_types(&v);
    for f in v["functions"].as_array().into_iter().flatten() {
        let Some(t) = receiver(f, &types) else { continue };
        let raw = f["name"].as_str().unwrap_or_default();
        let name = raw.strip_prefix("get$").unwrap_or(raw);
        if name.contains('$')
            || !name.starts_with(|c: char| c.is_alphabetic() || c == '_')
            || matches!(name, "to_string" | "to_debug")
        {
            continue;
        }
        out.entry(t).or_default().push(name.to_string());
    }
    for names in out.values_mut() {
        names.sort();
        names.dedup();
    }
    out
}

/// The method and property names of one script type, sorted.
pub fn members(engine: &Engine, type_name: &str) -> Vec<String> {
    members_by_type(engine).remove(type_name).unwrap_or_default()
}

/// The script-facing name of a value's type: `Model`, `array`, `map`, `string`, `int`.
pub fn value_type(engine: &Engine, v: &rhai::Dynamic) -> String {
    match v.type_name() {
        "i64" => "int".into(),
        "f64" => "float".into(),
        "char" => "char".into(),
        t => engine.map_type_name(t).to_string(),
    }
}

/// Docs of all overloads named `name`.
pub fn lookup(engine: &Engine, name: &str) -> Vec<FnDoc> {
    all_docs(engine).into_iter().filter(|d| d.name == name).collect()
}

/// Every function name callable in the engine, standard library included, for completion.
pub fn function_names(engine: &Engine) -> Vec<String> {
    let mut names: Vec<String> = engine
        .gen_fn_signatures(true)
        .into_iter()
        .filter_map(|s| {
            let s = s.strip_prefix("fn ").unwrap_or(&s).to_string();
            let name = s.split('(').next()?.trim().to_string();
            (!name.is_empty() && !name.starts_with(|c: char| !c.is_alphabetic() && c != '_') && !name.contains("$"))
                .then_some(name)
        })
        .collect();
    for (module, text) in STDLIB {
        if let Ok(ast) = engine.compile(text) {
            names.extend(ast.iter_functions().map(|f| format!("{module}::{}", f.name)));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Rhai keywords offered by completion.
pub const KEYWORDS: &[&str] = &[
    "let", "const", "fn", "if", "else", "for", "in", "while", "loop", "break", "continue", "return", "throw", "try",
    "catch", "import", "export", "as", "true", "false", "switch", "do", "until",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_are_extracted_from_fenced_blocks() {
        let d = FnDoc {
            name: "f".into(),
            signature: "f()".into(),
            receiver: None,
            doc: "Does f.\n\n```rhai\nlet x = 1;\nassert(x == 1);\n```\ntext\n```rhai\nf();\n```".into(),
        };
        let ex = d.examples();
        assert_eq!(ex.iter().map(|e| e.code.as_str()).collect::<Vec<_>>(), ["let x = 1;\nassert(x == 1);\n", "f();\n"]);
        assert!(!ex[0].must_fail);
        let bad = FnDoc {
            name: "g".into(),
            signature: "g()".into(),
            receiver: None,
            doc: "```rhai,error\ng(1);\n```".into(),
        };
        assert!(bad.examples()[0].must_fail);
    }

    #[test]
    fn signatures_are_written_as_scripts_call_them() {
        let types: HashMap<String, String> =
            [("ScriptModel", "Model"), ("AnalysisObj", "Analysis"), ("Dataset", "Dataset")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
        let f = |name: &str, params: &[(&str, &str)], ret: &str| {
            let ps: Vec<serde_json::Value> =
                params.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect();
            script_signature(&serde_json::json!({"name": name, "params": ps, "returnType": ret}), &types)
        };
        assert_eq!(
            f(
                "analyze",
                &[("m", "&mut ScriptModel"), ("data", "Dynamic"), ("options", "Map")],
                "ScriptResult<AnalysisObj>"
            ),
            "m.analyze(data, options) -> Analysis"
        );
        assert_eq!(f("get$texts", &[("d", "&mut Dataset")], "Array"), "d.texts -> array");
        assert_eq!(f("index$get$", &[("d", "&mut Dataset"), ("i", "i64")], "ScriptResult<Map>"), "d[i] -> map");
        assert_eq!(
            f("heatmap", &[("matrix", "Array"), ("options", "Map")], "Result<crate::plot::Plot, Box<EvalAltResult>>"),
            "heatmap(matrix, options) -> Plot"
        );
        assert_eq!(f("save", &[("p", "&mut Plot"), ("path", "&str")], "ScriptResult<()>"), "p.save(path)");
    }

    #[test]
    fn comment_markers_are_stripped() {
        assert_eq!(join_doc(&["/// Hello", "///", "///  indented"]), "Hello\n\n indented");
    }
}

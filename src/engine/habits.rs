//! Python habits: an error whose cause is Python written as Rhai gets one `note:` line giving
//! the Rhai form (`{"a": 1}` -> `#{"a": 1}`, `True` -> `true`, `def f(x):` -> `fn f(x) { }`).
//! The habit is found from the tokens around the error's position (what the parser saw there),
//! not by matching one spelling of the line; the notes are listed in `NOTES` (the README's
//! "Coming from Python" table is checked against it by a test).

use super::error::{ErrorKind, ScriptError};

/// One token of a line, with its 1-based character column.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Float,
    /// A quoted string: its quote and how many characters it holds.
    Str(char, usize),
    /// A Python prefixed string (`f"..."`, `f'...'`, `rf"..."`).
    Prefixed,
    Punct(&'static str),
    Other(char),
}

struct Token {
    tok: Tok,
    col: usize,
}

const PUNCT: [&str; 26] = [
    "==", "!=", "<=", ">=", "&&", "||", "=>", "->", "::", "..", "**", "#{", "=", "(", ")", "[", "]", "{", "}", ":",
    ",", ";", "?", "#", "/", ".",
];

/// The tokens of `line` up to a `//` comment.
fn lex(line: &str) -> Vec<Token> {
    let c: Vec<char> = line.chars().collect();
    let (mut i, mut out) = (0, Vec::new());
    while i < c.len() {
        let col = i + 1;
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch == '/' && c.get(i + 1) == Some(&'/') {
            break;
        }
        if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let prefix = matches!(word.to_ascii_lowercase().as_str(), "f" | "rf" | "fr" | "b" | "r");
            if prefix && i < c.len() && (c[i] == '"' || c[i] == '\'') {
                i = skip_string(&c, i).0;
                out.push(Token { tok: Tok::Prefixed, col });
            } else {
                out.push(Token { tok: Tok::Ident(word), col });
            }
            continue;
        }
        if ch.is_ascii_digit() {
            let start = i;
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let float = i + 1 < c.len() && c[i] == '.' && c[i + 1].is_ascii_digit();
            if float {
                i += 1;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                out.push(Token { tok: Tok::Float, col });
            } else {
                let text: String = c[start..i].iter().filter(|x| **x != '_').collect();
                out.push(Token { tok: text.parse().map(Tok::Int).unwrap_or(Tok::Float), col });
            }
            continue;
        }
        if ch == '"' || ch == '\'' || ch == '`' {
            let (end, len) = skip_string(&c, i);
            i = end;
            out.push(Token { tok: Tok::Str(ch, len), col });
            continue;
        }
        let rest: String = c[i..(i + 2).min(c.len())].iter().collect();
        match PUNCT.iter().find(|p| rest.starts_with(**p)) {
            Some(p) => {
                i += p.chars().count();
                out.push(Token { tok: Tok::Punct(p), col });
            }
            None => {
                i += 1;
                out.push(Token { tok: Tok::Other(ch), col });
            }
        }
    }
    out
}

/// The end of the string opening at `c[i]` and the characters it holds (to the line's end
/// where it is not closed).
fn skip_string(c: &[char], i: usize) -> (usize, usize) {
    let q = c[i];
    let (mut j, mut n) = (i + 1, 0);
    while j < c.len() && c[j] != q {
        j += if c[j] == '\\' { 2 } else { 1 };
        n += 1;
    }
    ((j + 1).min(c.len()), n)
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t.map(|t| &t.tok) {
        Some(Tok::Ident(w)) => Some(w.as_str()),
        _ => None,
    }
}

fn punct(t: Option<&Token>, p: &str) -> bool {
    matches!(t.map(|t| &t.tok), Some(Tok::Punct(q)) if *q == p)
}

/// The note for a Python habit behind `e`, raised by `code`.
pub fn note(code: &str, e: &ScriptError) -> Option<String> {
    let line_no = e.location.as_ref().map(|l| l.line).unwrap_or(1);
    let line = e.source_line.clone().or_else(|| code.lines().nth(line_no.saturating_sub(1)).map(str::to_string))?;
    let toks = lex(&line);
    let col = e.location.as_ref().map(|l| l.col).unwrap_or(1);
    // The token under the caret (the last one starting at or before it).
    let at = toks.iter().rposition(|t| t.col <= col).unwrap_or(0);
    match e.kind {
        ErrorKind::Runtime => runtime(&e.message, &toks),
        ErrorKind::Syntax => syntax(&e.message, &toks, at),
        _ => None,
    }
}

fn runtime(message: &str, toks: &[Token]) -> Option<String> {
    if let Some(name) = message.strip_prefix("Variable not found: ").map(str::trim) {
        return match name {
            "True" | "False" => Some(format!("Rhai's booleans are lower case: `{}`", name.to_lowercase())),
            "None" => Some("Rhai's None is `()` (unit): `x == ()` tests for it".into()),
            _ if ident(toks.first()) == Some("import") && ident(toks.get(1)) == Some(name) => {
                Some(format!("a module is imported by its path as a string: `import \"{name}\" as {name};`"))
            }
            _ => None,
        };
    }
    let rest = message.strip_prefix("Function not found: ")?;
    let name = rest.split([' ', '(']).next().unwrap_or_default();
    let args = rest.split_once('(').map(|(_, a)| a.trim_end_matches(')')).unwrap_or_default();
    // Rhai's names for a string argument: `string`, or `&str | ImmutableString | String`.
    let first = args.split(',').next().unwrap_or_default();
    let string = first.contains("str") || first.contains("String");
    Some(match name {
        "range" => "ranges are `0..n` (`for i in 0..n { ... }`; `0..=n` includes n)".into(),
        "str" => "`x.to_string()`, or a backtick string: `` `${x}` ``".into(),
        "int" if string => "`parse_int(s)`".into(),
        "int" => "`x.to_int()`".into(),
        "float" if string => "`parse_float(s)`".into(),
        "float" => "`x.to_float()`".into(),
        "enumerate" => "`for (x, i) in array { ... }` gives each item and its index".into(),
        "append" => "`a.push(x)` adds an item to an array".into(),
        "isinstance" | "type" => "`type_of(x)` names a value's type".into(),
        _ => return None,
    })
}

fn syntax(message: &str, toks: &[Token], at: usize) -> Option<String> {
    let here = toks.get(at);
    let before = at.checked_sub(1).and_then(|i| toks.get(i));
    // `x?` (IPython's help).
    if punct(here, "?") {
        if let Some(name) = ident(before) {
            return Some(format!("help is `:help {name}` (`{name}?` is IPython's)"));
        }
    }
    if punct(toks.first(), "#") && !punct(toks.get(1), "{") {
        return Some("comments start with `//` (`#{` begins a map)".into());
    }
    if let Some(i) = toks.iter().position(|t| matches!(&t.tok, Tok::Ident(w) if w == "def")) {
        if i == 0 || punct(toks.get(i - 1), ";") {
            return Some(
                "functions are `fn name(x) { ... }`: the last expression is the value (`return x;` works too)".into(),
            );
        }
    }
    if toks[..=at.min(toks.len().saturating_sub(1))].iter().any(|t| matches!(&t.tok, Tok::Ident(w) if w == "lambda")) {
        return Some("closures are `|x| x + 1`".into());
    }
    for t in [here, before] {
        match ident(t) {
            Some("elif") => return Some("`elif` is `else if` in Rhai".into()),
            Some(w @ ("and" | "or" | "not")) => {
                let op = match w {
                    "and" => "&&",
                    "or" => "||",
                    _ => "!",
                };
                return Some(format!("`{w}` is `{op}` in Rhai (`&&`, `||`, `!`)"));
            }
            _ => {}
        }
    }
    if toks.iter().any(|t| t.tok == Tok::Prefixed) {
        return Some("interpolation is a backtick string: `` `value ${x}` ``".into());
    }
    if toks.iter().any(|t| matches!(t.tok, Tok::Str('\'', n) if n != 1)) {
        return Some("strings are in double quotes (`\"abc\"`) or backticks; single quotes hold one character".into());
    }
    // A keyword argument: `name=` inside a call's parentheses.
    if punct(here, "=") {
        if let Some(k) = ident(before) {
            let depth: i32 = toks[..at]
                .iter()
                .map(|t| match t.tok {
                    Tok::Punct("(") => 1,
                    Tok::Punct(")") => -1,
                    _ => 0,
                })
                .sum();
            if depth > 0 {
                return Some(format!("options are a map as the last argument: `f(x, #{{{k}: ...}})`"));
            }
        }
    }
    // `{key: value}` where a map was meant.
    for (i, t) in toks.iter().enumerate() {
        if punct(Some(t), "{")
            && matches!(toks.get(i + 1).map(|t| &t.tok), Some(Tok::Str(..) | Tok::Ident(_)))
            && punct(toks.get(i + 2), ":")
        {
            return Some("a map is `#{\"a\": 1}` (or `#{a: 1}`); `{ ... }` is a block".into());
        }
    }
    // `x[a:b]`.
    if punct(here, ":") {
        let open = toks[..at].iter().rposition(|t| punct(Some(t), "["));
        let close = toks[..at].iter().rposition(|t| punct(Some(t), "]"));
        if open.is_some() && open > close {
            return Some("a slice is `x.extract(a..b)`".into());
        }
        if message.contains("Expecting '{'") || message.contains("terminate this statement") {
            return Some(
                "blocks are braces, not `:`: `for i in 0..3 { print(i) }`, `if x { ... } else { ... }`".into(),
            );
        }
    }
    None
}

/// A note for an input that ran but divides two integer literals unevenly (`7 / 2` is 3).
pub fn integer_division(code: &str) -> Option<String> {
    for line in code.lines() {
        let toks = lex(line);
        for w in toks.windows(3) {
            if let (Tok::Int(a), Tok::Punct("/"), Tok::Int(b)) = (&w[0].tok, &w[1].tok, &w[2].tok) {
                if *b != 0 && a % b != 0 {
                    return Some(format!(
                        "`{a} / {b}` divides integers ({}); `{a}.0 / {b}` is {}",
                        a / b,
                        *a as f64 / *b as f64
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::error::Location;

    fn syntax_at(line: &str, col: usize, message: &str) -> Option<String> {
        let e = ScriptError {
            kind: ErrorKind::Syntax,
            message: message.into(),
            location: Some(Location { source: "t".into(), line: 1, col }),
            source_line: Some(line.into()),
            notes: vec![],
        };
        note(line, &e)
    }

    #[test]
    fn the_lexer_sees_strings_numbers_and_prefixes() {
        let t = lex(r#"f"{x}" 'ab' "a\"b" 7 / 2.5 #{a: 1} // c"#);
        let kinds: Vec<Tok> = t.into_iter().map(|t| t.tok).collect();
        assert_eq!(
            kinds,
            vec![
                Tok::Prefixed,
                Tok::Str('\'', 2),
                Tok::Str('"', 3),
                Tok::Int(7),
                Tok::Punct("/"),
                Tok::Float,
                Tok::Punct("#{"),
                Tok::Ident("a".into()),
                Tok::Punct(":"),
                Tok::Int(1),
                Tok::Punct("}"),
            ]
        );
    }

    #[test]
    fn a_rhai_line_gets_no_note() {
        assert_eq!(syntax_at("let m = #{a: 1}; m.a ++", 22, "Unknown operator"), None);
        assert_eq!(integer_division("let x = 8 / 2; 7.0 / 2"), None);
        assert!(integer_division("7 / 2").unwrap().contains("3.5"));
    }
}

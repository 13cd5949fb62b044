//! Completion and inspection that know the session's values, shared by the REPL (Tab) and
//! the kernel (`complete_request`, `inspect_request`). What is before the cursor decides the
//! context, read by a small scanner (strings, comments and brackets), never by evaluating:
//!
//! - `m.an|`: the methods and properties of the type of the value `m` holds (and a map's keys);
//! - `r["e|`: the keys the value is indexed by (a grid's or analysis' kinds, a map's keys);
//! - `m.analyze(d, #{st|`: the option names that function accepts (not yet in the map);
//! - `:he|`: the `:` commands; otherwise functions, variables and keywords.

use super::{commands, docs, registry, Session};

/// One candidate: what a menu shows and what replaces the text from `Completion::start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub display: String,
    pub replacement: String,
}

/// Candidates for the text from byte `start` to the cursor.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    pub start: usize,
    pub candidates: Vec<Candidate>,
}

/// What the text before the cursor is in the middle of.
#[derive(Debug, Clone, PartialEq)]
pub enum Context<'a> {
    /// `receiver.partial`
    Member { receiver: &'a str, partial: &'a str },
    /// `receiver["partial`
    Index { receiver: &'a str, partial: &'a str },
    /// `func(..., #{key: 1, partial` — the keys already given are listed.
    /// `method`: the call is `x.func(...)` (a method's own options come first).
    OptionKey { func: &'a str, method: bool, partial: &'a str, given: Vec<&'a str> },
    /// A `:` command.
    Command(&'a str),
    /// A plain identifier (possibly `module::name`).
    Word(&'a str),
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifier ending at byte `end` of `s`: (start, identifier).
fn ident_before(s: &str, end: usize) -> (usize, &str) {
    let start = s[..end].char_indices().rev().take_while(|(_, c)| is_ident(*c)).last().map_or(end, |(i, _)| i);
    (start, &s[start..end])
}

/// An open bracket in the scanned text.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Paren(usize),
    Bracket(usize),
    Brace,
    /// `#{`, at the byte of its `{`.
    Map(usize),
}

/// Scans `s` for the brackets still open at its end, skipping strings and comments. Returns
/// `None` when the end is inside a string or comment (nothing to complete there, except an
/// index key, which the caller checks first).
fn open_brackets(s: &str) -> Option<Vec<Open>> {
    let b = s.as_bytes();
    let mut stack = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => match s[i..].find('\n') {
                Some(n) => i += n,
                None => return None,
            },
            b'/' if b.get(i + 1) == Some(&b'*') => match s[i + 2..].find("*/") {
                Some(n) => i += n + 3,
                None => return None,
            },
            q @ (b'"' | b'`' | b'\'') => {
                let mut j = i + 1;
                loop {
                    match b.get(j) {
                        None => return None,
                        Some(b'\\') => j += 2,
                        Some(&c) if c == q => break,
                        Some(_) => j += 1,
                    }
                }
                i = j;
            }
            b'(' => stack.push(Open::Paren(i)),
            b'[' => stack.push(Open::Bracket(i)),
            b'{' if i > 0 && b[i - 1] == b'#' => stack.push(Open::Map(i)),
            b'{' => stack.push(Open::Brace),
            b')' | b']' | b'}' => {
                stack.pop();
            }
            _ => {}
        }
        i += 1;
    }
    Some(stack)
}

/// The top-level keys written so far in a map literal's body (`a: 1, b: [2, 3], c`).
fn keys_in(body: &str) -> Vec<&str> {
    let mut keys = Vec::new();
    let mut depth = 0i32;
    let mut item_start = 0;
    for (i, c) in body.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => item_start = i + 1,
            ':' if depth == 0 => {
                let k = body[item_start..i].trim().trim_matches('"');
                if !k.is_empty() {
                    keys.push(k);
                }
            }
            _ => {}
        }
    }
    keys
}

/// Reads the context of the cursor at byte `pos` of `code`, and the byte where the text
/// to replace starts.
pub fn context(code: &str, pos: usize) -> (usize, Context<'_>) {
    let before = &code[..pos];
    if before.trim_start().starts_with(':') && !before.contains('\n') {
        let start = before.len() - before.trim_start().len();
        return (start, Context::Command(&before[start..]));
    }
    // `receiver["partial`: the cursor is inside a string that opens an index.
    if let Some(q) = before.rfind("[\"") {
        let partial = &before[q + 2..];
        if !partial.contains(['"', '\n']) {
            let (_, receiver) = ident_before(before, q);
            if !receiver.is_empty() && open_brackets(&before[..q]).is_some() {
                return (q + 2, Context::Index { receiver, partial });
            }
        }
    }
    let (start, partial) = ident_before(before, pos);
    let Some(stack) = open_brackets(before) else { return (pos, Context::Word("")) };
    let prev = before[..start].trim_end();
    // A key position inside `#{ ... }` that is an argument of a call.
    if let Some(Open::Map(brace)) = stack.last() {
        if prev.ends_with(',') || prev.len() == *brace + 1 {
            if let Some(Open::Paren(paren)) = stack.iter().rev().nth(1) {
                let (fstart, func) = ident_before(before, before[..*paren].trim_end().len());
                if !func.is_empty() {
                    let given = keys_in(&before[brace + 1..start]);
                    let method = before[..fstart].ends_with('.');
                    return (start, Context::OptionKey { func, method, partial, given });
                }
            }
        }
    }
    if let Some(dot) = before[..start].strip_suffix('.').map(str::len) {
        if !before[..start].ends_with("..") {
            let (_, receiver) = ident_before(before, dot);
            let is_number = receiver.chars().next().is_some_and(|c| c.is_ascii_digit());
            if !receiver.is_empty() && !is_number {
                return (start, Context::Member { receiver, partial });
            }
        }
    }
    // A plain word, with `module::` prefixes.
    let wstart = before[..pos]
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_ident(*c) || *c == ':')
        .last()
        .map_or(pos, |(i, _)| i);
    (wstart, Context::Word(&before[wstart..]))
}

/// `pos` clamped into `code` and moved back to a character boundary.
pub(crate) fn floor_boundary(code: &str, pos: usize) -> usize {
    (0..=pos.min(code.len())).rev().find(|&p| code.is_char_boundary(p)).unwrap_or(0)
}

fn plain(items: impl IntoIterator<Item = String>, partial: &str) -> Vec<Candidate> {
    let mut v: Vec<String> = items.into_iter().filter(|s| s.starts_with(partial)).collect();
    v.sort();
    v.dedup();
    v.into_iter().map(|s| Candidate { display: s.clone(), replacement: s }).collect()
}

impl Session {
    /// The value a variable of the session holds.
    fn value_of(&self, name: &str) -> Option<rhai::Dynamic> {
        self.scope.get_value::<rhai::Dynamic>(name)
    }

    /// The script type of a variable's value (`Model`), if the variable exists.
    pub fn type_of(&self, name: &str) -> Option<String> {
        self.value_of(name).map(|v| docs::value_type(&self.engine, &v))
    }

    /// Completion at byte `pos` of `code` (see the module doc for the contexts).
    pub fn complete(&self, code: &str, pos: usize) -> Completion {
        let pos = floor_boundary(code, pos);
        let (start, ctx) = context(code, pos);
        let candidates = match ctx {
            Context::Command(w) => plain(commands::COMMANDS.iter().map(|c| format!(":{}", c.name)), w),
            Context::Word("") => vec![],
            Context::Word(w) => plain(self.completions(w), w),
            Context::Member { receiver, partial } => {
                let Some(v) = self.value_of(receiver) else { return Completion { start, candidates: vec![] } };
                let mut names = docs::members(&self.engine, &docs::value_type(&self.engine, &v));
                if let Some(map) = v.read_lock::<rhai::Map>() {
                    names.extend(map.keys().map(|k| k.to_string()).filter(|k| k.chars().all(is_ident)));
                }
                plain(names, partial)
            }
            Context::Index { receiver, partial } => {
                let keys = self.value_of(receiver).map(|v| index_keys(&v)).unwrap_or_default();
                let mut c = plain(keys, partial);
                for x in &mut c {
                    x.replacement.push_str("\"]");
                }
                c
            }
            Context::OptionKey { func, method, partial, given } => {
                match registry::options_of_call(func, method.then_some("")) {
                    Some(opts) => opts
                        .iter()
                        .filter(|o| o.name.starts_with(partial) && !given.contains(&o.name))
                        .map(|o| Candidate { display: o.name.to_string(), replacement: format!("{}: ", o.name) })
                        .collect(),
                    None => vec![],
                }
            }
        };
        Completion { start, candidates }
    }

    /// What Shift-Tab shows at byte `pos`: for the function named under the cursor, or else
    /// for the call whose argument list the cursor is in (`m.ablate(|`, `m.ablate(d, [h], #{|`;
    /// the innermost call first), each overload's script-facing signature, its doc, its
    /// options with defaults, and its first example. A method after a variable (`m.analyze`)
    /// is looked up on the variable's type.
    pub fn inspect(&self, code: &str, pos: usize) -> Option<String> {
        let pos = floor_boundary(code, pos);
        let end = code[pos..].char_indices().find(|(_, c)| !is_ident(*c)).map_or(code.len(), |(i, _)| pos + i);
        let (start, name) = ident_before(code, end);
        if let Some(text) = self.describe_name(code, start, name) {
            return Some(text);
        }
        // The enclosing calls, innermost first: the name before each open `(`.
        let open = open_brackets(&code[..pos])?;
        open.iter().rev().find_map(|o| match o {
            Open::Paren(paren) => {
                let (start, name) = ident_before(code, code[..*paren].trim_end().len());
                self.describe_name(code, start, name)
            }
            _ => None,
        })
    }

    /// The help text of the function `name` written at byte `start` of `code`, with its
    /// `module::` prefix or its receiver (`m.` looks on the type of `m`'s value).
    fn describe_name(&self, code: &str, start: usize, name: &str) -> Option<String> {
        if name.is_empty() || docs::KEYWORDS.contains(&name) {
            return None;
        }
        let module = code[..start].strip_suffix("::").map(|_| ident_before(&code[..start - 2], start - 2).1);
        let full = match module {
            Some(m) if !m.is_empty() => format!("{m}::{name}"),
            _ => name.to_string(),
        };
        let receiver =
            code[..start].strip_suffix('.').map(|r| ident_before(r, r.len()).1).and_then(|r| self.type_of(r));
        let mut found = self.docs(&full);
        if let Some(t) = &receiver {
            let on_type: Vec<_> = found.iter().filter(|d| d.receiver.as_deref() == Some(t.as_str())).cloned().collect();
            if !on_type.is_empty() {
                found = on_type;
            }
        }
        (!found.is_empty()).then(|| describe(&found))
    }
}

/// The keys a value is indexed by with a string (`g["enc"]`, `map["key"]`).
fn index_keys(v: &rhai::Dynamic) -> Vec<String> {
    if let Some(map) = v.read_lock::<rhai::Map>() {
        return map.keys().map(|k| k.to_string()).collect();
    }
    registry::INDEX_KEYS.iter().find_map(|f| f(v)).unwrap_or_default()
}

/// Help text of a function's overloads: signatures first, then for each its doc (examples
/// included) and its options with their defaults.
pub fn describe(docs: &[docs::FnDoc]) -> String {
    let mut out: Vec<String> = docs.iter().map(|d| d.signature.clone()).collect();
    out.dedup();
    let mut text = out.join("\n");
    for d in docs {
        text += &format!("\n\n{}\n  {}", d.signature, d.doc.replace('\n', "\n  "));
    }
    // Each distinct option list once: a method may take other options than a function of
    // the same name (`m.bleu(data, #{...})` and `bleu(hyps, refs, #{...})`).
    let mut lists: Vec<(String, &'static [crate::script::convert::OptSpec])> = Vec::new();
    for d in docs {
        if let Some(opts) = registry::options_of_call(&d.name, d.receiver.as_deref()) {
            if !lists.iter().any(|(_, o)| std::ptr::eq(*o, opts)) {
                lists.push((d.receiver.as_ref().map_or_else(|| d.name.clone(), |r| format!("{r}.{}", d.name)), opts));
            }
        }
    }
    for (name, opts) in &lists {
        text += &if lists.len() == 1 {
            "\n\nOptions (name, default, meaning):".to_string()
        } else {
            format!("\n\nOptions of {name} (name, default, meaning):")
        };
        for o in opts.iter() {
            let default = o.default.to_string();
            let default = if default.is_empty() { "-".to_string() } else { default };
            text += &option_line(o.name, &default, o.help);
        }
    }
    text
}

/// Width of `:help`'s option lines: meanings wrap at spaces within it (a terminal would
/// otherwise break them mid-word).
const HELP_WIDTH: usize = 100;

/// One option of `:help`: name and default in columns, the meaning wrapped at word boundaries
/// under its own column (a default wider than its column puts the meaning on the next line).
fn option_line(name: &str, default: &str, help: &str) -> String {
    const NAME: usize = 22;
    const DEFAULT: usize = 24;
    let indent = 2 + NAME + 1 + DEFAULT + 1;
    let mut out = format!("\n  {name:<NAME$} {default:<DEFAULT$}");
    let mut col = out.chars().count() - 1; // the leading newline is not a column
    if col + 1 > indent {
        out += &format!("\n{}", " ".repeat(indent - 1));
        col = indent - 1;
    }
    for word in help.split_whitespace() {
        let w = word.chars().count();
        if col >= indent && col + 1 + w > HELP_WIDTH {
            out += &format!("\n{}", " ".repeat(indent - 1));
            col = indent - 1;
        }
        out.push(' ');
        out += word;
        col += 1 + w;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `:help`'s option lines stay within [`HELP_WIDTH`] and break only between words; a
    /// default wider than its column moves the meaning to the next line, in its column.
    #[test]
    fn option_meanings_wrap_between_words_within_the_width() {
        let help = "the layers swept: an index, an array or a range (`20..30`); other cells are NaN, as a removed head's are, and the count is of them";
        let text = option_line("layers", "every layer", help);
        let lines: Vec<&str> = text.trim_start_matches('\n').lines().collect();
        assert!(lines.len() >= 2, "{text}");
        assert!(lines.iter().all(|l| l.chars().count() <= HELP_WIDTH), "{text}");
        let words: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        let want: Vec<&str> = ["layers", "every", "layer"].into_iter().chain(help.split_whitespace()).collect();
        assert_eq!(words, want, "a word was broken");
        assert!(lines[1..].iter().all(|l| l.starts_with(&" ".repeat(50)) && !l.starts_with(&" ".repeat(51))), "{text}");
        assert_eq!(lines[0].find("the"), Some(50), "{text}");
        let wide = option_line("metric", "\"loss\" for language and translation models", "what is measured");
        let wl: Vec<&str> = wide.trim_start_matches('\n').lines().collect();
        assert_eq!(wl.len(), 2, "{wide}");
        assert_eq!(wl[1].trim_start(), "what is measured");
        assert_eq!(wl[1].len() - wl[1].trim_start().len(), 50);
    }

    fn ctx(code: &str) -> (usize, Context<'_>) {
        context(code, code.len())
    }

    #[test]
    fn contexts_are_read_from_the_text_before_the_cursor() {
        assert_eq!(ctx("m.an"), (2, Context::Member { receiver: "m", partial: "an" }));
        assert_eq!(ctx("let x = model."), (14, Context::Member { receiver: "model", partial: "" }));
        assert_eq!(ctx("r[\"e"), (3, Context::Index { receiver: "r", partial: "e" }));
        assert_eq!(ctx("print(r[\""), (9, Context::Index { receiver: "r", partial: "" }));
        assert_eq!(
            ctx("m.analyze(d, #{st"),
            (15, Context::OptionKey { func: "analyze", method: true, partial: "st", given: vec![] })
        );
        assert_eq!(
            ctx("m.analyze(d, #{stats: [\"rare\"], k"),
            (32, Context::OptionKey { func: "analyze", method: true, partial: "k", given: vec!["stats"] })
        );
        assert_eq!(
            ctx("heatmap(x, #{"),
            (13, Context::OptionKey { func: "heatmap", method: false, partial: "", given: vec![] })
        );
        assert_eq!(ctx(":he"), (0, Context::Command(":he")));
        assert_eq!(ctx("let a = heat"), (8, Context::Word("heat")));
        assert_eq!(ctx("stats::me"), (0, Context::Word("stats::me")));
    }

    #[test]
    fn no_member_context_inside_strings_numbers_or_map_values() {
        assert_eq!(ctx("print(\"m."), (9, Context::Word("")));
        assert_eq!(ctx("let x = 1."), (10, Context::Word("")));
        assert!(matches!(ctx("f(#{a: b"), (_, Context::Word("b"))));
        assert!(matches!(ctx("let m = #{a"), (_, Context::Word("a"))), "a map that is no call argument");
        assert_eq!(ctx("// m."), (5, Context::Word("")));
    }

    #[test]
    fn inspect_inside_a_call_shows_the_enclosing_call() {
        let s = Session::new(Default::default());
        let heatmap = s.inspect("heatmap", 3).expect("heatmap by name");
        assert!(heatmap.lines().any(|l| l.starts_with("heatmap(matrix")), "{heatmap}");
        // Right after `(`, after an argument that is no function, inside an options map.
        for code in ["heatmap(", "heatmap(x, ", "heatmap(x, #{", "let p = heatmap([[1, 2]], #{title: \"a\", "] {
            assert_eq!(s.inspect(code, code.len()).as_deref(), Some(heatmap.as_str()), "{code:?}");
        }
        // The innermost call first; a name under the cursor wins over the enclosing call.
        let corpus = s.inspect("corpus", 3).expect("corpus by name");
        assert_eq!(s.inspect("heatmap(corpus(", 15).as_deref(), Some(corpus.as_str()));
        assert_eq!(s.inspect("heatmap(corpus(\"a\"), ", 20).as_deref(), Some(heatmap.as_str()));
        assert_eq!(s.inspect("heatmap(x, corpus", 14).as_deref(), Some(corpus.as_str()));
        // Grouping parentheses, keywords, strings and unknown names show nothing.
        for code in ["(1 + ", "if (", "no_such_function(", "print(\"heatmap(", "let x = ["] {
            assert_eq!(s.inspect(code, code.len()), None, "{code:?}");
        }
    }

    #[test]
    fn map_keys_are_read_at_the_top_level() {
        assert_eq!(keys_in("a: 1, b: [2, #{c: 3}], \"d\": 4"), ["a", "b", "d"]);
    }
}

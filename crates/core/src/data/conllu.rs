//! A CoNLL-U reader and writer of our own. Comments (`# text =`, `# sent_id =`), multi-word
//! token lines and empty nodes are kept (and written back), CRLF and runs of blank lines are
//! accepted; every error names the file and line.

use std::fmt::Write as _;

/// One syntactic word (an integer-ID line).
#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    /// 1-based position in the sentence.
    pub id: usize,
    pub form: String,
    pub lemma: String,
    pub upos: String,
    pub xpos: String,
    pub feats: String,
    /// 0 for the root; `None` when the file has `_`.
    pub head: Option<usize>,
    pub deprel: String,
    pub deps: String,
    pub misc: String,
}

impl Word {
    pub fn space_after(&self) -> bool {
        !self.misc.split('|').any(|m| m == "SpaceAfter=No")
    }
}

/// A line of a sentence block, in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Comment(String),
    Word(Word),
    /// A multi-word token (`3-4`) or empty node (`5.1`), kept as its ten fields.
    Other(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sentence {
    pub lines: Vec<Line>,
    /// Line number of the block's first line, for error messages.
    pub line_no: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{file}:{line}: {msg}")]
pub struct ConlluError {
    pub file: String,
    pub line: usize,
    pub msg: String,
}

impl Sentence {
    pub fn words(&self) -> impl Iterator<Item = &Word> {
        self.lines.iter().filter_map(|l| if let Line::Word(w) = l { Some(w) } else { None })
    }

    fn comment(&self, key: &str) -> Option<&str> {
        self.lines.iter().find_map(|l| match l {
            Line::Comment(c) => c
                .strip_prefix('#')
                .map(str::trim_start)
                .and_then(|c| c.strip_prefix(key))
                .map(str::trim_start)
                .and_then(|c| c.strip_prefix('='))
                .map(str::trim),
            _ => None,
        })
    }

    pub fn sent_id(&self) -> Option<&str> {
        self.comment("sent_id")
    }

    /// The sentence text: `# text =`, else the word forms joined by their spacing.
    pub fn text(&self) -> String {
        if let Some(t) = self.comment("text") {
            return t.to_string();
        }
        let mut s = String::new();
        for w in self.words() {
            s += &w.form;
            if w.space_after() {
                s.push(' ');
            }
        }
        s.trim_end().to_string()
    }

    /// Character spans `[start, end)` of each word in `text()`, found in order; `None` for a
    /// word whose form is not found where expected.
    pub fn word_spans(&self) -> Vec<Option<(usize, usize)>> {
        let text: Vec<char> = self.text().chars().collect();
        let mut pos = 0;
        let mut out = Vec::new();
        for w in self.words() {
            let form: Vec<char> = w.form.chars().collect();
            // A form longer than the text is found nowhere (it once indexed past the text).
            let last = text.len().checked_sub(form.len());
            let found = last.and_then(|last| (pos..=last).find(|&i| text[i..i + form.len()] == form[..]));
            match found {
                Some(i) if !form.is_empty() => {
                    out.push(Some((i, i + form.len())));
                    pos = i + form.len();
                }
                _ => out.push(None),
            }
        }
        out
    }
}

fn field(s: &str) -> String {
    s.to_string()
}

/// Parses CoNLL-U text; `file` names the source in errors.
pub fn parse(text: &str, file: &str) -> Result<Vec<Sentence>, ConlluError> {
    let err = |line: usize, msg: String| ConlluError { file: file.to_string(), line, msg };
    let mut out = Vec::new();
    let mut cur = Sentence::default();
    let mut expect_id = 1;
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() {
            if !cur.lines.is_empty() {
                if cur.words().next().is_none() {
                    return Err(err(cur.line_no, "sentence block has no word lines".into()));
                }
                check_heads(&cur, file)?;
                out.push(std::mem::take(&mut cur));
                expect_id = 1;
            }
            continue;
        }
        if cur.lines.is_empty() {
            cur.line_no = n;
        }
        if line.starts_with('#') {
            if cur.words().next().is_some() {
                return Err(err(n, "comment after the first word line of a sentence".into()));
            }
            cur.lines.push(Line::Comment(line.to_string()));
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() != 10 {
            return Err(err(n, format!("expected 10 tab-separated columns, found {}", cols.len())));
        }
        let id = cols[0];
        if id.contains('-') || id.contains('.') {
            let ok = id.split(['-', '.']).all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(err(n, format!("bad ID '{id}'")));
            }
            cur.lines.push(Line::Other(cols.iter().map(|c| field(c)).collect()));
            continue;
        }
        let idn: usize = id.parse().map_err(|_| err(n, format!("bad ID '{id}'")))?;
        if idn != expect_id {
            return Err(err(n, format!("word ID {idn} out of order (expected {expect_id})")));
        }
        expect_id += 1;
        let head = match cols[6] {
            "_" => None,
            h => Some(h.parse::<usize>().map_err(|_| err(n, format!("bad HEAD '{h}'")))?),
        };
        cur.lines.push(Line::Word(Word {
            id: idn,
            form: field(cols[1]),
            lemma: field(cols[2]),
            upos: field(cols[3]),
            xpos: field(cols[4]),
            feats: field(cols[5]),
            head,
            deprel: field(cols[7]),
            deps: field(cols[8]),
            misc: field(cols[9]),
        }));
    }
    if !cur.lines.is_empty() {
        if cur.words().next().is_none() {
            return Err(err(cur.line_no, "sentence block has no word lines".into()));
        }
        check_heads(&cur, file)?;
        out.push(cur);
    }
    Ok(out)
}

/// Every HEAD points inside the sentence, and following heads from any word reaches the root
/// (or a word without a head) without a cycle.
fn check_heads(s: &Sentence, file: &str) -> Result<(), ConlluError> {
    let n = s.words().count();
    // Line of a word: block start + the lines before it in the block.
    let line_of =
        |id: usize| s.line_no + s.lines.iter().position(|l| matches!(l, Line::Word(x) if x.id == id)).unwrap_or(0);
    let heads: Vec<Option<usize>> = s.words().map(|w| w.head).collect();
    for w in s.words() {
        if let Some(h) = w.head {
            if h > n {
                return Err(ConlluError {
                    file: file.into(),
                    line: line_of(w.id),
                    msg: format!("HEAD {h} of word {} points past the sentence's {n} words", w.id),
                });
            }
        }
    }
    // 0 unknown, 1 on the current path, 2 reaches the root.
    let mut state = vec![0u8; n + 1];
    for start in 1..=n {
        let mut path = vec![];
        let mut at = start;
        while at != 0 && state[at] == 0 {
            state[at] = 1;
            path.push(at);
            at = heads[at - 1].unwrap_or(0);
        }
        if at != 0 && state[at] == 1 {
            let from = path.iter().position(|&p| p == at).unwrap_or(0);
            let mut cycle: Vec<String> = path[from..].iter().map(|p| p.to_string()).collect();
            cycle.push(at.to_string());
            let id = s.sent_id().map(|i| format!(" (sentence '{i}')")).unwrap_or_default();
            return Err(ConlluError {
                file: file.into(),
                line: line_of(at),
                msg: format!("the heads of words {} form a cycle{id}; a dependency tree has none", cycle.join(" -> ")),
            });
        }
        for p in path {
            state[p] = 2;
        }
    }
    Ok(())
}

/// Writes sentences back as CoNLL-U (LF line ends, one blank line after each sentence).
pub fn write(sentences: &[Sentence]) -> String {
    let mut s = String::new();
    for sent in sentences {
        for l in &sent.lines {
            match l {
                Line::Comment(c) => {
                    let _ = writeln!(s, "{c}");
                }
                Line::Word(w) => {
                    let head = w.head.map_or("_".to_string(), |h| h.to_string());
                    let _ = writeln!(
                        s,
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        w.id, w.form, w.lemma, w.upos, w.xpos, w.feats, head, w.deprel, w.deps, w.misc
                    );
                }
                Line::Other(cols) => {
                    let _ = writeln!(s, "{}", cols.join("\t"));
                }
            }
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# sent_id = s1\r\n# text = Don't stop.\r\n1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_\r\n1\tDo\tdo\tAUX\tVB\t_\t3\taux\t_\t_\r\n2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_\r\n3\tstop\tstop\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No\r\n3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t3:conj\t_\r\n4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_\r\n\r\n\r\n\r\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\tSpaceAfter=No\n2\t!\t!\tPUNCT\t.\t_\t1\tpunct\t_\t_\n";

    #[test]
    fn reads_comments_multiword_empty_nodes_crlf_and_blank_runs() {
        let s = parse(SAMPLE, "x.conllu").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].sent_id(), Some("s1"));
        assert_eq!(s[0].text(), "Don't stop.");
        assert_eq!(s[0].words().map(|w| w.form.as_str()).collect::<Vec<_>>(), ["Do", "n't", "stop", "."]);
        assert_eq!(s[0].words().nth(1).unwrap().head, Some(3));
        // No `# text`: forms joined with SpaceAfter=No respected.
        assert_eq!(s[1].text(), "Hi!");
        assert_eq!(s[1].sent_id(), None);
    }

    #[test]
    fn round_trips() {
        let s = parse(SAMPLE, "x.conllu").unwrap();
        let written = write(&s);
        let again = parse(&written, "y.conllu").unwrap();
        let lines = |v: &[Sentence]| v.iter().map(|x| x.lines.clone()).collect::<Vec<_>>();
        assert_eq!(lines(&again), lines(&s));
        // Byte-exact from then on (LF endings, single blank lines).
        assert_eq!(write(&again), written);
        assert_eq!(written.lines().filter(|l| l.is_empty()).count(), 2);
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("1\tA\ta\tX\tX\t_\t0\troot\t_\n", "x:1: expected 10 tab-separated columns, found 9"),
            ("# c\n1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n3\tB\tb\tX\tX\t_\t1\tdep\t_\t_\n", "x:3: word ID 3 out of order (expected 2)"),
            ("1\tA\ta\tX\tX\t_\tzero\troot\t_\t_\n", "x:1: bad HEAD 'zero'"),
            ("\n\n1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n2\tB\tb\tX\tX\t_\t9\tdep\t_\t_\n", "x:4: HEAD 9 of word 2 points past the sentence's 2 words"),
            ("# only a comment\n\n", "x:1: sentence block has no word lines"),
            ("1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n# late\n", "x:2: comment after the first word line of a sentence"),
            ("x-2\tA\t_\t_\t_\t_\t_\t_\t_\t_\n", "x:1: bad ID 'x-2'"),
            (
                "# sent_id = s7\n1\tA\ta\tX\tX\t_\t0\troot\t_\t_\n2\tB\tb\tX\tX\t_\t3\tdep\t_\t_\n3\tC\tc\tX\tX\t_\t2\tdep\t_\t_\n",
                "x:3: the heads of words 2 -> 3 -> 2 form a cycle (sentence 's7'); a dependency tree has none",
            ),
            ("1\tA\ta\tX\tX\t_\t1\troot\t_\t_\n", "x:1: the heads of words 1 -> 1 form a cycle; a dependency tree has none"),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text, "x").unwrap_err().to_string(), want, "for {text:?}");
        }
    }

    #[test]
    fn a_form_longer_than_the_text_has_no_span() {
        // Found by the conllu fuzz target (fuzz/regressions/conllu/form_longer_than_text.conllu).
        let s = parse("# text = a\n1\thello\t_\tX\t_\t_\t0\troot\t_\t_\n\n", "t.conllu").unwrap();
        assert_eq!(s[0].word_spans(), vec![None]);
    }

    #[test]
    fn word_spans_follow_the_text() {
        let s = parse(SAMPLE, "x").unwrap();
        assert_eq!(s[0].word_spans(), vec![Some((0, 2)), Some((2, 5)), Some((6, 10)), Some((10, 11))]);
    }
}

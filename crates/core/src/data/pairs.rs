//! Prompt pairs for activation patching (docs/methods.md#activation-patching): a clean and a
//! corrupted prompt with the answer the clean prompt should get and a wrong answer (the
//! corrupted prompt's), from a TSV `clean<TAB>corrupted<TAB>answer<TAB>wrong` or built in a
//! script. Answers are kept as written: a leading space is part of the token (`" Mary"`). A
//! translation model's pairs are two source sentences (`clean<TAB>corrupted`): their metric is
//! read over the clean source's translation, so they have no answers (empty here).

use super::{name_of, read, DataError};
use std::path::Path;
use std::rc::Rc;

#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub clean: String,
    pub corrupted: String,
    pub answer: String,
    pub wrong: String,
    /// Where the pair came from, for errors: `file:line` or `pairs[i]`.
    pub origin: String,
    /// Token ids given instead of texts (clean, corrupted, answer, wrong): used as they are.
    pub ids: Option<PairTokens>,
}

/// A pair given as token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct PairTokens {
    pub clean: Vec<i64>,
    pub corrupted: Vec<i64>,
    pub answer: i64,
    pub wrong: i64,
}

#[derive(Debug, Clone)]
pub struct Pairs {
    pub name: String,
    pub items: Rc<Vec<Pair>>,
}

/// The columns of a pairs file.
pub const COLUMNS: [&str; 4] = ["clean", "corrupted", "answer", "wrong"];

impl Pairs {
    pub fn new(name: impl Into<String>, items: Vec<Pair>) -> Pairs {
        Pairs { name: name.into(), items: Rc::new(items) }
    }

    /// `clean<TAB>corrupted<TAB>answer<TAB>wrong` per line; blank lines and lines starting
    /// with `#` are skipped. Prompts are trimmed, answers only of the line end.
    pub fn tsv(path: &Path) -> Result<Pairs, DataError> {
        let text = read(path)?;
        let file = path.display().to_string();
        let mut items = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let cols: Vec<&str> = line.split('\t').collect();
            let bad = |msg: String| DataError::Line { file: file.clone(), line: i + 1, msg };
            if cols.len() != COLUMNS.len() && cols.len() != 2 {
                return Err(bad(format!(
                    "{} columns, expected 4: {} (TAB-separated; 2 for a translation model's source pairs)",
                    cols.len(),
                    COLUMNS.join(", ")
                )));
            }
            if let Some(k) = (0..cols.len()).find(|&k| cols[k].trim().is_empty()) {
                return Err(bad(format!("the {} column is empty", COLUMNS[k])));
            }
            let col = |k: usize| cols.get(k).map_or(String::new(), |c| c.to_string());
            items.push(Pair {
                clean: cols[0].trim().into(),
                corrupted: cols[1].trim().into(),
                answer: col(2),
                wrong: col(3),
                origin: format!("{file}:{}", i + 1),
                ids: None,
            });
        }
        if items.is_empty() {
            return Err(DataError::Io(
                file,
                "holds no pairs (expected lines clean<TAB>corrupted<TAB>answer<TAB>wrong)".into(),
            ));
        }
        Ok(Pairs::new(name_of(path), items))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Pairs `rows` (a shard's slice), under the same name.
    pub fn slice(&self, rows: std::ops::Range<usize>) -> Pairs {
        let rows = rows.start.min(self.len())..rows.end.min(self.len());
        Pairs { name: self.name.clone(), items: Rc::new(self.items[rows].to_vec()) }
    }

    /// A digest of every pair (texts, answers and token ids): shards of one set share it.
    pub fn digest(&self) -> String {
        let ids: Vec<String> =
            self.items.iter().map(|p| p.ids.as_ref().map_or(String::new(), |t| format!("{t:?}"))).collect();
        crate::shard::digest(self.items.iter().zip(&ids).flat_map(|(p, t)| {
            [p.clean.as_bytes(), p.corrupted.as_bytes(), p.answer.as_bytes(), p.wrong.as_bytes(), t.as_bytes()]
        }))
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("pairs-{}-{}.tsv", std::process::id(), text.len()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_pairs_and_names_bad_lines() {
        let p = file("# header\nWhen Mary and John went, John gave it to\tWhen Mary and John went, Mary gave it to\t Mary\t John\n\n");
        let d = Pairs::tsv(&p).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d.items[0].answer, " Mary", "the answer keeps its leading space");
        assert!(d.items[0].origin.ends_with(":2"));
        let p = file("a b\ta c\n");
        assert_eq!(Pairs::tsv(&p).unwrap().items[0].answer, "", "two columns: source pairs");
        let p = file("a\tb\t c\n");
        let e = Pairs::tsv(&p).unwrap_err().to_string();
        assert!(e.contains(":1:") && e.contains("3 columns, expected 4"), "{e}");
        let p = file("a\tb\t\t d\n");
        assert!(Pairs::tsv(&p).unwrap_err().to_string().contains("the answer column is empty"));
    }
}

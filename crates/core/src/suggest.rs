//! Near-name suggestions for what a user mistyped (a function, method, variable, `:help`
//! topic or hook point): the candidates within a small edit distance, closest first.

/// Edit distance (insertions, deletions, substitutions, and swaps of two neighbours) between
/// `a` and `b`, case-insensitive.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[n][m]
}

/// Up to three `candidates` near `word` (distance at most a third of its length, at least 1,
/// at most 3), closest first; `word` itself is not suggested.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let limit = (word.chars().count() / 3).clamp(1, 3);
    let mut found: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .collect();
    found.sort();
    found.dedup_by(|a, b| a.1 == b.1);
    found.into_iter().take(3).map(|(_, c)| c).collect()
}

/// "did you mean 'analyze'?" (or "'a' or 'b'"), when something is near.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let near = nearest(word, candidates);
    if near.is_empty() {
        return None;
    }
    let quoted: Vec<String> = near.iter().map(|n| format!("'{n}'")).collect();
    Some(format!("did you mean {}?", quoted.join(" or ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_closest_first() {
        let names = ["analyze", "ablate", "ablation_sweep", "attention", "Model", "Head"];
        assert_eq!(nearest("analyse", names), vec!["analyze"]);
        assert_eq!(nearest("Modle", names), vec!["Model"]);
        assert_eq!(nearest("abalte", names), vec!["ablate"]);
        assert!(nearest("zzzzzz", names).is_empty());
        assert!(nearest("analyze", names).is_empty(), "the word itself is not a suggestion");
        assert_eq!(did_you_mean("atention", names).as_deref(), Some("did you mean 'attention'?"));
    }
}

//! Analysis results: per kind, layers x heads grids with the options and counts that produced
//! them; head functions (the paper's Figure 1c) and the Table-1 style syntactic table.

use super::heads_of;
use crate::model::{HeadId, Kind};
use crate::table::{Cell, Table};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct PosHead {
    /// Most frequent `argmax(t) - t`.
    pub offset: i64,
    /// Fraction of real queries at that offset.
    pub fraction: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rare {
    /// Fraction of real queries (of counted sentences) whose argmax is the rarest token.
    pub score: Vec<Vec<f64>>,
    /// ... is one of the two rarest tokens.
    pub two: Vec<Vec<f64>>,
    pub sentences: usize,
    pub queries: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RelDir {
    pub relation: String,
    /// "g->d" (query = governor) or "d->g" (query = dependent).
    pub direction: String,
    /// The paper's name, e.g. "v->s".
    pub label: String,
    pub edges: usize,
    /// Most frequent relative word offset `target - query`, and its accuracy.
    pub baseline_offset: i64,
    pub baseline: f64,
    /// `[layer][head]`.
    pub accuracy: Vec<Vec<f64>>,
}

impl RelDir {
    pub fn best(&self) -> (usize, usize, f64) {
        let mut best = (0, 0, f64::MIN);
        for (l, row) in self.accuracy.iter().enumerate() {
            for (h, &a) in row.iter().enumerate() {
                if a > best.2 {
                    best = (l, h, a);
                }
            }
        }
        best
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KindResult {
    pub kind: Kind,
    pub n_layers: usize,
    pub n_heads: usize,
    /// Real query tokens pooled over the dataset.
    pub queries: usize,
    pub confidence: Option<Vec<Vec<f64>>>,
    pub positional: Option<Vec<Vec<PosHead>>>,
    pub rare: Option<Rare>,
    pub syntactic: Option<Vec<RelDir>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    pub model: String,
    pub dataset: String,
    pub sentences: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub options: crate::output::Echo,
    pub positional_threshold: f64,
    pub rare_threshold: f64,
    pub margin: f64,
    pub freq_source: Option<String>,
    pub kinds: Vec<KindResult>,
}

/// A head's function: what the analyses found it does.
#[derive(Debug, Clone, PartialEq)]
pub enum Function {
    Positional(i64),
    Syntactic { relation: String, label: String, accuracy: f64, baseline: f64 },
    Rare(f64),
}

impl std::fmt::Display for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Function::Positional(d) => write!(f, "positional {d:+}"),
            Function::Syntactic { relation, label, .. } => write!(f, "syntactic {relation} {label}"),
            Function::Rare(_) => write!(f, "rare"),
        }
    }
}

impl Analysis {
    pub fn kind(&self, k: Kind) -> Option<&KindResult> {
        self.kinds.iter().find(|r| r.kind == k)
    }

    /// What each head does, by the spec's rules (thresholds echoed in the options).
    pub fn functions(&self) -> Vec<(HeadId, Vec<Function>)> {
        let mut out = Vec::new();
        for k in &self.kinds {
            for id in heads_of(k) {
                let (l, h) = (id.layer_idx, id.head);
                let mut f = Vec::new();
                if let Some(p) = &k.positional {
                    let ph = &p[l][h];
                    if ph.offset != 0 && ph.fraction >= self.positional_threshold {
                        f.push(Function::Positional(ph.offset));
                    }
                }
                if let Some(s) = &k.syntactic {
                    for rd in s {
                        let a = rd.accuracy[l][h];
                        if rd.edges > 0 && a >= rd.baseline + self.margin {
                            f.push(Function::Syntactic {
                                relation: rd.relation.clone(),
                                label: rd.label.clone(),
                                accuracy: a,
                                baseline: rd.baseline,
                            });
                        }
                    }
                }
                if let Some(r) = &k.rare {
                    if r.score[l][h] > self.rare_threshold {
                        f.push(Function::Rare(r.score[l][h]));
                    }
                }
                out.push((id, f));
            }
        }
        out
    }

    /// Heads with at least one function, one row each.
    pub fn functions_table(&self) -> Table {
        let mut t = Table::new(vec!["head".into(), "function".into(), "confidence".into()]);
        t.title = Some(format!("Head functions: {} on {}", self.model, self.dataset));
        for (id, f) in self.functions() {
            if f.is_empty() {
                continue;
            }
            let conf = self
                .kind(id.kind)
                .and_then(|k| k.confidence.as_ref())
                .map_or(Cell::Empty, |c| Cell::Float(c[id.layer_idx][id.head]));
            let _ = t.push_row(vec![
                Cell::Text(id.to_string()),
                Cell::Text(f.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
                conf,
            ]);
        }
        t
    }

    /// Table 1 of the paper: per relation and direction, the best head against the baseline.
    pub fn syntactic_table(&self) -> Option<Table> {
        let k = self.kinds.iter().find(|k| k.syntactic.is_some())?;
        let mut t = Table::new(
            ["relation", "direction", "edges", "best head", "accuracy", "baseline", "baseline offset", "+10 rule"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        t.title = Some(format!("Syntactic heads ({}): {} on {}", k.kind, self.model, self.dataset));
        for rd in k.syntactic.as_ref()? {
            let (l, h, a) = rd.best();
            let _ = t.push_row(vec![
                Cell::Text(rd.relation.clone()),
                Cell::Text(rd.label.clone()),
                Cell::Int(rd.edges as i64),
                Cell::Text(HeadId { kind: k.kind, layer_idx: l, head: h }.to_string()),
                Cell::Float(a),
                Cell::Float(rd.baseline),
                Cell::Int(rd.baseline_offset),
                Cell::Text(if a >= rd.baseline + self.margin { "yes".into() } else { "no".into() }),
            ]);
        }
        Some(t)
    }

    pub fn summary(&self) -> String {
        let kinds: Vec<String> =
            self.kinds.iter().map(|k| format!("{} {}x{}", k.kind, k.n_layers, k.n_heads)).collect();
        let n_func = self.functions().iter().filter(|(_, f)| !f.is_empty()).count();
        format!(
            "<Analysis of {} on {}: {} sentences, {} tokens, kinds {}, {} heads with a function, {:.1} s>",
            self.model,
            self.dataset,
            self.sentences,
            self.tokens,
            kinds.join(", "),
            n_func,
            self.seconds
        )
    }

    pub fn to_json(&self) -> Value {
        let kinds: Vec<Value> = self
            .kinds
            .iter()
            .map(|k| {
                json!({
                    "kind": k.kind.to_string(),
                    "layers": k.n_layers,
                    "heads": k.n_heads,
                    "queries": k.queries,
                    "confidence": k.confidence,
                    "positional": k.positional.as_ref().map(|p| p.iter().map(|r| r.iter().map(|x| json!({"offset": x.offset, "fraction": x.fraction})).collect::<Vec<_>>()).collect::<Vec<_>>()),
                    "rare": k.rare.as_ref().map(|r| json!({"score": r.score, "two_rarest": r.two, "sentences": r.sentences, "queries": r.queries})),
                    "syntactic": k.syntactic.as_ref().map(|s| s.iter().map(|rd| json!({
                        "relation": rd.relation, "direction": rd.direction, "label": rd.label, "edges": rd.edges,
                        "baseline_offset": rd.baseline_offset, "baseline": rd.baseline, "accuracy": rd.accuracy})).collect::<Vec<_>>()),
                })
            })
            .collect();
        let functions: Vec<Value> = self
            .functions()
            .into_iter()
            .filter(|(_, f)| !f.is_empty())
            .map(|(id, f)| json!({"head": id.to_string(), "functions": f.iter().map(|x| x.to_string()).collect::<Vec<_>>()}))
            .collect();
        json!({
            "model": self.model,
            "dataset": self.dataset,
            "sentences": self.sentences,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "options": self.options.iter().cloned().collect::<serde_json::Map<_, _>>(),
            "frequency_source": self.freq_source,
            "kinds": kinds,
            "functions": functions,
        })
    }
}

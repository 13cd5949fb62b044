//! Analysis options, typed once at the edge; every value is echoed in results (docs/methods.md).

use crate::model::Kind;
use std::path::PathBuf;

options_enum!(
    #[derive(Eq, Hash, PartialOrd, Ord)]
    Stat, "stat", { Confidence = "confidence", Positional = "positional", Rare = "rare", Syntactic = "syntactic" }
);

pub use crate::model::ExcludeKeys;

/// Where token frequencies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum FreqSource {
    /// A text corpus tokenized with the model's own tokenizer.
    Text(PathBuf),
    /// `token<TAB>count` lines.
    Counts(PathBuf),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub stats: Vec<Stat>,
    pub kinds: Vec<Kind>,
    pub batch_tokens: usize,
    pub exclude_keys: ExcludeKeys,
    pub positional_threshold: f64,
    pub rare_top_n: usize,
    pub rare_threshold: f64,
    pub freq: FreqSource,
    pub relations: Vec<String>,
    pub subtypes: bool,
    /// Syntactic when accuracy >= baseline + margin.
    pub margin: f64,
}

impl Options {
    // `Options::new` (every option at its default) and `Options::defaults` (what
    // `m.analyze(data)` runs with) are written beside `analyze`'s option list, the one place
    // the defaults are, in analysis/script/analysis.rs.

    pub fn wants(&self, s: Stat) -> bool {
        self.stats.contains(&s)
    }

    /// The options as (name, value) pairs, for result metadata.
    pub fn echo(&self) -> crate::output::Echo {
        use crate::output::echo_list;
        use serde_json::json;
        let mut v = vec![
            ("stats".to_string(), echo_list(&self.stats)),
            ("kinds".into(), echo_list(&self.kinds)),
            ("exclude_keys".into(), json!(self.exclude_keys.to_string())),
            ("batch_tokens".into(), json!(self.batch_tokens)),
        ];
        if self.wants(Stat::Positional) {
            v.push(("positional_threshold".into(), json!(self.positional_threshold)));
        }
        if self.wants(Stat::Rare) {
            v.push(("rare_top_n".into(), json!(self.rare_top_n)));
            v.push(("rare_threshold".into(), json!(self.rare_threshold)));
            v.push((
                "freq".into(),
                json!(match &self.freq {
                    FreqSource::Text(p) => format!("text:{}", p.display()),
                    FreqSource::Counts(p) => format!("counts:{}", p.display()),
                }),
            ));
        }
        if self.wants(Stat::Syntactic) {
            v.push(("relations".into(), echo_list(&self.relations)));
            v.push(("subtypes".into(), json!(self.subtypes)));
            v.push(("margin".into(), json!(self.margin)));
        }
        v
    }
}

/// A relation label as counted: UD `obj` is `dobj`; subtypes map to their base only when
/// `subtypes` is on.
pub fn relation_of(deprel: &str, subtypes: bool) -> String {
    let base = if subtypes { deprel.split(':').next().unwrap_or(deprel) } else { deprel };
    if base == "obj" {
        "dobj".into()
    } else {
        base.to_string()
    }
}

/// The paper's names of the two directions of a relation: (governor->dependent, dependent->governor).
pub fn direction_names(rel: &str) -> (String, String) {
    match rel {
        "nsubj" => ("v->s".into(), "s->v".into()),
        "dobj" => ("v->o".into(), "o->v".into()),
        "amod" => ("n->adj".into(), "adj->n".into()),
        "advmod" => ("v->adv".into(), "adv->v".into()),
        _ => ("gov->dep".into(), "dep->gov".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_map_obj_and_subtypes() {
        assert_eq!(relation_of("obj", false), "dobj");
        assert_eq!(relation_of("nsubj:pass", false), "nsubj:pass");
        assert_eq!(relation_of("nsubj:pass", true), "nsubj");
        assert_eq!(relation_of("obj:lvc", true), "dobj");
        assert!("Confidence".parse::<Stat>().unwrap_err().contains("unknown stat 'Confidence'"));
    }
}

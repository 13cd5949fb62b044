//! Analysis options, typed once at the edge; every value is echoed in results (SPEC.md).

use crate::model::Kind;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stat {
    Confidence,
    Positional,
    Rare,
    Syntactic,
}

impl FromStr for Stat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "confidence" => Ok(Stat::Confidence),
            "positional" => Ok(Stat::Positional),
            "rare" => Ok(Stat::Rare),
            "syntactic" => Ok(Stat::Syntactic),
            other => Err(format!("unknown stat '{other}' (expected \"confidence\", \"positional\", \"rare\" or \"syntactic\")")),
        }
    }
}

impl fmt::Display for Stat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stat::Confidence => "confidence",
            Stat::Positional => "positional",
            Stat::Rare => "rare",
            Stat::Syntactic => "syntactic",
        })
    }
}

/// Keys excluded when taking a head's argmax and confidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExcludeKeys {
    /// EOS / SEP keys (the default).
    Eos,
    /// Every special token (BOS/CLS as well: attention sinks in decoder-only models).
    Special,
    Nothing,
}

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
    pub fn new(stats: Vec<Stat>, kinds: Vec<Kind>, brown: PathBuf) -> Self {
        Options {
            stats,
            kinds,
            batch_tokens: crate::model::batch::DEFAULT_BATCH_TOKENS,
            exclude_keys: ExcludeKeys::Eos,
            positional_threshold: 0.9,
            rare_top_n: 500,
            rare_threshold: 0.5,
            freq: FreqSource::Text(brown),
            relations: ["nsubj", "dobj", "amod", "advmod"].iter().map(|s| s.to_string()).collect(),
            subtypes: false,
            margin: 0.10,
        }
    }

    pub fn wants(&self, s: Stat) -> bool {
        self.stats.contains(&s)
    }

    /// The options as (name, value) pairs, for result metadata.
    pub fn echo(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("stats".to_string(), self.stats.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")),
            ("kinds".into(), self.kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(",")),
            ("exclude_keys".into(), match self.exclude_keys { ExcludeKeys::Eos => "eos".into(), ExcludeKeys::Special => "special".into(), ExcludeKeys::Nothing => "none".into() }),
            ("batch_tokens".into(), self.batch_tokens.to_string()),
        ];
        if self.wants(Stat::Positional) {
            v.push(("positional_threshold".into(), self.positional_threshold.to_string()));
        }
        if self.wants(Stat::Rare) {
            v.push(("rare_top_n".into(), self.rare_top_n.to_string()));
            v.push(("rare_threshold".into(), self.rare_threshold.to_string()));
            v.push(("freq".into(), match &self.freq { FreqSource::Text(p) => format!("text:{}", p.display()), FreqSource::Counts(p) => format!("counts:{}", p.display()) }));
        }
        if self.wants(Stat::Syntactic) {
            v.push(("relations".into(), self.relations.join(",")));
            v.push(("subtypes".into(), self.subtypes.to_string()));
            v.push(("margin".into(), self.margin.to_string()));
        }
        v
    }
}

/// A relation label as counted: UD `obj` is `dobj`; subtypes map to their base only when
/// `subtypes` is on.
pub fn relation_of(deprel: &str, subtypes: bool) -> String {
    let base = if subtypes { deprel.split(':').next().unwrap_or(deprel) } else { deprel };
    if base == "obj" { "dobj".into() } else { base.to_string() }
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

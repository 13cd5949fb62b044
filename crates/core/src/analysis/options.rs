//! Analysis options, typed once at the edge; every value is echoed in results (docs/methods.md).

use crate::model::view::View;
use crate::model::Kind;
use crate::optspec::{opt_bool, opt_f64, opt_int, opt_strs, OptSpec};
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
    /// Query rows per score tile; 0: as many as fit in `TILE_BYTES` (docs/methods.md#score-tiles).
    pub tile_rows: usize,
}

/// `analyze`'s options with a fixed default, declared once: its script option list holds them
/// and [`Options::new`] reads them (the others' defaults depend on the model or the data).
pub const BATCH_TOKENS_OPTION: OptSpec =
    opt_int("batch_tokens", crate::model::batch::DEFAULT_BATCH_TOKENS as i64, "tokens per batch, padding included");
pub const POSITIONAL_THRESHOLD_OPTION: OptSpec =
    opt_f64("positional_threshold", 0.9, "a head is positional when it attends to one offset this often");
pub const RARE_TOP_N_OPTION: OptSpec = opt_int("rare_top_n", 500, "tokens this frequent or more are not rare");
pub const RARE_THRESHOLD_OPTION: OptSpec =
    opt_f64("rare_threshold", 0.5, "a head is rare-word when it attends to the rarest token this often");
pub const RELATIONS_OPTION: OptSpec =
    opt_strs("relations", &["nsubj", "dobj", "amod", "advmod"], "dependency relations scored");
pub const SUBTYPES_OPTION: OptSpec =
    opt_bool("subtypes", false, "count relation subtypes (nsubj:pass) as their base relation");
pub const MARGIN_OPTION: OptSpec = opt_f64("margin", 0.1, "syntactic when accuracy >= baseline + margin");
pub const TILE_ROWS_OPTION: OptSpec = opt_int(
    "tile_rows",
    0,
    "query rows per score tile; 0: as many as fit in 15 MiB, at most 128 (docs/methods.md#score-tiles)",
);

/// The statistics `analyze` computes when not told: syntactic too on a treebank.
pub fn default_stats(treebank: bool) -> Vec<Stat> {
    if treebank {
        vec![Stat::Confidence, Stat::Positional, Stat::Rare, Stat::Syntactic]
    } else {
        vec![Stat::Confidence, Stat::Positional, Stat::Rare]
    }
}

/// An option that is a share of queries: between 0 and 1.
pub fn fraction(func: &str, name: &str, x: f64) -> Result<f64, String> {
    if !(0.0..=1.0).contains(&x) {
        return Err(format!("{func}: option '{name}' must be between 0 and 1, got {x}"));
    }
    Ok(x)
}

/// Some relation must be scored.
pub fn no_empty_relations(func: &str, relations: &[String]) -> Result<(), String> {
    if relations.is_empty() {
        return Err(format!("{func}: option 'relations' is empty"));
    }
    Ok(())
}

impl Options {
    /// Every option at the default of `analyze`'s option list (the constants above), with
    /// these statistics, kinds and default frequency corpus, for an encoder or a translation
    /// model (`exclude_keys` "eos"; [`Options::for_model`] picks it for a model).
    pub fn new(stats: Vec<Stat>, kinds: Vec<Kind>, brown: PathBuf) -> Self {
        const BATCH: i64 = BATCH_TOKENS_OPTION.default.int();
        const POSITIONAL: f64 = POSITIONAL_THRESHOLD_OPTION.default.float();
        const TOP_N: i64 = RARE_TOP_N_OPTION.default.int();
        const RARE: f64 = RARE_THRESHOLD_OPTION.default.float();
        const RELATIONS: &[&str] = RELATIONS_OPTION.default.strs();
        const SUBTYPES: bool = SUBTYPES_OPTION.default.bool();
        const MARGIN: f64 = MARGIN_OPTION.default.float();
        const TILE_ROWS: i64 = TILE_ROWS_OPTION.default.int();
        Options {
            stats,
            kinds,
            batch_tokens: BATCH as usize,
            exclude_keys: ExcludeKeys::default_for(false),
            positional_threshold: POSITIONAL,
            rare_top_n: TOP_N as usize,
            rare_threshold: RARE,
            freq: FreqSource::Text(brown),
            relations: RELATIONS.iter().map(|r| r.to_string()).collect(),
            subtypes: SUBTYPES,
            margin: MARGIN,
            tile_rows: TILE_ROWS as usize,
        }
    }

    /// What `m.analyze(data)` runs with given no options: the default statistics for this
    /// data (syntactic too when every sentence has a tree), every kind of the model, its
    /// `exclude_keys` default, the rest from [`Options::new`].
    pub fn for_model(m: &View, data: &crate::data::Dataset, brown: PathBuf) -> Self {
        let treebank = data.items.iter().all(|i| i.tree.is_some());
        let kinds = m.model.kinds().iter().map(|k| k.kind).collect();
        let decoder_only = m.model.decoder_only();
        Options {
            exclude_keys: ExcludeKeys::default_for(decoder_only),
            ..Options::new(default_stats(treebank), kinds, brown)
        }
    }

    /// What parsing checks, for options built in Rust (the library API): the kinds are the
    /// model's, shares are between 0 and 1, some relation is scored.
    pub fn check(&self, m: &View, func: &str) -> Result<(), String> {
        for k in &self.kinds {
            m.model.kind_shape(*k).map_err(|e| format!("{func}: {e}"))?;
        }
        fraction(func, "positional_threshold", self.positional_threshold)?;
        fraction(func, "rare_threshold", self.rare_threshold)?;
        fraction(func, "margin", self.margin)?;
        no_empty_relations(func, &self.relations)
    }

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
            ("tile_rows".into(), json!(self.tile_rows)),
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

//! Evaluation metrics.

pub mod bleu;

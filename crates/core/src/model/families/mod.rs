//! The checkpoint families, one file each, and their table ([`family`]: how a directory is
//! recognised, which loader builds the one `Transformer`, the tokenizer source and EOS rule).
//! A loader reads its checkpoint's names through [`super::readers::weights`] and builds the
//! core's blocks (`StackLayer::new`, `DecoderLayer::new`, `Attention::new`); it computes
//! nothing of the forward.

pub mod bart;
pub mod bert;
pub mod deepseek;
pub mod deepseek_gguf;
pub mod family;
pub mod gemma;
pub mod gguf_hybrid;
pub mod gpt2;
pub mod gpt_neox;
pub mod granitehybrid;
pub mod granitehybrid_gguf;
pub mod jamba;
pub mod jamba_gguf;
pub mod lfm2;
pub mod lfm2_gguf;
pub mod llama;
pub mod llama4;
pub mod llama_gguf;
pub mod m2m100;
pub mod marian_bin;
pub mod phi3;
pub mod qwen3next;
pub mod t5;

//! Text to tokens: the HF `tokenizers` crate with character offsets and special tokens
//! ([`tokenizer`]), SentencePiece models read without the C++ library ([`spm`]), and the
//! tokenizer a GGUF file carries in its metadata ([`gguf_tokenizer`]).

pub mod gguf_tokenizer;
pub mod readable;
pub mod spm;
pub mod tokenizer;

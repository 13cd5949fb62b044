//! Reading checkpoints: where a model lies ([`locate`]), the file formats (safetensors over a
//! memory map, GGUF with its dequantisation, PyTorch's `torch.save` zip without executing
//! pickles, the bounds-checked [`bytes`] cursor they share), HF directories and their
//! `config.json` checked key by key ([`hf`], [`config_keys`]), and the loader toolkit the
//! families build layers with ([`weights`]). Nothing here builds a layer of a family (the
//! config keys each family reads are data here, its layout is in `families/`; docs/formats.md).

pub mod bytes;
pub mod config_keys;
pub mod gguf;
pub mod hf;
pub mod locate;
pub mod safetensors;
pub mod stored;
pub mod torch_pickle;
pub mod weights;

//! The numeric core: real checkpoints loaded into one gated Transformer on tch. Knows nothing
//! of Rhai and never prints. Split by layer: [`readers`] (locating and reading checkpoint
//! files, the loader toolkit), [`tokenize`] (text to tokens), [`families`] (one loader per
//! checkpoint family and the family table), and the core here: the one [`transformer`], its
//! blocks ([`nn`], [`mixer`], [`mlp`], [`ssru`]), the trace ([`hooks`]), the unembedding, the
//! masked view, batching and the task loss.

pub mod batch;
pub mod bias;
pub mod deltanet;
pub mod experts;
pub mod families;
pub mod fill;
pub mod hooks;
pub mod latent;
pub mod loss;
pub mod mamba1;
pub mod mamba2;
pub mod mixer;
pub mod mlp;
pub mod nn;
pub mod readers;
pub mod resume;
pub mod shortconv;
pub mod ssru;
pub mod tokenize;
pub mod transformer;
pub mod unembed;
pub mod view;

use crate::device::{device_name, DeviceChoice, DeviceError};
pub use families::family::Family;
use nn::Gates;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use tch::{Device, Kind as DType, Tensor};
use tokenize::tokenizer::{Encoded, Tok};
use transformer::Transformer;

/// An attention kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Encoder self-attention.
    Enc,
    /// Decoder self-attention (causal).
    Dec,
    /// Decoder-encoder attention.
    Cross,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Enc => "enc",
            Kind::Dec => "dec",
            Kind::Cross => "cross",
        })
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enc" => Ok(Kind::Enc),
            "dec" => Ok(Kind::Dec),
            "cross" => Ok(Kind::Cross),
            other => Err(format!("unknown attention kind '{other}' (expected \"enc\", \"dec\" or \"cross\")")),
        }
    }
}

/// Per-head values of one attention kind, indexed `[layer_idx][head]`.
pub type HeadGrid = Vec<Vec<f64>>;
/// One [`HeadGrid`] per attention kind.
pub type KindGrids = Vec<(Kind, HeadGrid)>;

/// One attention head, zero-based; printed `enc.2.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeadId {
    pub kind: Kind,
    pub layer_idx: usize,
    pub head: usize,
}

impl fmt::Display for HeadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.kind, self.layer_idx, self.head)
    }
}

/// Parses the printed name back: `enc.2.5` is kind `enc`, layer 2, head 5.
impl FromStr for HeadId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a head name (expected KIND.LAYER.HEAD, e.g. \"enc.5.5\")");
        let mut parts = s.trim().split('.');
        let (Some(k), Some(l), Some(h), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let kind: Kind = k.parse().map_err(|e: String| format!("{}: {e}", bad()))?;
        let layer_idx = l.parse::<usize>().map_err(|_| bad())?;
        let head = h.parse::<usize>().map_err(|_| bad())?;
        Ok(HeadId { kind, layer_idx, head })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}: {1}")]
    Io(String, String),
    #[error("{0}: bad config: {1}")]
    Config(String, String),
    #[error("{file}: tensor '{name}' is missing")]
    MissingTensor { file: String, name: String },
    #[error("{file}: tensor '{name}' has shape {got:?}, expected {want:?}")]
    BadShape { file: String, name: String, want: Vec<i64>, got: Vec<i64> },
    #[error("{file}: corrupt checkpoint: {why}")]
    Corrupt { file: String, why: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("input of {tokens} tokens is longer than the model's {max} positions")]
    TooLong { tokens: i64, max: i64 },
    #[error("input of {tokens} tokens is longer than the model's {max} positions (max_position_embeddings); allow_past_positions(true) runs past them (rotary positions extrapolate; the model was not trained there)")]
    PastPositions { tokens: i64, max: i64 },
    #[error("the model has no output head (it is an encoder only)")]
    NoOutputHead,
    #[error("{}", families::family::unknown(.0))]
    UnknownFamily(String),
    #[error("{0}")]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Invalid(String),
    #[error("interrupted")]
    Interrupted,
    #[error("torch: {}", one_line(&.0.to_string()))]
    Torch(#[from] tch::TchError),
}

/// A libtorch message without its C++ trace: libtorch appends `Exception raised from ...` and
/// `frame #N: ...` lines (in a panic's message, `\n`-escaped inside the error's Debug form);
/// a person sees the first line, saying the trace was left out. `RUST_BACKTRACE=1` prints the
/// whole message of a panic on stderr (`engine::install_panic_hook`).
pub fn one_line(msg: &str) -> String {
    let cuts = ["\nException raised from", "\\nException raised from", "\nframe #", "\\nframe #"];
    let cut = cuts.iter().filter_map(|c| msg.find(c)).min();
    match cut {
        Some(i) => {
            let head = msg[..i].trim_end();
            let head = head.strip_suffix('.').unwrap_or(head);
            format!("{head} (libtorch's C++ trace left out)")
        }
        None => msg.to_string(),
    }
}

/// Stops a forward pass between layers when the run on this thread was interrupted (Ctrl-C,
/// a kernel's `interrupt_request`; [`crate::run::interrupted`]). Analyses also check their own
/// `stop` between batches; this check bounds the wait for an interrupt by one layer's work
/// instead of one batch's (a sweep's batch runs every head's rows through the layers above it).
/// Outside a run (the library API, tests) it never fires.
pub fn check_interrupt() -> Result<(), ModelError> {
    if crate::run::interrupted() {
        return Err(ModelError::Interrupted);
    }
    Ok(())
}

/// `load_model`'s options with a fixed default, declared once: its script option list holds
/// them and [`LoadOptions`]'s `Default` reads them.
pub const DEVICE_OPTION: crate::optspec::OptSpec =
    crate::optspec::opt_str("device", "auto", "\"auto\" (CUDA when available), \"cpu\", \"cuda\", \"cuda:N\"");
pub const DTYPE_OPTION: crate::optspec::OptSpec = crate::optspec::opt_str(
    "dtype",
    "f32",
    "\"f32\", \"f64\" (for checking numerics), \"bf16\" (half the memory; CPU or CUDA) or \"f16\" (CUDA)",
);
pub const ALLOW_UNKNOWN_CONFIG_OPTION: crate::optspec::OptSpec = crate::optspec::opt_bool("allow_unknown_config", false, "load a config.json holding a key headscope does not read (or an unknown rope setting), with a warning, instead of refusing it");

/// Where and in what precision a model is loaded. `Default` gives what a script gets with no
/// options.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub device: Device,
    pub dtype: DType,
    /// Load a config holding a key headscope does not read (docs/formats.md#config-keys),
    /// warning once, instead of refusing it.
    pub allow_unknown_config: bool,
}

impl Default for LoadOptions {
    /// `load_model`'s defaults ([`DEVICE_OPTION`], [`DTYPE_OPTION`],
    /// [`ALLOW_UNKNOWN_CONFIG_OPTION`]): device "auto" (CUDA when available, resolved now),
    /// dtype "f32".
    fn default() -> Self {
        const AUTO: bool = crate::optspec::str_eq(DEVICE_OPTION.default.str(), "auto");
        const F32: bool = crate::optspec::str_eq(DTYPE_OPTION.default.str(), "f32");
        const _: () = assert!(AUTO && F32, "load_model's defaults are device \"auto\" and dtype \"f32\"");
        const ALLOW: bool = ALLOW_UNKNOWN_CONFIG_OPTION.default.bool();
        let device = if tch::Cuda::is_available() { Device::Cuda(0) } else { Device::Cpu };
        LoadOptions { device, dtype: DType::Float, allow_unknown_config: ALLOW }
    }
}

impl LoadOptions {
    /// From the user's choices, checked: half precision only on CUDA.
    pub fn new(device: DeviceChoice, dtype: &str) -> Result<Self, ModelError> {
        let device = device.resolve()?;
        let dtype = match dtype {
            "f32" | "float32" => DType::Float,
            // Double precision: for checking numerics against float64 references (LRP's z+
            // rule divides by sums that float32 rounds visibly), about 2x slower.
            "f64" | "float64" => DType::Double,
            "bf16" | "bfloat16" => DType::BFloat16,
            "f16" | "float16" => DType::Half,
            other => {
                return Err(ModelError::Invalid(format!(
                    "unknown dtype '{other}' (expected \"f32\", \"f64\", \"bf16\" or \"f16\")"
                )))
            }
        };
        LoadOptions { device, dtype, allow_unknown_config: false }.checked()
    }

    /// The options checked as `new` checks a user's choices, for options built in Rust (the
    /// library API): the device exists, the dtype is one of the four, half precision only on
    /// CUDA.
    pub fn checked(self) -> Result<Self, ModelError> {
        match self.device {
            Device::Cpu => {}
            // A CUDA index past the GPUs there are would fail inside libtorch; refused here.
            Device::Cuda(i) => {
                DeviceChoice::Cuda(i).resolve()?;
            }
            other => {
                return Err(ModelError::Invalid(format!(
                    "unsupported device {other:?} (expected the CPU or a CUDA device)"
                )))
            }
        }
        if !matches!(self.dtype, DType::Float | DType::Double | DType::BFloat16 | DType::Half) {
            return Err(ModelError::Invalid(format!(
                "unsupported dtype {:?} (expected f32, f64, bf16 or f16)",
                self.dtype
            )));
        }
        // bf16 runs on the CPU (libtorch's bf16 kernels; AVX-512 BF16 where the CPU has it):
        // a 7B checkpoint fits in 14 GB. float16 CPU kernels are slow or missing.
        if self.dtype == DType::Half && self.device == Device::Cpu {
            return Err(ModelError::Invalid(
                "dtype 'f16' is only supported on CUDA; use bf16, f32 or f64 on the CPU".into(),
            ));
        }
        Ok(self)
    }
}

/// How many layers and heads one attention kind has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindShape {
    pub kind: Kind,
    pub n_layers: usize,
    pub n_heads: usize,
}

/// Where loading time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTimes {
    /// Reading and converting the weights, building the network.
    pub weights: f64,
    /// Parsing tokenizer.json.
    pub tokenizer: f64,
    pub total: f64,
}

pub struct Model {
    pub load_times: LoadTimes,
    pub family: Family,
    /// What the file says it holds where the family covers several: a GGUF's
    /// `general.architecture` (`Model::family_name`).
    pub architecture: Option<String>,
    pub path: PathBuf,
    /// The name the user gave where the path does not say it: a model id resolved through the
    /// Hugging Face cache (`org/name`, not its snapshot's hash).
    pub id: Option<String>,
    /// What loading let through under `allow_unknown_config` (shown once, by `load_model`).
    pub warnings: Vec<String>,
    /// The dtype most of the checkpoint's weight bytes are stored in (`BF16`, `Q4_K`), where
    /// its headers say ([`readers::stored`]).
    pub stored: Option<String>,
    pub net: Transformer,
    pub tok: Tok,
    pub opts: LoadOptions,
    pub n_params: i64,
    /// Heads removed physically (`prune_heads`); empty for a model as loaded. Such a model
    /// has layers of different widths, and its heads keep no original numbering.
    pub removed: Vec<HeadId>,
}

/// A batch of tokenized sentences, padded.
pub struct Batch {
    pub ids: Tensor,
    /// `[B, S]`, 1 for real tokens (special tokens included), 0 for padding.
    pub mask: Tensor,
    pub encoded: Vec<Encoded>,
}

/// Counts of a streaming pass.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StreamStats {
    pub sentences: usize,
    /// Real tokens (special tokens included, padding not).
    pub tokens: usize,
    pub padded_tokens: usize,
    pub batches: usize,
}

/// One head's attention over one sentence.
#[derive(Clone)]
pub struct AttentionMap {
    pub head: HeadId,
    pub query_tokens: Vec<String>,
    pub key_tokens: Vec<String>,
    /// `[query][key]`.
    pub weights: Vec<Vec<f64>>,
    /// Per key: its token id and whether the tokenizer marks it special (BOS, CLS, EOS, a
    /// translation decoder's start token).
    pub key_ids: Vec<i64>,
    pub key_special: Vec<bool>,
    /// The keys the text listing leaves out of each query's top key (the weights keep every
    /// key), and the `exclude_keys` value that chose them (none: [`AttentionMap::listing_without`] sets them).
    pub key_excluded: Vec<bool>,
    pub exclude_keys: ExcludeKeys,
    /// The model's end-of-sequence ids (what `exclude_keys: "eos"` leaves out).
    pub eos_ids: Vec<i64>,
}

options_enum!(
    /// Keys excluded when taking a head's argmax and confidence.
    ExcludeKeys, "exclude_keys", {
        /// EOS / SEP keys (the default of encoders and translation models).
        Eos = "eos",
        /// Every special token (BOS/CLS as well: the attention sink of decoder-only models,
        /// their default; docs/methods.md#attention-sinks).
        Special = "special",
        Nothing = "none",
    }
);

impl ExcludeKeys {
    /// Whether a key of this id and special-token flag is left out.
    pub fn excludes(self, id: i64, special: bool, eos_ids: &[i64]) -> bool {
        match self {
            ExcludeKeys::Nothing => false,
            ExcludeKeys::Eos => eos_ids.contains(&id),
            ExcludeKeys::Special => special || eos_ids.contains(&id),
        }
    }

    /// The default for a model: `special` for a decoder-only model (its beginning-of-sequence
    /// token is an attention sink), `eos` otherwise (docs/methods.md#attention-sinks).
    pub fn default_for(decoder_only: bool) -> ExcludeKeys {
        if decoder_only {
            ExcludeKeys::Special
        } else {
            ExcludeKeys::Eos
        }
    }
}

impl AttentionMap {
    /// A copy listed under another `exclude_keys`.
    pub fn relisted(&self, exclude: ExcludeKeys) -> AttentionMap {
        self.clone().listing_without(exclude)
    }

    /// The map whose text listing takes each query's top key among the keys `exclude` keeps
    /// (the weights are unchanged).
    pub fn listing_without(mut self, exclude: ExcludeKeys) -> AttentionMap {
        self.key_excluded = self
            .key_ids
            .iter()
            .zip(&self.key_special)
            .map(|(&id, &sp)| exclude.excludes(id, sp, &self.eos_ids))
            .collect();
        self.exclude_keys = exclude;
        self
    }
}

/// Every head's attention of one kind on one sentence ([`Model::attention_maps`]).
pub struct KindAttention {
    pub kind: Kind,
    pub query_tokens: Vec<String>,
    pub key_tokens: Vec<String>,
    /// Per key: token id and special-token flag.
    pub key_ids: Vec<i64>,
    pub key_special: Vec<bool>,
    /// Per layer `[heads held, Tq, Tk]`, double precision, on the CPU; `None` for a layer
    /// without heads (`prune_heads`).
    pub layers: Vec<Option<Tensor>>,
}

impl Model {
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Model, ModelError> {
        if !path.exists() {
            return Err(ModelError::Io(path.display().to_string(), "no such file or directory".into()));
        }
        let family =
            families::family::detect(path)?.ok_or_else(|| ModelError::UnknownFamily(path.display().to_string()))?;
        // Every key of config.json is read or known harmless (docs/formats.md#config-keys).
        let warnings = if path.is_dir() && readers::hf::is_hf_dir(path) {
            readers::hf::vetted_config(path, opts.allow_unknown_config)?.1
        } else {
            vec![]
        };
        let t0 = std::time::Instant::now();
        let row = family.row();
        // Only the Firefox-Translations tokenizers leave the EOS to the model.
        let framing = if row.tokenizer == families::family::TokenizerSource::JsonAppendEos {
            tokenize::tokenizer::Framing::AppendEos(families::marian_bin::EOS)
        } else {
            tokenize::tokenizer::Framing::Tokenizer
        };
        // A `.gguf` file's tokenizer.json lies beside it.
        let tok_path = if path.is_file() { path.with_file_name("tokenizer.json") } else { path.join("tokenizer.json") };
        // Weights, then the tokenizer: on two cores a parallel tokenizer thread only competes
        // with libtorch's threads, and sequential loading keeps both times honest.
        let t = std::time::Instant::now();
        let net = {
            let _guard = tch::no_grad_guard();
            (row.load)(path, opts)?
        };
        let net = Ok::<_, ModelError>((net, t.elapsed().as_secs_f64()));
        let t = std::time::Instant::now();
        // MarianMT ships sentencepiece models and vocab.json instead of tokenizer.json.
        // A GGUF without a tokenizer.json beside it brings its own in its metadata.
        use families::family::TokenizerSource as Ts;
        let tok = if row.tokenizer == Ts::JsonOrMarianSpm && !tok_path.is_file() {
            Tok::marian(path)
        } else if row.tokenizer == Ts::JsonOrM2m100Spm
            && !tok_path.is_file()
            && path.join("sentencepiece.bpe.model").is_file()
            && path.join("vocab.json").is_file()
        {
            // M2M100's own checkpoints ship sentencepiece.bpe.model and vocab.json.
            Tok::m2m100(path)
        } else if row.tokenizer == Ts::JsonOrGguf && !tok_path.is_file() {
            families::llama_gguf::gguf_of(path)
                .ok_or_else(|| ModelError::Io(path.display().to_string(), "no single *.gguf in the directory".into()))
                .and_then(|f| Tok::from_gguf(&readers::gguf::Gguf::open(&f)?))
        } else {
            Tok::from_file(&tok_path, framing)
        };
        let tok = tok.map(|tok| (tok, t.elapsed().as_secs_f64()));
        let ((net, weights), (mut tok, tokenizer)) = (net?, tok?);
        if row.eos_from_model {
            tok.eos_id = Some(net.eos_id);
        }
        // Every id the tokenizer can produce must have an embedding row.
        let rows = net.embed.vocab();
        if tok.vocab_size() as i64 > rows {
            return Err(ModelError::Invalid(format!(
                "{}: the tokenizer has {} tokens but the embeddings have {rows} rows",
                tok_path.display(),
                tok.vocab_size()
            )));
        }
        let load_times = LoadTimes { weights, tokenizer, total: t0.elapsed().as_secs_f64() };
        let architecture = match row.source {
            families::family::Source::Gguf => families::llama_gguf::architecture(path),
            _ => None,
        };
        let mut m = Model {
            load_times,
            family,
            architecture,
            path: path.to_path_buf(),
            id: None,
            warnings,
            stored: readers::stored::stored(path),
            net,
            tok,
            opts,
            n_params: 0,
            removed: vec![],
        };
        m.n_params = m.count_params();
        Ok(m)
    }

    /// The parameters the model holds, as transformers' `sum(p.numel() for p in
    /// model.parameters())` counts them: a tied matrix once, buffers (HF seq2seq's
    /// `final_logits_bias`) not; learned position rows no input reads (RoBERTa's before
    /// `padding_idx + 1`, BART's offset 2) are not kept, so not counted (tests/models/param_count.rs).
    ///
    /// The count walks the blocks' own parameter lists ([`transformer::Transformer::named_params_mut`],
    /// each tensor once however many places share it), less what the family's row lists as
    /// transformers' buffers ([`families::family::Row::buffers`]: M2M100's sinusoid tables, the output
    /// bias of HF BART, mBART and MarianMT). It needs the walker's `&mut` only to reach the
    /// tensors.
    pub fn count_params(&mut self) -> i64 {
        let buffers = self.family.row().buffers;
        let buffer = |name: &str| buffers.iter().any(|b| name.ends_with(b));
        self.net.named_params_mut().iter().filter(|(name, _)| !buffer(name)).map(|(_, t)| t.numel() as i64).sum()
    }

    /// The family a person reads: the architecture of a GGUF file (`gemma3 (gguf)`), else the
    /// family's name (its HF `model_type`, `marian_bin`).
    pub fn family_name(&self) -> String {
        match &self.architecture {
            Some(a) => format!("{a} ({})", self.family),
            None => self.family.to_string(),
        }
    }

    pub fn name(&self) -> String {
        if let Some(id) = &self.id {
            return id.clone();
        }
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    pub fn device(&self) -> Device {
        self.opts.device
    }

    /// A decoder-only language model: a causal self-attention stack and no decoder (GPT-2,
    /// Llama, SmolLM2, ...); the models whose attention sinks analyses keep apart by default
    /// (docs/methods.md#attention-sinks).
    pub fn decoder_only(&self) -> bool {
        self.net.stack_kind == Kind::Dec && self.net.decoder.is_empty()
    }

    /// The attention kinds of this model, in order enc, dec, cross.
    /// `n_heads` is the width of a layer in the original numbering: after `prune_heads` some
    /// layers hold fewer heads ([`Model::present`]).
    pub fn kinds(&self) -> Vec<KindShape> {
        let mut v = Vec::new();
        // A hybrid stack's layers differ (LFM2's conv layers have no heads): the widest.
        if !self.net.stack.is_empty() {
            let n_heads = self.net.stack.iter().map(|l| l.mixer().width()).max().unwrap_or(0);
            v.push(KindShape { kind: self.net.stack_kind, n_layers: self.net.stack.len(), n_heads });
        }
        if let Some(a) = self.net.decoder.first().and_then(|l| l.self_heads()) {
            v.push(KindShape { kind: Kind::Dec, n_layers: self.net.decoder.len(), n_heads: a.width() });
        }
        if let Some((a, _)) = self.net.decoder.first().and_then(|l| l.cross.as_ref()) {
            v.push(KindShape { kind: Kind::Cross, n_layers: self.net.decoder.len(), n_heads: a.width() });
        }
        v
    }

    /// A decoder-only language model: a causal self-attention stack with an output head, whose
    /// task loss is the next-token loss (docs/methods.md#task-loss).
    pub fn is_lm(&self) -> bool {
        self.net.decoder.is_empty() && self.net.stack_kind == Kind::Dec && self.net.output.is_some()
    }

    /// An encoder-decoder with an output head (translation, teacher-forced loss).
    pub fn translates(&self) -> bool {
        self.net.output.is_some() && !self.net.decoder.is_empty()
    }

    /// Whether the model has a task loss (docs/methods.md#task-loss): next-token for a
    /// language model, teacher-forced for an encoder-decoder; an encoder has none.
    pub fn has_task_loss(&self) -> bool {
        self.is_lm() || self.translates()
    }

    /// The final states `[B, T, D]` whose logits predict `targets [B, T]`: a language model's
    /// stack output at positions `0..T` (the targets are the next tokens), else the teacher-forced
    /// decoder pass over `enc`.
    pub fn teacher_states(
        &self,
        enc: &Tensor,
        mask: &Tensor,
        targets: &Tensor,
        gates: &Gates,
    ) -> Result<Tensor, ModelError> {
        if self.is_lm() {
            return Ok(enc.f_narrow(1, 0, targets.size()[1])?);
        }
        self.net.teacher(enc, mask, targets, transformer::Stop::FinalNorm, gates, None)
    }

    /// Whether heads of `kind` live in the decoder of an encoder-decoder model (`dec` and
    /// `cross`), read over teacher-forced targets, rather than in the self-attention stack.
    pub fn in_decoder(&self, kind: Kind) -> bool {
        kind != self.net.stack_kind && !self.net.decoder.is_empty()
    }

    /// The token mixer of layer `layer_idx` of `kind` (its heads, through the one interface
    /// of [`mixer::Mixer`]): the stack's mixer, a decoder's self-attention or cross-attention.
    pub fn mixer(&self, kind: Kind, layer_idx: usize) -> Option<&dyn mixer::Mixer> {
        match kind {
            Kind::Cross => self.net.decoder.get(layer_idx)?.cross.as_ref().map(|(a, _)| a as &dyn mixer::Mixer),
            k if k == self.net.stack_kind => self.net.stack.get(layer_idx).map(|l| l.mixer()),
            Kind::Dec => self.net.decoder.get(layer_idx)?.self_heads(),
            _ => None,
        }
    }

    /// The token mixer of layer `layer_idx` of `kind`, to change (`prune_heads`).
    pub fn mixer_mut(&mut self, kind: Kind, layer_idx: usize) -> Option<&mut dyn mixer::Mixer> {
        match kind {
            Kind::Cross => self.net.decoder.get_mut(layer_idx)?.cross.as_mut().map(|(a, _)| a as &mut dyn mixer::Mixer),
            k if k == self.net.stack_kind => self.net.stack.get_mut(layer_idx).map(|l| l.mixer_mut()),
            Kind::Dec => self.net.decoder.get_mut(layer_idx)?.self_heads_mut(),
            _ => None,
        }
    }

    /// The attention block of layer `layer_idx` of `kind`, where its mixer is attention.
    pub fn attention(&self, kind: Kind, layer_idx: usize) -> Option<&nn::Attention> {
        self.mixer(kind, layer_idx)?.as_attention()
    }

    /// The heads of one layer that are present, by original number, in physical order (all
    /// of them unless `prune_heads` removed some).
    pub fn present(&self, kind: Kind, layer_idx: usize) -> Vec<usize> {
        self.mixer(kind, layer_idx).map(|a| a.present()).unwrap_or_default()
    }

    /// Per-physical-head values of one layer -> a row of the original width, NaN where a head
    /// was removed.
    pub fn spread(&self, kind: Kind, layer_idx: usize, values: &[f64]) -> Vec<f64> {
        self.spread_with(kind, layer_idx, values.to_vec(), f64::NAN)
    }

    /// [`Model::spread`] for any per-head value, `fill` where a head was removed.
    pub fn spread_with<T: Clone>(&self, kind: Kind, layer_idx: usize, values: Vec<T>, fill: T) -> Vec<T> {
        let Some(a) = self.mixer(kind, layer_idx) else { return values };
        // The kind's width: a hybrid's layer without heads spreads to a row of fills.
        let width = self.kind_shape(kind).map_or(a.width(), |s| s.n_heads);
        if a.n_present() == width {
            return values;
        }
        let mut row = vec![fill; width];
        for (&h, v) in a.present().iter().zip(values) {
            row[h] = v;
        }
        row
    }

    /// Per-layer physical rows of `kind` -> the original width (see [`Model::spread`]).
    pub fn spread_grid(&self, kind: Kind, grid: HeadGrid) -> HeadGrid {
        grid.into_iter().enumerate().map(|(l, row)| self.spread_with(kind, l, row, f64::NAN)).collect()
    }

    /// Heads present in each layer of `kind` (physical counts).
    pub fn layer_heads(&self, kind: Kind) -> Vec<usize> {
        let n = self.kind_shape(kind).map_or(0, |s| s.n_layers);
        (0..n).map(|l| self.mixer(kind, l).map_or(0, |a| a.n_present())).collect()
    }

    /// The first layer of `kind` whose mixer is not attention, with the mixer's kind (a
    /// hybrid's conv or Mamba-2 layer): what a method covering only stacks with attention heads
    /// in every layer names when it refuses (`what`: the method and what it covers).
    pub fn refuse_headless(&self, kind: Kind, what: &str) -> Result<(), ModelError> {
        let n = self.kind_shape(kind).map_or(0, |s| s.n_layers);
        match (0..n).find_map(|l| self.mixer(kind, l).filter(|a| a.as_attention().is_none()).map(|a| (l, a.kind()))) {
            Some((l, mixer)) => Err(ModelError::Invalid(format!(
                "{what}: {} has layers without attention heads ({kind} layer {l}'s token mixer is '{mixer}'; docs/methods.md#mixers)",
                self.name()
            ))),
            None => Ok(()),
        }
    }

    /// Heads of the kinds' numbering that no layer holds as loaded: in a hybrid stack, every
    /// head of a layer whose mixer has fewer than the widest layer's (LFM2's conv layers have
    /// none). They read as removed heads do (docs/methods.md#mixers).
    pub fn absent(&self) -> Vec<HeadId> {
        let mut out = Vec::new();
        for k in self.kinds() {
            for l in 0..k.n_layers {
                let width = self.mixer(k.kind, l).map_or(0, |a| a.width());
                out.extend((width..k.n_heads).map(|head| HeadId { kind: k.kind, layer_idx: l, head }));
            }
        }
        out
    }

    pub fn kind_shape(&self, kind: Kind) -> Result<KindShape, ModelError> {
        self.kinds().into_iter().find(|k| k.kind == kind).ok_or_else(|| {
            let have: Vec<String> = self.kinds().iter().map(|k| k.kind.to_string()).collect();
            ModelError::Invalid(format!("{} has no '{kind}' attention (it has: {})", self.name(), have.join(", ")))
        })
    }

    /// Checks a head exists, naming what is out of range.
    pub fn check_head(&self, h: HeadId) -> Result<(), ModelError> {
        let s = self.kind_shape(h.kind)?;
        if h.layer_idx >= s.n_layers {
            return Err(ModelError::Invalid(format!(
                "layer {} out of range: '{}' has layers 0..{}",
                h.layer_idx,
                h.kind,
                s.n_layers - 1
            )));
        }
        if h.head >= s.n_heads {
            return Err(ModelError::Invalid(format!(
                "head {} out of range: '{}' layers have heads 0..{}",
                h.head,
                h.kind,
                s.n_heads - 1
            )));
        }
        let mixer = self.mixer(h.kind, h.layer_idx);
        if let Some(a) = mixer.filter(|a| h.head >= a.width()) {
            return Err(ModelError::Invalid(format!(
                "head {h} does not exist: layer {} of {} is {} '{}' layer with {} heads (docs/methods.md#mixers)",
                h.layer_idx,
                self.name(),
                if a.kind().starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" },
                a.kind(),
                a.width()
            )));
        }
        if mixer.and_then(|a| a.physical(h.head)).is_none() {
            return Err(ModelError::Invalid(format!("head {h} was removed from {} by prune_heads", self.name())));
        }
        Ok(())
    }

    /// Gates closing `closed` heads (all others 1), one mask for the whole batch.
    pub fn gates_closing(&self, closed: &[HeadId]) -> Result<Gates, ModelError> {
        let mut g = Gates::none();
        for h in closed {
            self.check_head(*h)?;
        }
        for s in self.kinds() {
            let heads: Vec<&HeadId> = closed.iter().filter(|h| h.kind == s.kind).collect();
            if heads.is_empty() {
                continue;
            }
            let mut v = vec![1f32; s.n_layers * s.n_heads];
            for h in heads {
                v[h.layer_idx * s.n_heads + h.head] = 0.0;
            }
            let t = Tensor::from_slice(&v).view([1, s.n_layers as i64, s.n_heads as i64]).to_device(self.device());
            match s.kind {
                Kind::Enc => g.enc = Some(t),
                Kind::Dec => g.dec = Some(t),
                Kind::Cross => g.cross = Some(t),
            }
        }
        Ok(g)
    }

    /// Every hook point this model's forward meets, in order (docs/methods.md#hook-points):
    /// what its blocks say they visit ([`transformer::Transformer::hook_points`]).
    pub fn hook_points(&self) -> Vec<hooks::At> {
        self.net.hook_points()
    }

    /// The hook point named `name` (`blocks.L.…` without a kind on a model with one stack), or
    /// an error naming what is wrong and what exists.
    pub fn hook_point(&self, name: &str) -> Result<hooks::At, ModelError> {
        let default = if self.net.decoder.is_empty() { Some(self.net.stack_kind) } else { None };
        let at = hooks::parse_name(name, default).map_err(ModelError::Invalid)?;
        let all = self.hook_points();
        if all.contains(&at) {
            return Ok(at);
        }
        let same_point: Vec<&hooks::At> = all.iter().filter(|a| a.point == at.point).collect();
        let why = if same_point.is_empty() {
            format!("{} has no '{}' point", self.name(), at.point.spec().name)
        } else if !same_point.iter().any(|a| a.kind == at.kind) {
            let kinds: std::collections::BTreeSet<String> = same_point.iter().map(|a| a.kind.to_string()).collect();
            format!(
                "{} has '{}' for {} only",
                self.name(),
                at.point.spec().name,
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            )
        } else {
            let n = same_point.iter().filter(|a| a.kind == at.kind).map(|a| a.layer).max().unwrap_or(0);
            format!("layer {} out of range: {} has {} layers 0..{n}", at.layer, self.name(), at.kind)
        };
        Err(ModelError::Invalid(format!("hook '{name}': {why}")))
    }

    pub fn tokenize(&self, text: &str) -> Result<Encoded, ModelError> {
        self.tok.encode(text)
    }

    /// Tokenizes and pads sentences into one batch.
    pub fn batch(&self, texts: &[&str]) -> Result<Batch, ModelError> {
        Ok(self.batch_encoded(self.tokenize_all(texts.iter().copied())?))
    }

    pub fn batch_encoded(&self, encoded: Vec<Encoded>) -> Batch {
        let s = encoded.iter().map(|e| e.ids.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(encoded.len() * s);
        let mut mask = Vec::with_capacity(encoded.len() * s);
        for e in &encoded {
            ids.extend(e.ids.iter().copied().chain(std::iter::repeat_n(self.tok.pad_id, s - e.ids.len())));
            mask.extend(std::iter::repeat_n(1f32, e.ids.len()).chain(std::iter::repeat_n(0f32, s - e.ids.len())));
        }
        let b = encoded.len() as i64;
        Batch {
            ids: Tensor::from_slice(&ids).view([b, s as i64]).to_device(self.device()),
            mask: Tensor::from_slice(&mask).view([b, s as i64]).to_device(self.device()),
            encoded,
        }
    }

    /// Encoder output `[B, S, D]` of a batch.
    pub fn encode(&self, batch: &Batch, gates: &Gates, h: hooks::HookSlot) -> Result<Tensor, ModelError> {
        let _guard = tch::no_grad_guard();
        self.net.encode(&batch.ids, &batch.mask, gates, h)
    }

    /// The token of target language `code` (NLLB's `fra_Latn`, mBART's `fr_XX`, M2M100's
    /// `__fr__` also as `fr`): one of the tokenizer's language codes
    /// ([`tokenize::tokenizer::Tok::language_codes`]); anything else is an error naming the code.
    pub fn target_language(&self, code: &str) -> Result<i64, ModelError> {
        if !self.translates() {
            return Err(ModelError::Invalid(format!("tgt_lang '{code}': {} does not translate", self.name())));
        }
        let codes = self.tok.language_codes();
        if let Some((_, id)) = codes.iter().find(|(t, _)| t == code || *t == format!("__{code}__")) {
            return Ok(*id);
        }
        let known = match codes.len() {
            0 => "its tokenizer has none".to_string(),
            n if n <= 8 => codes.iter().map(|c| c.0.as_str()).collect::<Vec<_>>().join(", "),
            n => {
                format!("{}, ... ({n} in all)", codes[..8].iter().map(|c| c.0.as_str()).collect::<Vec<_>>().join(", "))
            }
        };
        Err(ModelError::Invalid(format!("tgt_lang '{code}' is not a language code of {} ({known})", self.name())))
    }

    /// Makes `code` ([`Model::target_language`]) the token every translation starts with:
    /// greedy decoding, greedy targets and reference targets of every analysis.
    pub fn set_target_language(&mut self, code: &str) -> Result<(), ModelError> {
        self.net.forced_bos.set(Some(self.target_language(code)?));
        Ok(())
    }

    /// Greedy translations, batched by length. Max output length: 2.5 x source tokens + 2.
    pub fn translate(&self, texts: &[&str], gates: &Gates, max_tokens: usize) -> Result<Vec<Vec<i64>>, ModelError> {
        self.translate_forced(texts, gates, max_tokens, self.net.forced_bos.get())
    }

    /// [`Model::translate`] with `forced` as every translation's first token (the target
    /// language), or none.
    pub fn translate_forced(
        &self,
        texts: &[&str],
        gates: &Gates,
        max_tokens: usize,
        forced: Option<i64>,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        if self.net.output.is_none() || self.net.decoder.is_empty() {
            return Err(ModelError::Invalid(format!("{} cannot translate: it has no decoder", self.name())));
        }
        let _guard = tch::no_grad_guard();
        let encoded = self.tokenize_all(texts.iter().copied())?;
        let mut out = vec![Vec::new(); texts.len()];
        for (rows, b) in self.batches(&encoded, max_tokens) {
            let h = self.net.encode(&b.ids, &b.mask, gates, None)?;
            let max_len: Vec<i64> = b.encoded.iter().map(|e| self.max_output_len(e.ids.len())).collect();
            let res = self.net.greedy_forced(&h, &b.mask, &max_len, gates, forced)?;
            for (slot, ids) in rows.iter().zip(res) {
                out[*slot] = ids;
            }
        }
        Ok(out)
    }

    /// Streams the encoder over many sentences in length buckets of at most `max_tokens`
    /// padded tokens, handing each batch and its output to `on_batch` (with the capture the
    /// caller asked for). Stops with `ModelError::Interrupted` when `stop()` turns true.
    pub fn encode_stream(
        &self,
        texts: &[&str],
        max_tokens: usize,
        gates: &Gates,
        stop: &dyn Fn() -> bool,
        on_batch: &mut dyn FnMut(&Batch, &Tensor) -> Result<(), ModelError>,
    ) -> Result<StreamStats, ModelError> {
        let _guard = tch::no_grad_guard();
        let encoded = self.tokenize_all(texts.iter().copied())?;
        let mut stats = StreamStats::default();
        // A decoder-only stack runs its sentences packed several to a row where it can
        // (docs/methods.md#packing): `on_batch` then sees rows that are not sentences.
        let batches: Box<dyn Iterator<Item = (Vec<usize>, Batch)>> = if self.net.packs(gates) {
            Box::new(self.packed_batches(&encoded, max_tokens))
        } else {
            Box::new(self.batches(&encoded, max_tokens))
        };
        for (rows, b) in batches {
            if stop() {
                return Err(ModelError::Interrupted);
            }
            let h = self.net.encode(&b.ids, &b.mask, gates, None)?;
            stats.sentences += rows.len();
            stats.tokens += rows.iter().map(|&i| encoded[i].ids.len()).sum::<usize>();
            stats.padded_tokens += b.ids.numel();
            stats.batches += 1;
            on_batch(&b, &h)?;
        }
        Ok(stats)
    }

    /// Greedy continuation of a text by a decoder-only model: at most `n` new token ids,
    /// stopping at EOS. The prompt runs once; each new token runs alone over the key/value
    /// cache of the positions before it ([`transformer::StackCache`]).
    pub fn generate(&self, text: &str, n: usize, gates: &Gates) -> Result<Vec<i64>, ModelError> {
        self.generate_with(text, n, gates, true)
    }

    /// [`Model::generate`], with the cache or (`cached: false`) recomputing the whole prefix
    /// for every new token (the reference the cached path is tested against).
    pub fn generate_with(&self, text: &str, n: usize, gates: &Gates, cached: bool) -> Result<Vec<i64>, ModelError> {
        Ok(self.generate_run(text, n, gates, cached)?.0)
    }

    /// [`Model::generate`] and the key/value cache it leaves (under a streaming view, packed:
    /// [`transformer::Packed`]); the cache is empty with `cached: false`.
    pub fn generate_run(
        &self,
        text: &str,
        n: usize,
        gates: &Gates,
        cached: bool,
    ) -> Result<(Vec<i64>, transformer::StackCache), ModelError> {
        if self.net.stack_kind != Kind::Dec || self.net.output.is_none() {
            return Err(ModelError::Invalid(format!("{} is not a decoder-only model: use translate", self.name())));
        }
        let head = self.net.output_head(None)?;
        let _guard = tch::no_grad_guard();
        let mut ids = self.tokenize_all([text])?.remove(0).ids;
        let mut out = Vec::new();
        let mut cache = transformer::StackCache { compress: true, ..Default::default() };
        let mut fresh: Vec<i64> = ids.clone();
        for _ in 0..n {
            let h = if cached {
                let t = Tensor::from_slice(&fresh).view([1, fresh.len() as i64]).to_device(self.device());
                self.net.stack_cached(&t, &mut cache, gates, None)?
            } else {
                let t = Tensor::from_slice(&ids).view([1, ids.len() as i64]).to_device(self.device());
                let mask = Tensor::ones([1, ids.len() as i64], (DType::Float, self.device()));
                self.net.encode(&t, &mask, gates, None)?
            };
            let last = h.f_narrow(1, h.size()[1] - 1, 1)?;
            let next = nn::top1(&head.logits(&last, &mut None)?.f_select(1, 0)?).int64_value(&[0]);
            if next == self.net.eos_id {
                break;
            }
            out.push(next);
            ids.push(next);
            fresh = vec![next];
        }
        Ok((out, cache))
    }

    pub fn detokenize(&self, ids: &[i64]) -> Result<String, ModelError> {
        self.tok.decode(ids)
    }

    /// One forward pass over `text` with hook points recorded, as TransformerLens's
    /// `run_with_cache`: `(point, tensor)` in the order computed, the batch dimension removed,
    /// internal layout (per-head points `[H, T, X]`; [`hooks::to_tl_axes`] gives
    /// TransformerLens's). `keep` says which points to record; `change` may intervene (the
    /// recorded values are the changed ones). Translation models: the decoder reads the
    /// model's own greedy output (under the same interventions), teacher-forced. Per-head
    /// tensors hold the heads a layer has (after `prune_heads`, those present, in order).
    pub fn run_with_cache(
        &self,
        text: &str,
        gates: &Gates,
        keep: &dyn Fn(hooks::At) -> bool,
        change: Option<&mut dyn hooks::Hooks>,
    ) -> Result<Vec<(hooks::At, Tensor)>, ModelError> {
        let _guard = tch::no_grad_guard();
        let b = self.batch(&[text])?;
        let t = b.ids.size().get(1).copied().unwrap_or(0);
        // The patterns (and scores) kept, in the model's dtype, each layer's counted apart: the
        // stack's now, a translation decoder's once its targets' length is known.
        let value = self.net.embed.tokens.kind().elt_size_in_bytes() as f64;
        let check = |stack: bool, tq: i64, tk: i64| -> Result<(), ModelError> {
            for k in self.kinds().iter().filter(|k| (k.kind == self.net.stack_kind) == stack) {
                let layers = (0..k.n_layers)
                    .flat_map(|l| [hooks::Point::Pattern, hooks::Point::Scores].map(|p| hooks::At::new(k.kind, l, p)))
                    .filter(|&at| keep(at))
                    .count();
                let tk = if k.kind == Kind::Cross { t } else { tk };
                self.check_patterns_kept(layers, k.n_heads, tq, tk, value)?;
            }
            Ok(())
        };
        check(true, t, t)?;
        struct Keep<'a> {
            keep: &'a dyn Fn(hooks::At) -> bool,
            cache: Vec<(hooks::At, Tensor)>,
        }
        impl hooks::Hooks for Keep<'_> {
            fn wants(&self, at: hooks::At) -> bool {
                (self.keep)(at)
            }
            fn visit(&mut self, at: hooks::At, x: &Tensor) -> Result<Option<Tensor>, ModelError> {
                self.cache.push((at, x.f_get(0)?.to_device(Device::Cpu)));
                Ok(None)
            }
        }
        let mut rec = Keep { keep, cache: Vec::new() };
        let mut noop = hooks::Interventions::default();
        let change: &mut dyn hooks::Hooks = match change {
            Some(c) => c,
            None => &mut noop,
        };
        let mut both = hooks::Both(change, &mut rec);
        let h = self.net.encode(&b.ids, &b.mask, gates, Some(&mut both))?;
        let last = if self.net.decoder.is_empty() {
            h
        } else {
            let targets = self.greedy_targets(&b, &h, gates)?;
            let (t, _) = self.target_tensors(&targets);
            let tq = t.size().get(1).copied().unwrap_or(0);
            check(false, tq, tq)?;
            self.net.teacher(&h, &b.mask, &t, transformer::Stop::FinalNorm, gates, Some(&mut both))?
        };
        if self.net.output.is_some() && hooks::Hooks::wants(&both, self.net.logits_at()) {
            let _ = self.net.logits_hooked(&last, &mut Some(&mut both))?;
        }
        Ok(rec.cache)
    }

    /// Every head's attention on one sentence, per kind: `[heads, Tq, Tk]` per layer (the heads
    /// a layer holds, in physical order). For `cross`, queries are the model's own greedy
    /// translation (teacher-forced), keys the source tokens; for `dec` in a translation model,
    /// queries and keys are that translation (keys: the decoder's inputs, the start token first).
    pub fn attention_maps(&self, text: &str, gates: &Gates) -> Result<Vec<KindAttention>, ModelError> {
        self.attention_maps_of(text, gates, None)
    }

    /// [`Model::attention_maps`] of every head, or of `only` one (its layer holding that head
    /// alone, `[1, Tq, Tk]`; the other layers none). What is kept is estimated first and
    /// refused over the memory budget (docs/methods.md#memory-budget).
    fn attention_maps_of(
        &self,
        text: &str,
        gates: &Gates,
        only: Option<(HeadId, i64)>,
    ) -> Result<Vec<KindAttention>, ModelError> {
        let _guard = tch::no_grad_guard();
        let b = self.batch(&[text])?;
        let t = b.ids.size().get(1).copied().unwrap_or(0);
        // float64 on the CPU, and as many again as lists of numbers for a script.
        let kept = |k: &KindShape| match only {
            Some((h, _)) if h.kind == k.kind => (1, 1),
            Some(_) => (0, 0),
            None => (k.n_layers, k.n_heads),
        };
        for k in self.kinds().iter().filter(|k| k.kind == self.net.stack_kind) {
            let (layers, heads) = kept(k);
            self.check_patterns_kept(layers, heads, t, t, 16.0)?;
        }
        let src_tokens = b.encoded[0].tokens.clone();
        let src_keys = (b.encoded[0].ids.clone(), b.encoded[0].special.clone());
        let mut maps: Vec<KindAttention> = self
            .kinds()
            .iter()
            .map(|s| KindAttention {
                kind: s.kind,
                query_tokens: vec![],
                key_tokens: vec![],
                key_ids: vec![],
                key_special: vec![],
                layers: (0..s.n_layers).map(|_| None).collect(),
            })
            .collect();
        // By layer: a layer without heads (prune_heads) hands out no attention.
        let mut on = |at: hooks::At, p: &Tensor| -> Result<(), ModelError> {
            if only.is_some_and(|(h, _)| (h.kind, h.layer_idx) != (at.kind, at.layer)) {
                return Ok(());
            }
            if let Some(slot) = maps.iter_mut().find(|m| m.kind == at.kind).and_then(|m| m.layers.get_mut(at.layer)) {
                let p = p.f_get(0)?;
                let p = match only {
                    Some((_, phys)) => p.f_narrow(0, phys, 1)?,
                    None => p,
                };
                *slot = Some(p.f_to_kind(DType::Double)?.f_to_device(Device::Cpu)?);
            }
            Ok(())
        };
        let mut rec = hooks::Record::new(&[hooks::Point::Pattern], &mut on);
        let h = self.net.encode(&b.ids, &b.mask, gates, Some(&mut rec))?;
        let mut queries = None;
        if !self.net.decoder.is_empty() {
            let targets = self.greedy_targets(&b, &h, gates)?;
            let (t, _) = self.target_tensors(&targets);
            let tq = t.size().get(1).copied().unwrap_or(0);
            for k in self.kinds().iter().filter(|k| k.kind != self.net.stack_kind) {
                let (layers, heads) = kept(k);
                let tk = if k.kind == Kind::Cross { b.ids.size().get(1).copied().unwrap_or(0) } else { tq };
                self.check_patterns_kept(layers, heads, tq, tk, 16.0)?;
            }
            let _ = self.net.teacher(&h, &b.mask, &t, transformer::Stop::FinalNorm, gates, Some(&mut rec))?;
            queries = targets.into_iter().next().map(|e| (e.tokens, e.ids, e.special));
        }
        let (out, out_ids, out_special) = queries.unwrap_or_default();
        fn shift<T: Clone>(first: T, v: &[T]) -> Vec<T> {
            std::iter::once(first).chain(v.iter().take(v.len().saturating_sub(1)).cloned()).collect()
        }
        for m in &mut maps {
            (m.key_ids, m.key_special) = match m.kind {
                k if k == self.net.stack_kind || k == Kind::Cross => src_keys.clone(),
                _ => (shift(self.net.dec_start.unwrap_or(-1), &out_ids), shift(true, &out_special)),
            };
            (m.query_tokens, m.key_tokens) = match m.kind {
                k if k == self.net.stack_kind => (src_tokens.clone(), src_tokens.clone()),
                Kind::Cross => (out.clone(), src_tokens.clone()),
                _ => {
                    let start = self.net.dec_start.map_or_else(|| "<start>".to_string(), |id| self.tok.id_to_token(id));
                    (
                        out.clone(),
                        std::iter::once(start).chain(out.iter().take(out.len().saturating_sub(1)).cloned()).collect(),
                    )
                }
            };
        }
        Ok(maps)
    }

    /// Refuses to keep whole attention patterns over the memory budget: `layers` layers of
    /// `heads` heads, `tq x tk` each, `value` bytes a weight as kept; the error names the bytes
    /// and the statistics that read the weights tile by tile instead (the caller names its verb).
    fn check_patterns_kept(&self, layers: usize, heads: usize, tq: i64, tk: i64, value: f64) -> Result<(), ModelError> {
        if layers == 0 || heads == 0 {
            return Ok(());
        }
        let bytes = value * (layers * heads) as f64 * tq as f64 * tk as f64;
        crate::budget::check(
            &format!("the whole attention pattern of {layers} layer(s) x {heads} head(s) over {tq} x {tk} tokens"),
            bytes,
        )
        .map_err(|e| {
            ModelError::Invalid(format!(
                "{e}; statistics of long texts read the weights tile by tile without holding them: analyze, head_types, kv_scores (docs/methods.md#score-tiles)"
            ))
        })
    }

    /// The attention map of one head on one sentence (see [`Model::attention_maps`]).
    pub fn attention_map(&self, text: &str, head: HeadId, gates: &Gates) -> Result<AttentionMap, ModelError> {
        self.check_head(head)?;
        // The head's place among the heads its layer holds (after prune_heads, not its number).
        let phys =
            self.mixer(head.kind, head.layer_idx).and_then(|a| a.physical(head.head)).unwrap_or(head.head) as i64;
        let maps = self.attention_maps_of(text, gates, Some((head, phys)))?;
        let m = maps.into_iter().find(|m| m.kind == head.kind).ok_or_else(|| {
            ModelError::Invalid(format!("{} attention maps are not available for this model", head.kind))
        })?;
        let a = m
            .layers
            .get(head.layer_idx)
            .and_then(|a| a.as_ref())
            .ok_or_else(|| ModelError::Invalid(format!("no attention captured for {head}")))?
            .get(0);
        let weights: Vec<Vec<f64>> =
            (0..a.size()[0]).map(|i| Vec::<f64>::try_from(a.get(i))).collect::<Result<_, _>>()?;
        let key_excluded = vec![false; m.key_tokens.len()];
        Ok(AttentionMap {
            head,
            query_tokens: m.query_tokens,
            key_tokens: m.key_tokens,
            weights,
            key_ids: m.key_ids,
            key_special: m.key_special,
            key_excluded,
            exclude_keys: ExcludeKeys::Nothing,
            eos_ids: self.tok.eos_id.into_iter().collect(),
        })
    }

    /// A copy of the model on another device (weights reloaded from the checkpoint there).
    pub fn to_device(&self, device: DeviceChoice) -> Result<Model, ModelError> {
        if self.pruned_physically() {
            return Err(ModelError::Invalid(format!(
                "{} had heads or experts removed (prune_heads, prune_experts); move the original model, then prune it there",
                self.name()
            )));
        }
        let opts = LoadOptions { device: device.resolve()?, ..self.opts };
        let mut m = Model::load(&self.path, opts)?;
        m.id = self.id.clone();
        Ok(m)
    }

    /// The rotary settings the model's layers actually use, one line per group of layers
    /// sharing them (`layers 0, 2: rope_theta 500, linear (factor 2), 16 of 16 dimensions`), or
    /// `none` for a model without rotary positions.
    pub fn rope(&self) -> String {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        let layers = self
            .net
            .stack
            .iter()
            .filter_map(|l| l.attention())
            .chain(self.net.decoder.iter().filter_map(|l| l.self_attention()));
        for (i, a) in layers.enumerate() {
            let Some(r) = &a.rotary else { continue };
            let scaling = match &r.scaling {
                nn::RopeScaling::None => "default".to_string(),
                nn::RopeScaling::Linear { factor } => format!("linear (factor {factor})"),
                nn::RopeScaling::Dynamic { factor, max_positions } => format!("dynamic (factor {factor}, from {max_positions} positions)"),
                nn::RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original } => format!("llama3 (factor {factor}, low_freq_factor {low_freq_factor}, high_freq_factor {high_freq_factor}, original {original})"),
                nn::RopeScaling::Yarn { factor, original, beta_fast, beta_slow, attention_factor, truncate } => format!("yarn (factor {factor}, original {original}, beta_fast {beta_fast}, beta_slow {beta_slow}, attention_factor {attention_factor:.6}, truncate {truncate})"),
                nn::RopeScaling::LongRope { short, original, attention_factor, .. } => format!("longrope ({} factor pairs, original {original}, attention_factor {attention_factor:.6})", short.len()),
            };
            let line = format!("rope_theta {}, rope_type {scaling}, {} of {} dimensions", r.base, r.dim, a.head_dim);
            match groups.iter_mut().find(|(l, _)| *l == line) {
                Some((_, v)) => v.push(i.to_string()),
                None => groups.push((line, vec![i.to_string()])),
            }
        }
        if groups.is_empty() {
            return "none (no rotary positions)".into();
        }
        groups
            .into_iter()
            .map(|(line, ls)| format!("layer{} {}: {line}", if ls.len() > 1 { "s" } else { "" }, ls.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// How many experts `prune_experts` removed (0 for a model as loaded).
    pub fn experts_removed(&self) -> usize {
        (0..self.net.stack.len()).filter_map(|l| self.experts(l)).map(|e| e.loaded() - e.ids().len()).sum()
    }

    /// Whether the weights differ from the checkpoint's by heads or experts removed: reloading
    /// from the files would not give this model back.
    pub fn pruned_physically(&self) -> bool {
        !self.removed.is_empty() || self.experts_removed() > 0
    }

    /// The mixture of experts of stack layer `layer`, where its MLP is one
    /// (docs/methods.md#experts-as-units).
    pub fn experts(&self, layer: usize) -> Option<&experts::Experts> {
        self.net.stack.get(layer)?.mlp().as_any()?.downcast_ref::<experts::Experts>()
    }

    pub fn describe(&self) -> String {
        // The shape as loaded; after `prune_heads`, how many heads of each kind are left.
        let mut kinds: Vec<String> = self
            .kinds()
            .iter()
            .map(|k| {
                let gone = self.removed.iter().filter(|h| h.kind == k.kind).count();
                let shape = format!("{} {}x{}", k.kind, k.n_layers, k.n_heads);
                if gone == 0 {
                    shape
                } else {
                    format!("{shape} ({} kept)", k.n_layers * k.n_heads - gone)
                }
            })
            .collect();
        if !self.removed.is_empty() {
            kinds.push(format!("{} removed by prune_heads", self.removed.len()));
        }
        let moe: Vec<&experts::Experts> = (0..self.net.stack.len()).filter_map(|l| self.experts(l)).collect();
        let experts = match moe.first() {
            None => String::new(),
            Some(first) => {
                let loaded: usize = moe.iter().map(|e| e.loaded()).sum();
                let kept: usize = moe.iter().map(|e| e.ids().len()).sum();
                let mut s = if moe.iter().all(|e| e.loaded() == first.loaded()) {
                    format!(", experts: {} layers x {} (top {})", moe.len(), first.loaded(), first.top_k)
                } else {
                    format!(", experts: {loaded} in {} layers (top {})", moe.len(), first.top_k)
                };
                if kept < loaded {
                    s += &format!(", {} removed by prune_experts", loaded - kept);
                }
                s
            }
        };
        // Latent attention: what its cache holds (docs/methods.md#latent-attention).
        let latent = (0..self.net.stack.len())
            .filter_map(|l| self.net.stack[l].attention().and_then(|a| a.latent.as_ref()))
            .next()
            .map_or(String::new(), |lat| {
                format!(", latent attention (cache: {} numbers per token and layer)", lat.numbers_per_entry())
            });
        // A hybrid stack: which layers each token mixer holds (docs/methods.md#mixers).
        let mut mixers: Vec<(&str, Vec<usize>)> = Vec::new();
        for (l, layer) in self.net.stack.iter().enumerate() {
            let k = layer.mixer().kind();
            match mixers.iter_mut().find(|(m, _)| *m == k) {
                Some((_, ls)) => ls.push(l),
                None => mixers.push((k, vec![l])),
            }
        }
        let hybrid = if mixers.len() > 1 {
            let each: Vec<String> = mixers
                .iter()
                .map(|(m, ls)| format!("{m} at {}", ls.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(" ")))
                .collect();
            format!(" ({} layers: {})", self.net.stack_kind, each.join("; "))
        } else {
            String::new()
        };
        let experts = format!("{hybrid}{latent}{experts}");
        // A 16-bit or quantised checkpoint held in float32: what bf16 would take.
        let saving = readers::stored::bf16_saving(self.stored.as_deref(), self.opts.dtype, self.n_params).map_or(
            String::new(),
            |(f32, bf16)| {
                format!(
                    "; stored as {}: {:.2} GB of weights, {:.2} GB with #{{dtype: \"bf16\"}}",
                    self.stored.as_deref().unwrap_or("?"),
                    f32 / 1e9,
                    bf16 / 1e9
                )
            },
        );
        // Tiny checkpoints in thousands (0.0M says nothing).
        let params = if self.n_params < 100_000 {
            format!("{:.1}k", self.n_params as f64 / 1e3)
        } else {
            format!("{:.1}M", self.n_params as f64 / 1e6)
        };
        format!(
            "<Model {} ({}), {params} parameters, heads: {}{experts}, on {} as {:?}{saving}>",
            self.name(),
            self.family_name(),
            kinds.join(", "),
            device_name(self.device()),
            self.opts.dtype
        )
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn a_torch_error_prints_one_line() {
        let e = ModelError::from(tch::TchError::Torch(
            "shape '[2, 3]' is invalid for input of size 5\nException raised from infer_size_impl at x.cpp:1\nframe #0: f".into(),
        ));
        assert_eq!(
            e.to_string(),
            "torch: Internal torch error: shape '[2, 3]' is invalid for input of size 5 (libtorch's C++ trace left out)"
        );
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(one_line("left: 1\nright: 2"), "left: 1\nright: 2", "only libtorch's trace is cut");
    }
}

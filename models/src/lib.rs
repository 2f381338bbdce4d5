//! Model architectures over burn-gguf: one decoder skeleton ([`Decoder`]) for Gemma 3, Llama,
//! Qwen3, Qwen3-MoE and Qwen3.5 (dense and MoE: gated delta-net and gated attention layers), the tokenizer ([`GgufTokenizer`]) and chat template ([`ChatTemplate`])
//! from GGUF metadata, sampling ([`Sampler`]), and generation with a KV cache on the device:
//! one sequence ([`generate()`], [`Session`]) or several in one batched pass
//! ([`Decoder::forward_batch`] over a [`BatchState`]).
//!
//! ```no_run
//! use burn_gguf::{GgufConfig, GgufLoader};
//! use burn_gguf_models::{Decoder, GgufTokenizer, Sampler, SamplerConfig, generate};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = gguf::GgufFile::open("model.gguf")?;
//! let loader = GgufLoader::new(&file, &burn_gguf::default_device(), GgufConfig::default());
//! let model = Decoder::load(&loader)?; // packed where a kernel fits; loader.report() says
//! let tokenizer = GgufTokenizer::from_gguf(&file)?;
//! let mut sampler = Sampler::new(SamplerConfig::default()); // greedy
//! let out = generate(&model, &tokenizer, "Once upon a time", 32, &mut sampler, |piece| {
//!     print!("{piece}")
//! })?;
//! println!("\n{:.1} tokens/s", out.timings.decode_tps());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
pub mod chat;
pub mod config;
pub mod decoder;
mod delta_net;
pub mod finetune;
pub mod generate;
pub mod lora;
pub mod sampling;
pub mod speculative;
pub mod state;
#[cfg(feature = "structured")]
pub mod structured;
pub mod tokenizer;
pub mod tool_calls;

pub use chat::{ChatTemplate, Message};
pub use config::{ARCHITECTURES, DecoderConfig, DeltaNet, Moe, SlidingWindow};
pub use decoder::{Activation, Decoder, RopeStyle, rms_norm};
pub use generate::{
    CausalLm, Generation, Session, Timings, generate, generate_async, generate_ids,
    generate_ids_async,
};
pub use lora::{DecoderLora, LoraTarget};
pub use sampling::{Sampler, SamplerConfig};
pub use speculative::{NgramConfig, SpecStats, Speculation};
pub use state::{BatchState, KV_BLOCK, LayerKind, LayerState, SequenceState, SlotSnapshot};
pub use tokenizer::GgufTokenizer;

/// The values of `t` read back to the host as f32 (autodiff stripped first), row-major.
///
/// # Errors
/// [`Error::Device`] when the read-back fails.
pub(crate) fn host_f32<const D: usize>(t: burn::tensor::Tensor<D>) -> Result<Vec<f32>, Error> {
    t.inner()
        .try_into_data()
        .map_err(|e| Error::Device(format!("{e:?}")))?
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|e| Error::Device(format!("{e:?}")))
}

/// Errors of the model layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The container is malformed (names the key or tensor).
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// Loading weights failed.
    #[error(transparent)]
    Load(#[from] burn_gguf::Error),
    /// A chat template failed to load or render.
    #[error(transparent)]
    Chat(#[from] chat::ChatError),
    /// Tokenizer construction or use failed.
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    /// The model's metadata or inputs do not fit the architecture.
    #[error("{0}")]
    Model(String),
    /// A LoRA adapter does not fit the model, or its file is malformed (names the key or
    /// tensor).
    #[error("{0}")]
    Adapter(String),
    /// A device operation failed (reported at read-back).
    #[error("device error: {0}")]
    Device(String),
}

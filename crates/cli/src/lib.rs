//! burn-gguf command line: run GGUF models on wgpu. The binary is `burn-gguf`; this library
//! holds what other tools reuse (model download and cache: [`fetch`]; the `run`, `chat` and
//! `inspect` commands, and the OpenAI-compatible server [`serve`]).
pub mod chat;
pub mod fetch;
pub mod inspect;
pub mod run;
pub mod serve;

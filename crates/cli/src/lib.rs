//! burn-gguf command line: run GGUF models on wgpu. The binary is `burn-gguf`; this library
//! holds what other tools reuse (model download and cache: [`fetch`]; the `run`, `chat` and
//! `inspect` commands, `finetune` and `--lora` ([`finetune`]), and the OpenAI-compatible server [`serve`]; the host threads' priority
//! on a software device: [`host`]).
pub mod chat;
pub mod fetch;
pub mod finetune;
pub mod host;
pub mod inspect;
pub mod run;
pub mod serve;

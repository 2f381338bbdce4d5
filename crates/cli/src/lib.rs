//! burn-gguf command line: run GGUF models on wgpu. The binary is `burn-gguf`; this library
//! holds what other tools reuse (model download and cache: [`fetch`]; the `run` command: [`run`]).
pub mod fetch;
pub mod run;

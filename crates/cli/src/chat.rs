//! `burn-gguf chat`: an interactive conversation with the file's chat template.
use crate::run::{Loaded, load};
use burn_gguf_models::{ChatTemplate, Message, Sampler, SamplerConfig, Session, generate_ids};
use std::io::{BufRead, Write};
use std::path::Path;

/// Options of one `chat`.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// A system message opening the conversation.
    pub system: Option<String>,
    /// Most new tokens per reply.
    pub max_new: usize,
    /// Sampling parameters.
    pub sampler: SamplerConfig,
    /// Speculative decoding ([`Session::set_speculation`]).
    pub spec: crate::run::SpecArgs,
    /// Dequantize every weight at load.
    pub dequantize: bool,
    /// The device, as [`crate::run::RunOptions::device`].
    pub device: Option<String>,
    /// LoRA adapter files applied together ([`crate::finetune::attach_lora`]).
    pub lora: Vec<std::path::PathBuf>,
    /// The factor of the adapters' updates.
    pub lora_scale: f32,
}

/// Runs a conversation: each line of `input` is a user message; each reply streams to
/// `output` and ends with a newline. The template is the file's `tokenizer.chat_template` (or a
/// built-in one); the KV cache of the history is reused from turn to turn. Ends at end of input
/// or a line `/exit`. Speeds go to stderr.
///
/// # Errors
/// Load, template, tokenizer, model or I/O errors, as a message.
pub fn chat(
    model_path: &Path,
    opts: &ChatOptions,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<(), String> {
    let loaded = load(model_path, opts.device.as_deref(), opts.dequantize, false)?;
    let speculation = opts.spec.speculation(&loaded, opts.device.as_deref())?;
    let Loaded {
        file,
        tokenizer,
        mut model,
        ..
    } = loaded;
    crate::finetune::attach_lora(&mut model, &opts.lora, opts.lora_scale)?;
    let template = ChatTemplate::from_gguf(&file, &tokenizer).map_err(|e| e.to_string())?;
    if template.is_builtin() {
        eprintln!("the file has no tokenizer.chat_template: using a built-in one");
    }
    let mut messages: Vec<Message> = opts
        .system
        .iter()
        .map(|s| Message::new("system", s.clone()))
        .collect();
    let mut session = Session::new(&model);
    session
        .set_speculation(speculation)
        .map_err(|e| e.to_string())?;
    let mut sampler = Sampler::new(opts.sampler.clone());
    for line in input.lines() {
        let line = line.map_err(|e| e.to_string())?;
        let line = line.trim();
        if line == "/exit" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        messages.push(Message::new("user", line));
        let prompt = template
            .render(&messages, true, &serde_json::Value::Null)
            .map_err(|e| e.to_string())?;
        let ids = tokenizer
            .encode_prompt(&prompt)
            .map_err(|e| e.to_string())?;
        let out = generate_ids(
            &model,
            &tokenizer,
            &mut session,
            ids,
            opts.max_new,
            &mut sampler,
            |piece| {
                let _ = output.write_all(piece.as_bytes());
                let _ = output.flush();
            },
        )
        .map_err(|e| e.to_string())?;
        writeln!(output).map_err(|e| e.to_string())?;
        eprintln!("[{}]", crate::run::speeds(&out));
        messages.push(Message::new("assistant", out.text.trim().to_string()));
    }
    Ok(())
}

//! Chat templates: `tokenizer.chat_template` from the GGUF file, rendered with minijinja as
//! Transformers renders it with Jinja2 (`trim_blocks`, `lstrip_blocks`, Python string methods
//! through minijinja-contrib's `pycompat`, `raise_exception`), or a built-in ChatML template for
//! files that carry none.
use crate::tokenizer::GgufTokenizer;
use gguf::GgufFile;
use serde::{Deserialize, Serialize};

/// `tokenizer.chat_template`
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// The template used when a file has none: ChatML (`<|im_start|>role\ncontent<|im_end|>\n`).
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
    message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
    {{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The template used for `gemma2` and `gemma3` files that have none: Gemma's turns
/// (`<start_of_turn>user\ncontent<end_of_turn>\n`, the assistant's role named `model`), after
/// the BOS token.
pub const GEMMA: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == \
    'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}\
    {{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}\
    {% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// Most bytes a template or a rendered prompt may have (untrusted input).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The text.
    pub content: String,
    /// The calls an assistant message made, as templates read them (Transformers' form:
    /// `{"type": "function", "function": {"name", "arguments": {...}}, "id"}`); empty for
    /// other messages, and then not passed to the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// The call a `tool` message answers (OpenAI `tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` message answers for, when known (templates that print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message from `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// Errors of template loading and rendering.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not parse, or rendering failed (a `raise_exception` message included).
    #[error("chat template: {0}")]
    Template(String),
    /// The template or its output is larger than [`MAX_TEMPLATE_BYTES`].
    #[error("chat template: {0} bytes exceed the limit of {MAX_TEMPLATE_BYTES}")]
    TooLarge(usize),
    /// The file's metadata is malformed.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

/// A chat template with the special tokens it may reference.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    builtin: bool,
}

impl ChatTemplate {
    /// `source` with the texts of the BOS and EOS tokens (`bos_token`, `eos_token` in templates).
    ///
    /// # Errors
    /// [`ChatError::TooLarge`] or a template that does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::TooLarge(source.len()));
        }
        let t = Self {
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            builtin: false,
        };
        t.environment()
            .template_from_str(&t.source)
            .map_err(jinja_err)?;
        Ok(t)
    }

    /// The file's `tokenizer.chat_template`, or when it has none a built-in one ([`GEMMA`] for
    /// `gemma3`, [`CHATML`] otherwise), with the tokenizer's BOS and EOS texts.
    ///
    /// # Errors
    /// A template key that is not a string, or a template that does not parse.
    pub fn from_gguf(file: &GgufFile, tokenizer: &GgufTokenizer) -> Result<Self, ChatError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or_default()
                .to_string()
        };
        let (bos, eos) = (text(tokenizer.bos_id()), text(tokenizer.eos_id()));
        match file.get_opt_str(KEY_CHAT_TEMPLATE)? {
            Some(source) => Self::new(source, &bos, &eos),
            None => {
                let source = match file.get_opt_str("general.architecture")? {
                    Some("gemma2" | "gemma3") => GEMMA,
                    _ => CHATML,
                };
                Ok(Self {
                    builtin: true,
                    ..Self::new(source, &bos, &eos)?
                })
            }
        }
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is the built-in template (the file has none).
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    fn environment(&self) -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<minijinja::Value, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env
    }

    /// Renders `messages`; `add_generation_prompt` opens the assistant's turn; `extra` adds
    /// template variables (e.g. `{"enable_thinking": false}`), a JSON object or null.
    ///
    /// # Errors
    /// [`ChatError::Template`] when rendering fails, with the template's `raise_exception`
    /// message; [`ChatError::TooLarge`] for an oversized result.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Value,
    ) -> Result<String, ChatError> {
        let env = self.environment();
        let tmpl = env.template_from_str(&self.source).map_err(jinja_err)?;
        let mut ctx = serde_json::Map::new();
        if let Some(obj) = extra.as_object() {
            ctx.extend(obj.clone());
        }
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).unwrap_or_default(),
        );
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        let out = tmpl
            .render(minijinja::Value::from_serialize(&ctx))
            .map_err(jinja_err)?;
        if out.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::TooLarge(out.len()));
        }
        Ok(out)
    }
}

/// A minijinja error with its cause chain (a `raise_exception` message is the detail).
fn jinja_err(e: minijinja::Error) -> ChatError {
    let msg = match e.detail() {
        Some(d) => d.to_string(),
        None => e.to_string(),
    };
    ChatError::Template(msg)
}

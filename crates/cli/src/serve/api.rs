//! OpenAI API request bodies, their validation, and error responses.
//!
//! Requests are parsed leniently (unknown fields are ignored, as OpenAI clients send many) but
//! every value the server uses is checked, and each failure is a 4xx with an OpenAI-style body:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

pub use super::format::{ToolChoice, ToolRequest, Unsupported, check_response_format, check_tools};

/// An error answered as OpenAI does.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What is wrong, for a person.
    pub message: String,
    /// The request field at fault, if one.
    pub param: Option<&'static str>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
            code: None,
        }
    }

    /// With a machine-readable code.
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// With another status.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.code,
            }
        });
        (self.status, Json(body)).into_response()
    }
}

/// Message content: a string, or an array of parts of which the `text` ones are joined.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`; other types are refused).
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// Part type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer` (read as `system`), `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (may be absent on an assistant message).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's calls: `[{"id", "type": "function", "function": {"name",
    /// "arguments": "<JSON text>"}}]`.
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` message's function name (optional).
    #[serde(default)]
    pub name: Option<String>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Up to 4 stop strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices).
    #[serde(default)]
    pub include_usage: bool,
}

/// Reasoning (thinking) for templates that support it: `on`, `off`, or `auto` (the template's
/// default). Rendered as the template variable `enable_thinking`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Reasoning {
    /// `enable_thinking = true`.
    On,
    /// `enable_thinking = false`.
    Off,
    /// The template's default.
    Auto,
}

/// Sampling and length fields shared by both endpoints.
#[derive(Debug, Deserialize)]
pub struct Generation {
    /// Most new tokens (`max_completion_tokens` is the newer name).
    pub max_tokens: Option<u64>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// 0 to 2; 0 is greedy. Default 1.
    pub temperature: Option<f32>,
    /// (0, 1]. Default 1.
    pub top_p: Option<f32>,
    /// llama.cpp extension: keep the k most likely tokens (0 keeps all).
    pub top_k: Option<usize>,
    /// Seed of the sampler (default: random).
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Number of choices; only 1 is supported.
    pub n: Option<u32>,
    /// Chat: `true` for each generated token's log-probability. Completions: an integer, the
    /// number of most likely alternatives per token (0 to 20).
    pub logprobs: Option<serde_json::Value>,
    /// Chat, with `logprobs`: the number of most likely alternatives per token (0 to 20).
    pub top_logprobs: Option<serde_json::Value>,
    /// llama-server's per-request adapters: `[{"id": 0, "scale": 0.5}, ...]` among those
    /// `serve --lora` loaded (`GET /lora-adapters` lists them); an adapter not listed is off,
    /// `[]` turns every one off. Absent: every loaded adapter at its `--lora-scale`.
    pub lora: Option<Vec<LoraChoice>>,
    /// The output's format: `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
    /// "json_schema", "json_schema": {"name", "schema", "strict"}}` (OpenAI structured outputs).
    pub response_format: Option<serde_json::Value>,
    /// llama-server's shorthand for a `json_schema` response format: the schema itself.
    pub json_schema: Option<serde_json::Value>,
    /// llama-server's per-request bound of speculative decoding: at most this many drafted
    /// tokens a verify pass, 0 to 63 (0 decodes this request one pass per token). Absent: the
    /// server's `--spec` and `--draft-max`. Greedy replies are the same either way.
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<serde_json::Value>,
    /// Fields that change the output and that this server does not honour.
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// One adapter a request applies (llama-server's `lora` field).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraChoice {
    /// Its index in `GET /lora-adapters`.
    pub id: usize,
    /// The factor of its updates.
    pub scale: f32,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// Model id (see `/v1/models`).
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Per-request reasoning override.
    pub reasoning: Option<Reasoning>,
    /// Extra template variables (vLLM / llama-server convention), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Functions the model may call: `[{"type": "function", "function": {"name",
    /// "description", "parameters"}}]`.
    pub tools: Option<serde_json::Value>,
    /// `"none"`, `"auto"` (the default with tools), `"required"`, or `{"type": "function",
    /// "function": {"name": ...}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether a reply may hold several calls (default true); a forced call is always one.
    pub parallel_tool_calls: Option<bool>,
    /// Sampling and length.
    #[serde(flatten)]
    pub generation: Generation,
}

/// `prompt` of a completion: one string (or a list holding one).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// The prompt.
    One(String),
    /// A list of prompts; only one is supported.
    Many(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// Model id.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling and length.
    #[serde(flatten)]
    pub generation: Generation,
}

/// Longest stop string accepted, in bytes.
const MAX_STOP_BYTES: usize = 256;
/// Most stop strings (OpenAI's limit).
const MAX_STOPS: usize = 4;

/// Checked sampling and length parameters.
#[derive(Debug)]
pub struct Checked {
    /// The sampler.
    pub sampler: burn_gguf_models::SamplerConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `max_tokens` as asked (None: up to the context).
    pub max_tokens: Option<u64>,
    /// Log-probabilities: `None`, or `Some(k)` with `k` alternatives per token.
    pub logprobs: Option<usize>,
    /// The adapters asked for, `(id, scale)` (ids not yet checked against the model's);
    /// `None` for the server's default.
    pub lora: Option<Vec<(usize, f32)>>,
    /// The grammar of `response_format` (not yet compiled); `None` for free text.
    pub grammar: Option<burn_gguf_models::structured::Grammar>,
    /// `speculative.n_max`: most drafted tokens a verify pass; `None` for the server's.
    pub draft_max: Option<usize>,
}

/// Which endpoint's reading of `logprobs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogprobsStyle {
    /// `/v1/chat/completions`: `logprobs: bool`, `top_logprobs: int`.
    Chat,
    /// `/v1/completions`: `logprobs: int`.
    Completion,
}

/// The log-probabilities `g` asks for: `None`, or `Some(k)` alternatives per token.
///
/// # Errors
/// A 400 naming the field for a value of the wrong type, past
/// [`super::engine::MAX_TOP_LOGPROBS`], or `top_logprobs` without `logprobs: true`.
pub fn check_logprobs(g: &Generation, style: LogprobsStyle) -> Result<Option<usize>, ApiError> {
    use serde_json::Value;
    let max = super::engine::MAX_TOP_LOGPROBS;
    let count = |v: &Value, field: &'static str| match v.as_u64() {
        Some(k) if k as usize <= max => Ok(k as usize),
        _ => Err(ApiError::bad_request(
            format!("{field} must be an integer from 0 to {max}, got {v}"),
            Some(field),
        )),
    };
    let top = match &g.top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(count(v, "top_logprobs")?),
    };
    match style {
        LogprobsStyle::Chat => match &g.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => match top {
                Some(k) if k > 0 => Err(ApiError::bad_request(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                )),
                _ => Ok(None),
            },
            Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
            Some(v) => Err(ApiError::bad_request(
                format!("logprobs must be true or false, got {v}"),
                Some("logprobs"),
            )),
        },
        LogprobsStyle::Completion => match &g.logprobs {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(count(v, "logprobs")?)),
        },
    }
}

/// Checks the fields of `g` (not the length against the prompt: see [`max_tokens_for`]).
///
/// # Errors
/// A 400 naming the field for an out-of-range value, `n` other than 1, a field the server
/// does not honour ([`Unsupported`]) or a malformed `response_format`.
pub fn check_generation(g: &Generation, style: LogprobsStyle) -> Result<Checked, ApiError> {
    g.unsupported.check()?;
    if g.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported", Some("n")));
    }
    let temperature = g.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(
            format!("temperature must be between 0 and 2, got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = g.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let stop = match &g.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS || stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad_request(
            format!("at most {MAX_STOPS} stop strings of at most {MAX_STOP_BYTES} bytes"),
            Some("stop"),
        ));
    }
    let max_tokens = g.max_completion_tokens.or(g.max_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let seed = g.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    Ok(Checked {
        sampler: burn_gguf_models::SamplerConfig {
            temperature,
            top_k: g.top_k.unwrap_or(0),
            top_p,
            seed,
        },
        stop,
        max_tokens,
        logprobs: check_logprobs(g, style)?,
        lora: check_lora(g)?,
        grammar: check_response_format(g)?,
        draft_max: check_draft_max(g)?,
    })
}

/// `speculative.n_max` of `g`.
///
/// # Errors
/// A 400 naming `speculative.n_max` for a value that is not an integer from 0 to
/// [`burn_gguf_models::speculative::DRAFT_MAX_LIMIT`].
fn check_draft_max(g: &Generation) -> Result<Option<usize>, ApiError> {
    let limit = burn_gguf_models::speculative::DRAFT_MAX_LIMIT;
    match &g.speculative_n_max {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n as usize <= limit => Ok(Some(n as usize)),
            _ => Err(ApiError::bad_request(
                format!("speculative.n_max must be an integer from 0 to {limit}, got {v}"),
                Some("speculative.n_max"),
            )),
        },
    }
}

/// Most adapters one request may name.
const MAX_LORA_CHOICES: usize = 64;

/// The `lora` field of `g` as `(id, scale)` pairs.
///
/// # Errors
/// A 400 naming `lora` for more than [`MAX_LORA_CHOICES`] entries, an id named twice, or a
/// scale that is not finite.
fn check_lora(g: &Generation) -> Result<Option<Vec<(usize, f32)>>, ApiError> {
    let Some(list) = &g.lora else {
        return Ok(None);
    };
    if list.len() > MAX_LORA_CHOICES {
        return Err(ApiError::bad_request(
            format!("lora: at most {MAX_LORA_CHOICES} adapters"),
            Some("lora"),
        ));
    }
    let mut out: Vec<(usize, f32)> = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        if !c.scale.is_finite() {
            return Err(ApiError::bad_request(
                format!("lora[{i}].scale must be a finite number"),
                Some("lora"),
            ));
        }
        if out.iter().any(|(id, _)| *id == c.id) {
            return Err(ApiError::bad_request(
                format!("lora[{i}]: adapter {} is named twice", c.id),
                Some("lora"),
            ));
        }
        out.push((c.id, c.scale));
    }
    Ok(Some(out))
}

/// `max_tokens` for a prompt of `prompt_len` tokens in a context of `n_ctx`: as asked if it
/// fits, else all that is left when not asked.
///
/// # Errors
/// A 400 `context_length_exceeded` when the prompt leaves no room, or the prompt plus the
/// asked `max_tokens` exceeds the context.
pub fn max_tokens_for(
    asked: Option<u64>,
    prompt_len: usize,
    n_ctx: usize,
) -> Result<usize, ApiError> {
    if prompt_len >= n_ctx {
        return Err(ApiError::bad_request(
            format!(
                "the prompt is {prompt_len} tokens, but this model's context is {n_ctx} tokens"
            ),
            Some("messages"),
        )
        .code("context_length_exceeded"));
    }
    let room = n_ctx - prompt_len;
    match asked {
        None => Ok(room),
        Some(n) if n as u128 <= room as u128 => Ok(n as usize),
        Some(n) => Err(ApiError::bad_request(
            format!(
                "this model's context is {n_ctx} tokens; the prompt is {prompt_len} tokens and \
                 max_tokens asks for {n} more"
            ),
            Some("max_tokens"),
        )
        .code("context_length_exceeded")),
    }
}

/// The conversation as template messages, checked: at least one message; roles `system`
/// (or `developer`) first only, then `user`, `assistant` and `tool`; a `tool` message only
/// after an assistant message with `tool_calls`; the last message from the user or a tool;
/// text content only. An assistant's calls reach the template as Transformers passes them
/// (`arguments` as a JSON object when its text parses).
///
/// # Errors
/// A 400 naming `messages` and the index at fault.
pub fn check_messages(
    messages: &[ChatMessage],
) -> Result<Vec<burn_gguf_models::Message>, ApiError> {
    use serde_json::Value;
    let bad = |m: String| ApiError::bad_request(m, Some("messages"));
    if messages.is_empty() {
        return Err(bad("messages must not be empty".into()));
    }
    let mut out: Vec<burn_gguf_models::Message> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" if i == 0 => "system",
            "system" | "developer" => {
                return Err(bad(format!(
                    "messages[{i}]: a system message may only come first"
                )));
            }
            "user" => "user",
            "assistant" => "assistant",
            "tool" => {
                let after_calls = out
                    .iter()
                    .rev()
                    .find(|p| p.role != "tool")
                    .is_some_and(|p| p.role == "assistant" && !p.tool_calls.is_empty());
                if !after_calls {
                    return Err(bad(format!(
                        "messages[{i}]: a tool message must follow an assistant message with \
                         tool_calls"
                    )));
                }
                "tool"
            }
            other => {
                return Err(bad(format!(
                    "messages[{i}]: role '{other}' is not supported (system, user, assistant, \
                     tool)"
                )));
            }
        };
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        (kind, _) => {
                            return Err(bad(format!(
                                "messages[{i}]: content part type '{kind}' is not supported (text only)"
                            )));
                        }
                    }
                }
                s
            }
        };
        if role == "user" && content.is_empty() {
            return Err(bad(format!("messages[{i}]: user content is empty")));
        }
        let mut msg = burn_gguf_models::Message::new(role, content);
        if let Some(calls) = &m.tool_calls {
            if role != "assistant" {
                return Err(bad(format!(
                    "messages[{i}]: only an assistant message has tool_calls"
                )));
            }
            for (k, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let args = f.and_then(|f| f.get("arguments"));
                let (Some(name), Some(args)) = (name, args) else {
                    return Err(bad(format!(
                        "messages[{i}].tool_calls[{k}] needs function.name and \
                         function.arguments"
                    )));
                };
                let arguments = match args {
                    Value::String(text) => {
                        serde_json::from_str(text).unwrap_or_else(|_| args.clone())
                    }
                    other => other.clone(),
                };
                let mut call = serde_json::json!({
                    "type": "function",
                    "function": { "name": name, "arguments": arguments },
                });
                if let Some(id) = c.get("id") {
                    call["id"] = id.clone();
                }
                msg.tool_calls.push(call);
            }
        }
        if role == "tool" {
            msg.tool_call_id = m.tool_call_id.clone();
            msg.name = m.name.clone();
        }
        out.push(msg);
    }
    match messages.last().map(|m| m.role.as_str()) {
        Some("user" | "tool") => Ok(out),
        _ => Err(bad(
            "the last message must be from the user or a tool".into()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(Content::Text(content.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    #[test]
    fn message_order_and_roles() {
        assert!(check_messages(&[]).is_err());
        assert!(check_messages(&[msg("user", "hi")]).is_ok());
        assert!(check_messages(&[msg("system", "s"), msg("user", "hi")]).is_ok());
        assert!(check_messages(&[msg("user", "hi"), msg("system", "s")]).is_err());
        assert!(check_messages(&[msg("user", "hi"), msg("assistant", "a")]).is_err());
        assert!(check_messages(&[msg("tool", "x"), msg("user", "hi")]).is_err());
        assert!(
            check_messages(&[msg("user", "hi"), msg("assistant", "a"), msg("tool", "x")]).is_err()
        );
        let mut call = msg("assistant", "");
        call.tool_calls = Some(vec![serde_json::json!({"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}})]);
        let out = check_messages(&[msg("user", "hi"), call, msg("tool", "3")]).unwrap();
        assert_eq!(
            out[1].tool_calls[0]["function"]["arguments"],
            serde_json::json!({"a": 1})
        );
        assert_eq!(out[2].role, "tool");
        assert!(check_messages(&[msg("user", "")]).is_err());
    }

    #[test]
    fn max_tokens_against_the_context() {
        assert_eq!(max_tokens_for(None, 10, 100).unwrap(), 90);
        assert_eq!(max_tokens_for(Some(5), 10, 100).unwrap(), 5);
        assert!(max_tokens_for(Some(91), 10, 100).is_err());
        assert!(max_tokens_for(Some(u64::MAX), 10, 100).is_err());
        assert!(max_tokens_for(None, 100, 100).is_err());
    }
}

//! What the page asks of a model: one generation request as JSON, checked before any work, and
//! the buffer a GGUF file is streamed into. Both are untrusted input (a page's query string, a
//! server's `Content-Length`), so every size is bounded and every error names its field.
use burn_gguf_models::{Message, SamplerConfig};
use serde::Deserialize;

/// Largest GGUF file the page takes, in bytes. A wasm32 module's memory is at most 4 GiB and a
/// `Vec` at most `isize::MAX` (2 GiB) bytes; the model's decoded state needs room beside it.
pub const MAX_FILE_BYTES: usize = 2_000_000_000;
/// Longest prompt or chat history, in bytes of UTF-8.
pub const MAX_PROMPT_BYTES: usize = 1 << 20;
/// Most new tokens one request may ask for.
pub const MAX_NEW_TOKENS: usize = 8192;

/// One generation request, as the page's script sends it (JSON; unknown fields are refused).
/// Exactly one of `prompt` (a completion of raw text, BOS added by the tokenizer's rule, as
/// `burn-gguf run`) and `messages` (a chat, rendered with the model's chat template, its KV
/// cache reused across turns, as `burn-gguf chat`) is given.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// Raw text to complete.
    #[serde(default)]
    pub prompt: Option<String>,
    /// A conversation; the model answers the last message.
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// Most new tokens (1..=[`MAX_NEW_TOKENS`]); 64 when absent.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Sampling temperature; 0 (the default) is greedy.
    #[serde(default)]
    pub temperature: f32,
    /// Top-k (0: off); 40 when absent.
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// Top-p in (0, 1]; 0.95 when absent.
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// Seed of the sampler's random generator.
    #[serde(default)]
    pub seed: u64,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

fn default_max_tokens() -> usize {
    64
}
fn default_top_k() -> usize {
    40
}
fn default_top_p() -> f32 {
    0.95
}

/// What a checked request asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Complete this text.
    Prompt(String),
    /// Answer this conversation.
    Chat(Vec<Message>),
}

impl GenerateRequest {
    /// Parses and checks `json`.
    ///
    /// # Errors
    /// A message naming the field: malformed JSON, an unknown field, neither or both of
    /// `prompt` and `messages`, an empty or over-long input, an unknown role, `max_tokens` out
    /// of 1..=[`MAX_NEW_TOKENS`], a temperature that is negative or not finite, `top_p`
    /// outside (0, 1].
    pub fn parse(json: &str) -> Result<(Input, usize, SamplerConfig), String> {
        let r: GenerateRequest = serde_json::from_str(json).map_err(|e| format!("request: {e}"))?;
        if !(1..=MAX_NEW_TOKENS).contains(&r.max_tokens) {
            return Err(format!(
                "max_tokens: {} is not in 1..={MAX_NEW_TOKENS}",
                r.max_tokens
            ));
        }
        if !(r.temperature.is_finite() && r.temperature >= 0.0) {
            return Err(format!(
                "temperature: {} is not a finite value >= 0",
                r.temperature
            ));
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return Err(format!("top_p: {} is not in (0, 1]", r.top_p));
        }
        let input = match (r.prompt, r.messages) {
            (Some(p), None) => {
                if p.is_empty() || p.len() > MAX_PROMPT_BYTES {
                    return Err(format!(
                        "prompt: {} bytes; 1..={MAX_PROMPT_BYTES} are accepted",
                        p.len()
                    ));
                }
                Input::Prompt(p)
            }
            (None, Some(m)) => {
                let bytes: usize = m.iter().map(|m| m.content.len()).sum();
                if m.is_empty() || bytes > MAX_PROMPT_BYTES {
                    return Err(format!(
                        "messages: {} messages of {bytes} bytes; 1 or more, up to \
                         {MAX_PROMPT_BYTES} bytes, are accepted",
                        m.len()
                    ));
                }
                if let Some(bad) = m
                    .iter()
                    .find(|m| !matches!(m.role.as_str(), "system" | "user" | "assistant"))
                {
                    return Err(format!(
                        "messages: role {:?} is not system, user or assistant",
                        bad.role
                    ));
                }
                Input::Chat(
                    m.into_iter()
                        .map(|m| Message::new(m.role, m.content))
                        .collect(),
                )
            }
            (Some(_), Some(_)) => return Err("request: give prompt or messages, not both".into()),
            (None, None) => return Err("request: prompt or messages is required".into()),
        };
        let sampler = SamplerConfig {
            temperature: r.temperature,
            top_k: r.top_k,
            top_p: r.top_p,
            seed: r.seed,
            ..SamplerConfig::default()
        };
        Ok((input, r.max_tokens, sampler))
    }
}

/// The bytes of a GGUF file as they arrive (a streamed `fetch` or a `File`'s stream), bounded
/// by [`MAX_FILE_BYTES`] whatever the server's `Content-Length` said.
#[derive(Debug, Default)]
pub struct FileBytes {
    bytes: Vec<u8>,
}

impl FileBytes {
    /// An empty buffer with room for `expected` bytes when that is known and within
    /// [`MAX_FILE_BYTES`] (a hint only: the stream decides the length).
    ///
    /// # Errors
    /// `expected` past [`MAX_FILE_BYTES`], or memory for it not available.
    pub fn with_expected(expected: Option<u64>) -> Result<Self, String> {
        let mut bytes = Vec::new();
        if let Some(n) = expected {
            if n > MAX_FILE_BYTES as u64 {
                return Err(too_large(n));
            }
            bytes
                .try_reserve_exact(n as usize)
                .map_err(|_| format!("no memory for a file of {n} bytes"))?;
        }
        Ok(Self { bytes })
    }

    /// Appends a chunk.
    ///
    /// # Errors
    /// The file growing past [`MAX_FILE_BYTES`], or memory not available.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), String> {
        let total = self.bytes.len().saturating_add(chunk.len());
        if total > MAX_FILE_BYTES {
            return Err(too_large(total as u64));
        }
        self.bytes
            .try_reserve(chunk.len())
            .map_err(|_| format!("no memory for a file of {total} bytes"))?;
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Bytes received so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was received.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The file's bytes.
    pub fn into_vec(self) -> Vec<u8> {
        self.bytes
    }
}

fn too_large(n: u64) -> String {
    format!("the file has {n} bytes; the page takes GGUF files up to {MAX_FILE_BYTES} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_request_takes_its_defaults() {
        let (input, n, s) = GenerateRequest::parse(r#"{"prompt":"Once upon a time"}"#).unwrap();
        assert_eq!(input, Input::Prompt("Once upon a time".into()));
        assert_eq!(n, 64);
        assert!(s.is_greedy());
        assert_eq!((s.top_k, s.top_p), (40, 0.95));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let cases = [
            (r#"{"prompt":"a","max_tokens":0}"#, "max_tokens"),
            (r#"{"prompt":"a","max_tokens":100000}"#, "max_tokens"),
            (r#"{"prompt":"a","temperature":-1}"#, "temperature"),
            (r#"{"prompt":"a","top_p":0}"#, "top_p"),
            (r#"{"prompt":""}"#, "prompt"),
            (r#"{"messages":[]}"#, "messages"),
            (r#"{"messages":[{"role":"tool","content":"x"}]}"#, "role"),
            (r#"{"prompt":"a","messages":[]}"#, "not both"),
            (r#"{}"#, "required"),
            (r#"{"prompt":"a","temp":0}"#, "unknown field"),
            (r#"{"prompt":"a""#, "request"),
        ];
        for (json, field) in cases {
            let e = GenerateRequest::parse(json).unwrap_err();
            assert!(e.contains(field), "{json}: {e}");
        }
    }

    #[test]
    fn the_file_buffer_is_bounded_whatever_the_header_says() {
        assert!(FileBytes::with_expected(Some(u64::MAX)).is_err());
        let mut b = FileBytes::with_expected(Some(4)).unwrap();
        b.push(b"GGUF").unwrap();
        b.push(&[0; 3]).unwrap();
        assert_eq!(b.len(), 7);
        assert_eq!(&b.into_vec()[..4], b"GGUF");
    }
}

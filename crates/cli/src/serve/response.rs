//! Response bodies of the OpenAI endpoints: a whole `chat.completion` / `text_completion`
//! object, or the server-sent event stream of chunks, built from a job's [`Event`]s.
//!
//! With tools, the reply's text is read for calls in the template's syntax
//! ([`ToolCallFormat`]): a whole reply is split into content and `tool_calls` at the end; a
//! stream sends content until a call marker appears (holding back text that may be the start
//! of one, and trailing whitespace), then the calls in one `tool_calls` delta at the end, so
//! the joined deltas equal the whole reply.
use std::collections::VecDeque;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::ApiError;
use super::engine::{self, Event, FinishReason, Logprobs};
use burn_gguf_models::tool_calls::{Tool, ToolCall, ToolCallFormat};

/// Which endpoint a response is for.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// Fields every response object carries.
#[derive(Clone)]
pub(super) struct Meta {
    pub(super) id: String,
    pub(super) model: String,
    pub(super) created: u64,
    pub(super) kind: Kind,
    /// How the reply is read for tool calls; `None` for text only.
    pub(super) tools: Option<ToolMode>,
}

/// How a chat reply is read for tool calls.
#[derive(Clone, Debug)]
pub(super) struct ToolMode {
    /// The template's syntax.
    pub(super) format: ToolCallFormat,
    /// The request's tools (the `<function=...>` syntax reads values by their declared type).
    pub(super) tools: Arc<[Tool]>,
    /// The grammar forces one call (`tool_choice` `required` or a named function).
    pub(super) forced: bool,
    /// Several calls may be kept (`parallel_tool_calls`).
    pub(super) parallel: bool,
}

impl ToolMode {
    /// `text` as content and calls (at most one unless parallel).
    fn parse(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let (content, mut calls) = self.format.parse(text, &self.tools);
        if !self.parallel {
            calls.truncate(1);
        }
        (content, calls)
    }
}

/// A stream's reading of tool calls: content goes out as it comes until a call marker.
struct ToolStream {
    mode: ToolMode,
    /// Text not yet sent: held back, or from the first marker on.
    held: String,
    /// Whitespace before the first marker (content again if the calls do not parse).
    gap: String,
    in_call: bool,
}

impl ToolStream {
    fn new(mode: ToolMode) -> Self {
        Self {
            in_call: mode.forced,
            mode,
            held: String::new(),
            gap: String::new(),
        }
    }

    /// Takes new text; returns the content that can be sent now.
    fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.in_call {
            return String::new();
        }
        let markers = self.mode.format.markers();
        if let Some(at) = markers.iter().filter_map(|m| self.held.find(m)).min() {
            let content = self.held[..at].trim_end().to_string();
            self.gap = self.held[content.len()..at].to_string();
            self.held.drain(..at);
            self.in_call = true;
            return content;
        }
        let markers: Vec<String> = markers.iter().map(|m| m.to_string()).collect();
        let keep = self.held.len() - engine::held_back(&self.held, &markers);
        let send = self.held[..keep].trim_end().len();
        self.held.drain(..send).collect()
    }

    /// At the end: the content still to send, and the calls.
    fn finish(self) -> (String, Vec<ToolCall>) {
        if self.in_call {
            let (_, calls) = self.mode.parse(&self.held);
            if !calls.is_empty() {
                return (String::new(), calls);
            }
        }
        (self.gap + &self.held, Vec::new())
    }
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// One choice carrying `text` (a delta when streaming) and, when asked for, the
    /// log-probabilities of its tokens (`logprobs` `Some`; `text_offset` of the first).
    fn choice(
        &self,
        text: Option<&str>,
        finish: Option<FinishReason>,
        chunk: bool,
        logprobs: Option<(&[Logprobs], usize)>,
    ) -> Value {
        let reason = finish.map(FinishReason::as_str);
        let lp = logprobs.map_or(Value::Null, |(lps, offset)| match self.kind {
            Kind::Chat => chat_logprobs(lps),
            Kind::Completion => completion_logprobs(lps, offset),
        });
        match self.kind {
            Kind::Chat if chunk => {
                let delta = match text {
                    Some(t) => json!({ "content": t }),
                    None => json!({}),
                };
                json!({ "index": 0, "delta": delta, "finish_reason": reason, "logprobs": lp })
            }
            Kind::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text.unwrap_or("") },
                "finish_reason": reason,
                "logprobs": lp,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "finish_reason": reason,
                "logprobs": lp,
            }),
        }
    }

    /// `calls` as OpenAI `tool_calls` (ids from the response id); in a delta each carries its
    /// `index`.
    fn tool_calls(&self, calls: &[ToolCall], delta: bool) -> Value {
        let list: Vec<Value> = (calls.iter().enumerate())
            .map(|(i, c)| {
                let mut v = json!({
                    "id": format!("call_{}_{i}", self.id),
                    "type": "function",
                    "function": { "name": c.name, "arguments": c.arguments.to_string() },
                });
                if delta {
                    v["index"] = i.into();
                }
                v
            })
            .collect();
        Value::Array(list)
    }

    fn body(&self, choices: Vec<Value>, usage: Option<Value>, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// A chat choice's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(lps: &[Logprobs]) -> Value {
    let one = |t: &engine::TokenLogprob| json!({ "token": t.token, "logprob": t.logprob, "bytes": t.bytes });
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut v = one(&l.chosen);
            v["top_logprobs"] = Value::Array(l.top.iter().map(one).collect());
            v
        })
        .collect();
    json!({ "content": content })
}

/// A completion choice's `logprobs` (the legacy shape): `tokens`, `token_logprobs`,
/// `top_logprobs` (one `{token: logprob}` object per token) and `text_offset` (characters from
/// the start of the generated text, the first at `offset`).
fn completion_logprobs(lps: &[Logprobs], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(lps.len());
    for l in lps {
        offsets.push(at);
        at += l.chosen.token.chars().count();
    }
    json!({
        "tokens": lps.iter().map(|l| l.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps
            .iter()
            .map(|l| {
                let mut m = serde_json::Map::new();
                for t in &l.top {
                    m.entry(t.token.clone()).or_insert(json!(t.logprob));
                }
                Value::Object(m)
            })
            .collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Characters the tokens of `lps` cover (the next `text_offset`).
fn logprob_chars(lps: &[Logprobs]) -> usize {
    lps.iter().map(|l| l.chosen.token.chars().count()).sum()
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

pub(super) async fn collect_response(
    meta: Meta,
    mut rx: UnboundedReceiver<Event>,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps: Vec<Logprobs> = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t, l) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Event::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            } => {
                let usage = Some(usage(prompt_tokens, completion_tokens));
                if let Some(mode) = &meta.tools {
                    let (content, calls) = mode.parse(&text);
                    if !calls.is_empty() {
                        let choice = json!({
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": content,
                                "tool_calls": meta.tool_calls(&calls, false),
                            },
                            "finish_reason": FinishReason::ToolCalls.as_str(),
                            "logprobs": null,
                        });
                        let body = meta.body(vec![choice], usage, false);
                        return Ok(axum::Json(body).into_response());
                    }
                }
                let lp = logprobs.then_some((&lps[..], 0));
                let body = meta.body(
                    vec![meta.choice(Some(&text), Some(finish_reason), false, lp)],
                    usage,
                    false,
                );
                return Ok(axum::Json(body).into_response());
            }
            Event::Error(e) => {
                return Err(
                    ApiError::bad_request(format!("generation failed: {e}"), None)
                        .status(StatusCode::INTERNAL_SERVER_ERROR),
                );
            }
        }
    }
    Err(
        ApiError::bad_request("generation ended without a result", None)
            .status(StatusCode::INTERNAL_SERVER_ERROR),
    )
}

/// The server-sent event stream: a first chunk with the role (chat), content chunks, with tools
/// a `tool_calls` chunk, a last chunk with `finish_reason`, an optional usage chunk, then
/// `data: [DONE]`. Dropping the stream (client gone) drops the receiver, which the worker sees
/// before its next step.
pub(super) fn stream_response(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    logprobs: bool,
) -> Response {
    /// What the stream holds between events.
    struct State {
        rx: UnboundedReceiver<Event>,
        meta: Meta,
        /// Characters streamed so far (the next `text_offset`).
        chars: usize,
        /// Chunks to send before reading the next event; `None` is `[DONE]`.
        queue: VecDeque<Option<Value>>,
        tools: Option<ToolStream>,
        ended: bool,
    }
    let first = match meta.kind {
        Kind::Chat => {
            json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "finish_reason": null, "logprobs": null })
        }
        Kind::Completion => meta.choice(Some(""), None, true, None),
    };
    let state = State {
        queue: VecDeque::from([Some(meta.body(vec![first], None, true))]),
        tools: meta.tools.clone().map(ToolStream::new),
        rx,
        meta,
        chars: 0,
        ended: false,
    };
    let stream = futures_lite::stream::unfold(state, move |mut st| async move {
        loop {
            if let Some(item) = st.queue.pop_front() {
                let ev = match item {
                    Some(v) => SseEvent::default().data(v.to_string()),
                    None => SseEvent::default().data("[DONE]"),
                };
                return Some((Ok::<_, std::convert::Infallible>(ev), st));
            }
            if st.ended {
                return None;
            }
            let meta = &st.meta;
            match st.rx.recv().await {
                Some(Event::Text(t, lps)) => match &mut st.tools {
                    Some(ts) => {
                        let content = ts.push(&t);
                        if !content.is_empty() {
                            let c = meta.choice(Some(&content), None, true, None);
                            st.queue.push_back(Some(meta.body(vec![c], None, true)));
                        }
                    }
                    None => {
                        let lp = logprobs.then_some((&lps[..], st.chars));
                        let c = meta.choice(Some(&t), None, true, lp);
                        st.queue.push_back(Some(meta.body(vec![c], None, true)));
                        st.chars += logprob_chars(&lps);
                    }
                },
                Some(Event::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let mut reason = finish_reason;
                    if let Some(ts) = st.tools.take() {
                        let (content, calls) = ts.finish();
                        if !content.is_empty() {
                            let c = meta.choice(Some(&content), None, true, None);
                            st.queue.push_back(Some(meta.body(vec![c], None, true)));
                        }
                        if !calls.is_empty() {
                            let c = json!({
                                "index": 0,
                                "delta": { "tool_calls": meta.tool_calls(&calls, true) },
                                "finish_reason": null,
                                "logprobs": null,
                            });
                            st.queue.push_back(Some(meta.body(vec![c], None, true)));
                            reason = FinishReason::ToolCalls;
                        }
                    }
                    let c = meta.choice(None, Some(reason), true, None);
                    st.queue.push_back(Some(meta.body(vec![c], None, true)));
                    if include_usage {
                        let u = usage(prompt_tokens, completion_tokens);
                        st.queue
                            .push_back(Some(meta.body(Vec::new(), Some(u), true)));
                    }
                    st.queue.push_back(None);
                    st.ended = true;
                }
                Some(Event::Error(e)) => {
                    st.queue.push_back(Some(
                        json!({ "error": { "message": format!("generation failed: {e}"), "type": "server_error", "param": null, "code": null } }),
                    ));
                    st.queue.push_back(None);
                    st.ended = true;
                }
                None => return None,
            }
        }
    });
    Sse::new(stream).into_response()
}

//! Serving measurements for `cargo xtask bench --serve`, through the server's own engine
//! ([`burn_gguf_cli::serve::engine`]: the worker thread, continuous batching, the grammar masks)
//! with no HTTP in between.
//!
//! **Structured outputs beside free text**: 8 greedy sequences decoded together, twice in one
//! run: all 8 free, then the first under a JSON schema (its mask computed beside each pass and
//! added to its row on the device) and 7 free. The figure is the 7 free sequences' decode
//! tokens/s (tokens after the first over the time from their first to their last token) in the
//! second batch over the first: 1.0 means the constrained neighbour costs them nothing. Each
//! batch runs once untimed first (kernels compile).
//!
//! **Prefix cache**: a long shared system prompt (`--serve-prompt-tokens`, default 1,500
//! tokens), then requests one after another, each the system prompt and its own short user
//! turn, 8 greedy tokens each: time to first token (from the job's sending to its first text)
//! of the first request against the mean of the others, which start after the cached prefix.
//! The first two are run again by a worker with the cache off, whose texts must be the same.
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use burn_gguf_cli::serve::engine::{self, Event, Job, ModelHandle};
use burn_gguf_cli::serve::metrics::Metrics;
use burn_gguf_models::SamplerConfig;
use burn_gguf_models::structured::{Grammar, TokenConstraint};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

/// Sequences decoded together (the server's default `--max-concurrent`).
const STREAMS: usize = 8;

/// A schema that keeps its sequence constrained for the whole run: at least 400 integers.
fn long_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"values": {"type": "array", "minItems": 400,
                                  "items": {"type": "integer", "minimum": 0, "maximum": 999}}},
        "required": ["values"],
        "additionalProperties": false
    })
}

/// One job's timeline: when its first and last text arrived, and its token count.
struct Timeline {
    first: Option<Instant>,
    last: Instant,
    tokens: usize,
}

/// Runs `STREAMS` greedy jobs of `steps` tokens on `handle` at once, the first under `grammar`
/// when given; returns each job's timeline.
fn batch(
    handle: &ModelHandle,
    prompts: &[Vec<u32>],
    steps: usize,
    grammar: Option<&Grammar>,
) -> Result<Vec<Timeline>, String> {
    let mut receivers = Vec::with_capacity(STREAMS);
    for (i, prompt) in prompts.iter().enumerate() {
        let constraint = match (i, grammar) {
            (0, Some(g)) => Some(
                (handle.grammars.as_ref().map_err(Clone::clone)?)
                    .compile(g)
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let (job, rx) = greedy_job(prompt, steps, constraint)?;
        handle.jobs.send(job).map_err(|e| e.to_string())?;
        receivers.push(rx);
    }
    // Every job's events are read as they come (a job read to its end first would stamp the
    // others' queued events late).
    let mut out: Vec<Timeline> = (0..receivers.len())
        .map(|_| Timeline {
            first: None,
            last: Instant::now(),
            tokens: 0,
        })
        .collect();
    let mut done = vec![false; receivers.len()];
    while done.iter().any(|d| !d) {
        let mut any = false;
        for (k, rx) in receivers.iter_mut().enumerate() {
            while !done[k] {
                match rx.try_recv() {
                    Ok(Event::Text(..)) => {
                        let now = Instant::now();
                        out[k].first.get_or_insert(now);
                        out[k].last = now;
                        any = true;
                    }
                    Ok(Event::Done {
                        completion_tokens, ..
                    }) => {
                        out[k].tokens = completion_tokens;
                        done[k] = true;
                        any = true;
                    }
                    Ok(Event::Error(e)) => return Err(e),
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                    Err(_) => return Err("the worker dropped a job".into()),
                }
            }
        }
        if !any {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    Ok(out)
}

/// A greedy job of `steps` tokens after `prompt`, with its own permit, and its event receiver.
fn greedy_job(
    prompt: &[u32],
    steps: usize,
    constraint: Option<TokenConstraint>,
) -> Result<(Job, UnboundedReceiver<Event>), String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let permit = Arc::new(tokio::sync::Semaphore::new(1))
        .try_acquire_owned()
        .map_err(|e| e.to_string())?;
    let job = Job {
        prompt_ids: prompt.to_vec(),
        max_tokens: steps,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        logprobs: None,
        lora: None,
        constraint,
        special_text: false,
        draft_max: None,
        events: tx,
        permit,
    };
    Ok((job, rx))
}

/// One request's time to first token and its text.
fn ttft_and_text(
    handle: &ModelHandle,
    prompt: &[u32],
    steps: usize,
) -> Result<(f64, String), String> {
    let (job, mut rx) = greedy_job(prompt, steps, None)?;
    let t = Instant::now();
    handle.jobs.send(job).map_err(|e| e.to_string())?;
    let (mut first, mut text) = (None, String::new());
    loop {
        match rx.blocking_recv() {
            Some(Event::Text(piece, _)) => {
                first.get_or_insert_with(|| t.elapsed().as_secs_f64());
                text.push_str(&piece);
            }
            Some(Event::Done { .. }) => {
                return Ok((first.unwrap_or_else(|| t.elapsed().as_secs_f64()), text));
            }
            Some(Event::Error(e)) => return Err(e),
            None => return Err("the worker dropped a job".into()),
        }
    }
}

/// The prefix-cache measurement on the model at `path`: a system prompt of at least
/// `prompt_tokens` tokens shared by `requests` chat requests sent one after another.
pub(super) fn prefix_cache(
    path: &Path,
    prompt_tokens: usize,
    requests: usize,
) -> Result<Value, String> {
    const STEPS: usize = 8;
    let start = |cache: bool| {
        let opts = engine::WorkerOptions {
            slots: STREAMS,
            prefix_cache: cache,
            ..engine::WorkerOptions::default()
        };
        engine::start(path.to_path_buf(), opts, Arc::new(Metrics::new()))
    };
    let handle = start(true)?;
    let paragraph = "The archive holds letters, maps and ledgers from the harbour's first \
        century: shipping records, weather notes, the names of captains and what they carried. ";
    let mut system = String::new();
    while handle
        .tokenizer
        .encode(&system, false)
        .map_err(|e| e.to_string())?
        .len()
        < prompt_tokens
    {
        system.push_str(paragraph);
    }
    let questions = [
        "What does the archive hold?",
        "Name one kind of record.",
        "Who is named in it?",
        "Summarise it in five words.",
        "Is weather mentioned?",
        "What century is covered?",
        "What did captains carry?",
        "Give it a title.",
        "Is it about a harbour?",
        "What is a ledger?",
        "Who would read it?",
        "Where is it kept?",
    ];
    let prompts: Vec<Vec<u32>> = (0..requests)
        .map(|k| {
            let messages = [
                burn_gguf_models::Message::new("system", system.clone()),
                burn_gguf_models::Message::new("user", questions[k % questions.len()]),
            ];
            let text = handle
                .template
                .render(&messages, true, &Value::Null)
                .map_err(|e| e.to_string())?;
            handle
                .tokenizer
                .encode_prompt(&text)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let shared = prompts[0]
        .iter()
        .zip(&prompts[1])
        .take_while(|(a, b)| a == b)
        .count();
    let mut cached = Vec::with_capacity(requests);
    for p in &prompts {
        cached.push(ttft_and_text(&handle, p, STEPS)?);
    }
    drop(handle.jobs);
    let _ = handle.thread.join();
    let plain = start(false)?;
    let mut uncached = Vec::new();
    for p in prompts.iter().take(2) {
        uncached.push(ttft_and_text(&plain, p, STEPS)?);
    }
    drop(plain.jobs);
    let _ = plain.thread.join();
    let first = cached[0].0;
    let rest: Vec<f64> = cached[1..].iter().map(|c| c.0).collect();
    let rest_mean = rest.iter().sum::<f64>() / rest.len().max(1) as f64;
    let equal = (cached.iter().zip(&uncached)).all(|(a, b)| a.1 == b.1);
    println!(
        "prefix cache ({} prompt tokens, {shared} shared; {requests} requests one after another):\n  \
         time to first token: first {first:.2} s, the others {rest_mean:.2} s on average: \
         {:.1}x lower; without the cache {:.2} s and {:.2} s; texts equal without the cache: \
         {equal}\n",
        prompts[0].len(),
        first / rest_mean.max(1e-9),
        uncached[0].0,
        uncached.get(1).map_or(0.0, |u| u.0),
    );
    Ok(json!({
        "model": path.display().to_string(),
        "prompt_tokens": prompts[0].len(),
        "shared_prefix_tokens": shared,
        "requests": requests,
        "ttft_first_seconds": first,
        "ttft_others_seconds": rest,
        "ttft_others_mean_seconds": rest_mean,
        "ratio_first_over_others": first / rest_mean.max(1e-9),
        "ttft_without_cache_seconds": uncached.iter().map(|u| u.0).collect::<Vec<_>>(),
        "texts_equal_without_cache": equal,
        "texts": cached.iter().map(|c| c.1.clone()).collect::<Vec<_>>(),
    }))
}

/// Decode tokens/s of the free sequences `1..` of a batch: their tokens after the first over
/// the span from the earliest first token to the latest last one.
fn free_tps(t: &[Timeline]) -> f64 {
    let free = &t[1..];
    let start = free.iter().filter_map(|t| t.first).min();
    let end = free.iter().map(|t| t.last).max();
    let tokens: usize = free.iter().map(|t| t.tokens.saturating_sub(1)).sum();
    match (start, end) {
        (Some(s), Some(e)) if e > s => tokens as f64 / (e - s).as_secs_f64(),
        _ => 0.0,
    }
}

/// The structured-outputs measurement on the model at `path`, `steps` greedy tokens a
/// sequence.
pub(super) fn structured(path: &Path, steps: usize) -> Result<Value, String> {
    let opts = engine::WorkerOptions {
        slots: STREAMS,
        ..engine::WorkerOptions::default()
    };
    let handle = engine::start(path.to_path_buf(), opts, Arc::new(Metrics::new()))?;
    let prompts: Vec<Vec<u32>> = (0..STREAMS)
        .map(|i| {
            let text =
                format!("{} {}", super::decode::PROMPT, "and then ".repeat(i % 4)) + &i.to_string();
            handle.tokenizer.encode(&text, true)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let grammar = Grammar::JsonSchema(long_schema());
    // Warm-up: both batches once (kernels compile, the grammar's first masks).
    batch(&handle, &prompts, 4, None)?;
    batch(&handle, &prompts, 4, Some(&grammar))?;
    let free = batch(&handle, &prompts, steps, None)?;
    let mixed = batch(&handle, &prompts, steps, Some(&grammar))?;
    let (free_tps, mixed_tps) = (free_tps(&free), free_tps(&mixed));
    let ratio = mixed_tps / free_tps.max(1e-9);
    println!(
        "structured outputs beside free text ({STREAMS} greedy streams, {steps} tokens):\n  \
         7 free streams: {free_tps:.2} tokens/s with 8 free, {mixed_tps:.2} tokens/s beside one \
         under a JSON schema: {ratio:.3}x (constrained stream: {} tokens)\n",
        mixed[0].tokens
    );
    drop(handle.jobs);
    let _ = handle.thread.join();
    Ok(json!({
        "model": path.display().to_string(),
        "streams": STREAMS,
        "steps": steps,
        "free_streams_tps_all_free": free_tps,
        "free_streams_tps_beside_constrained": mixed_tps,
        "ratio": ratio,
        "constrained_tokens": mixed[0].tokens,
        "schema": long_schema(),
    }))
}

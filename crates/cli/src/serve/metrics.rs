//! `GET /metrics`: the server's figures in Prometheus' text format (`prometheus-client`).
//!
//! Gauges of running and queued sequences are read when scraped; the workers add to the
//! counters as they go: tokens prefilled and generated, the seconds spent in prefill and
//! decode passes, and each request's time to first token.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The figures the workers update.
pub struct Metrics {
    registry: Registry,
    running: Gauge,
    waiting: Gauge,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    /// Tokens of decode passes (not the first token of each sequence, which prefill gives).
    decode_tokens: Counter,
    prompt_seconds: Counter<f64, AtomicU64>,
    decode_seconds: Counter<f64, AtomicU64>,
    prompt_tps: Gauge<f64, AtomicU64>,
    decode_tps: Gauge<f64, AtomicU64>,
    batch_rows: Histogram,
    ttft: Histogram,
    requests: Counter,
    prefix_hits: Counter,
    prefix_tokens: Counter,
    prefix_evicted: Counter,
    store_hits: Counter,
    store_evicted: Counter,
    store_entries: Gauge,
    store_bytes: Gauge,
    drafted: Counter,
    draft_accepted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("burn_gguf");
        let m = Metrics {
            running: Gauge::default(),
            waiting: Gauge::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            decode_tokens: Counter::default(),
            prompt_seconds: Counter::default(),
            decode_seconds: Counter::default(),
            prompt_tps: Gauge::default(),
            decode_tps: Gauge::default(),
            // 1 to 64 rows.
            batch_rows: Histogram::new(exponential_buckets(1.0, 2.0, 7)),
            // 10 ms to about 80 s.
            ttft: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            requests: Counter::default(),
            prefix_hits: Counter::default(),
            prefix_tokens: Counter::default(),
            prefix_evicted: Counter::default(),
            store_hits: Counter::default(),
            store_evicted: Counter::default(),
            store_entries: Gauge::default(),
            store_bytes: Gauge::default(),
            drafted: Counter::default(),
            draft_accepted: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "sequences_running",
            "Sequences generating now, over all models",
            m.running.clone(),
        );
        registry.register(
            "sequences_waiting",
            "Requests waiting for a concurrency slot",
            m.waiting.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens prefilled",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated (an end-of-generation token included)",
            m.generated_tokens.clone(),
        );
        registry.register(
            "prompt_seconds",
            "Seconds spent in prefill passes",
            m.prompt_seconds.clone(),
        );
        registry.register(
            "decode_seconds",
            "Seconds spent in decode passes (one pass decodes every running sequence)",
            m.decode_seconds.clone(),
        );
        registry.register(
            "prompt_tokens_per_second",
            "Prompt tokens per second of prefill, over the server's life",
            m.prompt_tps.clone(),
        );
        registry.register(
            "decode_tokens_per_second",
            "Generated tokens per second of decode passes, over the server's life (all \
             sequences together)",
            m.decode_tps.clone(),
        );
        registry.register(
            "decode_batch_rows",
            "Sequences per decode pass",
            m.batch_rows.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Seconds from a request reaching its model's worker to its first token",
            m.ttft.clone(),
        );
        registry.register(
            "requests",
            "Requests that reached a worker",
            m.requests.clone(),
        );
        registry.register(
            "prefix_cache_hits",
            "Requests that started after a prompt prefix already in a slot's cache",
            m.prefix_hits.clone(),
        );
        registry.register(
            "prefix_cache_reused_tokens",
            "Prompt tokens not computed because a slot's cache held them",
            m.prefix_tokens.clone(),
        );
        registry.register(
            "prefix_cache_evicted_tokens",
            "Cached tokens dropped when their slot took a request that did not share them",
            m.prefix_evicted.clone(),
        );
        registry.register(
            "prefix_store_hits",
            "Requests that started after a prefix loaded from the prefix store (--cache-memory)",
            m.store_hits.clone(),
        );
        registry.register(
            "prefix_store_evictions",
            "Prefix store entries evicted, least recently used first, to stay within \
             --cache-memory",
            m.store_evicted.clone(),
        );
        registry.register(
            "prefix_store_entries",
            "Prefixes the prefix store holds",
            m.store_entries.clone(),
        );
        registry.register(
            "prefix_store_bytes",
            "Device memory the prefix store holds, in bytes",
            m.store_bytes.clone(),
        );
        registry.register(
            "speculative_drafted_tokens",
            "Tokens drafted for speculative decoding and checked in verify passes",
            m.drafted.clone(),
        );
        registry.register(
            "speculative_accepted_tokens",
            "Drafted tokens the model accepted (each saved a decode pass)",
            m.draft_accepted.clone(),
        );
        Metrics { registry, ..m }
    }

    /// A request reused `tokens` cached prompt tokens; `evicted` cached tokens of its slot were
    /// dropped.
    pub fn prefix_cache(&self, tokens: usize, evicted: usize) {
        if tokens > 0 {
            self.prefix_hits.inc();
            self.prefix_tokens.inc_by(tokens as u64);
        }
        self.prefix_evicted.inc_by(evicted as u64);
    }

    /// A request started after a prefix loaded from the prefix store.
    pub fn prefix_store_hit(&self) {
        self.store_hits.inc();
    }

    /// A worker's prefix store changed by `entries` entries and `bytes` bytes, evicting
    /// `evicted` entries.
    pub fn prefix_store(&self, evicted: usize, entries: i64, bytes: i64) {
        self.store_evicted.inc_by(evicted as u64);
        self.store_entries.inc_by(entries);
        self.store_bytes.inc_by(bytes);
    }

    /// A verify pass checked `drafted` drafted tokens of a sequence and accepted `accepted`.
    pub fn speculative(&self, drafted: usize, accepted: usize) {
        self.drafted.inc_by(drafted as u64);
        self.draft_accepted.inc_by(accepted as u64);
    }

    /// A request reached a worker.
    pub fn request(&self) {
        self.requests.inc();
    }

    /// A prefill pass of `tokens` prompt tokens took `t`.
    pub fn prefill(&self, tokens: usize, t: Duration) {
        self.prompt_tokens.inc_by(tokens as u64);
        self.prompt_seconds.inc_by(t.as_secs_f64());
        self.prompt_tps
            .set(self.prompt_tokens.get() as f64 / self.prompt_seconds.get().max(1e-9));
    }

    /// A decode pass of `sequences` sequences gave `tokens` tokens (one each, or more with
    /// accepted drafts) and took `t`.
    pub fn decode(&self, sequences: usize, tokens: usize, t: Duration) {
        self.batch_rows.observe(sequences as f64);
        self.generated_tokens.inc_by(tokens as u64);
        self.decode_tokens.inc_by(tokens as u64);
        self.decode_seconds.inc_by(t.as_secs_f64());
        self.decode_tps
            .set(self.decode_tokens.get() as f64 / self.decode_seconds.get().max(1e-9));
    }

    /// A prefill's last pass gave a sequence its first token.
    pub fn first_token_generated(&self) {
        self.generated_tokens.inc();
    }

    /// A request's first token came `t` after it reached the worker.
    pub fn first_token(&self, t: Duration) {
        self.ttft.observe(t.as_secs_f64());
    }

    /// The text exposition, with the running and waiting gauges set to the values given.
    pub fn render(&self, running: usize, waiting: usize) -> String {
        self.running.set(running as i64);
        self.waiting.set(waiting as i64);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

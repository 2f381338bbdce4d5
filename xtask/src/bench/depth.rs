//! Decode at depth for `cargo xtask bench --depth`: what a token costs once the context is
//! long, on the end-to-end model (Gemma 3 270M Q4_K_M by default).
//!
//! - **Attention kernel** at Gemma 3 270M's shape (4 query heads sharing 1 KV head of 256
//!   values), one query row over 64, 590 and 2,048 cached keys: milliseconds per launch with a
//!   key per unit (`lanes` 1) and with a plane of the device's width per key, alternating
//!   rounds (the library's choice is marked); and with the library's choice, the keys in one
//!   block against blocks of 64 scattered through a paged cache (what the block table costs).
//! - **Decode tokens/s** after a 5-token prompt and after a 590-token prompt, greedy, in one
//!   process after a warm-up generation of each (kernels compiled, matmuls autotuned): the
//!   figure is their ratio. The prompt's prefill tokens/s is printed beside it.
use std::path::Path;

use burn_gguf_models::{Sampler, SamplerConfig, Session, generate_ids};
use cubecl::client::Client;
use cubecl::prelude::*;
use ggml_kernels::attention::{attention_lanes, launch_attention_lanes, plane_lanes};
use ggml_kernels::{AttentionShape, KvPaging, check::rand_f32};
use serde_json::{Value, json};

use super::timing::{Budget, measure_alternating, sync_client};

/// Gemma 3 270M's attention: query heads, KV heads, values per head.
const GEMMA_HEADS: (usize, usize, usize) = (4, 1, 256);

/// Positions per block of the paged caches the benchmark reads (`burn_gguf_models::KV_BLOCK`).
const PAGE: usize = burn_gguf_models::KV_BLOCK;

/// The attention kernel at Gemma's shape over `keys` cached keys, `lanes` per key: one call.
/// The cache is one block, or with `paged` blocks of [`PAGE`] positions in reverse order (no
/// two of the slot's blocks adjacent in the pool's order of reading).
fn attention_call(
    client: &Client,
    keys: usize,
    lanes: u32,
    paged: bool,
) -> Result<impl FnMut() -> Result<(), String> + use<>, String> {
    let (n_head, n_head_kv, hd) = GEMMA_HEADS;
    let capacity = keys.next_multiple_of(256);
    let (paging, table) = if paged {
        let width = capacity / PAGE;
        let table: Vec<u32> = (0..width as u32).rev().collect();
        (
            KvPaging {
                slots: 1,
                width,
                block: PAGE,
                blocks: width,
            },
            table,
        )
    } else {
        (KvPaging::contiguous(1, capacity), vec![0])
    };
    let cache_len = n_head_kv * capacity * hd;
    let q = client.create_from_slice(f32::as_bytes(&rand_f32(n_head * hd, 1)));
    let k = client.create_from_slice(f32::as_bytes(&rand_f32(cache_len, 2)));
    let v = client.create_from_slice(f32::as_bytes(&rand_f32(cache_len, 3)));
    // The query's slot and position, then the block table.
    let rows_u32: Vec<u32> = [0, keys as u32 - 1].into_iter().chain(table).collect();
    let rows_len = rows_u32.len();
    let rows = client.create_from_slice(u32::as_bytes(&rows_u32));
    let out = client.empty(n_head * hd * 4);
    let shape = AttentionShape {
        n: 1,
        n_head,
        n_head_kv,
        head_dim: hd,
        paging,
        window: None,
        keys,
    };
    let client = client.clone();
    Ok(move || {
        // SAFETY: each length is its buffer's (launch_attention_lanes checks them).
        let args = unsafe {
            [
                BufferArg::from_raw_parts(q.clone(), n_head * hd),
                BufferArg::from_raw_parts(k.clone(), cache_len),
                BufferArg::from_raw_parts(v.clone(), cache_len),
                BufferArg::from_raw_parts(rows.clone(), rows_len),
                BufferArg::from_raw_parts(out.clone(), n_head * hd),
            ]
        };
        let [q, k, v, rows, out] = args;
        let scale = 1.0 / (hd as f32).sqrt();
        launch_attention_lanes(&client, q, k, v, rows, out, shape, scale, None, lanes)
            .map_err(|e| e.to_string())
    })
}

/// The attention kernel's milliseconds per launch at each depth, a key per unit against a
/// plane per key, and with the library's lanes, one block against scattered blocks of
/// [`PAGE`] positions (what the block table costs).
fn attention_kernel(client: &Client, budget: Budget) -> Result<Value, String> {
    // Without plane ops both columns are a key per unit.
    let plane = plane_lanes(client);
    let chosen = attention_lanes(client);
    println!(
        "attention kernel, Gemma 3 270M's heads (4 query, 1 KV, 256 values), one query row; \
         ms per launch (* the library's choice):"
    );
    println!(
        "  {:>6} {:>12} {:>12} {:>12} {:>12}",
        "keys",
        "lanes 1",
        format!("lanes {plane}"),
        "one block",
        format!("paged {PAGE}")
    );
    let mut rows = Vec::new();
    for keys in [64usize, 590, 2048] {
        let sync = || sync_client(client);
        let (a, b) = measure_alternating(
            budget,
            (attention_call(client, keys, 1, false)?, sync),
            (attention_call(client, keys, plane, false)?, sync),
        )?;
        let (one, paged) = measure_alternating(
            budget,
            (attention_call(client, keys, chosen, false)?, sync),
            (attention_call(client, keys, chosen, true)?, sync),
        )?;
        let mark = |lanes: u32| if lanes == chosen { "*" } else { " " };
        println!(
            "  {keys:>6} {:>11.3}{} {:>11.3}{} {:>12.3} {:>12.3}",
            a.seconds * 1e3,
            mark(1),
            b.seconds * 1e3,
            mark(plane),
            one.seconds * 1e3,
            paged.seconds * 1e3
        );
        rows.push(json!({"keys": keys, "lanes_1_ms": a.seconds * 1e3,
                         "lanes_plane_ms": b.seconds * 1e3, "plane": plane,
                         "one_block_ms": one.seconds * 1e3, "paged_ms": paged.seconds * 1e3,
                         "page": PAGE}));
    }
    println!();
    Ok(json!({"chosen_lanes": chosen, "rows": rows}))
}

/// Greedy decode after `ids`: (prefill tokens/s, decode tokens/s).
fn decode_after(
    model: &burn_gguf_models::Decoder,
    tokenizer: &burn_gguf_models::GgufTokenizer,
    ids: &[u32],
    steps: usize,
) -> Result<(f64, f64), String> {
    let mut session = Session::new(model);
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    });
    let out = generate_ids(
        model,
        tokenizer,
        &mut session,
        ids.to_vec(),
        steps,
        &mut sampler,
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    Ok((out.timings.prompt_tps(), out.timings.decode_tps()))
}

/// The measurement on the model at `path`, `steps` decoded tokens a generation.
pub(super) fn run(path: &Path, steps: usize, budget: Budget) -> Result<Value, String> {
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).ok_or("not a CubeCL device")?;
    let kernel = attention_kernel(&client, budget)?;
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let short = tokenizer
        .encode(super::decode::PROMPT, true)
        .map_err(|e| e.to_string())?;
    // About 590 tokens: the speculative bench's passage twice, and a question.
    let passage = super::spec::PASSAGE;
    let text = format!(
        "{passage}\n\n{passage}\n\nQuestion: what happened to the lighthouse in the winter \
         of 1883, and who kept its light burning?\nAnswer:"
    );
    let long = tokenizer.encode(&text, true).map_err(|e| e.to_string())?;
    // Warm-up: every kernel and matmul shape of both runs, once.
    decode_after(model, tokenizer, &short, 4)?;
    decode_after(model, tokenizer, &long, 4)?;
    let (_, at_short) = decode_after(model, tokenizer, &short, steps)?;
    let (prefill, at_long) = decode_after(model, tokenizer, &long, steps)?;
    println!(
        "decode at depth, {steps} greedy tokens: after {} prompt tokens {at_short:.2} tokens/s, \
         after {} {at_long:.2} tokens/s ({:.2}x); that prompt's prefill {prefill:.1} tokens/s\n",
        short.len(),
        long.len(),
        at_long / at_short
    );
    Ok(json!({
        "attention_kernel": kernel,
        "model": path.display().to_string(),
        "steps": steps,
        "short_prompt_tokens": short.len(),
        "long_prompt_tokens": long.len(),
        "decode_tokens_per_s_short": at_short,
        "decode_tokens_per_s_long": at_long,
        "ratio": at_long / at_short,
        "prefill_tokens_per_s_long": prefill,
    }))
}

//! Batched decode for `cargo xtask bench`: `streams` greedy sequences decoded together
//! ([`Decoder::forward_batch`], one pass per step for all of them) against each run alone, in
//! the same run: aggregate tokens/s over the single-stream figure, and whether every stream's
//! tokens equal its tokens alone.
use std::path::Path;
use std::time::Instant;

use burn::tensor::{Int, Tensor};
use burn_gguf_models::{BatchState, Decoder, SequenceState};
use serde_json::{Value, json};

/// Stream `i`'s prompt: distinct, of different lengths.
fn prompt(i: usize) -> String {
    format!("{} {}", super::decode::PROMPT, "and then ".repeat(i % 4)) + &i.to_string()
}

/// Greedy ids of each row of `logits` `[rows, vocab]`: the argmax on the device, one read.
fn argmax_rows(logits: Tensor<2>) -> Result<Vec<u32>, String> {
    let ids: Tensor<2, Int> = logits.argmax(1);
    let data = ids.try_into_data().map_err(|e| format!("{e:?}"))?;
    Ok(data.iter::<i64>().map(|v| v as u32).collect())
}

/// `streams` sequences of `steps` greedy tokens after their prompts: each alone (one pass per
/// token), then all together (one pass per step), timed over the decode steps.
pub(super) fn batched_decode(
    label: &str,
    path: &Path,
    streams: usize,
    steps: usize,
) -> Result<Value, String> {
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let prompts: Vec<Vec<u32>> = (0..streams)
        .map(|i| tokenizer.encode(&prompt(i), true))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let e = |e: burn_gguf_models::Error| e.to_string();
    let run_alone = |ids: &[u32]| -> Result<(Vec<u32>, f64), String> {
        let mut state = SequenceState::new();
        let mut token = argmax_rows(model.forward(ids, &mut state, false).map_err(e)?)?[0];
        let mut out = vec![token];
        let t = Instant::now();
        for _ in 1..steps {
            token = argmax_rows(model.forward(&[token], &mut state, false).map_err(e)?)?[0];
            out.push(token);
        }
        Ok((out, t.elapsed().as_secs_f64()))
    };
    // Warm-up (kernels compiled for one row and for the batch), not timed.
    run_alone(&prompts[0])?;
    together(model, &prompts[..streams.min(2)], 2)?;

    let mut alone = Vec::with_capacity(streams);
    let mut alone_s = 0.0;
    for p in &prompts {
        let (ids, s) = run_alone(p)?;
        alone.push(ids);
        alone_s += s;
    }
    let (batched, batched_s) = together(model, &prompts, steps)?;
    let decoded = (steps - 1) as f64;
    let single_tps = decoded * streams as f64 / alone_s;
    let aggregate_tps = decoded * streams as f64 / batched_s;
    let equal = alone.iter().zip(&batched).filter(|(a, b)| a == b).count();
    let texts_equal = alone
        .iter()
        .zip(&batched)
        .filter(|(a, b)| tokenizer.decode(a).ok() == tokenizer.decode(b).ok())
        .count();
    println!(
        "  {label}: {streams} streams together: {aggregate_tps:.1} tokens/s aggregate against \
         {single_tps:.1} alone = {:.2}x; {equal}/{streams} streams' tokens equal alone \
         ({texts_equal}/{streams} texts)",
        aggregate_tps / single_tps
    );
    Ok(json!({
        "streams": streams,
        "steps": steps,
        "single_stream_tokens_per_s": single_tps,
        "aggregate_tokens_per_s": aggregate_tps,
        "speedup": aggregate_tps / single_tps,
        "streams_with_equal_tokens": equal,
        "streams_with_equal_text": texts_equal,
    }))
}

/// Every prompt in its own slot: prefilled one pass each, then `steps - 1` decode passes of
/// all sequences at once. Returns each sequence's `steps` ids and the decode passes' seconds.
fn together(
    model: &Decoder,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<(Vec<Vec<u32>>, f64), String> {
    let e = |e: burn_gguf_models::Error| e.to_string();
    let mut state = BatchState::new(prompts.len());
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(prompts.len());
    for (slot, p) in prompts.iter().enumerate() {
        let logits = model
            .forward_batch(&mut state, &[(slot, p)], false)
            .map_err(e)?;
        out.push(argmax_rows(logits)?);
    }
    let t = Instant::now();
    for _ in 1..steps {
        let last: Vec<[u32; 1]> = out.iter().map(|ids| [ids[ids.len() - 1]]).collect();
        let seqs: Vec<(usize, &[u32])> = last
            .iter()
            .enumerate()
            .map(|(s, id)| (s, &id[..]))
            .collect();
        let ids = argmax_rows(model.forward_batch(&mut state, &seqs, false).map_err(e)?)?;
        for (seq, id) in out.iter_mut().zip(ids) {
            seq.push(id);
        }
    }
    Ok((out, t.elapsed().as_secs_f64()))
}

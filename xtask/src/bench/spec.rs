//! Speculative decoding for `cargo xtask bench --spec`: greedy decode tokens/s with drafts from
//! the context (`--spec ngram`) against plain decoding, side by side in one run on the
//! end-to-end model (Gemma 3 270M Q4_K_M by default), on prompts whose reply copies from them
//! (extracting from a passage of about 300 tokens, editing a 40-line function) and on one that
//! copies nothing (a story). For each: both runs' decode tokens/s (tokens after the first over
//! the decode time, prefill excluded), their ratio, the acceptance rate (accepted over
//! drafted tokens) and the tokens a verify pass gave; the two texts must be equal token for
//! token. Kernels for every row count a verify pass takes are compiled before the first timed
//! run.
//!
//! **A draft model**: the tiny Qwen3 fixture as the draft (its Q8_0 file) of a target 10 times
//! its cost. No such pair shares a vocabulary in the fixtures, so the target is built here
//! ([`deeper`]): the F16 fixture with 28 more layers whose output projections are zero, so its
//! logits are the F16 model's while each token runs 30 layers instead of 2. The draft (Q8_0)
//! then disagrees with the target only where quantization moves its argmax. Figures: each
//! model's plain decode tokens/s (their ratio is the cost ratio), the target's with the draft,
//! the acceptance, and the same greedy ids checked.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn_gguf_models::speculative::{DEFAULT_DRAFT_MAX, DraftModel};
use burn_gguf_models::{
    CausalLm, Generation, NgramConfig, Sampler, SamplerConfig, Session, Speculation, generate_ids,
};
use gguf::{GgufWriter, MetadataValue};
use serde_json::{Value, json};

/// A passage of about 300 tokens for the extraction prompt.
pub(super) const PASSAGE: &str = "The lighthouse on Gull Rock was built in 1871 from granite \
quarried on the mainland and carried out by barge over three summers. Its first keeper, Thomas \
Avery, kept a logbook in which he recorded the weather twice a day, the ships that passed, and the \
birds that struck the lantern glass during the autumn migration. In the winter of 1883 a storm \
tore the iron gallery from the tower and flooded the oil store, and for eleven nights Avery kept \
the light burning with lamp oil he carried up the stairs in buckets. The logbook entries from \
those nights are short: the wind direction, the height of the sea, and the words 'light kept'. \
When the lighthouse was automated in 1958, the last keeper, Margaret Hale, left the logbooks to \
the harbour museum, where they are still kept in a glass case beside the original lens. The lens \
itself is a first-order Fresnel lens made in Paris, nearly three metres tall, with more than a \
thousand pieces of hand-ground glass. Visitors can climb the tower on summer weekends, when \
volunteers explain how the clockwork turned the lens and how the keepers trimmed the wicks. The \
rock is also home to a colony of puffins, which return every April and leave in August, and the \
museum keeps a record of their numbers that goes back to Avery's first notes.";

/// A 40-line function for the code-edit prompt.
const CODE: &str = "def summarize_orders(orders, min_total=0.0):
    \"\"\"Group orders by customer and return totals above min_total.\"\"\"
    totals = {}
    counts = {}
    for order in orders:
        customer = order[\"customer\"]
        amount = order[\"amount\"]
        if amount < 0:
            raise ValueError(\"negative amount in order %s\" % order[\"id\"])
        if customer not in totals:
            totals[customer] = 0.0
            counts[customer] = 0
        totals[customer] += amount
        counts[customer] += 1
    result = []
    for customer, total in totals.items():
        if total < min_total:
            continue
        average = total / counts[customer]
        result.append({
            \"customer\": customer,
            \"total\": round(total, 2),
            \"orders\": counts[customer],
            \"average\": round(average, 2),
        })
    result.sort(key=lambda row: row[\"total\"], reverse=True)
    return result


def print_report(rows):
    width = max((len(row[\"customer\"]) for row in rows), default=8)
    print(\"customer\".ljust(width), \"total\", \"orders\", \"average\")
    for row in rows:
        print(
            row[\"customer\"].ljust(width),
            \"%.2f\" % row[\"total\"],
            row[\"orders\"],
            \"%.2f\" % row[\"average\"],
        )
    print(\"%d customers\" % len(rows))
";

/// The measured prompts: `(name, text, copies)`.
fn prompts() -> Vec<(&'static str, String, bool)> {
    vec![
        (
            "extract",
            format!(
                "{PASSAGE}\n\nCopy the three sentences about the storm and the logbook \
                 exactly as they appear in the text above.\n\nIn the winter of 1883"
            ),
            true,
        ),
        (
            "summarise",
            format!("{PASSAGE}\n\nSummary of the text above, in its own words:\n\nThe lighthouse"),
            true,
        ),
        (
            "code-edit",
            format!(
                "{CODE}\n\n# The same code with the variable `totals` renamed to \
                 `sums` everywhere:\n\ndef summarize_orders(orders, min_total=0.0):\n"
            ),
            true,
        ),
        (
            "story",
            "Write a short story about a fox who learns to swim.\n\nOnce upon a time".into(),
            false,
        ),
    ]
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    })
}

/// One generation of `steps` greedy tokens after `ids` with `speculation`.
fn generation(
    model: &burn_gguf_models::Decoder,
    tokenizer: &burn_gguf_models::GgufTokenizer,
    ids: &[u32],
    steps: usize,
    speculation: Speculation,
) -> Result<Generation, String> {
    let mut session = Session::new(model);
    session
        .set_speculation(speculation)
        .map_err(|e| e.to_string())?;
    generate_ids(
        model,
        tokenizer,
        &mut session,
        ids.to_vec(),
        steps,
        &mut greedy(),
        |_| {},
    )
    .map_err(|e| e.to_string())
}

/// Compiles what a verify pass runs: a pass of every row count up to `rows` with every row's
/// logits, and their argmax.
fn warm_up(model: &burn_gguf_models::Decoder, ids: &[u32], rows: usize) -> Result<(), String> {
    for r in 1..=rows.min(ids.len()) {
        let mut cache = model.new_cache();
        let logits = model
            .forward(&ids[..r], &mut cache, true)
            .map_err(|e| e.to_string())?;
        logits
            .argmax(1)
            .try_into_data()
            .map_err(|e| format!("{e:?}"))?;
    }
    Ok(())
}

/// Writes `path`'s model with `extra` more layers to `out`: each a copy of layer 0 whose output
/// projections (`attn_output`, `ffn_down`) are zero, so that it adds nothing to the residual
/// stream: the deeper model's logits are `path`'s, each token running `extra` more layers.
fn deeper(path: &Path, extra: usize, out: &Path) -> Result<(), String> {
    let file = gguf::GgufFile::open(path).map_err(|e| e.to_string())?;
    let key = format!(
        "{}.block_count",
        file.architecture().map_err(|e| e.to_string())?
    );
    let n = file.get_u32(&key).map_err(|e| e.to_string())? as usize;
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        match k.as_str() {
            "general.alignment" => {}
            k if k == key => {
                w.add_metadata(k, MetadataValue::U32((n + extra) as u32));
            }
            _ => {
                w.add_metadata(k.clone(), v.clone());
            }
        }
    }
    w.alignment(file.alignment() as u32);
    let err = |e: gguf::GgufError| e.to_string();
    for t in file.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.ne, file.tensor_data(t))
            .map_err(err)?;
    }
    let first: Vec<_> = (file.tensors().iter())
        .filter(|t| t.name.starts_with("blk.0."))
        .collect();
    for layer in n..n + extra {
        for t in &first {
            let rest = &t.name["blk.0.".len()..];
            let zero = rest.starts_with("attn_output.") || rest.starts_with("ffn_down.");
            let data = if zero {
                vec![0u8; t.n_bytes as usize]
            } else {
                file.tensor_data(t).to_vec()
            };
            w.add_tensor(format!("blk.{layer}.{rest}"), t.ggml_type, &t.ne, &data)
                .map_err(err)?;
        }
    }
    w.write(out).map_err(err)
}

/// The draft-model measurement (see the module docs), `steps` tokens a generation.
fn draft_model(steps: usize) -> Result<Value, String> {
    let fixtures = PathBuf::from("../shared/fixtures/gguf");
    let target_path = std::env::temp_dir().join(format!(
        "burn-gguf-bench-{}-tiny-qwen3-f16-30-layers.gguf",
        std::process::id()
    ));
    deeper(&fixtures.join("tiny-qwen3-f16.gguf"), 28, &target_path)?;
    let target = burn_gguf_cli::run::load(&target_path, None, false, false);
    let _ = std::fs::remove_file(&target_path);
    let target = target?;
    let draft =
        burn_gguf_cli::run::load(&fixtures.join("tiny-qwen3-Q8_0.gguf"), None, false, false)?;
    burn_gguf_cli::run::check_same_vocabulary(&target.tokenizer, &draft.tokenizer)?;
    let tokenizer = &target.tokenizer;
    let draft_model = Arc::new(draft.model);
    // A prompt after which the tiny model writes on (it ends "Once upon a time" at once).
    let ids = tokenizer
        .encode(
            "one two three four five six seven. one two three four five six seven. one two",
            true,
        )
        .map_err(|e| e.to_string())?;
    let speculation = || {
        Speculation::Draft(DraftModel {
            model: draft_model.clone(),
            draft_max: DEFAULT_DRAFT_MAX,
        })
    };
    // Warm-up: every row count of a verify pass, both models.
    warm_up(&target.model, &ids, DEFAULT_DRAFT_MAX + 1)?;
    generation(&draft_model, &draft.tokenizer, &ids, 8, Speculation::Off)?;
    generation(&target.model, tokenizer, &ids, 8, speculation())?;
    let plain_draft = generation(
        &draft_model,
        &draft.tokenizer,
        &ids,
        steps,
        Speculation::Off,
    )?;
    let plain = generation(&target.model, tokenizer, &ids, steps, Speculation::Off)?;
    let with = generation(&target.model, tokenizer, &ids, steps, speculation())?;
    let stats = with.speculation.clone().unwrap_or_default();
    let same = with.generated_ids == plain.generated_ids;
    let (d, p, w) = (
        plain_draft.timings.decode_tps(),
        plain.timings.decode_tps(),
        with.timings.decode_tps(),
    );
    println!(
        "draft model: target (tiny-qwen3 F16 + 28 zero layers) {p:.1} tokens/s, draft \
         (tiny-qwen3 Q8_0) {d:.1} tokens/s ({:.1}x the target's speed); target with the draft \
         {w:.1} tokens/s ({:.2}x), {:.0}% of {} drafted tokens accepted, {:.2} tokens a verify \
         pass, same ids: {same}\n",
        d / p,
        w / p,
        100.0 * stats.acceptance_rate(),
        stats.drafted,
        stats.tokens_per_pass()
    );
    if !same {
        return Err(format!(
            "draft model: greedy ids differ:\n{:?}\n{:?}",
            plain.generated_ids, with.generated_ids
        ));
    }
    Ok(json!({
        "target": "tiny-qwen3-f16 with 28 more layers whose output projections are zero",
        "draft": "tiny-qwen3-Q8_0",
        "steps": steps,
        "draft_decode_tokens_per_s": d,
        "target_decode_tokens_per_s": p,
        "target_with_draft_tokens_per_s": w,
        "cost_ratio": d / p,
        "speedup": w / p,
        "verify_passes": stats.verify_passes,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate(),
        "tokens_per_verify_pass": stats.tokens_per_pass(),
        "same_ids": same,
    }))
}

/// The measurement on the model at `path`, `steps` tokens a generation.
pub(super) fn run(path: &Path, steps: usize) -> Result<Value, String> {
    let draft = draft_model(steps.max(32))?;
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let config = NgramConfig::default();
    let ngram = Speculation::Ngram(config.clone());
    let warm_ids = tokenizer.encode(PASSAGE, true).map_err(|e| e.to_string())?;
    warm_up(model, &warm_ids, config.draft_max + 1)?;
    println!(
        "speculative decoding (prompt lookup, n-grams {}..={}, drafts up to {} tokens), {steps} \
         greedy tokens each, plain then ngram:",
        config.min_ngram, config.max_ngram, config.draft_max
    );
    println!(
        "  {:<10} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10}  same",
        "prompt", "tokens", "plain t/s", "ngram t/s", "ratio", "accepted", "tok/pass"
    );
    let mut rows = Vec::new();
    for (name, text, copies) in prompts() {
        let ids = tokenizer.encode(&text, true).map_err(|e| e.to_string())?;
        let plain = generation(model, tokenizer, &ids, steps, Speculation::Off)?;
        let spec = generation(model, tokenizer, &ids, steps, ngram.clone())?;
        let stats = spec.speculation.clone().unwrap_or_default();
        let same = plain.generated_ids == spec.generated_ids;
        let (p, s) = (plain.timings.decode_tps(), spec.timings.decode_tps());
        println!(
            "  {name:<10} {:>7} {p:>10.2} {s:>10.2} {:>6.2}x {:>9.0}% {:>10.2}  {same}",
            ids.len(),
            s / p,
            100.0 * stats.acceptance_rate(),
            stats.tokens_per_pass(),
        );
        rows.push(json!({
            "prompt": name,
            "copies": copies,
            "prompt_tokens": ids.len(),
            "generated_tokens": plain.generated_ids.len(),
            "plain_decode_tokens_per_s": p,
            "ngram_decode_tokens_per_s": s,
            "ratio": s / p,
            "verify_passes": stats.verify_passes,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate(),
            "tokens_per_verify_pass": stats.tokens_per_pass(),
            "same_ids": same,
            "plain_text": plain.text,
            "ngram_text": spec.text,
        }));
        if !same {
            return Err(format!(
                "{name}: greedy ids with drafts differ from plain decoding:\n{:?}\n{:?}",
                plain.generated_ids, spec.generated_ids
            ));
        }
    }
    println!();
    Ok(json!({
        "draft_model": draft,
        "model": path.display().to_string(),
        "steps": steps,
        "min_ngram": config.min_ngram,
        "max_ngram": config.max_ngram,
        "draft_max": config.draft_max,
        "prompts": rows,
    }))
}

//! Speculative decoding with drafts from the context (issue 40): greedy ids equal plain greedy
//! decoding token for token on every fixture family (attention, sliding windows, MoE, the
//! recurrent delta-net layers of Qwen3.5 whose state goes back to a checkpoint) and on Gemma 3
//! 270M, across chat turns that reuse the cache; sampled drafts keep the model's distribution.
use burn::tensor::{Tensor, TensorData};
use burn_gguf_models::speculative::{DraftModel, verify};
use burn_gguf_models::{
    CausalLm, Decoder, GgufTokenizer, NgramConfig, Sampler, SamplerConfig, Session, SpecStats,
    Speculation, generate_ids,
};
use burn_gguf_tests::{fixtures, gemma_path, load_decoder};
use std::sync::Arc;

/// One file of each architecture the decoder runs (Gemma 3 is the real model below).
const FAMILIES: &[&str] = &[
    "gguf/tiny-qwen3-Q8_0.gguf",
    "gguf/tiny-qwen3moe-Q4_K_M.gguf",
    "arch/tiny-llama-Q4_K_M.gguf",
    "arch/tiny-qwen2-Q8_0.gguf",
    "arch/tiny-phi3-Q4_K_M.gguf",
    "arch/tiny-gemma2-Q8_0.gguf",
    "arch/tiny-qwen35-Q8_0.gguf",
    "arch/tiny-qwen35moe-Q4_K_M.gguf",
];

/// A prompt that repeats itself, so that lookups find drafts from the first step.
const PROMPT: &str =
    "one two three four five six seven. one two three four five six seven. one two";

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    })
}

/// Drafts from single-token matches too: the tiny random models rarely repeat a bigram, and
/// the rejected drafts are what exercise the roll-back.
fn ngram() -> Speculation {
    Speculation::Ngram(NgramConfig {
        min_ngram: 1,
        ..NgramConfig::default()
    })
}

/// Greedy ids of each prompt in turn through one session (turn 2 reuses turn 1's cache).
fn turns(
    model: &Decoder,
    tokenizer: &GgufTokenizer,
    prompts: &[Vec<u32>],
    n: usize,
    spec: Speculation,
) -> (Vec<Vec<u32>>, SpecStats) {
    let mut session = Session::new(model);
    session.set_speculation(spec).expect("speculation");
    let mut total = SpecStats::default();
    let ids = prompts
        .iter()
        .map(|p| {
            let mut sampler = greedy();
            let out = generate_ids(
                model,
                tokenizer,
                &mut session,
                p.clone(),
                n,
                &mut sampler,
                |_| {},
            )
            .expect("generate");
            if let Some(s) = out.speculation {
                total.verify_passes += s.verify_passes;
                total.drafted += s.drafted;
                total.accepted += s.accepted;
            }
            out.generated_ids
        })
        .collect();
    (ids, total)
}

/// Two turns: the prompt, then the first turn's prompt and reply with the prompt again.
fn two_turns(model: &Decoder, tokenizer: &GgufTokenizer, n: usize) -> Vec<Vec<u32>> {
    let first = tokenizer.encode(PROMPT, true).expect("encode");
    let (plain, _) = turns(
        model,
        tokenizer,
        std::slice::from_ref(&first),
        n,
        Speculation::Off,
    );
    let mut second = first.clone();
    second.extend_from_slice(&plain[0]);
    second.extend(tokenizer.encode(PROMPT, false).expect("encode"));
    vec![first, second]
}

#[test]
fn greedy_ids_equal_plain_decoding_on_every_family() {
    let mut accepted = 0;
    for rel in FAMILIES {
        let path = fixtures().join(rel);
        let file = gguf::GgufFile::open(&path).expect("fixture");
        let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
        let model = load_decoder(&path, false);
        let prompts = two_turns(&model, &tokenizer, 24);
        let (plain, _) = turns(&model, &tokenizer, &prompts, 24, Speculation::Off);
        let (spec, stats) = turns(&model, &tokenizer, &prompts, 24, ngram());
        assert_eq!(spec, plain, "{rel}: greedy ids with drafts");
        assert!(
            stats.verify_passes > 0 && stats.drafted > 0,
            "{rel}: no draft ran: {stats:?}"
        );
        // A draft of 1 to 7 tokens: bounded by draft_max and by the room left.
        assert!(stats.drafted <= 7 * stats.verify_passes, "{rel}: {stats:?}");
        accepted += stats.accepted;
        eprintln!("{rel}: {stats:?}");
    }
    assert!(accepted > 0, "no drafted token was ever accepted");
}

/// The shortest draft (1 token) and the longest (63, more than one GEMV pass of rows) give the
/// same ids, as does a budget that ends inside a draft.
#[test]
fn draft_lengths_and_budgets_do_not_change_greedy_ids() {
    let path = fixtures().join("gguf/tiny-qwen3-Q8_0.gguf");
    let file = gguf::GgufFile::open(&path).expect("fixture");
    let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let model = load_decoder(&path, false);
    let prompt = vec![tokenizer.encode(PROMPT, true).expect("encode")];
    for n in [1, 2, 5, 40] {
        let (plain, _) = turns(&model, &tokenizer, &prompt, n, Speculation::Off);
        for draft_max in [1, 3, 63] {
            let spec = Speculation::Ngram(NgramConfig {
                draft_max,
                ..NgramConfig::default()
            });
            let (ids, stats) = turns(&model, &tokenizer, &prompt, n, spec);
            assert_eq!(ids, plain, "n {n}, draft_max {draft_max}: {stats:?}");
            assert!(ids[0].len() <= n);
        }
    }
}

/// The acceptance rule on real logits: drafting the model's second choice and testing it with
/// `verify` draws the first token with the sampler's own probabilities (4,000 draws; each
/// token's frequency within 4.5 standard deviations of its probability).
#[test]
fn sampled_verdicts_keep_the_models_distribution() {
    let path = fixtures().join("gguf/tiny-qwen3-Q8_0.gguf");
    let file = gguf::GgufFile::open(&path).expect("fixture");
    let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let model = load_decoder(&path, false);
    let prompt = tokenizer
        .encode("The quick brown fox", true)
        .expect("encode");
    let logits = |ids: &[u32]| -> Vec<f32> {
        let mut cache = model.new_cache();
        model
            .forward(ids, &mut cache, true)
            .expect("forward")
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32")
    };
    let row0 = logits(&prompt);
    let vocab = row0.len() / prompt.len();
    let row0 = &row0[(prompt.len() - 1) * vocab..];
    // The sampler's distribution at temperature 1 over the whole row.
    let max = row0.iter().copied().fold(f32::MIN, f32::max) as f64;
    let exps: Vec<f64> = row0.iter().map(|&v| (v as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let p: Vec<f64> = exps.iter().map(|e| e / sum).collect();
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let (first, second) = (order[0] as u32, order[1] as u32);
    // Two drafted tokens after the prompt; the verify pass's three rows.
    let mut ids = prompt.clone();
    ids.extend([second, first]);
    let all = logits(&ids);
    let rows = all[(prompt.len() - 1) * vocab..].to_vec();
    let device = burn_gguf::default_device();
    let rows = Tensor::<2>::from_data(TensorData::new(rows, [3, vocab]), &device);
    let n = 4000;
    let mut counts = vec![0usize; vocab];
    for seed in 0..n {
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        });
        let v = verify(rows.clone(), &[second, first], &mut sampler).expect("verify");
        let t = if v.accepted >= 1 { second } else { v.next };
        counts[t as usize] += 1;
    }
    for &id in &order[..4] {
        let got = counts[id] as f64 / n as f64;
        let sd = (p[id] * (1.0 - p[id]) / n as f64).sqrt();
        assert!(
            (got - p[id]).abs() <= 4.5 * sd + 1e-3,
            "token {id}: frequency {got}, probability {}",
            p[id]
        );
    }
}

/// A draft model: the tiny Qwen3 fixture's Q4_0 file drafting for its F16 file (the same
/// tokenizer): greedy ids equal plain decoding's across two turns, with some drafted tokens
/// accepted (a random model's small margins make 4-bit weights move many argmaxes).
#[test]
fn draft_model_greedy_ids_equal_plain_decoding() {
    let target_path = fixtures().join("gguf/tiny-qwen3-f16.gguf");
    let file = gguf::GgufFile::open(&target_path).expect("fixture");
    let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let target = load_decoder(&target_path, false);
    let draft = Arc::new(load_decoder(
        &fixtures().join("gguf/tiny-qwen3-Q4_0.gguf"),
        false,
    ));
    let prompts = two_turns(&target, &tokenizer, 24);
    let (plain, _) = turns(&target, &tokenizer, &prompts, 24, Speculation::Off);
    for draft_max in [1, 4, 7] {
        let spec = Speculation::Draft(DraftModel {
            model: draft.clone(),
            draft_max,
        });
        let (ids, stats) = turns(&target, &tokenizer, &prompts, 24, spec);
        assert_eq!(ids, plain, "draft_max {draft_max}: {stats:?}");
        assert!(
            stats.verify_passes > 0 && stats.accepted > 0,
            "draft_max {draft_max}: no drafted token accepted: {stats:?}"
        );
        eprintln!("draft model, draft_max {draft_max}: {stats:?}");
    }
    let bad = Speculation::Draft(DraftModel {
        model: draft,
        draft_max: 0,
    });
    assert!(Session::new(&target).set_speculation(bad).is_err());
}

/// A draft model must share the target's tokenizer: the tiny fixtures of two architectures do
/// (one tiny BPE), Gemma 3's does not.
#[test]
fn draft_vocabulary_is_checked() {
    let tok = |path: std::path::PathBuf| {
        GgufTokenizer::from_gguf(&gguf::GgufFile::open(path).expect("open")).expect("tokenizer")
    };
    let qwen3 = tok(fixtures().join("gguf/tiny-qwen3-Q8_0.gguf"));
    let llama = tok(fixtures().join("arch/tiny-llama-Q8_0.gguf"));
    let gemma = tok(gemma_path());
    burn_gguf_cli::run::check_same_vocabulary(&qwen3, &llama).expect("same tokenizer");
    let err = burn_gguf_cli::run::check_same_vocabulary(&gemma, &qwen3).unwrap_err();
    assert!(
        err.contains("384 tokens") && err.contains("262144"),
        "{err}"
    );
}

/// Gemma 3 270M: a prompt that the reply copies from, greedy ids with drafts equal to plain.
#[test]
fn gemma_greedy_ids_equal_plain_decoding() {
    let file = gguf::GgufFile::open(gemma_path()).expect("open gemma");
    let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
    let model = load_decoder(&gemma_path(), false);
    let prompt = "Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons.\n\
                  apples, pears, plums,";
    let prompts = vec![tokenizer.encode(prompt, true).expect("encode")];
    let (plain, _) = turns(&model, &tokenizer, &prompts, 16, Speculation::Off);
    let ngram = Speculation::Ngram(NgramConfig::default());
    let (spec, stats) = turns(&model, &tokenizer, &prompts, 16, ngram);
    assert_eq!(spec, plain, "{stats:?}");
    assert!(stats.accepted > 0, "{stats:?}");
    eprintln!("gemma: {:?}: {stats:?}", tokenizer.decode(&plain[0]));
}

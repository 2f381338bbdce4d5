//! The real Gemma 3 270M Q4_K_M file against the float64 reference
//! (`../shared/fixtures/gemma/gemma3_270m_f64ref_*`): greedy ids, teacher-forced top-1 and the
//! full last-prompt logit row.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{Decoder, GgufTokenizer, Sampler, SamplerConfig, generate};
use burn_gguf_tests::{gemma_path, json_ids, read_f32s, read_json};
use std::sync::OnceLock;

struct Fixture {
    model: Decoder,
    tokenizer: GgufTokenizer,
}

/// Loaded once per test binary: the tests share the device and the 253 MB of weights.
fn gemma() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let file = gguf::GgufFile::open(gemma_path()).expect("open gemma");
        let tokenizer = GgufTokenizer::from_gguf(&file).expect("tokenizer");
        let device = burn_gguf::default_device();
        let loader = GgufLoader::new(&file, &device, GgufConfig::default());
        let model = Decoder::load(&loader).expect("load gemma");
        let report = loader.report();
        // Every 2-D weight of this file has a kernel: nothing falls back.
        assert_eq!(report.dequantized().count(), 0, "{report}");
        assert_eq!(report.packed_count(), 127, "{report}");
        Fixture { model, tokenizer }
    })
}

fn greedy(prompt: &str, n: usize) -> (Vec<u32>, Vec<u32>, String) {
    let f = gemma();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    });
    let out = generate(&f.model, &f.tokenizer, prompt, n, &mut sampler, |_| {}).expect("generate");
    (out.prompt_ids, out.generated_ids, out.text)
}

#[test]
fn once_upon_a_time_greedy_matches_f64_reference() {
    let r = read_json("gemma/gemma3_270m_f64ref_once.json");
    let (prompt_ids, ids, text) = greedy("Once upon a time", 16);
    assert_eq!(prompt_ids, json_ids(&r["prompt_ids"]));
    assert_eq!(ids, json_ids(&r["greedy_ids"]));
    assert_eq!(
        text,
        ", there was a little girl named Lily. She was a very smart girl,"
    );
}

#[test]
fn capital_greedy_matches_f64_reference_to_step_24() {
    let r = read_json("gemma/gemma3_270m_f64ref_capital.json");
    let (prompt_ids, ids, _) = greedy("The capital of France is", 32);
    assert_eq!(prompt_ids, json_ids(&r["prompt_ids"]));
    let want = json_ids(&r["greedy_ids"]);
    assert_eq!(ids.len(), 32);
    // Step 25 is a near-tie in the reference (margin 0.0048).
    assert_eq!(ids[..25], want[..25]);
}

/// Teacher-forced over prompt + reference ids: top-1 agrees wherever the reference margin is
/// >= 0.01, and the whole last-prompt row is within 0.02 of the reference.
fn teacher_forced(name: &str) {
    let f = gemma();
    let r = read_json(&format!("gemma/gemma3_270m_f64ref_{name}.json"));
    let prompt = json_ids(&r["prompt_ids"]);
    let greedy_ids = json_ids(&r["greedy_ids"]);
    let margins: Vec<f64> = r["top1_top2_margin_per_row"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut ids = prompt.clone();
    ids.extend_from_slice(&greedy_ids[..greedy_ids.len() - 1]);
    let rows = ids.len();
    assert_eq!(margins.len(), rows);

    let mut cache = burn_gguf_models::SequenceState::new();
    let logits = f.model.forward(&ids, &mut cache, true).expect("forward");
    let [n, vocab] = logits.dims();
    assert_eq!((n, vocab), (rows, 262_144));
    let data = logits.try_into_data().unwrap().try_to_vec::<f32>().unwrap();

    let mut checked = 0;
    for row in 0..rows {
        let want = if row + 1 < prompt.len() {
            continue; // rows before the last prompt token predict prompt tokens, not references
        } else {
            greedy_ids[row + 1 - prompt.len()]
        };
        if margins[row] < 0.01 {
            continue;
        }
        let top = burn_gguf_models::sampling::argmax(&data[row * vocab..(row + 1) * vocab]);
        assert_eq!(
            top, want,
            "{name} row {row} (reference margin {})",
            margins[row]
        );
        checked += 1;
    }
    assert!(checked >= greedy_ids.len() - 2, "{checked} rows checked");

    let reference = read_f32s(&format!(
        "gemma/gemma3_270m_f64ref_{name}.lastprompt_logits.f32"
    ));
    let last = &data[(prompt.len() - 1) * vocab..prompt.len() * vocab];
    let mut worst = (0f32, 0usize);
    for (i, (a, b)) in last.iter().zip(&reference).enumerate() {
        let d = (a - b).abs();
        if d > worst.0 || d.is_nan() {
            worst = (d, i);
        }
    }
    assert!(
        worst.0 <= 0.02,
        "{name}: last prompt row logit {} differs by {}",
        worst.1,
        worst.0
    );
}

#[test]
fn once_teacher_forced_logits() {
    teacher_forced("once");
}

#[test]
fn capital_teacher_forced_logits() {
    teacher_forced("capital");
}

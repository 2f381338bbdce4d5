//! The tiny Qwen3.5 and Qwen3.5-MoE fixtures (`arch/tiny-qwen35*-{F32,Q4_K_M,Q8_0}.gguf`: gated
//! delta-net layers 0-2, a gated attention layer 3) through the shared decoder:
//! teacher-forced logits within 5e-3 of the exact-math reference (`*.numpy.logits.f32`; see
//! `arch/README.md` for why 5e-3) on the packed and the dequantized path, the reference's
//! greedy ids wherever its top-1/top-2 margin is at least 1e-3, and a prompt run in one pass
//! (the recurrent scan over its tokens) equal to the same tokens decoded one at a time.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{BatchState, Decoder, SequenceState};
use burn_gguf_tests::{json_ids, max_abs_diff, read_f32s, read_json, teacher_forced_logits};
use gguf::GgufFile;

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

fn to_vec(t: burn::tensor::Tensor<2>) -> Vec<f32> {
    t.try_into_data().unwrap().try_to_vec::<f32>().unwrap()
}

fn load(path: &std::path::Path, dequantize: bool) -> Decoder {
    let file = GgufFile::open(path).unwrap();
    let device = burn_gguf::default_device();
    let config = GgufConfig {
        dequantize,
        ..GgufConfig::default()
    };
    let loader = GgufLoader::new(&file, &device, config);
    let model = Decoder::load(&loader).unwrap();
    if !dequantize {
        let fell_back: Vec<_> = loader
            .report()
            .dequantized()
            .map(|e| e.name.clone())
            .collect();
        assert!(fell_back.is_empty(), "{path:?}: dequantized {fell_back:?}");
    }
    model
}

/// Checks the three files of `arch/reference_logits_<arch>.json`, packed and dequantized.
fn check_arch(arch: &str) {
    let reference = read_json(&format!("arch/reference_logits_{arch}.json"));
    let mut checked = 0;
    for (name, entry) in reference.as_object().unwrap() {
        let path = burn_gguf_tests::fixtures().join(format!("arch/{name}.gguf"));
        let tokens = json_ids(&entry["teacher_forced_sequence"]);
        let greedy = json_ids(&entry["greedy_ids"]);
        let n_prompt = json_ids(&entry["prompt_ids"]).len();
        let margins: Vec<f64> = entry["per_row_top1_top2_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let want = read_f32s(&format!("arch/{name}.numpy.logits.f32"));
        let vocab = want.len() / tokens.len();
        for dequantize in [false, true] {
            let got = teacher_forced_logits(&load(&path, dequantize), &tokens);
            let worst = max_abs_diff(&got, &want);
            assert!(
                worst <= 5e-3,
                "{name} (dequantize: {dequantize}): max |logit - reference| = {worst}"
            );
            for r in 0..tokens.len() {
                if margins[r] >= 1e-3 {
                    let row = |l: &[f32]| argmax(&l[r * vocab..(r + 1) * vocab]);
                    assert_eq!(row(&got), row(&want), "{name} row {r}");
                }
            }
            // Row n_prompt - 1 + j chose greedy token j.
            for (j, &g) in greedy.iter().enumerate() {
                let r = n_prompt - 1 + j;
                if r < tokens.len() && margins[r] >= 1e-3 {
                    assert_eq!(
                        argmax(&got[r * vocab..(r + 1) * vocab]),
                        g as usize,
                        "{name}"
                    );
                }
            }
            eprintln!("{name} dequantize={dequantize}: max |diff| {worst:.2e}");
            checked += 1;
        }
    }
    assert_eq!(checked, 6, "{arch}: three files, two paths each");
}

#[test]
fn tiny_qwen35_logits_match_the_reference() {
    check_arch("qwen35");
}

#[test]
fn tiny_qwen35moe_logits_match_the_reference() {
    check_arch("qwen35moe");
}

/// One pass over the prompt, then decode steps, equals decoding every token alone; and two
/// sequences batched into one pass equal each alone (the recurrent state is per slot).
#[test]
fn prefill_then_decode_equals_token_by_token() {
    for name in ["tiny-qwen35-Q8_0", "tiny-qwen35moe-Q4_K_M"] {
        let path = burn_gguf_tests::fixtures().join(format!("arch/{name}.gguf"));
        let model = load(&path, false);
        let arch = name.split('-').nth(1).unwrap();
        let reference = read_json(&format!("arch/reference_logits_{arch}.json"));
        let tokens = json_ids(&reference[name]["teacher_forced_sequence"]);
        let all = teacher_forced_logits(&model, &tokens);
        let vocab = all.len() / tokens.len();
        // Token by token.
        let mut state = SequenceState::new();
        let mut stepped = Vec::new();
        for t in &tokens {
            stepped.extend(to_vec(model.forward(&[*t], &mut state, false).unwrap()));
        }
        let d = max_abs_diff(&all, &stepped);
        assert!(d <= 1e-4, "{name}: one pass vs token by token: {d}");
        // A 12-token prefill, then the rest one by one.
        let mut state = SequenceState::new();
        let mut mixed = to_vec(model.forward(&tokens[..12], &mut state, true).unwrap());
        for t in &tokens[12..] {
            mixed.extend(to_vec(model.forward(&[*t], &mut state, false).unwrap()));
        }
        let d = max_abs_diff(&all, &mixed);
        assert!(d <= 1e-4, "{name}: prefill + decode vs one pass: {d}");
        // Two sequences in slots 1 and 0 of one state, a prompt each, then a decode step
        // together.
        let (a, b) = (&tokens[..9], &tokens[5..17]);
        let mut batch = BatchState::new(2);
        let first = to_vec(
            model
                .forward_batch(&mut batch, &[(1, a), (0, b)], false)
                .unwrap(),
        );
        let next = to_vec(
            model
                .forward_batch(
                    &mut batch,
                    &[(0, &tokens[17..18]), (1, &tokens[9..10])],
                    false,
                )
                .unwrap(),
        );
        let alone = |ids: &[u32]| {
            let l = teacher_forced_logits(&model, ids);
            l[l.len() - vocab..].to_vec()
        };
        let pairs = [
            (&first[..vocab], alone(a)),
            (&first[vocab..], alone(b)),
            (&next[..vocab], alone(&tokens[5..18])),
            (&next[vocab..], alone(&tokens[..10])),
        ];
        for (i, (got, want)) in pairs.iter().enumerate() {
            let d = max_abs_diff(got, want);
            assert!(d <= 1e-4, "{name}: batched row {i} vs alone: {d}");
        }
        // A slot reused for a new sequence after truncate(0) starts from a zero state.
        batch.truncate(1, 0);
        let again = to_vec(model.forward_batch(&mut batch, &[(1, b)], false).unwrap());
        let d = max_abs_diff(&again, &alone(b));
        assert!(d <= 1e-4, "{name}: reused slot vs alone: {d}");
    }
}

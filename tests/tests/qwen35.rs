//! The tiny Qwen3.5 and Qwen3.5-MoE fixtures (`arch/tiny-qwen35*-{F32,Q4_K_M,Q8_0}.gguf`: gated
//! delta-net layers 0-2, a gated attention layer 3) through the shared decoder:
//! teacher-forced logits within 5e-3 of the exact-math reference (`*.numpy.logits.f32`; see
//! `arch/README.md` for why 5e-3) on the packed and the dequantized path, the reference's
//! greedy ids wherever its top-1/top-2 margin is at least 1e-3, and a prompt run in one pass
//! (the recurrent scan over its tokens) equal to the same tokens decoded one at a time.
use burn_gguf_models::{BatchState, Decoder, SequenceState};
use burn_gguf_tests::{
    check_arch_fixtures, json_ids, load_decoder, max_abs_diff, read_json, teacher_forced_logits,
};

fn to_vec(t: burn::tensor::Tensor<2>) -> Vec<f32> {
    t.try_into_data().unwrap().try_to_vec::<f32>().unwrap()
}

fn load(path: &std::path::Path, dequantize: bool) -> Decoder {
    load_decoder(path, dequantize)
}

#[test]
fn tiny_qwen35_logits_match_the_reference() {
    check_arch_fixtures("qwen35", 5e-3);
}

#[test]
fn tiny_qwen35moe_logits_match_the_reference() {
    check_arch_fixtures("qwen35moe", 5e-3);
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

//! The tiny `llama` (Llama 3.x with `rope_freqs`), `qwen2`, `phi3` and `gemma2` fixtures
//! (`arch/tiny-<arch>-{F32,Q4_K_M,Q8_0}.gguf`, `arch/README.md`) through the shared decoder:
//! teacher-forced logits within 1e-3 of the exact-math reference (`*.numpy.logits.f32`),
//! packed (no tensor dequantized) and dequantized, the reference's argmax and greedy ids
//! wherever its top-1/top-2 margin is at least 1e-3; the parts each architecture adds shown to
//! matter; a prompt in one pass equal to the same tokens decoded one at a time.
use burn_gguf_models::SequenceState;
use burn_gguf_tests::{
    check_arch_fixtures, copy_gguf_without, fixtures, json_ids, load_decoder, max_abs_diff,
    read_f32s, read_json, teacher_forced_logits,
};

#[test]
fn tiny_llama_logits_match_the_reference() {
    check_arch_fixtures("llama", 1e-3);
}

#[test]
fn tiny_qwen2_logits_match_the_reference() {
    check_arch_fixtures("qwen2", 1e-3);
}

#[test]
fn tiny_phi3_logits_match_the_reference() {
    check_arch_fixtures("phi3", 1e-3);
}

#[test]
fn tiny_gemma2_logits_match_the_reference() {
    check_arch_fixtures("gemma2", 1e-3);
}

/// The fixture's prompt and greedy continuation, and its exact-math logits.
fn reference(name: &str) -> (Vec<u32>, Vec<f32>) {
    let arch = name.split('-').nth(1).expect("tiny-<arch>-<type>");
    let entry = &read_json(&format!("arch/reference_logits_{arch}.json"))[name];
    let tokens = json_ids(&entry["teacher_forced_sequence"]);
    (tokens, read_f32s(&format!("arch/{name}.numpy.logits.f32")))
}

/// The Llama fixture's `rope_freqs.weight` (Llama 3.1 scaling, factors 1 to 8) is what meets
/// the reference: the same file without it is far off (`arch/README.md`: 7.1).
#[test]
fn llama_rope_freqs_change_the_logits() {
    let name = "tiny-llama-F32";
    let (tokens, want) = reference(name);
    let src = fixtures().join(format!("arch/{name}.gguf"));
    let dir = tempfile::tempdir().unwrap();
    let without = dir.path().join("no-rope-freqs.gguf");
    copy_gguf_without(&src, &without, &["rope_freqs.weight"]);
    let with = max_abs_diff(
        &teacher_forced_logits(&load_decoder(&src, false), &tokens),
        &want,
    );
    let plain = load_decoder(&without, false);
    let off = max_abs_diff(&teacher_forced_logits(&plain, &tokens), &want);
    eprintln!("{name}: with rope_freqs {with:.2e}, without {off:.2}");
    assert!(with <= 1e-3, "with rope_freqs: {with}");
    assert!(off > 1.0, "without rope_freqs: {off}");
}

/// Qwen2's Q/K/V biases matter: without them the logits are far off (`arch/README.md`: 71.6).
#[test]
fn qwen2_biases_change_the_logits() {
    let name = "tiny-qwen2-Q8_0";
    let (tokens, want) = reference(name);
    let src = fixtures().join(format!("arch/{name}.gguf"));
    let dir = tempfile::tempdir().unwrap();
    let without = dir.path().join("no-bias.gguf");
    let biases: Vec<String> = (0..2)
        .flat_map(|il| ["q", "k", "v"].map(|p| format!("blk.{il}.attn_{p}.bias")))
        .collect();
    let names: Vec<&str> = biases.iter().map(String::as_str).collect();
    copy_gguf_without(&src, &without, &names);
    let off = max_abs_diff(
        &teacher_forced_logits(&load_decoder(&without, false), &tokens),
        &want,
    );
    eprintln!("{name}: without the biases {off:.2}");
    assert!(off > 1.0, "without biases: {off}");
}

/// A 9-token prompt in one pass, then one token at a time, equals the whole sequence in one
/// pass (Gemma 2's window of 8 is crossed on both paths; Phi-3's fused projections).
#[test]
fn prefill_then_decode_equals_one_pass() {
    for name in ["tiny-gemma2-Q8_0", "tiny-phi3-Q4_K_M", "tiny-qwen2-Q8_0"] {
        let (tokens, want) = reference(name);
        let model = load_decoder(&fixtures().join(format!("arch/{name}.gguf")), false);
        let all = teacher_forced_logits(&model, &tokens);
        let mut state = SequenceState::new();
        let to_vec = |t: burn::tensor::Tensor<2>| t.try_into_data().unwrap().try_to_vec::<f32>();
        let mut stepped = to_vec(model.forward(&tokens[..9], &mut state, true).unwrap()).unwrap();
        for t in &tokens[9..] {
            stepped.extend(to_vec(model.forward(&[*t], &mut state, false).unwrap()).unwrap());
        }
        let d = max_abs_diff(&all, &stepped);
        assert!(d <= 1e-4, "{name}: prefill + decode vs one pass: {d}");
        assert!(max_abs_diff(&stepped, &want) <= 1e-3, "{name}");
    }
}

/// A minimal `arch` file's metadata (one layer, no tensor but `token_embd`) plus `extra` keys,
/// read as a [`DecoderConfig`].
fn config_with(
    arch: &str,
    extra: Vec<(&str, gguf::MetadataValue)>,
) -> Result<burn_gguf_models::DecoderConfig, burn_gguf_models::Error> {
    use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    for (k, val) in [
        ("context_length", 64u32),
        ("embedding_length", 8),
        ("block_count", 46),
        ("feed_forward_length", 16),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 1),
    ] {
        w.add_metadata(format!("{arch}.{k}"), MetadataValue::U32(val));
    }
    w.add_metadata(
        format!("{arch}.attention.layer_norm_rms_epsilon"),
        MetadataValue::F32(1e-6),
    );
    for (k, v) in extra {
        w.add_metadata(format!("{arch}.{k}"), v);
    }
    w.add_tensor("token_embd.weight", GgmlType::F32, &[8, 4], &[0u8; 128])
        .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    burn_gguf_models::DecoderConfig::from_gguf(&file)
}

/// The keys llama.cpp reads for these architectures, their defaults, and errors that name
/// the key.
#[test]
fn architecture_keys_and_defaults() {
    use burn_gguf_models::RopeStyle;
    use gguf::MetadataValue::{F32, String as S, U32};
    // Gemma 2: llama.cpp's defaults (soft-caps 50 and 30, a 4096 window on the even layers,
    // the local base equal to the global one), and the 46-layer model's attention scale.
    let keys = vec![
        ("rope.freq_base", F32(2e4)),
        ("attention.key_length", U32(16)),
    ];
    let c = config_with("gemma2", keys).unwrap();
    assert_eq!(c.attention_softcap, Some(50.0));
    assert_eq!(c.final_softcap, Some(30.0));
    let w = c.sliding_window.as_ref().unwrap();
    assert_eq!((w.window, w.pattern, w.rope_base), (4096, 2, 2e4));
    assert!(c.is_local(0) && !c.is_local(1) && c.is_local(2));
    assert_eq!(c.head_dim, 16);
    assert_eq!(
        c.attention_scale,
        1.0 / 2.0,
        "1 / sqrt(n_embd / n_head), not 1/4"
    );
    assert!(c.tied_head && c.post_norms && !c.qk_norm);
    assert_eq!(c.embed_scale, Some(8f64.sqrt()));
    let e = config_with("gemma2", vec![("attn_logit_softcapping", F32(-1.0))]).unwrap_err();
    assert!(
        e.to_string().contains("gemma2.attn_logit_softcapping"),
        "{e}"
    );
    // Qwen2 and Phi-3: NEOX pairs, no Q/K norm, base 1e4 by default.
    for arch in ["qwen2", "phi3"] {
        let c = config_with(arch, vec![]).unwrap();
        assert_eq!(c.rope_style, RopeStyle::Neox, "{arch}");
        assert!(!c.qk_norm && c.attention_softcap.is_none(), "{arch}");
        assert_eq!(c.rope_base, 1e4, "{arch}");
        assert!(
            c.sliding_window.is_none(),
            "{arch}: llama.cpp ignores phi3's window"
        );
    }
    // Linear RoPE scaling, from either key; YaRN refused by name.
    let scale = |extra| config_with("llama", extra).map(|c| c.rope_linear_scale);
    assert_eq!(scale(vec![]).unwrap(), 1.0);
    let linear = vec![
        ("rope.scaling.type", S("linear".into())),
        ("rope.scaling.factor", F32(4.0)),
    ];
    assert_eq!(scale(linear).unwrap(), 4.0);
    assert_eq!(scale(vec![("rope.scale_linear", F32(2.0))]).unwrap(), 2.0);
    let e = scale(vec![("rope.scaling.type", S("yarn".into()))]).unwrap_err();
    assert!(e.to_string().contains("llama.rope.scaling.type"), "{e}");
    let e = scale(vec![("rope.scaling.factor", F32(-2.0))]).unwrap_err();
    assert!(e.to_string().contains("llama.rope.scaling.factor"), "{e}");
    let e = scale(vec![("rope.scaling.type", U32(1))]).unwrap_err();
    assert!(e.to_string().contains("expected STRING"), "{e}");
}

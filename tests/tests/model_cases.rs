//! Model-assembly cases of `../shared/cases/CASES.md` on hand-built GGUF files: C14 (tied
//! embeddings), C18 (Qwen3 Q/K norms on the cached decode path) and C20 (merged gate/up experts).
use burn::tensor::{Int, Tensor, TensorData};
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{CausalLm, Decoder};
use burn_gguf_tests::rand_vec;
use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Adds an F32 tensor of Burn shape `shape` (ggml `ne` reversed).
fn add(w: &mut GgufWriter, name: &str, shape: &[usize], values: &[f32]) {
    assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
    let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    w.add_tensor(name, GgmlType::F32, &ne, &f32_bytes(values))
        .unwrap();
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.try_into_data().unwrap().try_to_vec::<f32>().unwrap()
}

/// C14: without `output.weight` the head is `token_embd`; with one, the head is that tensor.
#[test]
fn c14_tied_embeddings() {
    // token_embd ne = [4, 8]: row t is one-hot at t % 4, scaled by t + 1.
    let mut embd = vec![0f32; 8 * 4];
    for t in 0..8 {
        embd[t * 4 + t % 4] = (t + 1) as f32;
    }
    let device = burn_gguf::default_device();
    let h = Tensor::<2>::from_data(TensorData::new(vec![1f32, 0., 0., 0.], [1, 4]), &device);
    for with_output in [false, true] {
        let mut w = GgufWriter::new();
        add(&mut w, "token_embd.weight", &[8, 4], &embd);
        if with_output {
            add(&mut w, "output.weight", &[8, 4], &[7.0; 32]);
        }
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let loader = GgufLoader::new(&file, &device, GgufConfig::default());
        let embed = loader.embedding("token_embd.weight").unwrap();
        let head = match file.tensor("output.weight") {
            Some(_) => loader.linear("output.weight").unwrap(),
            None => embed.as_linear(),
        };
        let logits = to_vec(head.forward(h.clone()));
        let want: Vec<f32> = if with_output {
            vec![7.0; 8]
        } else {
            vec![1., 0., 0., 0., 5., 0., 0., 0.]
        };
        assert_eq!(logits, want, "output.weight present: {with_output}");
        // Tied: one tensor loaded, the head shares the embedding's weight.
        assert_eq!(loader.report().entries.len(), 1 + usize::from(with_output));
    }
}

/// A one-layer Qwen3 GGUF (n_embd 4, one head of 4, n_ff 8, vocab 8) with random weights and
/// the given K norm weight.
fn tiny_qwen3(k_norm: f32) -> GgufFile {
    let (e, f, v) = (4usize, 8usize, 8usize);
    let mut w = GgufWriter::new();
    let s = |x: &str| MetadataValue::String(x.into());
    w.add_metadata("general.architecture", s("qwen3"));
    for (k, val) in [
        ("context_length", 64u32),
        ("embedding_length", e as u32),
        ("block_count", 1),
        ("feed_forward_length", f as u32),
        ("attention.head_count", 1),
        ("attention.head_count_kv", 1),
        ("attention.key_length", 4),
        ("attention.value_length", 4),
    ] {
        w.add_metadata(format!("qwen3.{k}"), MetadataValue::U32(val));
    }
    w.add_metadata("qwen3.rope.freq_base", MetadataValue::F32(10_000.0));
    w.add_metadata(
        "qwen3.attention.layer_norm_rms_epsilon",
        MetadataValue::F32(1e-6),
    );
    let r =
        |n: usize, seed: u64| -> Vec<f32> { rand_vec(n, seed).iter().map(|x| x * 0.5).collect() };
    add(&mut w, "token_embd.weight", &[v, e], &r(v * e, 1));
    add(&mut w, "output_norm.weight", &[e], &[1.0; 4]);
    add(&mut w, "blk.0.attn_norm.weight", &[e], &[1.0; 4]);
    add(&mut w, "blk.0.ffn_norm.weight", &[e], &[1.0; 4]);
    add(&mut w, "blk.0.attn_q_norm.weight", &[4], &[1.0; 4]);
    add(&mut w, "blk.0.attn_k_norm.weight", &[4], &[k_norm; 4]);
    for (i, name) in ["attn_q", "attn_k", "attn_v", "attn_output"]
        .iter()
        .enumerate()
    {
        add(
            &mut w,
            &format!("blk.0.{name}.weight"),
            &[4, e],
            &r(16, 10 + i as u64),
        );
    }
    add(&mut w, "blk.0.ffn_gate.weight", &[f, e], &r(f * e, 20));
    add(&mut w, "blk.0.ffn_up.weight", &[f, e], &r(f * e, 21));
    add(&mut w, "blk.0.ffn_down.weight", &[e, f], &r(f * e, 22));
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// Logits of token 2 after tokens `[3, 5]`: `(full 2-token forward, prefill 1 + cached decode 1)`.
fn second_token_logits(file: &GgufFile) -> (Vec<f32>, Vec<f32>) {
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(file, &device, GgufConfig::default());
    let model = Decoder::load(&loader).unwrap();
    let mut cache = model.new_cache();
    let full = to_vec(model.forward(&[3, 5], &mut cache, false).unwrap());
    let mut cache = model.new_cache();
    model.forward(&[3], &mut cache, false).unwrap();
    let cached = to_vec(model.forward(&[5], &mut cache, false).unwrap());
    (full, cached)
}

/// C18: the per-head K norm applies on the cached decode path as in the full forward, and it is
/// live (a different K norm weight changes the second token's logits).
#[test]
fn c18_qk_norm_on_the_cached_path() {
    let (full, cached) = second_token_logits(&tiny_qwen3(2.0));
    for (a, b) in full.iter().zip(&cached) {
        assert!((a - b).abs() <= 1e-4, "full {full:?}\ncached {cached:?}");
    }
    let (plain, _) = second_token_logits(&tiny_qwen3(1.0));
    let diff = full
        .iter()
        .zip(&plain)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-3, "the K norm weight has no effect: {diff}");
}

/// C20: a merged `ffn_gate_up_exps` holds the gate in each expert's first `n_ff` rows; separate
/// gate and up banks with the same numbers give the same output.
#[test]
fn c20_merged_gate_up_experts() {
    // n_embd 2, n_ff 1, 2 experts. Expert 0: gate [1, 0], up [0, 1]; expert 1: zeros.
    let gate_up = [1f32, 0., 0., 1., 0., 0., 0., 0.]; // [2 experts, 2 rows, 2 cols]
    let down = [1f32, 0., 0., 0.]; // [2 experts, 2 rows, 1 col]
    let mut merged = GgufWriter::new();
    add(&mut merged, "gate_up", &[2, 2, 2], &gate_up);
    add(&mut merged, "down", &[2, 2, 1], &down);
    let mut separate = GgufWriter::new();
    add(&mut separate, "gate", &[2, 1, 2], &[1., 0., 0., 0.]);
    add(&mut separate, "up", &[2, 1, 2], &[0., 1., 0., 0.]);
    add(&mut separate, "down", &[2, 2, 1], &down);
    let device = burn_gguf::default_device();
    let x = Tensor::<2>::from_data(TensorData::new(vec![2f32, 3.], [1, 2]), &device);
    let want = [5.284_782_5f32, 0.0]; // silu(2) * 3, not silu(3) * 2 = 5.7154448
    for (label, w) in [("merged", merged), ("separate", separate)] {
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let loader = GgufLoader::new(&file, &device, GgufConfig::default());
        let experts = match label {
            "merged" => loader.experts_merged("gate_up", "down").unwrap(),
            _ => loader.experts("gate", "up", "down").unwrap(),
        };
        assert_eq!(experts.n_expert(), 2);
        let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![0i64], [1, 1]), &device);
        let weights = Tensor::<2>::from_data(TensorData::new(vec![1f32], [1, 1]), &device);
        let y = to_vec(experts.forward(x.clone(), ids, weights).unwrap());
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5, "{label}: {y:?}");
        }
    }
}

/// C16: NEOX RoPE (qwen3, qwen3moe, gemma3) rotates element `i` with `i + d/2`, NORM (llama)
/// adjacent pairs: one head of 4, base 10 000, `q = [1, 0, 0, 0]` at positions 0 and 1.
#[test]
fn c16_rope_pairing_per_architecture() {
    use burn_gguf::{RopeTable, rope};
    use burn_gguf_models::RopeStyle;
    let device = burn_gguf::default_device();
    let q = Tensor::<3>::from_data(
        TensorData::new(vec![1f32, 0., 0., 0., 1., 0., 0., 0.], [2, 1, 4]),
        &device,
    );
    for (style, want) in [
        (RopeStyle::Neox, [0.540_302_3f32, 0.0, 0.841_471, 0.0]),
        (RopeStyle::Norm, [0.540_302_3f32, 0.841_471, 0.0, 0.0]),
    ] {
        let table = RopeTable::new(2, 4, 10_000.0, None, &device);
        let got = to_vec(rope(q.clone(), &table.cos, &table.sin, style));
        assert_eq!(&got[..4], &[1.0, 0.0, 0.0, 0.0], "{style:?} position 0");
        for (a, b) in got[4..].iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6, "{style:?} position 1: {got:?}");
        }
    }
    // The architecture picks the style.
    for (arch, style) in [("qwen3", RopeStyle::Neox), ("llama", RopeStyle::Norm)] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", MetadataValue::String(arch.into()));
        for (k, val) in [
            ("context_length", 64u32),
            ("embedding_length", 4),
            ("block_count", 1),
            ("feed_forward_length", 8),
            ("attention.head_count", 1),
            ("attention.head_count_kv", 1),
        ] {
            w.add_metadata(format!("{arch}.{k}"), MetadataValue::U32(val));
        }
        w.add_metadata(
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            MetadataValue::F32(1e-6),
        );
        add(&mut w, "token_embd.weight", &[8, 4], &[0.0; 32]);
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let config = burn_gguf_models::DecoderConfig::from_gguf(&file).unwrap();
        assert_eq!(config.rope_style, style, "{arch}");
    }
}

/// C21: activations and the residual stream are f32, so Gemma-sized values do not overflow:
/// `60000 + 10000` and its negative, RMS-normalised with weight 1, give `[1, -1]`.
#[test]
fn c21_residual_and_norm_in_f32() {
    let device = burn_gguf::default_device();
    let t = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [1, 2]), &device);
    let x = t(vec![60000.0, -60000.0]) + t(vec![10000.0, -10000.0]);
    let w = Tensor::<1>::from_data(TensorData::new(vec![1f32, 1.0], [2]), &device);
    let y = to_vec(burn_gguf_models::rms_norm(x, &w, 1e-6));
    assert_eq!(y.len(), 2);
    assert!(
        (y[0] - 1.0).abs() <= 1e-6 && (y[1] + 1.0).abs() <= 1e-6,
        "{y:?}"
    );
}

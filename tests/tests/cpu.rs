//! The CPU backend (burn-flex): no kernels, so the loader dequantizes every weight, says why,
//! and the model gives the same logits (tiny Qwen3 and Qwen3-MoE against the float64
//! reference, within 1e-3; Qwen3.5 and Qwen3.5-MoE, whose delta-net layers run as Burn ops
//! here, within 5e-3 as `arch/README.md` sets; Qwen2's biases, Gemma 2's soft-caps and
//! Phi-3's fused projections within 1e-3).
use burn::tensor::Device;
use burn_gguf::{GgufConfig, GgufLoader, LoadKind};
use burn_gguf_models::Decoder;
use burn_gguf_tests::{
    fixtures, json_ids, max_abs_diff, read_f32s, read_json, teacher_forced_logits,
};
use gguf::GgufFile;

#[test]
fn tiny_models_run_dequantized_on_the_cpu_backend() {
    let device = Device::flex();
    for (dir, arch, name, tol) in [
        ("logits", "qwen3", "tiny-qwen3-Q4_K_M", 1e-3),
        ("logits", "qwen3moe", "tiny-qwen3moe-IQ4_XS", 1e-3),
        ("arch", "qwen35", "tiny-qwen35-Q4_K_M", 5e-3),
        ("arch", "qwen35moe", "tiny-qwen35moe-Q8_0", 5e-3),
        ("arch", "qwen2", "tiny-qwen2-Q4_K_M", 1e-3),
        ("arch", "gemma2", "tiny-gemma2-Q8_0", 1e-3),
        ("arch", "phi3", "tiny-phi3-Q8_0", 1e-3),
    ] {
        let entry = &read_json(&format!("{dir}/reference_logits_{arch}.json"))[name];
        let gguf_dir = if dir == "arch" { "arch" } else { "gguf" };
        let file = GgufFile::open(fixtures().join(format!("{gguf_dir}/{name}.gguf"))).unwrap();
        let loader = GgufLoader::new(&file, &device, GgufConfig::default());
        let model = Decoder::load(&loader).unwrap();
        let report = loader.report();
        assert_eq!(report.packed_count(), 0, "{name}: {report}");
        // Weights dequantized for the stated reason; norms, the MoE router and the delta net's
        // small tensors (convolution, decay, dt bias) dense as always.
        for e in &report.entries {
            match &e.kind {
                LoadKind::Dequantized(why) => assert!(why.contains("not a CubeCL device"), "{why}"),
                LoadKind::Dense => assert!(
                    ["norm", "gate_inp", "ssm_conv1d", "ssm_a", "ssm_dt", ".bias"]
                        .iter()
                        .any(|s| e.name.contains(s)),
                    "{} dense",
                    e.name
                ),
                LoadKind::Packed => panic!("{} packed on the CPU backend", e.name),
            }
        }
        assert!(report.dequantized().count() >= 8, "{report}");
        assert!(burn_gguf::max_buffer_bytes(&device).is_none());

        let tokens = json_ids(&entry["teacher_forced_sequence"]);
        let want = read_f32s(&format!("{dir}/{name}.numpy.logits.f32"));
        let worst = max_abs_diff(&teacher_forced_logits(&model, &tokens), &want);
        assert!(worst <= tol, "{name}: max |logit - reference| = {worst}");
    }
}

/// `GgufConfig::dtype` stores dequantized weights in f16: half the bytes, logits still close to
/// the float64 reference (weights rounded to f16, products accumulated by the backend).
#[test]
fn dequantized_weights_in_f16() {
    use burn::tensor::FloatDType;
    let device = Device::flex();
    let name = "tiny-qwen3-Q8_0";
    let entry = &read_json("logits/reference_logits_qwen3.json")[name];
    let file = GgufFile::open(fixtures().join(format!("gguf/{name}.gguf"))).unwrap();
    let config = GgufConfig {
        dtype: FloatDType::F16,
        ..GgufConfig::default()
    };
    let loader = GgufLoader::new(&file, &device, config);
    let model = Decoder::load(&loader).unwrap();
    let tokens = json_ids(&entry["teacher_forced_sequence"]);
    let want = read_f32s(&format!("logits/{name}.numpy.logits.f32"));
    let worst = max_abs_diff(&teacher_forced_logits(&model, &tokens), &want);
    assert!(
        worst <= 0.25,
        "{name} in f16: max |logit - reference| = {worst}"
    );
    assert!(worst > 0.0);
}

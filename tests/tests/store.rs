//! `GgufStore`: a user-defined Burn module (plain `nn::Linear` and `nn::RmsNorm` fields) loads
//! GGUF weights through `burn-store`, with key remapping and the PyTorch-to-Burn adapter; the
//! values equal `ggml-codec`'s dequantization of the file's blocks; `ApplyResult` names a
//! missing parameter and the unused tensors; a shape that does not fit is an error naming it.
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::store::{ModuleSnapshot, PyTorchToBurnAdapter};
use burn::tensor::Device;
use burn_gguf::GgufStore;
use burn_gguf_tests::{fixtures, json_ids, max_abs_diff, read_f32s, read_json};
use gguf::GgufFile;

/// The `custom_model` example's Qwen3, written with Burn's modules and loaded with `GgufStore`.
#[path = "../../crates/burn-gguf/examples/custom_model.rs"]
mod custom_model;

/// The example's model gives the float64 reference's logits on the tiny Qwen3 fixtures
/// (teacher-forced, every row) within 1e-3, with `nn::Linear` (dequantized) and with packed
/// `GgmlLinear` projections, on the CPU backend and on wgpu.
#[test]
fn the_custom_model_example_matches_the_reference_logits() {
    for device in [Device::flex(), burn_gguf::default_device()] {
        for name in ["tiny-qwen3-Q8_0", "tiny-qwen3-Q4_K_M", "tiny-qwen3-IQ4_XS"] {
            let entry = &read_json("logits/reference_logits_qwen3.json")[name];
            let tokens = json_ids(&entry["teacher_forced_sequence"]);
            let want = read_f32s(&format!("logits/{name}.numpy.logits.f32"));
            let path = fixtures().join(format!("gguf/{name}.gguf"));
            let path = path.to_str().unwrap();
            let (c, plain) = custom_model::load(path, &device).unwrap();
            let (_, packed) = custom_model::load_packed(path, &device).unwrap();
            for (kind, logits) in [
                ("nn::Linear", plain.forward(&c, &tokens)),
                ("GgmlLinear", packed.forward(&c, &tokens)),
            ] {
                let got = logits.into_data().try_to_vec::<f32>().unwrap();
                let worst = max_abs_diff(&got, &want);
                assert!(
                    worst <= 1e-3,
                    "{name} {kind} on {device:?}: max |logit - reference| = {worst}"
                );
            }
        }
    }
}

/// The first layer's attention inputs of the tiny Qwen3 fixture, and one field the file lacks.
#[derive(Module, Debug)]
struct FirstLayer {
    norm: RmsNorm,
    q: Linear,
    k: Linear,
    extra: Linear,
}

fn first_layer(device: &Device, q_out: usize) -> FirstLayer {
    let linear = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
    FirstLayer {
        norm: RmsNormConfig::new(256).init(device),
        q: linear(256, q_out),
        k: linear(256, 128),
        extra: linear(4, 4),
    }
}

fn store(path: &std::path::Path) -> GgufStore {
    GgufStore::from_file(path)
        .with_key_remapping(r"^blk\.0\.attn_norm\.", "norm.")
        .with_key_remapping(r"^blk\.0\.attn_q\.", "q.")
        .with_key_remapping(r"^blk\.0\.attn_k\.", "k.")
        .with_from_adapter(PyTorchToBurnAdapter)
}

/// `name` of the fixture dequantized by the codec, `[rows, cols]` row-major.
fn codec_values(file: &GgufFile, name: &str) -> (Vec<f32>, Vec<usize>) {
    let info = file.tensor(name).unwrap();
    let n = info.n_elements() as usize;
    let values = ggml_codec::dequantize_to_vec(info.ggml_type, file.tensor_data(info), n).unwrap();
    (values, info.shape())
}

#[test]
fn a_burn_module_loads_gguf_weights_through_burn_store() {
    let device = Device::flex();
    for name in ["tiny-qwen3-Q8_0", "tiny-qwen3-Q4_K_M"] {
        let path = fixtures().join(format!("gguf/{name}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let mut model = first_layer(&device, 256);
        let result = model
            .load_from(&mut store(&path).allow_partial(true))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The missing field and the file's other tensors are named.
        assert!(
            result
                .missing
                .iter()
                .any(|(p, _)| p.contains("extra.weight")),
            "{name}: {result}"
        );
        assert!(
            result.unused.iter().any(|t| t == "output.weight"),
            "{name}: {result}"
        );
        assert!(result.errors.is_empty(), "{name}: {result}");
        // Values: the codec's, with Linear weights transposed to Burn's [in, out].
        for (field, tensor) in [
            (&model.q, "blk.0.attn_q.weight"),
            (&model.k, "blk.0.attn_k.weight"),
        ] {
            let (want, shape) = codec_values(&file, tensor);
            let (rows, cols) = (shape[0], shape[1]);
            let got = field.weight.val().into_data().try_to_vec::<f32>().unwrap();
            assert_eq!(field.weight.val().dims(), [cols, rows], "{name} {tensor}");
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        got[c * rows + r].to_bits(),
                        want[r * cols + c].to_bits(),
                        "{name} {tensor} [{r}, {c}]"
                    );
                }
            }
        }
        let (gamma, _) = codec_values(&file, "blk.0.attn_norm.weight");
        let got = model
            .norm
            .gamma
            .val()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(got, gamma, "{name}: attn_norm");
        // Without allow_partial the missing field is an error naming it.
        let mut again = first_layer(&device, 256);
        let e = again.load_from(&mut store(&path)).unwrap_err().to_string();
        assert!(e.contains("extra.weight"), "{e}");
    }
}

#[test]
fn a_shape_that_does_not_fit_names_the_tensor() {
    let device = Device::flex();
    let path = fixtures().join("gguf/tiny-qwen3-Q8_0.gguf");
    let mut model = first_layer(&device, 100);
    let e = model
        .load_from(&mut store(&path).allow_partial(true))
        .unwrap_err()
        .to_string();
    assert!(e.contains("q.weight"), "{e}");
}

#[test]
fn the_store_lists_the_files_tensors_and_metadata() {
    use burn::store::ModuleStore;
    let path = fixtures().join("gguf/tiny-qwen3-Q8_0.gguf");
    let mut s = GgufStore::from_file(&path);
    let keys = s.keys().unwrap();
    assert_eq!(keys.len(), 25);
    let t = s.get_tensor("output.weight").unwrap().unwrap();
    assert_eq!(t.shape.as_slice(), &[384, 256]);
    let arch = s
        .file()
        .unwrap()
        .get("general.architecture")
        .and_then(|v| v.as_str().map(String::from));
    assert_eq!(arch.as_deref(), Some("qwen3"));
    let missing = GgufStore::from_file("/nonexistent.gguf")
        .keys()
        .unwrap_err()
        .to_string();
    assert!(missing.contains("/nonexistent.gguf"), "{missing}");
}

//! The tiny Qwen3 (F16 and 21 quant mixes) and Qwen3-MoE (F16 and 12 mixes) fixtures through the
//! shared decoder: teacher-forced logits over the fixture's 23 tokens within 1e-3 of the exact
//! float64 reference (`logits/*.numpy.logits.f32`, weights dequantized by gguf-py), on the packed
//! path and on the dequantized path, and the reference's greedy ids. MoE rows whose recorded
//! router gap (2nd vs 3rd expert probability) is under 1e-4 in some layer are skipped.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::Decoder;
use burn_gguf_tests::{json_ids, read_f32s, read_json, teacher_forced_logits};
use gguf::GgufFile;

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// Checks every model of `logits/reference_logits_<arch>.json`; returns how many were checked.
fn check_arch(arch: &str) -> usize {
    let reference = read_json(&format!("logits/reference_logits_{arch}.json"));
    let device = burn_gguf::default_device();
    let mut checked = 0;
    for (name, entry) in reference.as_object().unwrap() {
        let path = burn_gguf_tests::fixtures().join(format!("gguf/{name}.gguf"));
        if !path.exists() {
            // The `*-f32` entries describe models that are not stored.
            assert!(name.ends_with("-f32"), "{name}: fixture missing");
            continue;
        }
        let file = GgufFile::open(&path).unwrap();
        let tokens = json_ids(&entry["teacher_forced_sequence"]);
        let greedy = json_ids(&entry["greedy_ids"]);
        let n_prompt = json_ids(&entry["prompt_ids"]).len();
        let want = read_f32s(&format!("logits/{name}.numpy.logits.f32"));
        let vocab = want.len() / tokens.len();
        // Rows where the float64 reference's routing is too close to call.
        let skip: Vec<bool> = (0..tokens.len())
            .map(|r| {
                entry["router_topk_gap_per_layer_per_row_numpy"]
                    .as_array()
                    .is_some_and(|layers| {
                        layers
                            .iter()
                            .any(|l| l[r].as_f64().is_some_and(|g| g < 1e-4))
                    })
            })
            .collect();
        for dequantize in [false, true] {
            let loader = GgufLoader::new(
                &file,
                &device,
                GgufConfig {
                    dequantize,
                    ..GgufConfig::default()
                },
            );
            let model = Decoder::load(&loader).unwrap();
            if !dequantize {
                assert_eq!(loader.report().dequantized().count(), 0, "{name}");
            }
            let got = teacher_forced_logits(&model, &tokens);
            assert_eq!(got.len(), want.len(), "{name}");
            let worst = (0..tokens.len())
                .filter(|&r| !skip[r])
                .flat_map(|r| r * vocab..(r + 1) * vocab)
                .map(|i| (got[i] - want[i]).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-3,
                "{name} (dequantize: {dequantize}): max |logit - reference| = {worst}"
            );
            // Greedy: row n_prompt - 1 + j chooses token j.
            for (j, &g) in greedy.iter().enumerate() {
                let r = n_prompt - 1 + j;
                if r >= tokens.len() {
                    break;
                }
                if skip[r] {
                    continue;
                }
                let ours = argmax(&got[r * vocab..(r + 1) * vocab]);
                let exact = argmax(&want[r * vocab..(r + 1) * vocab]);
                assert_eq!(ours, exact, "{name} row {r}");
                if exact == g as usize {
                    assert_eq!(ours, g as usize, "{name} greedy step {j}");
                }
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn tiny_qwen3_logits_match_the_float64_reference() {
    assert_eq!(check_arch("qwen3"), 2 * 22);
}

#[test]
fn tiny_qwen3moe_logits_match_the_float64_reference() {
    assert_eq!(check_arch("qwen3moe"), 2 * 13);
}

#[test]
fn unsupported_architecture_is_named() {
    let mut w = gguf::GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        gguf::MetadataValue::String("mamba".into()),
    );
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let err = Decoder::load(&loader).err().unwrap().to_string();
    assert!(
        err.contains("'mamba'")
            && err.contains("gemma2, gemma3, llama, phi3, qwen2, qwen3, qwen3moe, qwen35"),
        "{err}"
    );
}

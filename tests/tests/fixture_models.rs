//! Every tiny dense Qwen3 fixture (`../shared/fixtures/gguf/tiny-qwen3-*.gguf`: F16 and 21 quant mixes
//! covering every type llama.cpp quantizes to) loads with every weight packed: the load report
//! names no fallback, and each packed weight's GEMV agrees with the CPU codec.
use burn::tensor::{Tensor, TensorData};
use burn_gguf::{GgufConfig, GgufLoader, LoadKind};
use burn_gguf_tests::{fixtures, rand_vec};
use gguf::GgufFile;

#[test]
fn every_tiny_dense_fixture_loads_fully_packed() {
    let device = burn_gguf::default_device();
    let mut files: Vec<_> = std::fs::read_dir(fixtures().join("gguf"))
        .expect("fixtures/gguf")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("tiny-qwen3-") && name.ends_with(".gguf")
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 22, "{files:?}");
    let mut types = std::collections::BTreeSet::new();
    for path in &files {
        let file = GgufFile::open(path).unwrap();
        let loader = GgufLoader::new(&file, &device, GgufConfig::default());
        let mut weights = 0usize;
        for info in file.tensors() {
            match info.shape().len() {
                1 => drop(loader.dense::<1>(&info.name).unwrap()),
                2 => {
                    weights += 1;
                    types.insert(info.ggml_type);
                    let lin = loader.linear(&info.name).unwrap();
                    let [rows, cols] = lin.weight.shape();
                    let x = rand_vec(cols, weights as u64);
                    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [1, cols]), &device);
                    let y = lin
                        .forward(xt)
                        .try_into_data()
                        .unwrap()
                        .try_to_vec::<f32>()
                        .unwrap();
                    let reference = ggml_codec::dequantize_to_vec(
                        info.ggml_type,
                        file.tensor_data(info),
                        rows * cols,
                    )
                    .unwrap();
                    let err = ggml_kernels::check::gemv_error_of(&y, &x, &reference, rows, cols);
                    assert!(err <= 1.0, "{} {}: error {err}", path.display(), info.name);
                }
                n => panic!("{}: {} has rank {n}", path.display(), info.name),
            }
        }
        let report = loader.report();
        assert_eq!(
            report.dequantized().count(),
            0,
            "{}: {report}",
            path.display()
        );
        assert_eq!(report.packed_count(), weights, "{}", path.display());
        assert!(
            report
                .entries
                .iter()
                .all(|e| matches!(e.kind, LoadKind::Packed | LoadKind::Dense)),
            "{report}"
        );
        assert_eq!(
            report.to_string(),
            format!(
                "{} tensors: {weights} packed, 0 dequantized",
                file.tensors().len()
            )
        );
    }
    // The mixes cover 22 weight types: F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K,
    // IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0.
    assert_eq!(types.len(), 22, "{types:?}");
}

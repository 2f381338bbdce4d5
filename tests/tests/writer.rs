//! Burn tensors written to GGUF with the codec's quantizers (`burn_gguf::write::add_quantized`)
//! read back as the quantizer's blocks with the shape reversed, and load and run as packed
//! modules.
use burn::tensor::{Device, Tensor, TensorData};
use burn_gguf::{Error, GgufConfig, GgufLoader, write::add_quantized};
use burn_gguf_tests::rand_vec;
use gguf::{GgmlType, GgufFile, GgufWriter};

#[test]
fn quantized_tensors_round_trip_through_the_file() {
    let device = Device::flex();
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|&t| ggml_codec::supports_quantize(t))
        .collect();
    assert_eq!(types.len(), 11);
    let (rows, cols) = (3, 256);
    let mut w = GgufWriter::new();
    let mut originals = Vec::new();
    for (i, &ty) in types.iter().enumerate() {
        let values = rand_vec(rows * cols, i as u64 + 1);
        let t = Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, cols]), &device);
        add_quantized(&mut w, &format!("w.{ty}"), ty, t).unwrap();
        originals.push(values);
    }
    // Rank 3 (Burn [2, 3, 32]) gives ne [32, 3, 2].
    let r3 = Tensor::<3>::from_data(TensorData::new(rand_vec(192, 9), [2, 3, 32]), &device);
    add_quantized(&mut w, "r3", GgmlType::Q8_0, r3).unwrap();

    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    for (&ty, values) in types.iter().zip(&originals) {
        let info = f.tensor(&format!("w.{ty}")).unwrap();
        assert_eq!(
            (info.ggml_type, info.ne.clone()),
            (ty, vec![cols as u64, rows as u64])
        );
        let expected = ggml_codec::quantize(ty, values).unwrap();
        assert_eq!(f.tensor_data(info), &expected[..], "{ty}");
        // And the blocks decode near the values (ternary types only keep signs and a scale).
        let back = ggml_codec::dequantize_to_vec(ty, f.tensor_data(info), rows * cols).unwrap();
        let worst = values
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let bound = match ty {
            GgmlType::F32 => 0.0,
            GgmlType::F16 | GgmlType::BF16 => 4e-3,
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => 1.0,
            GgmlType::Q8_0 => 1e-2,
            // d = amax / -2^(bits-1): the far end clamps to one step short.
            GgmlType::Q5_0 | GgmlType::Q5_1 => 0.07,
            GgmlType::Q4_0 | GgmlType::Q4_1 => 0.13,
            // e2m1 values with a shared power-of-two scale: steps of 0.5 near the top.
            GgmlType::MXFP4 => 0.3,
            other => panic!("no bound for {other}"),
        };
        assert!(worst <= bound, "{ty}: worst error {worst} > {bound}");
    }
    assert_eq!(f.tensor("r3").unwrap().ne, vec![32, 3, 2]);
}

#[test]
fn unsupported_types_and_partial_blocks_are_errors() {
    let device = Device::flex();
    let mut w = GgufWriter::new();
    let t = Tensor::<2>::from_data(TensorData::new(vec![0f32; 512], [2, 256]), &device);
    let e = add_quantized(&mut w, "a", GgmlType::Q4_K, t).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                ggml_type: GgmlType::Q4_K,
                ..
            }
        ),
        "{e}"
    );
    let t = Tensor::<2>::from_data(TensorData::new(vec![0f32; 66], [2, 33]), &device);
    let e = add_quantized(&mut w, "blk.3.ffn_up.weight", GgmlType::Q8_0, t).unwrap_err();
    assert!(e.to_string().contains("blk.3.ffn_up.weight"), "{e}");
    assert!(w.to_bytes().is_ok());
}

/// A written Q8_0 weight loads packed on the wgpu device and its linear layer matches the f64
/// product of the codec's dequantized weights.
#[test]
fn written_weights_load_as_packed_modules() {
    let cpu = Device::flex();
    let (rows, cols) = (16, 128);
    let values = rand_vec(rows * cols, 42);
    let mut w = GgufWriter::new();
    let t = Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), &cpu);
    add_quantized(&mut w, "blk.0.attn_q.weight", GgmlType::Q8_0, t).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();

    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&f, &device, GgufConfig::default());
    let linear = loader.linear("blk.0.attn_q.weight").unwrap();
    assert_eq!(loader.report().packed_count(), 1);
    let x = rand_vec(cols, 7);
    let y = linear
        .forward(Tensor::<2>::from_data(
            TensorData::new(x.clone(), [1, cols]),
            &device,
        ))
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let weights = ggml_codec::dequantize_to_vec(
        GgmlType::Q8_0,
        f.tensor_bytes("blk.0.attn_q.weight").unwrap(),
        rows * cols,
    )
    .unwrap();
    for (r, got) in y.iter().enumerate() {
        let want: f64 = (0..cols)
            .map(|c| weights[r * cols + c] as f64 * x[c] as f64)
            .sum();
        assert!(
            (*got as f64 - want).abs() < 1e-4,
            "row {r}: {got} vs {want}"
        );
    }
}

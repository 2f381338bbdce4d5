//! The loader: packed where a kernel fits, dequantized (and reported) where none does, with the
//! same results either way; a dense fallback too large for one device buffer is split by rows.
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_gguf::{DenseWeight, GgufConfig, GgufLoader, LoadKind, Weight};
use burn_gguf_tests::rand_vec;
use gguf::{GgmlType, GgufFile, GgufWriter};

/// A file with one Q8_0 and one Q4_0 weight of `[rows, cols]` (Burn order) from the same values.
fn file(rows: usize, cols: usize) -> (GgufFile, Vec<f32>) {
    let values = rand_vec(rows * cols, 9);
    let mut w = GgufWriter::new();
    let ne = [cols as u64, rows as u64];
    w.add_tensor(
        "q8",
        GgmlType::Q8_0,
        &ne,
        &ggml_codec::quantize_q8_0(&values),
    )
    .unwrap();
    w.add_tensor(
        "q4",
        GgmlType::Q4_0,
        &ne,
        &ggml_codec::quantize_q4_0(&values),
    )
    .unwrap();
    (GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap(), values)
}

fn y(loader: &GgufLoader, name: &str, x: &Tensor<2>) -> Vec<f32> {
    let lin = loader.linear(name).unwrap();
    lin.forward(x.clone())
        .try_into_data()
        .unwrap()
        .try_to_vec::<f32>()
        .unwrap()
}

#[test]
fn fallback_is_reported_and_agrees_with_the_packed_path() {
    let (rows, cols) = (40, 96);
    let (file, _) = file(rows, cols);
    let device = burn_gguf::default_device();
    let x = Tensor::<2>::from_data(TensorData::new(rand_vec(3 * cols, 4), [3, cols]), &device);

    for ty_name in ["q8", "q4"] {
        let packed = GgufLoader::new(&file, &device, GgufConfig::default());
        let forced = GgufLoader::new(
            &file,
            &device,
            GgufConfig {
                dequantize: true,
                ..GgufConfig::default()
            },
        );
        let a = y(&packed, ty_name, &x);
        let b = y(&forced, ty_name, &x);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                "{ty_name} [{i}]: packed {p}, dense {q}"
            );
        }
        let kind = &packed.report().entries[0].kind;
        let has_kernel = ggml_kernels::supports(file.tensor(ty_name).unwrap().ggml_type);
        assert_eq!(*kind == LoadKind::Packed, has_kernel, "{ty_name}: {kind:?}");
        if !has_kernel {
            assert!(
                matches!(kind, LoadKind::Dequantized(why) if why.contains("no kernel")),
                "{kind:?}"
            );
        }
        assert!(
            matches!(&forced.report().entries[0].kind, LoadKind::Dequantized(why) if why.contains("dequantize"))
        );
    }
}

/// A dense fallback larger than one device buffer is split by rows like a packed tensor: with
/// buffers of 3 rows, a `[10, 64]` weight takes 4 parts, and its product and row lookups
/// (across part boundaries) equal the single-buffer weight's.
#[test]
fn dense_fallback_is_split_by_rows() {
    let device = burn_gguf::default_device();
    let (rows, cols) = (10, 64);
    let values = rand_vec(rows * cols, 5);
    let split = DenseWeight::from_values(
        values.clone(),
        [rows, cols],
        &device,
        3 * 64 * 4,
        FloatDType::F32,
    )
    .unwrap();
    assert_eq!(split.num_parts(), 4);
    let whole = DenseWeight::new(Tensor::<2>::from_data(
        TensorData::new(values.clone(), [rows, cols]),
        &device,
    ));
    let (split, whole) = (Weight::Dense(split), Weight::Dense(whole));
    let x = Tensor::<2>::from_data(TensorData::new(rand_vec(2 * cols, 6), [2, cols]), &device);
    let vec = |t: Tensor<2>| t.try_into_data().unwrap().try_to_vec::<f32>().unwrap();
    let (a, b) = (vec(split.matmul_t(x.clone())), vec(whole.matmul_t(x)));
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{p} vs {q}");
    }
    let ids = [9u32, 0, 2, 3, 5, 6, 2];
    let got = vec(split.rows(&ids).unwrap());
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            &got[i * cols..(i + 1) * cols],
            &values[id as usize * cols..][..cols]
        );
    }
    assert!(split.rows(&[10]).is_err());
    // A row that does not fit one buffer is an error, not a panic.
    assert!(DenseWeight::from_values(values, [rows, cols], &device, 100, FloatDType::F32).is_err());
}

/// `plan` says what the loader will do before loading: it agrees with the load report for a
/// packed weight, a weight whose rows do not fit the kernel blocks, a norm, and under
/// `GgufConfig::dequantize`.
#[test]
fn plan_agrees_with_the_load_report() {
    let device = burn_gguf::default_device();
    let mut w = GgufWriter::new();
    let values = rand_vec(8 * 64, 3);
    w.add_tensor(
        "w",
        GgmlType::Q8_0,
        &[64, 8],
        &ggml_codec::quantize_q8_0(&values),
    )
    .unwrap();
    // F32 rows of 40 values: no whole 32-value kernel block.
    let odd: Vec<u8> = rand_vec(3 * 40, 4)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.add_tensor("odd", GgmlType::F32, &[40, 3], &odd).unwrap();
    let norm: Vec<u8> = [1f32; 64].iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor("norm", GgmlType::F32, &[64], &norm).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    for config in [
        GgufConfig::default(),
        GgufConfig {
            dequantize: true,
            ..GgufConfig::default()
        },
    ] {
        let loader = GgufLoader::new(&file, &device, config.clone());
        loader.weight("w").unwrap();
        loader.weight("odd").unwrap();
        loader.dense::<1>("norm").unwrap();
        for e in loader.report().entries {
            let info = file.tensor(&e.name).unwrap();
            assert_eq!(
                burn_gguf::plan(info, &device, &config),
                e.kind,
                "{}",
                e.name
            );
        }
    }
    let odd = file.tensor("odd").unwrap();
    assert!(matches!(
        burn_gguf::plan(odd, &device, &GgufConfig::default()),
        LoadKind::Dequantized(why) if why.contains("multiple of 32")
    ));
}

/// The packed modules are Burn `Module`s: they report their device, move with `to_device`, and
/// display their packed weights.
#[test]
fn packed_modules_are_burn_modules() {
    use burn::module::Module;
    let (file, _) = file(40, 96);
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let lin = loader.linear("q4").unwrap();
    assert_eq!(lin.devices(), vec![device.clone()]);
    let x = Tensor::<2>::from_data(TensorData::new(rand_vec(96, 8), [1, 96]), &device);
    let moved = lin.clone().to_device(&device);
    let vec = |t: Tensor<2>| t.try_into_data().unwrap().try_to_vec::<f32>().unwrap();
    assert_eq!(vec(moved.forward(x.clone())), vec(lin.forward(x)));
    let shown = format!("{lin}");
    assert!(
        shown.contains("GgmlTensor {type: Q4_0, shape: [40, 96], parts: 1}"),
        "{shown}"
    );
}

/// `GgmlEmbedding::forward_ids` takes `[batch, seq]` ids like `burn::nn::Embedding` and gives
/// `[batch, seq, dim]`, row for row the table's.
#[test]
fn embedding_of_an_id_tensor() {
    let (file, values) = file(40, 96);
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let embed = loader.embedding("q8").unwrap();
    let ids = Tensor::<2, burn::tensor::Int>::from_data(
        TensorData::new(vec![3i64, 0, 39, 7, 7, 1], [2, 3]),
        &device,
    );
    let out = embed.forward_ids(ids).unwrap();
    assert_eq!(out.dims(), [2, 3, 96]);
    let got = out.try_into_data().unwrap().try_to_vec::<f32>().unwrap();
    let reference =
        ggml_codec::dequantize_to_vec(GgmlType::Q8_0, &ggml_codec::quantize_q8_0(&values), 40 * 96)
            .unwrap();
    for (i, id) in [3usize, 0, 39, 7, 7, 1].into_iter().enumerate() {
        assert_eq!(
            &got[i * 96..(i + 1) * 96],
            &reference[id * 96..(id + 1) * 96]
        );
    }
    let bad =
        Tensor::<2, burn::tensor::Int>::from_data(TensorData::new(vec![40i64], [1, 1]), &device);
    assert!(embed.forward_ids(bad).is_err());
}

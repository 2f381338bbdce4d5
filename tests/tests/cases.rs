//! Cases of `../shared/cases/CASES.md` on the device: hand-built blocks (C08, C09, C11) through
//! the kernels, the WGSL limits (C26, C27), the buffer and dispatch limits (C28, C29) and a
//! Q4 block matmul of several rows, packed and as Burn's QFloat (C30). The
//! codec side of C08, C09 and C11 is in `crates/ggml-codec/tests/cases.rs`.
use burn::tensor::{Tensor, TensorData};
use burn_gguf::GgmlTensor;
use ggml_kernels::GemvConfig;
use ggml_kernels::source::{Variant, wgsl};
use gguf::GgmlType;

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.try_into_data().unwrap().try_to_vec::<f32>().unwrap()
}

/// `x W^T` for `x` `[1, cols]` through the packed tensor.
fn gemv(t: &GgmlTensor, x: &[f32]) -> Vec<f32> {
    let device = t.device();
    let xt = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [1, x.len()]), &device);
    to_vec(t.matmul_t(xt))
}

/// One block of `ty` dequantized on the device must give `expected(i)` for each of its 256
/// elements, and the GEMV with `x = 1` their sum.
fn assert_block(ty: GgmlType, block: &[u8], expected: impl Fn(usize) -> f32) {
    let device = burn_gguf::default_device();
    let t = GgmlTensor::from_bytes(block, ty, [1, 256], &device).unwrap();
    let y = to_vec(t.dequantize());
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, expected(i), "{ty} element {i}");
    }
    let sum: f32 = (0..256).map(&expected).sum();
    assert_eq!(gemv(&t, &[1.0; 256]), vec![sum], "{ty} GEMV with x = 1");
}

/// C08: Q4_K sub-blocks 4..8 take the top 2 bits of their scale from bytes 0..4.
#[test]
fn c08_q4k_scale_min_unpacking_on_the_device() {
    let mut block = vec![0x00, 0x3C, 0x00, 0x00]; // d = 1.0, dmin = 0
    block.extend_from_slice(&[0xC1, 0x01, 0x01, 0x01, 0, 0, 0, 0, 0x05, 0x01, 0x01, 0x01]);
    block.extend_from_slice(&[0x11; 128]);
    assert_block(GgmlType::Q4_K, &block, |i| {
        if (128..160).contains(&i) { 53.0 } else { 1.0 }
    });
}

/// C09: Q5_K's 5th bit of value `l` in sub-block `s` is bit `s` of `qh[l]`.
#[test]
fn c09_q5k_high_bit_layout_on_the_device() {
    let mut block = vec![0x00, 0x3C, 0x00, 0x00]; // d = 1.0, dmin = 0
    block.extend_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
    let mut qh = [0u8; 32];
    qh[0] = 0x04;
    block.extend_from_slice(&qh);
    block.extend_from_slice(&[0u8; 128]);
    assert_block(GgmlType::Q5_K, &block, |i| if i == 64 { 16.0 } else { 0.0 });
}

/// C11: TQ2_0 stores four 2-bit planes per 32-byte chunk.
#[test]
fn c11_tq2_0_bit_planes_on_the_device() {
    let mut block = vec![0x64];
    block.extend_from_slice(&[0x55; 63]);
    block.extend_from_slice(&[0x00, 0x3C]); // d = 1.0
    assert_block(GgmlType::TQ2_0, &block, |i| match i {
        0 => -1.0,
        64 => 1.0,
        _ => 0.0,
    });
}

/// Every variant's WGSL for every type (dequantize-rows, and each GEMV configuration at every
/// pass width), as the tests' device compiles it.
fn every_wgsl() -> Vec<(String, String)> {
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).unwrap();
    let mut variants = vec![Variant::DequantizeRows];
    for config in GemvConfig::variants(&client) {
        variants.extend(
            config
                .pass_widths()
                .into_iter()
                .map(|m_pass| Variant::Gemv { config, m_pass }),
        );
    }
    let mut out = Vec::new();
    for &ty in GgmlType::all()
        .iter()
        .filter(|t| ggml_kernels::supports(**t))
    {
        for &v in &variants {
            let src = wgsl(&client, ty, v).unwrap_or_else(|e| panic!("{ty} {v:?}: {e}"));
            out.push((format!("{ty} {v:?}"), src));
        }
    }
    out
}

fn tokens(src: &str) -> impl Iterator<Item = &str> {
    src.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
}

/// C26: block bytes are read from `u32` words with shifts; no kernel declares an 8- or 16-bit
/// integer, and a Q4_0 tensor with an odd number of blocks (block 1 starts mid-word, at byte
/// 18) dequantizes bit-exactly.
#[test]
fn c26_no_narrow_integers_and_mid_word_blocks() {
    for (name, src) in every_wgsl() {
        for t in tokens(&src) {
            assert!(
                !matches!(t, "u8" | "i8" | "u16" | "i16"),
                "{name}: WGSL uses `{t}`"
            );
        }
    }
    let device = burn_gguf::default_device();
    let values = burn_gguf_tests::rand_vec(3 * 32, 26);
    let bytes = ggml_codec::quantize_q4_0(&values);
    assert_eq!(bytes.len(), 3 * 18);
    let t = GgmlTensor::from_bytes(&bytes, GgmlType::Q4_0, [1, 96], &device).unwrap();
    let reference = ggml_codec::dequantize_to_vec(GgmlType::Q4_0, &bytes, 96).unwrap();
    let got = to_vec(t.dequantize());
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        reference.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// C27: no kernel enables or uses `f16`, so none needs the `shader-f16` feature; fp16 scales and
/// F16 weights are decoded from their bits. The Q8_0 GEMV and an F16 Linear agree with the CPU
/// reference within 1e-5 of each dot's magnitude.
#[test]
fn c27_no_shader_f16() {
    for (name, src) in every_wgsl() {
        assert!(!src.contains("enable f16"), "{name}: `enable f16`");
        assert!(!tokens(&src).any(|t| t == "f16"), "{name}: uses f16");
    }
    let device = burn_gguf::default_device();
    let (rows, cols) = (48, 256);
    let values = burn_gguf_tests::rand_vec(rows * cols, 27);
    let x = burn_gguf_tests::rand_vec(cols, 28);
    for ty in [GgmlType::Q8_0, GgmlType::F16] {
        let bytes = ggml_codec::quantize(ty, &values).unwrap();
        let reference = ggml_codec::dequantize_to_vec(ty, &bytes, rows * cols).unwrap();
        let t = GgmlTensor::from_bytes(&bytes, ty, [rows, cols], &device).unwrap();
        let y = gemv(&t, &x);
        let err = ggml_kernels::check::gemv_error_of(&y, &x, &reference, rows, cols);
        assert!(err <= 1.0, "{ty}: error {err} x the bound");
    }
}

/// C28: a tensor larger than the device's buffer limit is split by rows on block boundaries.
/// With the limit forced to 1 MiB, the Q8_0 table `ne = [256, 3856]` (1,048,832 bytes) takes two
/// buffers; the lookup of row 3855 is bit-exact and the GEMV over all rows is within bound.
#[test]
fn c28_tensor_over_the_buffer_limit() {
    let device = burn_gguf::default_device();
    let (rows, cols) = (3856, 256);
    let values = burn_gguf_tests::rand_vec(rows * cols, 28);
    let bytes = ggml_codec::quantize_q8_0(&values);
    assert_eq!(bytes.len(), 1_048_832);
    let t =
        GgmlTensor::from_bytes_with_limit(&bytes, GgmlType::Q8_0, [rows, cols], &device, 1 << 20)
            .unwrap();
    assert_eq!(t.num_parts(), 2);
    let reference = ggml_codec::dequantize_to_vec(GgmlType::Q8_0, &bytes, rows * cols).unwrap();
    for id in [0u32, 3854, 3855] {
        let row = to_vec(t.gather_rows(&[id]).unwrap());
        let want = &reference[id as usize * cols..][..cols];
        assert!(
            row.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {id}"
        );
    }
    let x = burn_gguf_tests::rand_vec(cols, 29);
    let err = ggml_kernels::check::gemv_error_of(&gemv(&t, &x), &x, &reference, rows, cols);
    assert!(err <= 1.0, "error {err} x the bound");
    // A limit below one row is an error, not a panic.
    assert!(
        GgmlTensor::from_bytes_with_limit(&bytes, GgmlType::Q8_0, [rows, cols], &device, 64)
            .is_err()
    );
}

/// C29: a Q8_0 GEMV of 262,144 rows at 4 rows per workgroup needs 65,536 workgroups, one more
/// than a dimension takes: the dispatch folds into X and Y, and every output (the last row and
/// those at the fold included) equals the row sums with `x = 1`.
#[test]
fn c29_more_than_65535_workgroups() {
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).unwrap();
    let (rows, cols) = (262_144, 32);
    let values = burn_gguf_tests::rand_vec(rows * cols, 30);
    let bytes = ggml_codec::quantize_q8_0(&values);
    let reference = ggml_codec::dequantize_to_vec(GgmlType::Q8_0, &bytes, rows * cols).unwrap();
    let config = GemvConfig::Split {
        lanes: 1,
        rows_per_cube: 4,
        plane: false,
    };
    assert_eq!(rows / 4, 65_536);
    let x = vec![1.0f32; cols];
    let err = ggml_kernels::check::gemv_error(
        &client,
        GgmlType::Q8_0,
        &bytes,
        rows,
        cols,
        config,
        ggml_kernels::GemvLaunch::default(),
        &x,
        &reference,
    )
    .unwrap();
    assert!(err <= 1.0, "error {err} x the bound");
}

/// C30: a 1,024 x 1,024 Q4_0 weight (4-bit blocks of 32) multiplies `x` of 1 and of 2 rows
/// (ones, and random values) both packed (`GgmlTensor`: the fused GEMV, whose variant is picked
/// within the device's workgroup-memory limit) and as Burn's own quantized tensor
/// (`burn_gguf::qfloat`, Burn's quantized matmul): each output within 1e-3 of the f64 product
/// with the dequantized weight, relative to `sum |x_k w_nk|`. Quantizing a transposed view
/// (`write::add_quantized`) gives the blocks of a contiguous copy: the quantizer reads logical
/// order, not storage order.
#[test]
fn c30_q4_blocks_for_several_rows_and_from_a_transposed_view() {
    use burn_gguf::write::add_quantized;
    use gguf::{GgufFile, GgufWriter};
    let device = burn_gguf::default_device();
    let (n, k) = (1024, 1024);
    let w = burn_gguf_tests::rand_vec(n * k, 30);
    // W^T stored contiguously ([k, n]), so that `.transpose()` is W as a strided view.
    let w_t: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let blocks = |t: Tensor<2>| {
        let mut writer = GgufWriter::new();
        add_quantized(&mut writer, "w", GgmlType::Q4_0, t).unwrap();
        let file = GgufFile::from_bytes(writer.to_bytes().unwrap()).unwrap();
        file.tensor_data(file.tensor("w").unwrap()).to_vec()
    };
    let bytes = blocks(Tensor::from_data(TensorData::new(w, [n, k]), &device));
    let view = Tensor::<2>::from_data(TensorData::new(w_t, [k, n]), &device).transpose();
    assert!(
        blocks(view) == bytes,
        "a transposed view quantizes differently"
    );

    let wq = ggml_codec::dequantize_to_vec(GgmlType::Q4_0, &bytes, n * k).unwrap();
    let packed = GgmlTensor::from_bytes(&bytes, GgmlType::Q4_0, [n, k], &device).unwrap();
    let qfloat = Tensor::<2>::from_data(
        burn_gguf::qfloat::to_qfloat(GgmlType::Q4_0, &bytes, &[n, k], &device).unwrap(),
        &device,
    );
    let random = burn_gguf_tests::rand_vec(k, 31);
    for m in [1, 2] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| if i < k { 1.0 } else { random[i - k] })
            .collect();
        let xt = || Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &device);
        let outputs = [
            ("packed", to_vec(packed.matmul_t(xt()))),
            ("qfloat", to_vec(xt().matmul(qfloat.clone().transpose()))),
        ];
        for (path, y) in outputs {
            for r in 0..m {
                for row in 0..n {
                    let (mut dot, mut mag) = (0f64, 0f64);
                    for j in 0..k {
                        let p = f64::from(x[r * k + j]) * f64::from(wq[row * k + j]);
                        dot += p;
                        mag += p.abs();
                    }
                    let got = f64::from(y[r * n + row]);
                    assert!(
                        (got - dot).abs() <= 1e-3 * mag,
                        "{path} M={m} [{r}, {row}]: {got} vs f64 {dot}"
                    );
                }
            }
        }
    }
}

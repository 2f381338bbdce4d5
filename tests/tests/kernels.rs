//! Every kernel type against the CPU codec: the fused GEMV against an f64 dot of the codec's
//! dequantized weights (within 1e-5 of the dot's magnitude), the dequantize-rows op against the
//! codec element for element, on fixture blocks from llama.cpp and on the real Gemma tensors,
//! including a row count that is not a multiple of the rows per workgroup and a tensor over
//! 128 MiB (split into device buffers by rows).
use burn::tensor::{Tensor, TensorData};
use burn_gguf::GgmlTensor;
use burn_gguf_tests::{rand_vec, read_fixture};
use gguf::GgmlType;

/// GEMV tolerance: |y - y_ref| <= TOL * sum_k |w_k x_k| (the scale of f32 rounding in a dot).
const TOL: f64 = 1e-5;

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.try_into_data()
        .expect("device read-back")
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// Asserts `y` `[m, rows]` equals `x W^T` computed in f64 from `row(n)`, the codec's
/// dequantization of weight row `n`, within [`TOL`] of each dot's magnitude.
fn assert_gemv(
    label: &str,
    row: impl Fn(usize) -> Vec<f32>,
    x: &[f32],
    y: &[f32],
    m: usize,
    rows: usize,
    cols: usize,
) {
    assert_eq!(y.len(), m * rows, "{label}: output length");
    for n in 0..rows {
        let w = row(n);
        for r in 0..m {
            let (mut dot, mut mag) = (0f64, 0f64);
            for (wk, xk) in w.iter().zip(&x[r * cols..(r + 1) * cols]) {
                let p = *wk as f64 * *xk as f64;
                dot += p;
                mag += p.abs();
            }
            let got = y[r * rows + n] as f64;
            assert!(
                (got - dot).abs() <= TOL * mag.max(1e-30),
                "{label} m={m} y[{r},{n}] = {got}, f64 reference {dot} (|w||x| = {mag})"
            );
        }
    }
}

/// Checks dequantize and GEMV (m = 1, 2, 5, 8 fused; 11 through prefill) of `bytes` viewed as
/// `[rows, cols]` of `ty`.
fn check(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) {
    let device = burn_gguf::default_device();
    let reference = ggml_codec::dequantize_to_vec(ty, bytes, rows * cols).expect("codec");
    let t = GgmlTensor::from_bytes(bytes, ty, [rows, cols], &device).expect("upload");

    let deq = to_vec(t.dequantize());
    let scale = reference
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    for (i, (a, b)) in deq.iter().zip(&reference).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * scale,
            "{ty} [{rows}x{cols}] dequantize [{i}]: {a} vs codec {b}"
        );
    }

    for (seed, m) in [1usize, 2, 5, 8, 11].into_iter().enumerate() {
        let x = rand_vec(m * cols, 100 + seed as u64);
        let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, cols]), &device);
        let y = to_vec(t.matmul_t(xt));
        let row = |n: usize| reference[n * cols..(n + 1) * cols].to_vec();
        assert_gemv(&format!("{ty} [{rows}x{cols}]"), row, &x, &y, m, rows, cols);
    }
}

/// Fixture blocks `dequant/<name>.blocks.bin` (128 rows x 256 values as quantized by ggml).
fn fixture(name: &str) -> Vec<u8> {
    read_fixture(&format!("dequant/{name}.blocks.bin"))
}

/// The fixture's 128 x 256 values viewed as rows of 256 (125 of them: not a multiple of any
/// rows-per-cube the GEMV uses), 1024 and 2048 values.
fn check_fixture(ty: GgmlType, bytes: &[u8]) {
    for (rows, cols) in [(125, 256), (32, 1024), (13, 2048)] {
        let n = rows * ty.row_bytes(cols as u64).unwrap() as usize;
        check(ty, &bytes[..n], rows, cols);
    }
}

#[test]
fn f32_kernels() {
    check_fixture(GgmlType::F32, &read_fixture("dequant/source_f32.bin"));
}

#[test]
fn f16_kernels() {
    check_fixture(GgmlType::F16, &fixture("F16"));
}

#[test]
fn bf16_kernels() {
    check_fixture(GgmlType::BF16, &fixture("BF16"));
}

#[test]
fn q4_0_kernels() {
    check_fixture(GgmlType::Q4_0, &fixture("Q4_0"));
}

#[test]
fn q4_1_kernels() {
    check_fixture(GgmlType::Q4_1, &fixture("Q4_1"));
}

#[test]
fn q5_1_kernels() {
    check_fixture(GgmlType::Q5_1, &fixture("Q5_1"));
}

#[test]
fn q2_k_kernels() {
    check_fixture(GgmlType::Q2_K, &fixture("Q2_K"));
}

#[test]
fn q3_k_kernels() {
    check_fixture(GgmlType::Q3_K, &fixture("Q3_K"));
}

#[test]
fn q5_k_kernels() {
    check_fixture(GgmlType::Q5_K, &fixture("Q5_K"));
}

#[test]
fn q8_0_kernels() {
    check_fixture(GgmlType::Q8_0, &fixture("Q8_0"));
    check(GgmlType::Q8_0, &fixture("gemma_token_embd_Q8_0"), 24, 640);
}

#[test]
fn q5_0_kernels() {
    check_fixture(GgmlType::Q5_0, &fixture("Q5_0"));
    check(GgmlType::Q5_0, &fixture("gemma_blk_0_attn_q_Q5_0"), 24, 640);
}

#[test]
fn q4_k_kernels() {
    check_fixture(GgmlType::Q4_K, &fixture("Q4_K"));
    check(
        GgmlType::Q4_K,
        &fixture("gemma_blk_0_attn_output_Q4_K"),
        96,
        1024,
    );
}

#[test]
fn q6_k_kernels() {
    check_fixture(GgmlType::Q6_K, &fixture("Q6_K"));
    check(
        GgmlType::Q6_K,
        &fixture("gemma_blk_0_ffn_down_Q6_K"),
        48,
        2048,
    );
}

#[test]
fn unsupported_type_and_bad_shapes_are_errors() {
    let device = burn_gguf::default_device();
    // Every type without a kernel is refused at upload (the loader then falls back).
    for &ty in GgmlType::all() {
        if !ggml_kernels::supports(ty) {
            let bytes = vec![0u8; ty.row_bytes(256 * ty.block_size() as u64).unwrap() as usize];
            let err = GgmlTensor::from_bytes(&bytes, ty, [1, 256 * ty.block_size()], &device);
            assert!(
                matches!(err, Err(burn_gguf::Error::Unsupported { .. })),
                "{ty}: {err:?}"
            );
        }
    }
    let q8 = fixture("Q8_0");
    // 250 is not a multiple of 32; a byte count that does not match the shape.
    assert!(GgmlTensor::from_bytes(&q8, GgmlType::Q8_0, [128, 250], &device).is_err());
    assert!(GgmlTensor::from_bytes(&q8[..100], GgmlType::Q8_0, [128, 256], &device).is_err());
}

/// Gemma's tied `token_embd` (Q8_0, 262144 x 640, 178 MB) is over lavapipe's 128 MiB storage
/// buffer limit: it is split by rows, and GEMV and lookups across the split agree with the codec.
#[test]
fn tensor_over_128_mib_is_split_by_rows() {
    let file = gguf::GgufFile::open(burn_gguf_tests::gemma_path()).expect("gemma file");
    let info = file.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(info.ggml_type, GgmlType::Q8_0);
    let bytes = file.tensor_data(info);
    assert!(bytes.len() > 128 << 20);
    let [rows, cols] = <[usize; 2]>::try_from(info.shape()).unwrap();
    let device = burn_gguf::default_device();
    let t = GgmlTensor::from_bytes(bytes, GgmlType::Q8_0, [rows, cols], &device).expect("upload");
    assert!(
        t.num_parts() >= 2,
        "a 178 MB tensor must be split on a 128 MiB device"
    );

    let row_bytes = info.ggml_type.row_bytes(cols as u64).unwrap() as usize;
    let row = |r: usize| {
        ggml_codec::dequantize_to_vec(GgmlType::Q8_0, &bytes[r * row_bytes..][..row_bytes], cols)
            .unwrap()
    };

    let m = 2;
    let x = rand_vec(m * cols, 7);
    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, cols]), &device);
    let y = to_vec(t.matmul_t(xt));
    assert_gemv("token_embd", row, &x, &y, m, rows, cols);

    // Lookups on both sides of every part boundary, and the last row.
    let split = (((128u64 << 20) - 8) / row_bytes as u64) as u32;
    let ids = [0u32, 1, split - 1, split, split + 1, rows as u32 - 1, 2];
    let got = to_vec(t.gather_rows(&ids).unwrap());
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            &got[i * cols..(i + 1) * cols],
            row(id as usize).as_slice(),
            "row {id}"
        );
    }
    assert!(t.gather_rows(&[rows as u32]).is_err());
}

/// Every GEMV variant this device can run (one unit per row, shared-memory reduction, plane
/// reduction), launched directly, for every kernel type and 1..=8 activation rows.
#[test]
fn every_gemv_variant_matches_the_codec() {
    use cubecl::prelude::*;
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).expect("a CubeCL device");
    // Every type with a kernel, on llama.cpp's fixture blocks.
    let cases: Vec<(GgmlType, Vec<u8>)> = GgmlType::all()
        .iter()
        .filter(|ty| ggml_kernels::supports(**ty))
        .map(|&ty| match ty {
            GgmlType::F32 => (ty, read_fixture("dequant/source_f32.bin")),
            _ => (ty, fixture(ty.name())),
        })
        .collect();
    assert!(cases.len() >= 13);
    let (rows, cols) = (61, 512);
    for (ty, bytes) in &cases {
        let bytes = &bytes[..rows * ty.row_bytes(cols as u64).unwrap() as usize];
        let reference = ggml_codec::dequantize_to_vec(*ty, bytes, rows * cols).unwrap();
        let words = ggml_kernels::words_for_bytes(bytes);
        let w = client.create_from_slice(u32::as_bytes(&words));
        for config in ggml_kernels::GemvConfig::variants(&client) {
            for m in [1usize, 3, 8] {
                let x = rand_vec(m * cols, m as u64);
                let xh = client.create_from_slice(f32::as_bytes(&x));
                let yh = client.empty(m * rows * 4);
                // SAFETY: the lengths are those of the buffers just created.
                let (wa, xa, ya) = unsafe {
                    (
                        BufferArg::from_raw_parts(w.clone(), words.len()),
                        BufferArg::from_raw_parts(xh, m * cols),
                        BufferArg::from_raw_parts(yh.clone(), m * rows),
                    )
                };
                ggml_kernels::launch_gemv(&client, *ty, wa, xa, ya, rows, cols, config).unwrap();
                let y = f32::from_bytes(&client.read_one(yh).expect("read-back")).to_vec();
                let row = |n: usize| reference[n * cols..(n + 1) * cols].to_vec();
                assert_gemv(&format!("{ty} {config:?}"), row, &x, &y, m, rows, cols);
            }
        }
    }
}

//! Every kernel type against the CPU codec: the fused GEMV against an f64 dot of the codec's
//! dequantized weights (within 1e-5 of the dot's magnitude), the dequantize-rows op against the
//! codec element for element, on fixture blocks from llama.cpp and on the real Gemma tensors,
//! including a row count that is not a multiple of the rows per workgroup and a tensor over
//! 128 MiB (split into device buffers by rows). These run the variant the device picks; every
//! other variant, at every pass width, is `cargo xtask kernel-test`'s (CI runs it on a type of
//! each family; every type by hand). The
//! RMSNorm kernel is checked against an f64 reference of its formula.
use burn::tensor::{Tensor, TensorData};
use burn_gguf::GgmlTensor;
use burn_gguf_tests::{rand_vec, read_fixture};
use gguf::GgmlType;

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.try_into_data()
        .expect("device read-back")
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// Asserts `y` `[m, rows]` equals `x W^T` computed in f64 from `reference` (`W` as the codec
/// dequantizes it, `[rows, cols]`), within `ggml_kernels::check::GEMV_TOL` of each dot's magnitude.
fn assert_gemv(label: &str, reference: &[f32], x: &[f32], y: &[f32], rows: usize, cols: usize) {
    assert_eq!(y.len() * cols, x.len() * rows, "{label}: output length");
    let err = ggml_kernels::check::gemv_error_of(y, x, reference, rows, cols);
    assert!(
        err <= 1.0,
        "{label} m={}: error {err} x the bound",
        x.len() / cols
    );
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
        assert_gemv(
            &format!("{ty} [{rows}x{cols}]"),
            &reference,
            &x,
            &y,
            rows,
            cols,
        );
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
fn tq2_0_kernels() {
    check_fixture(GgmlType::TQ2_0, &fixture("TQ2_0"));
}

#[test]
fn tq1_0_kernels() {
    check_fixture(GgmlType::TQ1_0, &fixture("TQ1_0"));
}

#[test]
fn iq4_nl_kernels() {
    check_fixture(GgmlType::IQ4_NL, &fixture("IQ4_NL"));
}

#[test]
fn iq4_xs_kernels() {
    check_fixture(GgmlType::IQ4_XS, &fixture("IQ4_XS"));
}

#[test]
fn mxfp4_kernels() {
    check_fixture(GgmlType::MXFP4, &fixture("MXFP4"));
}

#[test]
fn nvfp4_kernels() {
    check_fixture(GgmlType::NVFP4, &fixture("NVFP4"));
}

#[test]
fn q1_0_kernels() {
    check_fixture(GgmlType::Q1_0, &fixture("Q1_0"));
}

#[test]
fn q2_0_kernels() {
    check_fixture(GgmlType::Q2_0, &fixture("Q2_0"));
}

#[test]
fn iq1_s_kernels() {
    check_fixture(GgmlType::IQ1_S, &fixture("IQ1_S"));
}

#[test]
fn iq1_m_kernels() {
    check_fixture(GgmlType::IQ1_M, &fixture("IQ1_M"));
}

#[test]
fn iq2_xxs_kernels() {
    check_fixture(GgmlType::IQ2_XXS, &fixture("IQ2_XXS"));
}

#[test]
fn iq2_xs_kernels() {
    check_fixture(GgmlType::IQ2_XS, &fixture("IQ2_XS"));
}

#[test]
fn iq2_s_kernels() {
    check_fixture(GgmlType::IQ2_S, &fixture("IQ2_S"));
}

#[test]
fn iq3_xxs_kernels() {
    check_fixture(GgmlType::IQ3_XXS, &fixture("IQ3_XXS"));
}

#[test]
fn iq3_s_kernels() {
    check_fixture(GgmlType::IQ3_S, &fixture("IQ3_S"));
}

/// Every E8M0 (MXFP4) and UE4M3 (NVFP4) scale byte, subnormals, zeros, `0x7F` and bit 7
/// included, with every nibble: the dequantize op matches the codec bit for bit.
#[test]
fn fp4_scales_match_the_codec_bit_for_bit() {
    let nibbles =
        |b: usize, j: usize| (((b * 7 + 2 * j) % 16) | (((b * 5 + 2 * j + 1) % 16) << 4)) as u8;
    // MXFP4: one block per E8M0 byte, 256 blocks of 32 = 32 rows of 256.
    let mut mx = Vec::new();
    for e in 0..=255u8 {
        mx.push(e);
        mx.extend((0..16).map(|j| nibbles(e as usize, j)));
    }
    // NVFP4: four UE4M3 bytes per block, 64 blocks of 64 = 16 rows of 256.
    let mut nv = Vec::new();
    for b in 0..64usize {
        nv.extend((0..4).map(|s| (4 * b + s) as u8));
        nv.extend((0..32).map(|j| nibbles(b, j)));
    }
    for (ty, bytes, rows) in [(GgmlType::MXFP4, mx, 32), (GgmlType::NVFP4, nv, 16)] {
        assert_dequantize_bit_exact(ty, &bytes, rows);
    }
}

/// Dequantizes `bytes` (`rows` x 256 of `ty`) on the device and asserts every value has the
/// codec's bits.
fn assert_dequantize_bit_exact(ty: GgmlType, bytes: &[u8], rows: usize) {
    let device = burn_gguf::default_device();
    let reference = ggml_codec::dequantize_to_vec(ty, bytes, rows * 256).expect("codec");
    let t = GgmlTensor::from_bytes(bytes, ty, [rows, 256], &device).expect("upload");
    let got = to_vec(t.dequantize());
    assert_eq!(got.len(), reference.len(), "{ty}");
    for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{ty} [{i}]: {a:e} vs codec {b:e}");
    }
}

/// The ternary, codebook (IQ) and 1/2-bit decoders repeat the codec's f32 operations, so their
/// dequantization of llama.cpp's fixture blocks is bit-exact.
#[test]
fn bit_exact_decoders_on_fixtures() {
    for ty in [
        GgmlType::TQ2_0,
        GgmlType::TQ1_0,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
    ] {
        assert_dequantize_bit_exact(ty, &fixture(ty.name()), 128);
    }
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
    let reference = ggml_codec::dequantize_to_vec(GgmlType::Q8_0, bytes, rows * cols).unwrap();
    assert_gemv("token_embd", &reference, &x, &y, rows, cols);

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

/// RMSNorm with its weight (one kernel on this device) against llama.cpp's formula in f64,
/// `x / sqrt(mean(x^2) + eps) * w` per row: a 3-D input made non-contiguous by a swap of
/// dimensions, rows of Gemma 3 270M's width (640) with values up to 1e4 (case C21's range),
/// and rows of one element.
#[test]
fn rms_norm_kernel() {
    let device = burn_gguf::default_device();
    for (dims, seed, amp, eps) in [
        ([4usize, 3, 256], 1u64, 1.0f32, 1e-6f32),
        ([2, 1, 640], 2, 1e4, 1e-6),
        ([5, 1, 1], 3, 1.0, 1e-5),
    ] {
        let [a, b, d] = dims;
        let x = Tensor::<3>::from_data(
            TensorData::new(
                rand_vec(a * b * d, seed).iter().map(|v| v * amp).collect(),
                dims,
            ),
            &device,
        )
        .swap_dims(0, 1);
        let w_vals = rand_vec(d, seed + 10);
        let w = Tensor::<1>::from_data(TensorData::new(w_vals.clone(), [d]), &device);
        let xs: Vec<f32> = x.clone().into_data().try_to_vec::<f32>().unwrap();
        let y: Vec<f32> = burn_gguf::rms_norm(x, &w, eps)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(y.len(), xs.len());
        for (r, (xr, yr)) in xs.chunks(d).zip(y.chunks(d)).enumerate() {
            let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let inv = 1.0 / (ss / d as f64 + f64::from(eps)).sqrt();
            let want: Vec<f64> = xr
                .iter()
                .zip(&w_vals)
                .map(|(&v, &wv)| f64::from(v) * inv * f64::from(wv))
                .collect();
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (i, (&got, &want)) in yr.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * scale.max(1e-6),
                    "{dims:?} row {r} element {i}: {got} against {want}"
                );
            }
        }
    }
}

/// RoPE (one kernel on this device) against `(x1 cos - x2 sin, x1 sin + x2 cos)` in f64, in both
/// pairings, on a non-contiguous input of 3 tokens x 2 heads x 8 dimensions with random angles.
#[test]
fn rope_kernel() {
    use burn_gguf::RopeStyle;
    let device = burn_gguf::default_device();
    let (n, h, d) = (3usize, 2usize, 8usize);
    let half = d / 2;
    let angles: Vec<f32> = rand_vec(n * half, 21).iter().map(|a| a * 4.0).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let table = |v: &[f32]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [n, half]), &device);
    let x = Tensor::<3>::from_data(TensorData::new(rand_vec(n * h * d, 22), [h, n, d]), &device)
        .swap_dims(0, 1);
    let xs: Vec<f32> = x.clone().into_data().try_to_vec::<f32>().unwrap();
    for style in [RopeStyle::Neox, RopeStyle::Norm] {
        let y: Vec<f32> = burn_gguf::rope(x.clone(), &table(&cos), &table(&sin), style)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for t in 0..n {
            for head in 0..h {
                let base = (t * h + head) * d;
                for i in 0..half {
                    let (a, b) = match style {
                        RopeStyle::Neox => (base + i, base + i + half),
                        RopeStyle::Norm => (base + 2 * i, base + 2 * i + 1),
                    };
                    let (c, s) = (f64::from(cos[t * half + i]), f64::from(sin[t * half + i]));
                    let (x1, x2) = (f64::from(xs[a]), f64::from(xs[b]));
                    for (got, want) in [(y[a], x1 * c - x2 * s), (y[b], x1 * s + x2 * c)] {
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-6,
                            "{style:?} token {t} head {head} pair {i}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }
}

/// `act(gate) * up` (one kernel on this device) against ggml's GELU (tanh approximation) and
/// SiLU in f64, on random values and on magnitudes up to 1e4, where the tanh and the exp
/// saturate (no NaN).
#[test]
fn gated_activation_kernel() {
    use burn_gguf::Activation;
    let device = burn_gguf::default_device();
    let mut gate = rand_vec(200, 31)
        .iter()
        .map(|v| v * 6.0)
        .collect::<Vec<f32>>();
    gate.extend([-1e4f32, -50.0, -10.0, 0.0, 10.0, 50.0, 1e4]);
    let up = rand_vec(gate.len(), 32);
    let len = gate.len();
    let t = |v: &[f32]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [1, len]), &device);
    for act in [Activation::GeluTanh, Activation::Silu] {
        let y: Vec<f32> = burn_gguf::gated(t(&gate), t(&up), act)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (i, ((&g, &u), &got)) in gate.iter().zip(&up).zip(&y).enumerate() {
            let x = f64::from(g);
            let a = match act {
                Activation::GeluTanh => {
                    let inner = 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x);
                    0.5 * x * (1.0 + inner.tanh())
                }
                Activation::Silu => x / (1.0 + (-x).exp()),
            };
            let want = a * f64::from(u);
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{act:?} element {i} (gate {g}): {got} against {want}"
            );
        }
    }
}

/// The KV-cache step and attention kernels against float64 references
/// (`ggml_kernels::check::attention_error`): every case of `attention_cases` (1 and 8 query
/// rows and a 37-row prefill, GQA ratios 1, 2 and 8, contexts inside one split, not a multiple
/// of it and several splits long, sliding windows shorter and longer than the context, both
/// RoPE pairings, with and without Q/K norm). Cache positions outside the step stay bit for
/// bit as they were.
#[test]
fn attention_kernels() {
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).expect("a CubeCL device");
    for (i, case) in ggml_kernels::check::attention_cases()
        .into_iter()
        .enumerate()
    {
        let err = ggml_kernels::check::attention_error(&client, case, 40 + i as u64)
            .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        assert!(err <= 1.0, "{}: error {err} x the bound", case.label());
    }
}

/// The delta-net kernels (causal convolution with its window, the gated delta rule with its
/// state) against float64 references (`ggml_kernels::check::delta_net_error`): every case of
/// `delta_net_cases` (1 and 8 sequences, prompts from position 0 and after earlier tokens, a
/// 150-token prompt, head ratios 1 to 4, state sizes 16 to 128). The slot no row names stays
/// bit for bit as it was.
#[test]
fn delta_net_kernels() {
    let device = burn_gguf::default_device();
    let client = burn_gguf::cube_client(&device).expect("a CubeCL device");
    for (i, case) in ggml_kernels::check::delta_net_cases()
        .into_iter()
        .enumerate()
    {
        let err = ggml_kernels::check::delta_net_error(&client, case, 110 + i as u64)
            .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        assert!(err <= 1.0, "{}: error {err} x the bound", case.label());
    }
}

/// The residual step (one kernel on this device) against `x + rms_norm(o, pre)` and the next
/// norm in f64, with and without the pre-norm, on rows of Gemma 3 270M's width with values up
/// to 1e4.
#[test]
fn add_rms_norm_kernel() {
    let device = burn_gguf::default_device();
    let (rows, d, eps) = (3usize, 640usize, 1e-6f32);
    let t2 = |v: &[f32]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [rows, d]), &device);
    let t1 = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [d]), &device);
    let x: Vec<f32> = rand_vec(rows * d, 51).iter().map(|v| v * 1e4).collect();
    let o: Vec<f32> = rand_vec(rows * d, 52).iter().map(|v| v * 30.0).collect();
    let (pre, w) = (rand_vec(d, 53), rand_vec(d, 54));
    let norm = |v: &[f64], w: &[f32]| -> Vec<f64> {
        let inv = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / d as f64 + f64::from(eps)).sqrt();
        v.iter()
            .zip(w)
            .map(|(a, b)| a * inv * f64::from(*b))
            .collect()
    };
    for with_pre in [false, true] {
        let (x_out, h) = burn_gguf::add_rms_norm(
            t2(&x),
            t2(&o),
            with_pre.then(|| t1(&pre)).as_ref(),
            &t1(&w),
            eps,
        );
        let (x_out, h) = (to_vec(x_out), to_vec(h));
        for r in 0..rows {
            let orow: Vec<f64> = o[r * d..(r + 1) * d]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let orow = if with_pre { norm(&orow, &pre) } else { orow };
            let sum: Vec<f64> = orow
                .iter()
                .zip(&x[r * d..(r + 1) * d])
                .map(|(a, b)| a + f64::from(*b))
                .collect();
            let hrow = norm(&sum, &w);
            for i in 0..d {
                let (gx, gh) = (f64::from(x_out[r * d + i]), f64::from(h[r * d + i]));
                assert!(
                    (gx - sum[i]).abs() <= 1e-6 * sum[i].abs().max(1.0),
                    "pre={with_pre} row {r} x[{i}]: {gx} against {}",
                    sum[i]
                );
                assert!(
                    (gh - hrow[i]).abs() <= 1e-5 * hrow[i].abs().max(1.0),
                    "pre={with_pre} row {r} h[{i}]: {gh} against {}",
                    hrow[i]
                );
            }
        }
    }
}

/// `act(gate) * up` of a stacked gate/up projection (one kernel) equals the two-tensor form
/// on the halves, bit for bit, for both activations.
#[test]
fn stacked_gated_activation_kernel() {
    use burn_gguf::Activation;
    let device = burn_gguf::default_device();
    let (rows, width) = (3usize, 37usize);
    let gu: Vec<f32> = rand_vec(rows * 2 * width, 61)
        .iter()
        .map(|v| v * 6.0)
        .collect();
    let t = |v: Vec<f32>, cols| Tensor::<2>::from_data(TensorData::new(v, [rows, cols]), &device);
    let half = |second: bool| -> Vec<f32> {
        gu.chunks(2 * width)
            .flat_map(|r| if second { &r[width..] } else { &r[..width] })
            .copied()
            .collect()
    };
    for act in [Activation::GeluTanh, Activation::Silu] {
        let stacked = to_vec(burn_gguf::gated_stacked(t(gu.clone(), 2 * width), act));
        let apart = to_vec(burn_gguf::gated(
            t(half(false), width),
            t(half(true), width),
            act,
        ));
        assert_eq!(stacked, apart, "{act:?}");
    }
}

/// Top-k through the Burn op ([`burn_gguf::top_k`]) against the host's order
/// ([`burn_gguf::sampling::top_k_row`]), value and id for id, on
/// `ggml_kernels::check::top_k_cases`: rows of one chunk and of several (the two-pass path,
/// Gemma 3's vocabulary of 262,144 among them), a last chunk that is not full, `k` of 1, 40 and
/// the maximum, ties, NaN and infinities (never selected), and rows with fewer finite values
/// than `k` (padded with `NO_ID`).
#[test]
fn top_k_kernel() {
    use ggml_kernels::check::{top_k_cases, top_k_input, top_k_mismatches};
    let device = burn_gguf::default_device();
    for (i, (rows, n, k)) in top_k_cases().into_iter().enumerate() {
        let x = top_k_input(rows, n, 90 + i as u64);
        let logits = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, n]), &device);
        let (values, ids) = burn_gguf::top_k(logits, k);
        assert_eq!(values.dims(), [rows, k]);
        let values = to_vec(values);
        let ids: Vec<u32> = ids.into_data().iter::<i64>().map(|v| v as u32).collect();
        let wrong = top_k_mismatches(&x, n, k, &values, &ids);
        assert_eq!(
            wrong,
            0,
            "rows {rows} n {n} k {k}: {wrong} of {} differ",
            rows * k
        );
    }
}

/// The GEMV with the gated activation as its epilogue ([`GgmlTensor::matmul_t_gated`], one
/// kernel) against `act(x W_gate^T) * (x W_up^T)` in f64 from the codec's weights
/// (`ggml_kernels::check::gemv_glu_error_of`), for both activations and 1, 2, 5 and 8
/// activation rows, on the fixture blocks of the types of llama.cpp's Q4_K_M mix viewed as a
/// stacked gate/up projection of 2 x 62 rows (a workgroup's rows not all used).
#[test]
fn gated_gemv_kernel() {
    let device = burn_gguf::default_device();
    let (rows, cols) = (124usize, 256usize);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let bytes = fixture(&ty.to_string());
        let n = rows * ty.row_bytes(cols as u64).unwrap() as usize;
        let bytes = &bytes[..n];
        let reference = ggml_codec::dequantize_to_vec(ty, bytes, rows * cols).expect("codec");
        let t = GgmlTensor::from_bytes(bytes, ty, [rows, cols], &device).expect("upload");
        for (seed, m) in [1usize, 2, 5, 8].into_iter().enumerate() {
            let gelu = seed % 2 == 0;
            let x = rand_vec(m * cols, 300 + seed as u64);
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, cols]), &device);
            let y = to_vec(
                t.matmul_t_gated(xt, gelu)
                    .expect("one buffer, 8 rows at most"),
            );
            assert_eq!(y.len(), m * rows / 2, "{ty} m={m}: output length");
            let err = ggml_kernels::check::gemv_glu_error_of(&y, &x, &reference, rows, cols, gelu);
            assert!(
                err <= 1.0,
                "{ty} m={m} gelu={gelu}: error {err} x the bound"
            );
        }
    }
}

/// GEMVs launched from WGSL text through the kernel cache (`ggml_kernels::wgsl_cache`, the
/// default on WGSL) give the bits of CubeCL's own launch of the same kernels (its IR-derived
/// bind-group layout), and both match the f64 reference: own-rows passes of 1 and 4 rows, a
/// codebook type, and the gated epilogue. The two paths are pipelines of their own (the cached
/// kernel has its own id), so both run here.
#[test]
fn wgsl_cache_matches_cubecl() {
    use ggml_kernels::wgsl_cache::{CacheMode, set_mode};
    let device = burn_gguf::default_device();
    let (rows, cols) = (124usize, 256usize);
    for (ty, m, gated) in [
        (GgmlType::Q8_0, 1usize, false),
        (GgmlType::Q8_0, 3, false),
        (GgmlType::IQ3_XXS, 1, false),
        (GgmlType::Q5_0, 2, true),
    ] {
        let bytes = fixture(&ty.to_string());
        let bytes = &bytes[..rows * ty.row_bytes(cols as u64).unwrap() as usize];
        let reference = ggml_codec::dequantize_to_vec(ty, bytes, rows * cols).expect("codec");
        let t = GgmlTensor::from_bytes(bytes, ty, [rows, cols], &device).expect("upload");
        let x = rand_vec(m * cols, 500 + m as u64);
        let run = |mode: CacheMode| {
            set_mode(Some(mode));
            let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, cols]), &device);
            let y = if gated {
                t.matmul_t_gated(xt, true)
                    .expect("one buffer, 8 rows at most")
            } else {
                t.matmul_t(xt)
            };
            to_vec(y)
        };
        let cached = run(CacheMode::InProcess);
        let own = run(CacheMode::Off);
        set_mode(None);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&cached), bits(&own), "{ty} m={m} gated={gated}");
        let err = if gated {
            ggml_kernels::check::gemv_glu_error_of(&cached, &x, &reference, rows, cols, true)
        } else {
            ggml_kernels::check::gemv_error_of(&cached, &x, &reference, rows, cols)
        };
        assert!(err <= 1.0, "{ty} m={m}: error {err} x the bound");
    }
}

//! ggml blocks as Burn's own quantized tensors (`burn_gguf::qfloat`): for the Q8_0, Q4_0 and
//! MXFP4 fixture blocks (`dequant/<TYPE>.blocks.bin`, made by ggml), Burn's `dequantize()` of the
//! `QFloat` tensor equals ggml's dequantization bit for bit, on Burn's CPU backend and on wgpu;
//! Burn's quantized matmul is within 1e-4 of an f64 product; `GgufStore::keep_quantized` loads
//! an `nn::Linear` that way.
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearLayout};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_gguf::GgufStore;
use burn_gguf::qfloat::to_qfloat;
use burn_gguf_tests::{fixtures, rand_vec, read_f32s, read_fixture};
use gguf::{GgmlType, GgufFile};

const TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4];
/// The fixtures' shape: 128 rows of 256 values.
const SHAPE: [usize; 2] = [128, 256];

fn devices() -> [Device; 2] {
    [Device::flex(), burn_gguf::default_device()]
}

/// `blocks` as a QFloat tensor on `device`, dequantized by Burn; and the scheme it took.
fn burn_dequantize(
    ty: GgmlType,
    blocks: &[u8],
    shape: [usize; 2],
    device: &Device,
) -> (Vec<f32>, String) {
    let data = to_qfloat(ty, blocks, &shape, device).unwrap();
    let DType::QFloat(scheme) = data.dtype() else {
        panic!("{ty}: not a QFloat: {:?}", data.dtype())
    };
    let q = Tensor::<2>::from_data(data, device);
    let values = q.dequantize().into_data().try_to_vec::<f32>().unwrap();
    (
        values,
        format!("{:?} {:?}", scheme.value, scheme.block_scale()),
    )
}

fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let differing: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = differing.first() {
        panic!(
            "{what}: {} of {} values differ in bits; first at {i}: {} (0x{:08x}), want {} (0x{:08x})",
            differing.len(),
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

#[test]
fn dequantize_equals_ggml_bit_for_bit() {
    for device in devices() {
        for ty in TYPES {
            let blocks = read_fixture(&format!("dequant/{ty}.blocks.bin"));
            let want = read_f32s(&format!("dequant/{ty}.dequant_ggml.f32"));
            let (got, scheme) = burn_dequantize(ty, &blocks, SHAPE, &device);
            eprintln!("{ty} as {scheme} on {device:?}");
            assert_bits_eq(&format!("{ty} as {scheme} on {device:?}"), &got, &want);
        }
        // Real Gemma 3 blocks (24 rows of 640).
        let blocks = read_fixture("dequant/gemma_token_embd_Q8_0.blocks.bin");
        let want = read_f32s("dequant/gemma_token_embd_Q8_0.dequant_ggml.f32");
        let (got, scheme) = burn_dequantize(GgmlType::Q8_0, &blocks, [24, 640], &device);
        assert_bits_eq(
            &format!("Gemma Q8_0 as {scheme} on {device:?}"),
            &got,
            &want,
        );
    }
}

/// MXFP4 scales at the ends of E8M0's range: `e = 0` and `1` (subnormal scales), and a tensor
/// with `e = 255`, which has no E2M1 form (2^128 is not an f32) and takes the Q8 one.
#[test]
fn mxfp4_extreme_scales_equal_the_codec() {
    let fixture = read_fixture("dequant/MXFP4.blocks.bin");
    for device in devices() {
        for e in [[0u8, 1, 2, 254], [255, 0, 1, 127]] {
            let mut blocks = fixture[..4 * 17 * 8].to_vec(); // 4 rows of 256
            for (i, b) in blocks.chunks_exact_mut(17).enumerate() {
                b[0] = e[i % 4];
            }
            let want = ggml_codec::dequantize_to_vec(GgmlType::MXFP4, &blocks, 4 * 256).unwrap();
            let (got, scheme) = burn_dequantize(GgmlType::MXFP4, &blocks, [4, 256], &device);
            assert_bits_eq(
                &format!("MXFP4 e {e:?} as {scheme} on {device:?}"),
                &got,
                &want,
            );
        }
    }
}

/// `y = x W^T` with `W` a QFloat tensor, through Burn's quantized matmul on wgpu (the transpose
/// only changes strides there), against the f64 product of `x` and the codec's `W`: within
/// 1e-4 relative to `sum |x_k W_nk|`.
#[test]
fn quantized_matmul_is_within_1e_4_of_f64() {
    let device = burn_gguf::default_device();
    let (rows, cols, m) = (SHAPE[0], SHAPE[1], 3);
    let x = rand_vec(m * cols, 11);
    for ty in TYPES {
        let blocks = read_fixture(&format!("dequant/{ty}.blocks.bin"));
        let w = ggml_codec::dequantize_to_vec(ty, &blocks, rows * cols).unwrap();
        let q = Tensor::<2>::from_data(to_qfloat(ty, &blocks, &SHAPE, &device).unwrap(), &device);
        let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, cols]), &device);
        let y = xt
            .matmul(q.transpose())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for r in 0..m {
            for n in 0..rows {
                let (mut dot, mut mag) = (0f64, 0f64);
                for k in 0..cols {
                    let p = f64::from(x[r * cols + k]) * f64::from(w[n * cols + k]);
                    dot += p;
                    mag += p.abs();
                }
                let err = (f64::from(y[r * rows + n]) - dot).abs();
                assert!(
                    err <= 1e-4 * mag.max(f64::MIN_POSITIVE),
                    "{ty} [{r}, {n}]: {} vs f64 {dot} (sum |x w| = {mag})",
                    y[r * rows + n]
                );
            }
        }
    }
}

#[derive(Module, Debug)]
struct Projection {
    q: Linear,
}

/// `keep_quantized`: the tiny Qwen3 Q8_0 fixture's `attn_q` loads into an `nn::Linear` as a
/// QFloat weight in the file's `[out, in]` layout (`LinearLayout::Col`), and its output equals
/// the dequantized `nn::Linear`'s within 1e-4.
#[test]
fn the_store_keeps_q8_0_quantized() {
    let device = burn_gguf::default_device();
    let path = fixtures().join("gguf/tiny-qwen3-Q8_0.gguf");
    let file = GgufFile::open(&path).unwrap();
    let info = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(info.ggml_type, GgmlType::Q8_0);
    let [out, inp] = [info.shape()[0], info.shape()[1]];
    let load = |layout, quantized: bool| {
        let mut model = Projection {
            q: LinearConfig::new(inp, out)
                .with_bias(false)
                .with_layout(layout)
                .init(&device),
        };
        let mut store = GgufStore::from_file(&path)
            .with_key_remapping(r"^blk\.0\.attn_q\.", "q.")
            .allow_partial(true);
        if quantized {
            store = store.keep_quantized(&device);
        } else {
            store = store.with_from_adapter(burn::store::PyTorchToBurnAdapter);
        }
        let result = model.load_from(&mut store).unwrap();
        assert!(result.errors.is_empty(), "{result}");
        model
    };
    let native = load(LinearLayout::Col, true);
    assert!(
        matches!(native.q.weight.val().dtype(), DType::QFloat(_)),
        "{:?}",
        native.q.weight.val().dtype()
    );
    let plain = load(LinearLayout::Row, false);
    let x = Tensor::<2>::from_data(TensorData::new(rand_vec(2 * inp, 5), [2, inp]), &device);
    let a = native
        .q
        .forward(x.clone())
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let b = plain.q.forward(x).into_data().try_to_vec::<f32>().unwrap();
    let worst = burn_gguf_tests::max_abs_diff(&a, &b);
    assert!(
        worst <= 1e-4,
        "QFloat and dequantized nn::Linear differ by {worst}"
    );
}

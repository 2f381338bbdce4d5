//! Gradients through the ggml-quant tensor type and LoRA fine-tuning (issue 37, DESIGN
//! decision 10): packed products pass `dx = dy W` from their blocks and the LoRA adapters'
//! gradients equal those of the same model built from dequantized dense weights under Burn's
//! own autodiff; one f64 finite-difference check; adapters round-trip through llama.cpp's GGUF
//! adapter format and bad adapters are refused by name.
use burn::tensor::{Device, Tensor, TensorData};
use burn_gguf::nn::DenseWeight;
use burn_gguf::{GgmlLinear, GgmlTensor, GgufConfig, GgufLoader, LoraAdapter, LoraConfig, Weight};
use burn_gguf_models::finetune::{Example, FineTune, TrainConfig, sequence_loss, text_examples};
use burn_gguf_models::{Decoder, DecoderLora, GgufTokenizer};
use burn_gguf_tests::{fixtures, rand_vec};
use ggml_kernels::matmul::MatmulPath;
use gguf::{GgmlType, GgufFile};

fn autodiff_device() -> Device {
    burn_gguf::default_device().autodiff()
}

fn values(t: Tensor<2>) -> Vec<f32> {
    t.inner()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32")
}

/// Largest `|a - b|` over the largest `|b|` (1 where `b` is all zeros).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// A 2-D tensor of `ty` from a fixture file (`[rows, cols]` and its bytes), or for MXFP4 (no
/// model fixture holds it) random values quantized by the codec.
fn weight_of(ty: GgmlType) -> ([usize; 2], Vec<u8>) {
    let file_for =
        |name: &str| GgufFile::open(fixtures().join("gguf").join(name)).expect("fixture");
    let file = match ty {
        GgmlType::MXFP4 => {
            let [rows, cols] = [48, 256];
            let w: Vec<f32> = rand_vec(rows * cols, 7).iter().map(|v| v * 0.1).collect();
            return (
                [rows, cols],
                ggml_codec::quantize(ty, &w).expect("quantize MXFP4"),
            );
        }
        GgmlType::Q8_0 => file_for("tiny-qwen3-Q8_0.gguf"),
        GgmlType::Q4_K => file_for("tiny-qwen3-Q4_K_M.gguf"),
        GgmlType::IQ2_XXS => file_for("tiny-qwen3-IQ2_XXS.gguf"),
        GgmlType::TQ2_0 => file_for("tiny-qwen3-TQ2_0.gguf"),
        GgmlType::F16 => file_for("tiny-qwen3-f16.gguf"),
        other => panic!("no fixture weight of {other}"),
    };
    let info = file
        .tensors()
        .iter()
        .find(|t| t.ggml_type == ty && t.ne.len() == 2)
        .unwrap_or_else(|| panic!("a {ty} weight in the fixture"));
    let shape = info.shape();
    ([shape[0], shape[1]], file.tensor_data(info).to_vec())
}

/// The same weight packed and as a dense f32 `nn`-style weight (the codec's dequantization),
/// on `device`.
fn packed_and_dense(ty: GgmlType, device: &Device) -> (GgmlLinear, GgmlLinear, Vec<f32>) {
    let (shape, bytes) = weight_of(ty);
    let [rows, cols] = shape;
    let packed = GgmlTensor::from_bytes(&bytes, ty, shape, device).expect("pack");
    let mut dense = vec![0f32; rows * cols];
    ggml_codec::dequantize(ty, &bytes, &mut dense).expect("dequantize");
    let dense_w = DenseWeight::from_values(
        dense.clone(),
        shape,
        device,
        u64::MAX,
        burn::tensor::FloatDType::F32,
    )
    .expect("dense");
    (
        GgmlLinear {
            weight: Weight::Packed(packed),
            bias: None,
        },
        GgmlLinear {
            weight: Weight::Dense(dense_w),
            bias: None,
        },
        dense,
    )
}

/// A LoRA adapter with given (non-zero) values, trainable on `device`.
fn adapter(shape: [usize; 2], rank: usize, seed: u64, device: &Device) -> LoraAdapter {
    let [out, inp] = shape;
    let a: Vec<f32> = rand_vec(rank * inp, seed).iter().map(|v| v * 0.2).collect();
    let b: Vec<f32> = rand_vec(out * rank, seed + 1)
        .iter()
        .map(|v| v * 0.2)
        .collect();
    LoraAdapter::from_tensors(
        Tensor::from_data(TensorData::new(a, [rank, inp]), device),
        Tensor::from_data(TensorData::new(b, [out, rank]), device),
        16.0,
        0.0,
    )
}

/// `dL/dx`, `dL/dA`, `dL/dB` of `L = sum(c * (x W^T + delta(x)))` through `layer`.
fn linear_grads(
    layer: &GgmlLinear,
    lora: &LoraAdapter,
    x: &[f32],
    m: usize,
    device: &Device,
) -> [Vec<f32>; 3] {
    let [out, inp] = layer.weight.shape();
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [m, inp]), device).require_grad();
    let c = Tensor::<2>::from_data(TensorData::new(rand_vec(m * out, 99), [m, out]), device);
    let y = layer.forward(x.clone()) + lora.forward(x.clone(), 1.0);
    let grads = (y * c).sum().backward();
    let g = |t: &Tensor<2>| values(t.grad(&grads).expect("a gradient"));
    [g(&x), g(&lora.a.val()), g(&lora.b.val())]
}

/// The acceptance item: for one type of each weight family, the gradients with respect to
/// the input and to the LoRA matrices equal those of the dequantized dense layer under Burn's
/// own autodiff, within 1e-4 relative, for GEMV-sized (3 rows) and prefill-sized (80 rows)
/// inputs. The blocks get no gradient (they are not parameters at all). Both paths of the
/// product over many rows are checked: the tile kernel and the chunked dequantize + matmul
/// ([`MatmulPath`]; the override is process-wide, and a test beside this one that runs while
/// it is set takes the tile kernel, equally correct).
#[test]
fn packed_linear_gradients_equal_dense() {
    let device = autodiff_device();
    for path in [MatmulPath::Tile, MatmulPath::Chunked] {
        MatmulPath::set_override(Some(path));
        linear_gradients_equal_dense(&device, path);
    }
    MatmulPath::set_override(None);
}

fn linear_gradients_equal_dense(device: &Device, path: MatmulPath) {
    let device = device.clone();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::IQ2_XXS,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::F16,
    ] {
        let (packed, dense, _) = packed_and_dense(ty, &device);
        let shape = packed.weight.shape();
        for m in [3, 80] {
            let x = rand_vec(m * shape[1], m as u64);
            let lora = adapter(shape, 4, 11, &device);
            let got = linear_grads(&packed, &lora, &x, m, &device);
            let want = linear_grads(&dense, &lora, &x, m, &device);
            for (what, g, w) in [
                ("x", &got[0], &want[0]),
                ("A", &got[1], &want[1]),
                ("B", &got[2], &want[2]),
            ] {
                let d = rel_diff(g, w);
                assert!(
                    d <= 1e-4,
                    "{ty} {shape:?}, {m} rows, {path:?}: d{what} differs by {d} (relative)"
                );
                assert!(w.iter().any(|v| *v != 0.0), "{ty}: d{what} is all zeros");
            }
        }
    }
}

/// One f64 finite-difference check: `L = sum(c * tanh(x W^T + s B A x))` over a Q4_K weight,
/// its derivative with respect to `x` and to elements of `A` and `B` by central differences
/// in f64 (the codec's dequantized `W`), against the autodiff gradients of the packed layer.
#[test]
fn packed_lora_gradients_match_f64_finite_differences() {
    let device = autodiff_device();
    let (packed, _, w) = packed_and_dense(GgmlType::Q4_K, &device);
    let [out, inp] = packed.weight.shape();
    let (m, rank) = (2, 3);
    let lora = adapter([out, inp], rank, 5, &device);
    let x = rand_vec(m * inp, 17);
    let c = rand_vec(m * out, 99);
    let s = f64::from(lora.scale());
    let a64: Vec<f64> = values(lora.a.val()).iter().map(|&v| f64::from(v)).collect();
    let b64: Vec<f64> = values(lora.b.val()).iter().map(|&v| f64::from(v)).collect();
    let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let loss = |x: &[f64], a: &[f64], b: &[f64]| -> f64 {
        let mut total = 0.0;
        for r in 0..m {
            let xr = &x[r * inp..(r + 1) * inp];
            let ax: Vec<f64> = (0..rank)
                .map(|k| (0..inp).map(|j| a[k * inp + j] * xr[j]).sum())
                .collect();
            for o in 0..out {
                let wx: f64 = (0..inp).map(|j| f64::from(w[o * inp + j]) * xr[j]).sum();
                let bax: f64 = (0..rank).map(|k| b[o * rank + k] * ax[k]).sum();
                total += f64::from(c[r * out + o]) * (wx + s * bax).tanh();
            }
        }
        total
    };
    // Autodiff of the packed layer.
    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, inp]), &device).require_grad();
    let ct = Tensor::<2>::from_data(TensorData::new(c.clone(), [m, out]), &device);
    let y = packed.forward(xt.clone()) + lora.forward(xt.clone(), 1.0);
    let grads = (y.tanh() * ct).sum().backward();
    let gx = values(xt.grad(&grads).expect("dx"));
    let ga = values(lora.a.val().grad(&grads).expect("dA"));
    let gb = values(lora.b.val().grad(&grads).expect("dB"));
    let h = 1e-5;
    let fd = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
    for i in [0, 7, inp + 3] {
        let want = fd(&|e| {
            let mut x = x64.clone();
            x[i] += e;
            loss(&x, &a64, &b64)
        });
        assert!(
            (f64::from(gx[i]) - want).abs() <= 1e-3 * want.abs().max(1e-2),
            "dx[{i}]: {} vs {want}",
            gx[i]
        );
    }
    for i in [0, 5, inp + 1] {
        let want = fd(&|e| {
            let mut a = a64.clone();
            a[i] += e;
            loss(&x64, &a, &b64)
        });
        assert!(
            (f64::from(ga[i]) - want).abs() <= 1e-3 * want.abs().max(1e-2),
            "dA[{i}]: {} vs {want}",
            ga[i]
        );
    }
    for i in [0, 4, rank * 3 + 1] {
        let want = fd(&|e| {
            let mut b = b64.clone();
            b[i] += e;
            loss(&x64, &a64, &b)
        });
        assert!(
            (f64::from(gb[i]) - want).abs() <= 1e-3 * want.abs().max(1e-2),
            "dB[{i}]: {} vs {want}",
            gb[i]
        );
    }
}

fn load(path: &str, dequantize: bool, device: &Device) -> (GgufFile, Decoder) {
    let file = GgufFile::open(fixtures().join(path)).expect("fixture");
    let config = GgufConfig {
        dequantize,
        ..GgufConfig::default()
    };
    let model = Decoder::load(&GgufLoader::new(&file, device, config)).expect("load");
    (file, model)
}

/// The adapters' values (A and B of each, in order).
fn lora_values(l: &DecoderLora) -> Vec<Vec<f32>> {
    l.adapters()
        .iter()
        .flat_map(|a| [values(a.a.val()), values(a.b.val())])
        .collect()
}

/// Adapters with non-zero `B` (a fresh adapter's `B` is zero, which would hide `A`'s
/// gradient), the same values for every model built from one file.
fn nonzero_lora(model: &Decoder, device: &Device) -> DecoderLora {
    device.seed(3);
    let l = DecoderLora::new(model, &LoraConfig::default(), device).expect("lora");
    let mut w = l.to_gguf(&model.config().architecture).expect("writer");
    let bytes = w.to_bytes().expect("bytes");
    let file = GgufFile::from_bytes(bytes).expect("reread");
    // Refill B from A's values so every matrix is non-zero and deterministic.
    let mut out = gguf::GgufWriter::new();
    for (k, v) in file.metadata() {
        out.add_metadata(k.clone(), v.clone());
    }
    for (i, t) in file.tensors().iter().enumerate() {
        let n = t.n_elements() as usize;
        let vals: Vec<u8> = rand_vec(n, 100 + i as u64)
            .iter()
            .flat_map(|v| (v * 0.1).to_le_bytes())
            .collect();
        out.add_tensor(t.name.clone(), GgmlType::F32, &t.ne, &vals)
            .expect("tensor");
    }
    w = out;
    let file = GgufFile::from_bytes(w.to_bytes().expect("bytes")).expect("reread");
    DecoderLora::from_gguf(&file, model, 1.0, device).expect("adapter")
}

/// The acceptance item on whole models: the LoRA gradients of a sequence's loss through the
/// packed tiny Qwen3 of each family equal those through the same model with every weight
/// dequantized (Burn's autodiff over dense matmuls), within 1e-4 relative.
#[test]
fn model_lora_gradients_equal_dequantized_model() {
    let device = autodiff_device();
    let ids: Vec<u32> = vec![1, 15, 27, 301, 42, 7, 99, 3, 250, 18];
    let ex = Example {
        target: vec![true; ids.len()],
        ids,
    };
    for mix in ["Q8_0", "Q4_K_M", "IQ2_XXS", "TQ2_0", "f16"] {
        let path = format!("gguf/tiny-qwen3-{mix}.gguf");
        let grads = |dequantize: bool| {
            let (_, model) = load(&path, dequantize, &device);
            let lora = nonzero_lora(&model, &device);
            let loss = sequence_loss(&model, Some(&lora), &ex).expect("loss");
            let g = loss.backward();
            lora.adapters()
                .iter()
                .flat_map(|a| {
                    [
                        values(a.a.val().grad(&g).expect("dA")),
                        values(a.b.val().grad(&g).expect("dB")),
                    ]
                })
                .collect::<Vec<_>>()
        };
        let (packed, dense) = (grads(false), grads(true));
        assert_eq!(packed.len(), dense.len());
        for (i, (p, d)) in packed.iter().zip(&dense).enumerate() {
            let diff = rel_diff(p, d);
            assert!(
                diff <= 1e-4,
                "{mix}: gradient {i} differs by {diff} (relative)"
            );
        }
    }
}

/// Adapters written in llama.cpp's format read back with the same values; a file for another
/// architecture, a tensor the model lacks, a shape that does not fit, an unpaired tensor and
/// rank 0 or an unknown target are refused with errors naming them.
#[test]
fn adapter_files_round_trip_and_bad_ones_are_refused() {
    let device = autodiff_device();
    let (_, model) = load("arch/tiny-llama-F32.gguf", false, &device);
    let lora = nonzero_lora(&model, &device);
    let bytes = lora.to_gguf("llama").unwrap().to_bytes().unwrap();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(file.get_str("general.type").unwrap(), "adapter");
    assert_eq!(file.get_str("adapter.type").unwrap(), "lora");
    let again = DecoderLora::from_gguf(&file, &model, 1.0, &device).unwrap();
    assert_eq!(lora_values(&again), lora_values(&lora));
    assert_eq!(again.targets(), lora.targets());

    let err = |w: gguf::GgufWriter| {
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        DecoderLora::from_gguf(&f, &model, 1.0, &device)
            .unwrap_err()
            .to_string()
    };
    let other = lora.to_gguf("qwen3").unwrap();
    assert!(err(other).contains("general.architecture"));
    // Rewrite with one tensor renamed, reshaped or dropped.
    let rewrite = |f: &dyn Fn(&str, &[u64]) -> Option<(String, Vec<u64>)>| {
        let mut w = gguf::GgufWriter::new();
        for (k, v) in file.metadata() {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in file.tensors() {
            if let Some((name, ne)) = f(&t.name, &t.ne) {
                let n: u64 = ne.iter().product();
                w.add_tensor(name, GgmlType::F32, &ne, &vec![0u8; 4 * n as usize])
                    .unwrap();
            }
        }
        w
    };
    let first = file.tensors()[0].name.clone();
    let base = first.trim_end_matches(".lora_a").to_string();
    let msg = err(rewrite(&|n, ne| {
        Some((n.replace("blk.0.", "blk.99."), ne.to_vec()))
    }));
    assert!(msg.contains("blk.99."), "{msg}");
    let msg = err(rewrite(&|n, ne| {
        let mut ne = ne.to_vec();
        if n == first {
            ne[0] += 1;
        }
        Some((n.to_string(), ne))
    }));
    assert!(msg.contains(&first), "{msg}");
    let msg = err(rewrite(&|n, ne| {
        (n != format!("{base}.lora_b")).then(|| (n.to_string(), ne.to_vec()))
    }));
    assert!(msg.contains(&format!("{base}.lora_b")), "{msg}");

    let bad = |config: LoraConfig| {
        DecoderLora::new(&model, &config, &device)
            .unwrap_err()
            .to_string()
    };
    assert!(
        bad(LoraConfig {
            rank: 0,
            ..LoraConfig::default()
        })
        .contains("rank 0")
    );
    let msg = bad(LoraConfig {
        targets: vec!["attn_qkv".into()],
        ..LoraConfig::default()
    });
    assert!(
        msg.contains("'attn_qkv'") && msg.contains("attn_q"),
        "{msg}"
    );
}

/// A few steps of training on the tiny Llama lower the loss on its text, and a fresh adapter
/// leaves the model's logits as they were (B starts at zero).
#[test]
fn finetune_lowers_the_loss() {
    let device = autodiff_device();
    let (file, model) = load("arch/tiny-llama-Q8_0.gguf", false, &device);
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let data = text_examples(
        &tokenizer,
        "the cat sat on the mat and the dog sat on the log",
        64,
    )
    .unwrap();
    device.seed(1);
    let lora = DecoderLora::new(&model, &LoraConfig::default(), &device).unwrap();
    let before = values(
        sequence_loss(&model, None, &data[0])
            .unwrap()
            .reshape([1, 1]),
    );
    let fresh = values(
        sequence_loss(&model, Some(&lora), &data[0])
            .unwrap()
            .reshape([1, 1]),
    );
    assert!(
        (before[0] - fresh[0]).abs() < 1e-5,
        "{before:?} vs {fresh:?}"
    );
    let config = TrainConfig {
        lr: 3e-3,
        ..TrainConfig::default()
    };
    let mut run = FineTune::new(&model, lora, config);
    let first = run.step(&data).unwrap().loss;
    let mut last = first;
    for _ in 0..19 {
        last = run.step(&data).unwrap().loss;
    }
    assert!(last < 0.5 * first, "loss {first} -> {last}");
}

/// A loss that is not finite stops training with an error naming it, and the adapters keep
/// their values from before that step; a JSONL line that does not parse is reported with its
/// number.
#[test]
fn bad_training_input_is_reported() {
    let device = autodiff_device();
    let (file, model) = load("arch/tiny-llama-Q8_0.gguf", false, &device);
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let data = text_examples(&tokenizer, "the cat sat on the mat", 64).unwrap();
    device.seed(2);
    let lora = DecoderLora::new(&model, &LoraConfig::default(), &device).unwrap();
    // A learning rate that blows the adapters up: the loss overflows within a few steps.
    let config = TrainConfig {
        lr: 1e30,
        ..TrainConfig::default()
    };
    let mut run = FineTune::new(&model, lora, config);
    let mut last_good = lora_values(run.lora());
    let err = loop {
        let before = lora_values(run.lora());
        match run.step(&data) {
            Ok(_) => last_good = lora_values(run.lora()),
            Err(e) => {
                assert_eq!(
                    lora_values(run.lora()),
                    before,
                    "the failed step changed the adapters"
                );
                break e.to_string();
            }
        }
        assert!(run.steps() < 20, "the loss stayed finite with lr 1e30");
    };
    assert!(err.contains("loss is"), "{err}");
    assert_eq!(lora_values(run.lora()), last_good);

    let template = burn_gguf_models::ChatTemplate::from_gguf(&file, &tokenizer).unwrap();
    let ok = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
    let jsonl = format!("{ok}\n\n{ok}\n{{\"messages\": [\n");
    let err = burn_gguf_models::finetune::chat_examples(&tokenizer, &template, &jsonl, 64)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 4:"), "{err}");
    let examples =
        burn_gguf_models::finetune::chat_examples(&tokenizer, &template, ok, 64).unwrap();
    // Only the assistant's turn is learnt: "hello" and what closes the turn, not the prompt.
    let ex = &examples[0];
    let learnt: Vec<u32> = (1..ex.ids.len())
        .filter(|&i| ex.target[i])
        .map(|i| ex.ids[i])
        .collect();
    let text = tokenizer.decode(&learnt).unwrap();
    assert!(
        text.contains("hello") && !text.contains("hi"),
        "learnt {text:?}"
    );
}

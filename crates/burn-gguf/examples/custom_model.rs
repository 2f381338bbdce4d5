//! A Qwen3 written with Burn's own modules, its weights loaded from a GGUF file with
//! `GgufStore` (dequantized), and its logits compared with the fixture's float64 reference.
//!
//!     cargo run -p burn-gguf --example custom_model -- ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::store::{ModuleSnapshot, PyTorchToBurnAdapter};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_gguf::GgufStore;

/// Hyper-parameters read from the file (`qwen3.*` keys).
pub struct Config {
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub eps: f64,
    pub rope_base: f64,
}

#[derive(Module, Debug)]
pub struct Layer {
    attn_norm: RmsNorm,
    attn_q: Linear,
    attn_k: Linear,
    attn_v: Linear,
    attn_output: Linear,
    attn_q_norm: RmsNorm,
    attn_k_norm: RmsNorm,
    ffn_norm: RmsNorm,
    ffn_gate: Linear,
    ffn_up: Linear,
    ffn_down: Linear,
}

#[derive(Module, Debug)]
pub struct Qwen3 {
    token_embd: Embedding,
    layers: Vec<Layer>,
    output_norm: RmsNorm,
    output: Linear,
}

impl Qwen3 {
    /// An untrained model of `c`'s shapes; `load_from` fills it.
    pub fn new(c: &Config, device: &Device) -> Self {
        let lin = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        let norm = |d| RmsNormConfig::new(d).with_epsilon(c.eps).init(device);
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let layer = || Layer {
            attn_norm: norm(c.dim),
            attn_q: lin(c.dim, q),
            attn_k: lin(c.dim, kv),
            attn_v: lin(c.dim, kv),
            attn_output: lin(q, c.dim),
            attn_q_norm: norm(c.head_dim),
            attn_k_norm: norm(c.head_dim),
            ffn_norm: norm(c.dim),
            ffn_gate: lin(c.dim, c.ffn),
            ffn_up: lin(c.dim, c.ffn),
            ffn_down: lin(c.ffn, c.dim),
        };
        Self {
            token_embd: EmbeddingConfig::new(c.vocab, c.dim).init(device),
            layers: (0..c.layers).map(|_| layer()).collect(),
            output_norm: norm(c.dim),
            output: lin(c.dim, c.vocab),
        }
    }

    /// Logits `[n, vocab]` of the tokens `ids` (causal attention over them).
    pub fn forward(&self, c: &Config, ids: &[u32]) -> Tensor<2> {
        let (n, hd, device) = (ids.len(), c.head_dim, self.output.weight.val().device());
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, n]),
            &device,
        );
        let mut x = self.token_embd.forward(ids).reshape([n, c.dim]);
        // NEOX RoPE angles p * base^(-2i / head_dim) and the causal mask.
        let angles: Vec<f32> = (0..n)
            .flat_map(|p| {
                (0..hd / 2)
                    .map(move |i| (p as f64 * c.rope_base.powf(-2.0 * i as f64 / hd as f64)) as f32)
            })
            .collect();
        let angles = Tensor::<2>::from_data(TensorData::new(angles, [n, hd / 2]), &device)
            .unsqueeze_dim::<3>(1);
        let (cos, sin) = (angles.clone().cos(), angles.sin());
        let rope = |t: Tensor<3>| {
            let (a, b) = (t.clone().narrow(2, 0, hd / 2), t.narrow(2, hd / 2, hd / 2));
            Tensor::cat(
                vec![
                    a.clone() * cos.clone() - b.clone() * sin.clone(),
                    b * cos.clone() + a * sin.clone(),
                ],
                2,
            )
        };
        let mask: Vec<f32> = (0..n * n)
            .map(|i| {
                if i % n > i / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [n, n]), &device).unsqueeze::<3>();
        for l in &self.layers {
            let h = l.attn_norm.forward(x.clone());
            let q = rope(
                l.attn_q_norm
                    .forward(l.attn_q.forward(h.clone()).reshape([n, c.heads, hd])),
            )
            .swap_dims(0, 1);
            let k = rope(
                l.attn_k_norm
                    .forward(l.attn_k.forward(h.clone()).reshape([n, c.kv_heads, hd])),
            )
            .swap_dims(0, 1);
            let v = l
                .attn_v
                .forward(h)
                .reshape([n, c.kv_heads, hd])
                .swap_dims(0, 1);
            let rep = c.heads / c.kv_heads; // query head j reads KV head j / rep
            let (k, v) = (
                k.repeat_dim(1, rep).reshape([c.heads, n, hd]),
                v.repeat_dim(1, rep).reshape([c.heads, n, hd]),
            );
            let att = softmax(
                q.matmul(k.swap_dims(1, 2)) / (hd as f64).sqrt() + mask.clone(),
                2,
            );
            x = x + l
                .attn_output
                .forward(att.matmul(v).swap_dims(0, 1).reshape([n, c.heads * hd]));
            let h = l.ffn_norm.forward(x.clone());
            x = x + l
                .ffn_down
                .forward(silu(l.ffn_gate.forward(h.clone())) * l.ffn_up.forward(h));
        }
        self.output.forward(self.output_norm.forward(x))
    }
}

/// The file's `qwen3.*` hyper-parameters and a Burn model of them with its weights loaded.
pub fn load(path: &str, device: &Device) -> Result<(Config, Qwen3), Box<dyn std::error::Error>> {
    let mut store = GgufStore::from_file(path)
        .with_key_remapping(r"^blk\.(\d+)\.", "layers.$1.")
        .with_from_adapter(PyTorchToBurnAdapter);
    let f = store.file()?.clone();
    let u = |k: &str| f.get_u32(&format!("qwen3.{k}")).map(|v| v as usize);
    let c = Config {
        dim: u("embedding_length")?,
        layers: u("block_count")?,
        heads: u("attention.head_count")?,
        kv_heads: u("attention.head_count_kv")?,
        head_dim: u("attention.key_length")?,
        ffn: u("feed_forward_length")?,
        vocab: f
            .tensor("token_embd.weight")
            .ok_or("no token_embd")?
            .shape()[0],
        eps: f.get_f32("qwen3.attention.layer_norm_rms_epsilon")? as f64,
        rope_base: f.get_f32("qwen3.rope.freq_base")? as f64,
    };
    let mut model = Qwen3::new(&c, device);
    println!("{}", model.load_from(&mut store)?);
    Ok((c, model))
}

#[allow(dead_code)] // the tests include this file for `load` and `Qwen3`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or("../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf".into());
    let (c, model) = load(&path, &Device::flex())?;
    let logits = model.forward(&c, &[299, 296, 336, 0, 319, 298, 269, 220]);
    println!(
        "logits {:?}, last row argmax {}",
        logits.dims(),
        logits.narrow(0, 7, 1).argmax(1).into_scalar::<i64>()
    );
    Ok(())
}

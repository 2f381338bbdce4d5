//! A Qwen3 written with Burn's own modules, its weights loaded from a GGUF file with
//! `GgufStore`: once with `nn::Linear` projections (dequantized), once with packed
//! `GgmlLinear` ones (loaded by name from the same store). `tests/tests/store.rs` checks both
//! against the fixture's float64 reference logits.
//!
//!     cargo run -p burn-gguf --example custom_model -- ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::store::{ModuleSnapshot, PyTorchToBurnAdapter};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_gguf::{GgmlLinear, GgufConfig, GgufStore};
use std::error::Error;

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

/// A projection `x W^T`: Burn's `nn::Linear` (weights dequantized by `GgufStore`) or
/// burn-gguf's `GgmlLinear` (blocks kept packed, decoded by the fused GEMV on a GPU).
pub trait Proj: Module + burn::module::ModuleDisplay {
    /// `x` `[n, in]` -> `[n, out]`.
    fn project(&self, x: Tensor<2>) -> Tensor<2>;
}
impl Proj for Linear {
    fn project(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}
impl Proj for GgmlLinear {
    fn project(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}

#[derive(Module, Debug)]
pub struct Layer<L: Module> {
    attn_norm: RmsNorm,
    attn_q: L,
    attn_k: L,
    attn_v: L,
    attn_output: L,
    attn_q_norm: RmsNorm,
    attn_k_norm: RmsNorm,
    ffn_norm: RmsNorm,
    ffn_gate: L,
    ffn_up: L,
    ffn_down: L,
}

#[derive(Module, Debug)]
pub struct Qwen3<L: Module> {
    token_embd: Embedding,
    layers: Vec<Layer<L>>,
    output_norm: RmsNorm,
    output: L,
}

impl<L: Proj> Qwen3<L> {
    /// A model of `c`'s shapes, its projections from `proj(GGUF name, in, out)` and every other
    /// parameter untrained (`load_from` fills them).
    pub fn new<E>(
        c: &Config,
        device: &Device,
        mut proj: impl FnMut(&str, usize, usize) -> Result<L, E>,
    ) -> Result<Self, E> {
        let norm = |d| RmsNormConfig::new(d).with_epsilon(c.eps).init(device);
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut layers = Vec::new();
        for il in 0..c.layers {
            let mut p = |name: &str, i, o| proj(&format!("blk.{il}.{name}.weight"), i, o);
            layers.push(Layer {
                attn_norm: norm(c.dim),
                attn_q: p("attn_q", c.dim, q)?,
                attn_k: p("attn_k", c.dim, kv)?,
                attn_v: p("attn_v", c.dim, kv)?,
                attn_output: p("attn_output", q, c.dim)?,
                attn_q_norm: norm(c.head_dim),
                attn_k_norm: norm(c.head_dim),
                ffn_norm: norm(c.dim),
                ffn_gate: p("ffn_gate", c.dim, c.ffn)?,
                ffn_up: p("ffn_up", c.dim, c.ffn)?,
                ffn_down: p("ffn_down", c.ffn, c.dim)?,
            });
        }
        Ok(Self {
            token_embd: EmbeddingConfig::new(c.vocab, c.dim).init(device),
            layers,
            output_norm: norm(c.dim),
            output: proj("output.weight", c.dim, c.vocab)?,
        })
    }

    /// Logits `[n, vocab]` of the tokens `ids` (causal attention over them).
    pub fn forward(&self, c: &Config, ids: &[u32]) -> Tensor<2> {
        let (n, hd, device) = (ids.len(), c.head_dim, self.token_embd.weight.val().device());
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
                    .forward(l.attn_q.project(h.clone()).reshape([n, c.heads, hd])),
            )
            .swap_dims(0, 1);
            let k = rope(
                l.attn_k_norm
                    .forward(l.attn_k.project(h.clone()).reshape([n, c.kv_heads, hd])),
            )
            .swap_dims(0, 1);
            let v = l
                .attn_v
                .project(h)
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
                .project(att.matmul(v).swap_dims(0, 1).reshape([n, c.heads * hd]));
            let h = l.ffn_norm.forward(x.clone());
            x = x + l
                .ffn_down
                .project(silu(l.ffn_gate.project(h.clone())) * l.ffn_up.project(h));
        }
        self.output.project(self.output_norm.forward(x))
    }
}

type Loaded<L> = Result<(Config, Qwen3<L>), Box<dyn Error>>;

/// The file's `qwen3.*` hyper-parameters and a model of them with Burn's `nn::Linear`
/// projections, every weight loaded (dequantized) through `GgufStore`.
pub fn load(path: &str, device: &Device) -> Loaded<Linear> {
    load_with(path, device, |_, _, i, o| {
        Ok(LinearConfig::new(i, o).with_bias(false).init(device))
    })
}

/// The same model with packed `GgmlLinear` projections, loaded by name from the same store
/// (`GgufStore::loader`: the blocks stay quantized on a GPU; the CPU backend dequantizes them),
/// and the embedding and norms through `load_from` as in [`load`].
pub fn load_packed(path: &str, device: &Device) -> Loaded<GgmlLinear> {
    load_with(path, device, |store, name, _, _| {
        Ok(store.loader(device, GgufConfig::default())?.linear(name)?)
    })
}

fn load_with<L: Proj>(
    path: &str,
    device: &Device,
    mut proj: impl FnMut(&mut GgufStore, &str, usize, usize) -> Result<L, Box<dyn Error>>,
) -> Loaded<L> {
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
    let mut model = Qwen3::new(&c, device, |name, i, o| proj(&mut store, name, i, o))?;
    // Packed projections are not parameters: their tensors show as unused here.
    println!("{}", model.load_from(&mut store)?);
    Ok((c, model))
}

#[allow(dead_code)] // the tests include this file for `load` and `Qwen3`
fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or("../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf".into());
    let ids = [299, 296, 336, 0, 319, 298, 269, 220];
    let device = burn_gguf::default_device();
    let (c, plain) = load(&path, &device)?;
    let (_, packed) = load_packed(&path, &device)?;
    let (a, b) = (plain.forward(&c, &ids), packed.forward(&c, &ids));
    let diff = (a.clone() - b).abs().max().into_scalar::<f32>();
    let next = a.narrow(0, ids.len() - 1, 1).argmax(1).into_scalar::<i64>();
    println!("next token {next}; nn::Linear and GgmlLinear logits differ by at most {diff}");
    Ok(())
}

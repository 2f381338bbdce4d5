//! LoRA adapters over packed layers (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
//! Language Models"): the packed weight `W` stays frozen on the device and a small trainable
//! pair `A` `[r, in]`, `B` `[out, r]` adds `(alpha / r) B (A x)` to its output, unmerged, as
//! llama.cpp applies its adapters (`src/llama-graph.cpp` `build_lora_mm`: two small GEMMs
//! beside the quantized product). Under Burn's `Autodiff`, `A` and `B` are the only
//! parameters ([`LoraAdapter`] is a `Module` whose params are those two), so an optimizer over
//! a module of adapters trains them and nothing else.
use crate::nn::GgmlLinear;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{Device, Distribution, Tensor};

/// LoRA hyper-parameters (the fields of peft's `LoraConfig` that llama.cpp's adapters keep).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r`: `A` is `[r, in]`, `B` `[out, r]`. At least 1.
    pub rank: usize,
    /// `alpha`: the update is scaled by `alpha / r` (llama.cpp `adapter.lora.alpha`).
    pub alpha: f32,
    /// Dropout probability on the adapter's input while training (0 for none).
    pub dropout: f64,
    /// The layer tensors adapted, by their GGUF names without the `blk.N.` prefix and the
    /// `.weight` suffix (`attn_q`, `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`,
    /// `ffn_down`; `attn_qkv` where a file fuses Q, K and V).
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    /// Rank 8, alpha 16, no dropout, every attention and FFN projection (QLoRA's choice:
    /// adapting all linear layers matches full fine-tuning best).
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: DEFAULT_TARGETS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The projections [`LoraConfig::default`] adapts.
pub const DEFAULT_TARGETS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// The low-rank update of one linear layer `[out, in]`:
/// `delta(x) = scale * dropout(x) A^T B^T` with `scale = alpha / r`, `A` `[r, in]`, `B`
/// `[out, r]` (Burn order; llama.cpp's `lora_a` has `ne = [in, r]`, `lora_b` `ne = [r, out]`).
#[derive(Module, Debug)]
pub struct LoraAdapter {
    /// `A` `[r, in]` f32.
    pub a: Param<Tensor<2>>,
    /// `B` `[out, r]` f32.
    pub b: Param<Tensor<2>>,
    /// `alpha` (the update is scaled by `alpha / r`).
    pub alpha: f32,
    dropout: Dropout,
}

impl LoraAdapter {
    /// A new adapter for a layer `[out, in]` on `device`, initialised as peft does: `A` from
    /// `U(-1/sqrt(in), 1/sqrt(in))` (Kaiming-uniform with `a = sqrt(5)`), `B` zeros, so the
    /// adapted layer starts equal to the base one.
    ///
    /// # Panics
    /// If `config.rank`, `out` or `in` is 0 (the callers check the config first).
    pub fn new(shape: [usize; 2], config: &LoraConfig, device: &Device) -> Self {
        let [out, inp] = shape;
        assert!(
            config.rank > 0 && out > 0 && inp > 0,
            "LoRA: rank {} for [{out}, {inp}]",
            config.rank
        );
        let bound = 1.0 / (inp as f64).sqrt();
        let a = Tensor::random(
            [config.rank, inp],
            Distribution::Uniform(-bound, bound),
            device,
        );
        let b = Tensor::zeros([out, config.rank], device);
        Self::from_tensors(a, b, config.alpha, config.dropout)
    }

    /// An adapter from its matrices, `a` `[r, in]` and `b` `[out, r]` (as read from an adapter
    /// file), trainable where the device has autodiff.
    ///
    /// # Panics
    /// If the inner dimensions differ (callers check shapes and name the tensor first).
    pub fn from_tensors(a: Tensor<2>, b: Tensor<2>, alpha: f32, dropout: f64) -> Self {
        assert_eq!(
            a.dims()[0],
            b.dims()[1],
            "LoRA: A {:?} and B {:?} differ in rank",
            a.dims(),
            b.dims()
        );
        Self {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            alpha,
            dropout: DropoutConfig::new(dropout).init(),
        }
    }

    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.a.dims()[0]
    }

    /// `[out, in]` of the adapted layer.
    pub fn shape(&self) -> [usize; 2] {
        [self.b.dims()[0], self.a.dims()[1]]
    }

    /// `alpha / r`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank() as f32
    }

    /// The update `scale * user_scale * (x A^T) B^T` for `x` `[..., in]` -> `[..., out]`
    /// (`user_scale`: llama.cpp's `--lora-scaled` factor, 1 for training).
    ///
    /// # Panics
    /// If `x`'s last dimension is not `in` (a programming error in the caller's shapes).
    pub fn forward<const D: usize>(&self, x: Tensor<D>, user_scale: f32) -> Tensor<D> {
        let dims = x.dims();
        let [out, inp] = self.shape();
        assert_eq!(
            dims[D - 1],
            inp,
            "LoRA: input has {} features, the adapter {inp}",
            dims[D - 1]
        );
        let m = dims[..D - 1].iter().product::<usize>();
        let x = self.dropout.forward(x.reshape([m, inp]));
        let y = x
            .matmul(self.a.val().transpose())
            .matmul(self.b.val().transpose())
            * (self.scale() * user_scale) as f64;
        let mut out_dims = dims;
        out_dims[D - 1] = out;
        y.reshape(out_dims)
    }
}

/// A packed linear layer with an optional LoRA adapter: `y = x W^T (+ b) + delta(x)`, for a
/// user's own Burn module (a field loaded with [`crate::GgufStore::loader`]). Its only
/// parameters are the adapter's.
#[derive(Module, Debug)]
pub struct LoraLinear {
    /// The frozen layer.
    pub base: GgmlLinear,
    /// The trainable update, if any.
    pub lora: Option<LoraAdapter>,
}

impl LoraLinear {
    /// `base` with a new adapter of `config` (B zero: the output starts equal to `base`'s).
    ///
    /// # Panics
    /// If `config.rank` is 0.
    pub fn new(base: GgmlLinear, config: &LoraConfig, device: &Device) -> Self {
        let lora = LoraAdapter::new(base.weight.shape(), config, device);
        Self {
            base,
            lora: Some(lora),
        }
    }

    /// Applies the layer to `x` `[..., in]` -> `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let y = self.base.forward(x.clone());
        match &self.lora {
            Some(l) => y + l.forward(x, 1.0),
            None => y,
        }
    }
}

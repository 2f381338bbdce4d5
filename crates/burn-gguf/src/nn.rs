//! Packed modules: Linear, Embedding and MoE experts over ggml-quant weights, or over their
//! dense fallback.
use crate::Error;
use crate::tensor::GgmlTensor;
use burn::tensor::activation::silu;
use burn::tensor::{Tensor, TensorData};

/// A weight `[out, in]` (Burn order; ggml `ne = [in, out]`): packed blocks on the device, or a
/// dense f32 tensor when the loader fell back to dequantization.
// A Burn tensor is larger than a GgmlTensor; weights are few and long-lived, so no boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Weight {
    /// Raw ggml blocks, decoded in the kernels.
    Packed(GgmlTensor),
    /// Dequantized at load, `[out, in]` f32.
    Dense(Tensor<2>),
}

impl Weight {
    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Weight::Packed(t) => t.shape(),
            Weight::Dense(t) => t.dims(),
        }
    }

    /// `x W^T` for `x` `[m, in]` -> `[m, out]`.
    pub fn matmul_t(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Weight::Packed(t) => t.matmul_t(x),
            Weight::Dense(w) => x.matmul(w.clone().transpose()),
        }
    }

    /// Rows `ids` of the weight, `[ids.len(), in]` f32.
    ///
    /// # Errors
    /// [`Error::Shape`] if an id is not below `out`.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor<2>, Error> {
        match self {
            Weight::Packed(t) => t.gather_rows(ids),
            Weight::Dense(w) => {
                let [rows, _] = w.dims();
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= rows) {
                    return Err(Error::Shape(format!(
                        "row id {bad} out of range for {rows} rows"
                    )));
                }
                let device = w.device();
                let idx = Tensor::<1, burn::tensor::Int>::from_data(
                    burn::tensor::TensorData::new(
                        ids.iter().map(|&i| i as i64).collect(),
                        [ids.len()],
                    ),
                    &device,
                );
                Ok(w.clone().select(0, idx))
            }
        }
    }

    /// Whether the weight stays packed on the device.
    pub fn is_packed(&self) -> bool {
        matches!(self, Weight::Packed(_))
    }
}

/// `y = x W^T (+ b)`, like `burn::nn::Linear` but with a ggml weight. Input `[..., in]`,
/// output `[..., out]`.
#[derive(Clone, Debug)]
pub struct GgmlLinear {
    /// `[out, in]`.
    pub weight: Weight,
    /// `[out]`, if any.
    pub bias: Option<Tensor<1>>,
}

impl GgmlLinear {
    /// Applies the layer to `x` `[..., in]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dims = x.dims();
        let [out, inp] = self.weight.shape();
        assert_eq!(
            dims[D - 1],
            inp,
            "GgmlLinear: input has {} features, the weight {inp}",
            dims[D - 1]
        );
        let m = dims[..D - 1].iter().product::<usize>();
        let y = self.weight.matmul_t(x.reshape([m, inp]));
        let y = match &self.bias {
            Some(b) => y + b.clone().unsqueeze::<2>(),
            None => y,
        };
        let mut out_dims = dims;
        out_dims[D - 1] = out;
        y.reshape(out_dims)
    }
}

/// Token embedding `[vocab, dim]` over a ggml weight: a lookup dequantizes only the rows it
/// needs. With tied embeddings the same weight is the output head ([`GgmlEmbedding::as_linear`]).
#[derive(Clone, Debug)]
pub struct GgmlEmbedding {
    /// `[vocab, dim]`.
    pub weight: Weight,
}

impl GgmlEmbedding {
    /// Embeddings of `ids`: `[ids.len(), dim]` f32.
    ///
    /// # Errors
    /// [`Error::Shape`] if an id is not below the vocabulary size.
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor<2>, Error> {
        self.weight.rows(ids)
    }

    /// The same weight as a Linear `[dim] -> [vocab]` (tied output head).
    pub fn as_linear(&self) -> GgmlLinear {
        GgmlLinear {
            weight: self.weight.clone(),
            bias: None,
        }
    }
}

/// Mixture-of-experts FFN banks `[n_expert, d_ff, d_model]` (gate, up) and
/// `[n_expert, d_model, d_ff]` (down), Burn order (ggml `ne = [d_model, d_ff, n_expert]`), one
/// [`Weight`] per expert: the file's blocks of each expert, packed, or dequantized where no kernel
/// fits. Only the experts a token is routed to run.
#[derive(Clone, Debug)]
pub struct GgmlExperts {
    /// `n_expert` weights `[d_ff, d_model]`.
    pub gate: Vec<Weight>,
    /// `n_expert` weights `[d_ff, d_model]`.
    pub up: Vec<Weight>,
    /// `n_expert` weights `[d_model, d_ff]`.
    pub down: Vec<Weight>,
}

impl GgmlExperts {
    /// Experts in the bank.
    pub fn n_expert(&self) -> usize {
        self.gate.len()
    }

    /// `y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))` with `e = ids[t, j]`, for
    /// `x` `[n, d_model]`, `ids` and `weights` `[n, k]` row-major (host values: the router's
    /// choice). Each expert runs once, on the tokens routed to it (the fused GEMV for up to 8 of
    /// them). Returns `[n, d_model]`.
    ///
    /// # Errors
    /// [`Error::Shape`] when `ids` and `weights` differ in length or are not `n * k` long, or an
    /// id is not below [`GgmlExperts::n_expert`].
    pub fn forward(
        &self,
        x: Tensor<2>,
        ids: &[u32],
        weights: &[f32],
        k: usize,
    ) -> Result<Tensor<2>, Error> {
        let [n, d] = x.dims();
        if ids.len() != weights.len() || ids.len() != n * k {
            return Err(Error::Shape(format!(
                "experts: {} ids and {} weights for {n} tokens x {k}",
                ids.len(),
                weights.len()
            )));
        }
        if let Some(bad) = ids.iter().find(|&&e| e as usize >= self.n_expert()) {
            return Err(Error::Shape(format!(
                "expert id {bad} out of range for {} experts",
                self.n_expert()
            )));
        }
        let device = x.device();
        let mut out = Tensor::<2>::zeros([n, d], &device);
        for e in 0..self.n_expert() {
            // The (token, weight) pairs routed to expert e.
            let routed: Vec<(usize, f32)> = (0..n * k)
                .filter(|&i| ids[i] as usize == e)
                .map(|i| (i / k, weights[i]))
                .collect();
            if routed.is_empty() {
                continue;
            }
            let r = routed.len();
            // One-hot gather [r, n] and weighted scatter [n, r] matrices.
            let mut gather = vec![0f32; r * n];
            let mut scatter = vec![0f32; n * r];
            for (j, &(t, w)) in routed.iter().enumerate() {
                gather[j * n + t] = 1.0;
                scatter[t * r + j] = w;
            }
            let gather = Tensor::<2>::from_data(TensorData::new(gather, [r, n]), &device);
            let scatter = Tensor::<2>::from_data(TensorData::new(scatter, [n, r]), &device);
            let xe = gather.matmul(x.clone());
            let h = silu(self.gate[e].matmul_t(xe.clone())) * self.up[e].matmul_t(xe);
            out = out + scatter.matmul(self.down[e].matmul_t(h));
        }
        Ok(out)
    }
}

//! Packed modules: Linear and Embedding over a ggml-quant weight, or over its dense fallback.
use crate::Error;
use crate::tensor::GgmlTensor;
use burn::tensor::Tensor;

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

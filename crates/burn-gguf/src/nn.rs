//! Packed modules: Linear and Embedding over ggml-quant weights, or over their
//! dense fallback; and the models' per-layer ops that run as one kernel each on a CubeCL
//! device ([`rms_norm`], [`rope`], [`gated`]).
use crate::Error;
use crate::ops::GgmlOps;
use crate::tensor::GgmlTensor;
use burn::backend::{Dispatch, DispatchDevice};
use burn::module::{
    Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
};
use burn::tensor::activation::silu;
use burn::tensor::{Device, FloatDType, Tensor, TensorData};

/// RMSNorm over the last dimension, `x / sqrt(mean(x^2) + eps) * w`: `x` `[..., d]` f32 and
/// `w` `[d]` f32 give the shape of `x`, in f32 (activations and the residual stream stay f32,
/// case C21). On a CubeCL device it is one kernel ([`ggml_kernels::launch_rms_norm`], llama.cpp's
/// `rms_norm` and `mul` fused); on other devices, Burn ops.
///
/// # Panics
/// If `w` does not have `d` values (a programming error in the caller's shapes).
pub fn rms_norm<const D: usize>(x: Tensor<D>, w: &Tensor<1>, eps: f32) -> Tensor<D> {
    let d = x.dims()[D - 1];
    assert_eq!(
        w.dims()[0],
        d,
        "rms_norm: the weight has {} values, the rows {d}",
        w.dims()[0]
    );
    if is_cube(&x.device()) {
        return Tensor::from_dispatch(Dispatch::ggml_rms_norm(
            x.into_dispatch(),
            w.clone().into_dispatch(),
            eps,
        ));
    }
    let inv = (x.clone().powi_scalar(2).mean_dim(D - 1) + eps)
        .sqrt()
        .recip();
    x * inv * w.clone().unsqueeze::<D>()
}

/// How RoPE pairs the dimensions of a head (llama.cpp `LLAMA_ROPE_TYPE_*`, case C16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Element `i` rotates with `i + d/2` (GPT-NeoX; Qwen, Gemma).
    Neox,
    /// Adjacent pairs `(2i, 2i + 1)` (llama.cpp's `llama`, whose converter permutes Q and K
    /// for it).
    Norm,
}

/// Rotary position embedding: `x` `[n, heads, d]` f32, each pair `i` of token `t`'s heads
/// rotated by the angle whose cosine and sine are `cos[t, i]` and `sin[t, i]` (`[n, r/2]` f32
/// each): `(x1 cos - x2 sin, x1 sin + x2 cos)`, the pairs as `style` says among the first `r`
/// values of each head (`r` = `d` but for partial rotary, e.g. Qwen3.5's 16 of 64); values
/// past `r` are kept. The shape of `x`. On a CubeCL device one kernel
/// ([`ggml_kernels::launch_rope`]); elsewhere Burn ops.
///
/// # Panics
/// If the tables are not `[n, r/2]` with `r` even and at most `d` (a programming error in the
/// caller's shapes).
pub fn rope(x: Tensor<3>, cos: &Tensor<2>, sin: &Tensor<2>, style: RopeStyle) -> Tensor<3> {
    let [n, h, d] = x.dims();
    let half = cos.dims()[1];
    assert!(
        2 * half <= d && half > 0 && cos.dims() == [n, half] && sin.dims() == [n, half],
        "rope: x {:?}, cos {:?}, sin {:?}",
        x.dims(),
        cos.dims(),
        sin.dims()
    );
    if 2 * half < d {
        let kept = x.clone().narrow(2, 2 * half, d - 2 * half);
        let rotated = rope(x.narrow(2, 0, 2 * half), cos, sin, style);
        return Tensor::cat(vec![rotated, kept], 2);
    }
    if is_cube(&x.device()) {
        return Tensor::from_dispatch(Dispatch::ggml_rope(
            x.into_dispatch(),
            cos.clone().into_dispatch(),
            sin.clone().into_dispatch(),
            style == RopeStyle::Neox,
        ));
    }
    let cos = cos.clone().reshape([n, 1, half]);
    let sin = sin.clone().reshape([n, 1, half]);
    match style {
        RopeStyle::Neox => {
            let x1 = x.clone().narrow(2, 0, half);
            let x2 = x.narrow(2, half, half);
            let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
            let r2 = x1 * sin + x2 * cos;
            Tensor::cat(vec![r1, r2], 2)
        }
        RopeStyle::Norm => {
            let pairs = x.reshape([n, h, half, 2]);
            let x1 = pairs.clone().narrow(3, 0, 1).reshape([n, h, half]);
            let x2 = pairs.narrow(3, 1, 1).reshape([n, h, half]);
            let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
            let r2 = x1 * sin + x2 * cos;
            Tensor::stack::<4>(vec![r1, r2], 3).reshape([n, h, d])
        }
    }
}

/// The activation of a feed-forward block's gate projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (Llama, Qwen).
    Silu,
    /// ggml's GELU, tanh approximation (Gemma).
    GeluTanh,
}

/// A gated feed-forward activation, `act(gate) * up` elementwise (llama.cpp `ggml_swiglu`,
/// `ggml_geglu`): f32 tensors of one shape give that shape. With [`Activation::GeluTanh`],
/// `act(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`. On a CubeCL device one kernel
/// ([`ggml_kernels::launch_glu`]); elsewhere Burn ops.
///
/// # Panics
/// If `gate` and `up` differ in shape (a programming error in the caller's shapes).
pub fn gated<const D: usize>(gate: Tensor<D>, up: Tensor<D>, act: Activation) -> Tensor<D> {
    assert_eq!(gate.dims(), up.dims(), "gated: gate and up differ in shape");
    if is_cube(&gate.device()) {
        return Tensor::from_dispatch(Dispatch::ggml_glu(
            gate.into_dispatch(),
            up.into_dispatch(),
            act == Activation::GeluTanh,
        ));
    }
    let a = match act {
        Activation::Silu => silu(gate),
        Activation::GeluTanh => {
            const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
            let x = gate;
            let x3 = x.clone() * x.clone() * x.clone();
            let inner = (x.clone() + x3 * 0.044715) * SQRT_2_OVER_PI;
            x * (inner.tanh() + 1.0) * 0.5
        }
    };
    a * up
}

/// `act(gate) * up` of a stacked gate/up projection: `gate_up` `[n, 2 * width]` f32, the gate
/// in the first `width` columns and up in the rest (one GEMV of [`crate::GgufLoader::stacked_linear`]
/// over `ffn_gate` and `ffn_up`) -> `[n, width]`. On a CubeCL device one kernel
/// ([`ggml_kernels::launch_glu`]); elsewhere [`gated`] over the two halves.
///
/// # Panics
/// If the row length is odd (a programming error in the caller's shapes).
pub fn gated_stacked(gate_up: Tensor<2>, act: Activation) -> Tensor<2> {
    let [_, cols] = gate_up.dims();
    assert!(cols % 2 == 0, "gated_stacked: rows of {cols} values");
    if is_cube(&gate_up.device()) {
        return Tensor::from_dispatch(Dispatch::ggml_glu_stacked(
            gate_up.into_dispatch(),
            act == Activation::GeluTanh,
        ));
    }
    let width = cols / 2;
    let gate = gate_up.clone().narrow(1, 0, width);
    gated(gate, gate_up.narrow(1, width, width), act)
}

/// The residual step between two sub-layers: `x_out = x + o'` with `o' = rms_norm(o, pre)`
/// when `pre` is given (Gemma's post-attention / post-FFN norm) or `o' = o`, and
/// `h = rms_norm(x_out, w)`, the next sub-layer's input. `x`, `o` `[n, d]` f32, `pre`, `w`
/// `[d]` f32; returns `(x_out, h)`, `[n, d]` each. On a CubeCL device one kernel
/// ([`ggml_kernels::launch_add_rms_norm`], equal to the unfused ops bit for bit); elsewhere
/// Burn ops.
///
/// # Panics
/// If the shapes differ (a programming error in the caller's shapes).
pub fn add_rms_norm(
    x: Tensor<2>,
    o: Tensor<2>,
    pre: Option<&Tensor<1>>,
    w: &Tensor<1>,
    eps: f32,
) -> (Tensor<2>, Tensor<2>) {
    let d = x.dims()[1];
    assert!(
        o.dims() == x.dims() && w.dims() == [d] && pre.is_none_or(|p| p.dims() == [d]),
        "add_rms_norm: x {:?}, o {:?}, w {:?}",
        x.dims(),
        o.dims(),
        w.dims()
    );
    if is_cube(&x.device()) {
        let (x_out, h) = Dispatch::ggml_add_rms_norm(
            x.into_dispatch(),
            o.into_dispatch(),
            pre.unwrap_or(w).clone().into_dispatch(),
            w.clone().into_dispatch(),
            eps,
            pre.is_some(),
        );
        return (Tensor::from_dispatch(x_out), Tensor::from_dispatch(h));
    }
    let o = match pre {
        Some(p) => rms_norm(o, p, eps),
        None => o,
    };
    let x = x + o;
    let h = rms_norm(x.clone(), w, eps);
    (x, h)
}

/// Whether `device` is a CubeCL one, where the fused kernels run.
pub(crate) fn is_cube(device: &Device) -> bool {
    matches!(device.as_dispatch(), DispatchDevice::Cube(_))
}

/// A weight `[out, in]` (Burn order; ggml `ne = [in, out]`): packed blocks on the device, or
/// dense f32 when the loader fell back to dequantization.
// A Burn tensor is larger than a GgmlTensor; weights are few and long-lived, so no boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Weight {
    /// Raw ggml blocks, decoded in the kernels.
    Packed(GgmlTensor),
    /// Dequantized at load.
    Dense(DenseWeight),
}

/// A dequantized weight `[out, in]` f32, split by rows into parts that each fit one device
/// buffer (Gemma 3's 262,144 x 640 embedding is 671 MB of f32; lavapipe's buffers hold 128 MiB).
#[derive(Clone, Debug)]
pub struct DenseWeight {
    /// `(first row, [rows, in])` per part, in row order.
    parts: Vec<(usize, Tensor<2>)>,
    shape: [usize; 2],
}

impl DenseWeight {
    /// One part holding all of `t` `[out, in]`.
    pub fn new(t: Tensor<2>) -> Self {
        let shape = t.dims();
        Self {
            parts: vec![(0, t)],
            shape,
        }
    }

    /// `values` (`[out, in]` row-major f32) uploaded to `device` as `dtype` in parts of at most
    /// `max_buffer` bytes.
    ///
    /// # Errors
    /// [`Error::Shape`] when `values` does not have `out * in` elements or one row does not fit
    /// `max_buffer`.
    pub fn from_values(
        values: Vec<f32>,
        shape: [usize; 2],
        device: &burn::tensor::Device,
        max_buffer: u64,
        dtype: FloatDType,
    ) -> Result<Self, Error> {
        let [rows, cols] = shape;
        let elem_bytes = burn::tensor::DType::from(dtype).size() as u64;
        if Some(values.len()) != rows.checked_mul(cols) || cols == 0 {
            return Err(Error::Shape(format!(
                "{} values for a dense [{rows}, {cols}] weight",
                values.len()
            )));
        }
        let rows_per_part = (max_buffer / (cols as u64 * elem_bytes)).min(rows as u64) as usize;
        if rows_per_part == 0 {
            return Err(Error::Shape(format!(
                "one {dtype:?} row of {cols} values exceeds the device's {max_buffer}-byte buffers"
            )));
        }
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|start| {
                let n = rows_per_part.min(rows - start);
                let chunk = values[start * cols..(start + n) * cols].to_vec();
                let data = TensorData::new(chunk, [n, cols]);
                (start, Tensor::<2>::from_data(data, (device, dtype.into())))
            })
            .collect();
        Ok(Self { parts, shape })
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// Device buffers this weight is split into.
    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }

    fn matmul_t(&self, x: Tensor<2>) -> Tensor<2> {
        let dtype = self.parts[0].1.dtype();
        let x = x.cast(dtype);
        let outs: Vec<Tensor<2>> = self
            .parts
            .iter()
            .map(|(_, w)| {
                x.clone()
                    .matmul(w.clone().transpose())
                    .cast(FloatDType::F32)
            })
            .collect();
        if outs.len() == 1 {
            outs.into_iter().next().expect("one part")
        } else {
            Tensor::cat(outs, 1)
        }
    }

    fn rows(&self, ids: &[u32]) -> Result<Tensor<2>, Error> {
        let [rows, _] = self.shape;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= rows) {
            return Err(Error::Shape(format!(
                "row id {bad} out of range for {rows} rows"
            )));
        }
        let n = ids.len();
        let mut out: Option<Tensor<2>> = None;
        for (start, w) in &self.parts {
            let device = w.device();
            let part_rows = w.dims()[0];
            let inside = |id: u32| (*start..start + part_rows).contains(&(id as usize));
            // Ids outside this part read its row 0 and are masked to zero.
            let local: Vec<i64> = ids
                .iter()
                .map(|&id| {
                    if inside(id) {
                        (id as usize - start) as i64
                    } else {
                        0
                    }
                })
                .collect();
            let idx =
                Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(local, [n]), &device);
            let picked = w.clone().select(0, idx).cast(FloatDType::F32);
            let part = if self.parts.len() == 1 {
                picked
            } else {
                let mask: Vec<f32> = ids
                    .iter()
                    .map(|&id| f32::from(u8::from(inside(id))))
                    .collect();
                picked * Tensor::<2>::from_data(TensorData::new(mask, [n, 1]), &device)
            };
            out = Some(match out {
                None => part,
                Some(acc) => acc + part,
            });
        }
        Ok(out.expect("a dense weight has at least one part"))
    }

    /// The rows `ids` (`[n]` Int, each below `out`: a device tensor, read by no host code)
    /// as `[n, in]` f32, gathered on the device part by part (an id outside a part reads
    /// its row 0, masked to zero).
    pub(crate) fn rows_by(&self, ids: Tensor<1, burn::tensor::Int>) -> Tensor<2> {
        let n = ids.dims()[0];
        if let [(_, w)] = self.parts.as_slice() {
            return w.clone().select(0, ids).cast(FloatDType::F32);
        }
        let mut out: Option<Tensor<2>> = None;
        for (start, w) in &self.parts {
            let part_rows = w.dims()[0] as i64;
            let local = ids.clone().sub_scalar(*start as i64);
            let inside = local
                .clone()
                .greater_equal_elem(0)
                .bool_and(local.clone().lower_elem(part_rows));
            let idx = local.clamp(0, part_rows - 1);
            let part =
                w.clone().select(0, idx).cast(FloatDType::F32) * inside.float().reshape([n, 1]);
            out = Some(match out {
                None => part,
                Some(acc) => acc + part,
            });
        }
        out.expect("a dense weight has at least one part")
    }
}

/// A constant of a module: moved between devices with it, never a trainable parameter.
impl Module for DenseWeight {
    fn visit<V: ModuleVisitor>(&self, _visitor: &mut V) {}

    fn map<M: ModuleMapper>(self, _mapper: &mut M) -> Self {
        self
    }

    fn to_device(self, device: &Device) -> Self {
        Self {
            parts: self
                .parts
                .into_iter()
                .map(|(start, t)| (start, t.to_device(device)))
                .collect(),
            shape: self.shape,
        }
    }

    fn fork(self, device: &Device) -> Self {
        self.to_device(device)
    }

    fn collect_devices(&self, devices: Devices) -> Devices {
        self.parts
            .iter()
            .fold(devices, |d, (_, t)| t.collect_devices(d))
    }

    fn materialize(self) -> Self {
        self
    }

    fn valid(&self) -> Self {
        self.clone()
    }

    fn train(self) -> Self {
        self
    }
}

impl ModuleDisplayDefault for DenseWeight {
    fn content(&self, content: Content) -> Option<Content> {
        content
            .add_single(&format!(
                "DenseWeight {{shape: {:?}, parts: {}}}",
                self.shape,
                self.parts.len()
            ))
            .optional()
    }
}

impl ModuleDisplay for DenseWeight {}

impl Weight {
    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Weight::Packed(t) => t.shape(),
            Weight::Dense(t) => t.shape(),
        }
    }

    /// `x W^T` for `x` `[m, in]` -> `[m, out]`.
    pub fn matmul_t(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Weight::Packed(t) => t.matmul_t(x),
            Weight::Dense(w) => w.matmul_t(x),
        }
    }

    /// Rows `ids` of the weight, `[ids.len(), in]` f32.
    ///
    /// # Errors
    /// [`Error::Shape`] if an id is not below `out`.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor<2>, Error> {
        match self {
            Weight::Packed(t) => t.gather_rows(ids),
            Weight::Dense(w) => w.rows(ids),
        }
    }

    /// Row ranges `(first, n)` covering the weight, each within one device buffer and at most
    /// [`crate::tensor::PREFILL_SCRATCH_BYTES`] of f32 ([`GgmlTensor::row_chunks`]).
    pub fn row_chunks(&self) -> Vec<(usize, usize)> {
        match self {
            Weight::Packed(t) => t.row_chunks(),
            Weight::Dense(w) => {
                let parts = w.parts.iter().map(|(start, t)| (*start, t.dims()[0]));
                crate::tensor::row_chunks_of(parts, w.shape[1])
            }
        }
    }

    /// `x W[first..first + n]^T` for `x` `[m, in]` -> `[m, n]` f32, the rows one of
    /// [`Self::row_chunks`] (a piece of a large output head).
    ///
    /// # Panics
    /// If the rows span two of [`Self::row_chunks`]'s buffers or `x` has the wrong width.
    pub fn matmul_t_rows(&self, x: Tensor<2>, first: usize, n: usize) -> Tensor<2> {
        match self {
            Weight::Packed(t) => t.matmul_t_rows(x, first, n),
            Weight::Dense(w) => {
                let (start, part) = w
                    .parts
                    .iter()
                    .find(|(s, t)| (*s..s + t.dims()[0]).contains(&first))
                    .filter(|(s, t)| first + n <= s + t.dims()[0])
                    .unwrap_or_else(|| panic!("rows {first}..{} span buffers", first + n));
                let rows = part.clone().narrow(0, first - start, n);
                x.cast(rows.dtype())
                    .matmul(rows.transpose())
                    .cast(FloatDType::F32)
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
#[derive(Module, Debug)]
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

    /// `act(gate) * up` of this layer as a stacked gate/up projection (its weight `[2 * width,
    /// in]`: `ffn_gate`'s rows, then `ffn_up`'s; [`crate::GgufLoader::stacked_linear`]): `x`
    /// `[n, in]` f32 -> `[n, width]`. A packed weight on a CubeCL device without a bias runs
    /// one GEMV with the activation as its epilogue ([`GgmlTensor::matmul_t_gated`]); else
    /// [`Self::forward`] and [`gated_stacked`], the same values.
    ///
    /// # Panics
    /// If `x`'s last dimension is not the layer's input size or the output size is odd (a
    /// programming error in the caller's shapes).
    pub fn forward_gated(&self, x: Tensor<2>, act: Activation) -> Tensor<2> {
        if let (Weight::Packed(t), None) = (&self.weight, &self.bias)
            && is_cube(&x.device())
            && let Some(y) = t.matmul_t_gated(x.clone(), act == Activation::GeluTanh)
        {
            return y;
        }
        gated_stacked(self.forward(x), act)
    }
}

/// Token embedding `[vocab, dim]` over a ggml weight: a lookup dequantizes only the rows it
/// needs. With tied embeddings the same weight is the output head ([`GgmlEmbedding::as_linear`]).
#[derive(Module, Debug)]
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

    /// Embeddings of an id tensor `[batch, seq]` (Int): `[batch, seq, dim]` f32, like
    /// `burn::nn::Embedding::forward`. The ids are read back to the host once to pick the rows.
    ///
    /// # Errors
    /// [`Error::Shape`] for a negative id or one not below the vocabulary size.
    pub fn forward_ids(&self, ids: Tensor<2, burn::tensor::Int>) -> Result<Tensor<3>, Error> {
        let [batch, seq] = ids.dims();
        let values = ids
            .try_into_data()
            .map_err(|e| Error::Shape(format!("reading ids: {e:?}")))?
            .convert::<i64>()
            .try_to_vec::<i64>()
            .map_err(|e| Error::Shape(format!("reading ids: {e:?}")))?;
        let ids = values
            .into_iter()
            .map(|v| {
                u32::try_from(v).map_err(|_| Error::Shape(format!("token id {v} out of range")))
            })
            .collect::<Result<Vec<u32>, Error>>()?;
        let [_, dim] = self.weight.shape();
        Ok(self.forward(&ids)?.reshape([batch, seq, dim]))
    }

    /// The same weight as a Linear `[dim] -> [vocab]` (tied output head).
    pub fn as_linear(&self) -> GgmlLinear {
        GgmlLinear {
            weight: self.weight.clone(),
            bias: None,
        }
    }
}

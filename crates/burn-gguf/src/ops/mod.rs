//! The backend extension: ggml-quant ops on Burn tensors, and the per-layer ops of the models
//! that Burn's ops run as several kernels each (RMSNorm, the residual add with the next norm,
//! RoPE, the gated FFN activation, the KV-cache write and attention, the delta-net convolution
//! and recurrence), and MoE routing and the expert GEMV.
//!
//! Implemented for every CubeCL runtime (`CubeBackend`) and, lazily, for `Fusion<CubeBackend>`
//! (Burn's default wgpu backend), so an op's output feeds fused Burn ops directly. Under Burn's
//! `Autodiff` ([`crate::autodiff`]) the packed products pass gradients to their activations and
//! none to their blocks (DESIGN decision 10). The weights are
//! an `Int` tensor of dtype `U32` holding a ggml tensor's raw blocks ([`ggml_kernels::words_for_bytes`]);
//! `grid` is the type's codebook, also `U32` ([`ggml_kernels::grid_words`]).
use burn::backend::backend_extension;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::tensor::{DType, Shape};
use ggml_kernels::GemvConfig;
use gguf::GgmlType;

mod products;
pub(crate) use products::gemv_passes_fit;
use products::{dequantize_matmul_op, gemv_op};

/// Ops over raw ggml blocks. Shapes are in Burn order; `w` holds `rows` rows of `cols` elements.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait GgmlOps: burn::backend::Backend {
    /// Fused dequantize + GEMV: `x` `[m, cols]` f32 (m in 1..=8) -> `[m, rows]` f32,
    /// `y = x W^T`.
    #[fusion(dtype = x, shape = {
        let m = x.num_elements() / (*cols).max(1);
        burn::tensor::Shape::new([m, *rows])
    })]
    fn ggml_gemv(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
    ) -> FloatTensor<Self>;

    /// [`GgmlOps::ggml_gemv`] of a stacked gate/up projection with the gated activation as its
    /// epilogue, one kernel ([`ggml_kernels::launch_gemv_glu`]): `w` holds `rows = 2 * width`
    /// rows (the gate's, then up's), `x` `[m, cols]` f32 (m in 1..=8) -> `[m, width]` f32,
    /// `act(x W_gate^T) * (x W_up^T)` with ggml's GELU (tanh approximation) when `gelu`, else
    /// SiLU.
    #[fusion(dtype = x, shape = {
        let m = x.num_elements() / (*cols).max(1);
        burn::tensor::Shape::new([m, *rows / 2])
    })]
    fn ggml_gemv_glu(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        gelu: bool,
    ) -> FloatTensor<Self>;

    /// Dequantize rows by id: `ids` `[n]` u32 -> `[n, cols]` f32, row `t` = `W[ids[t] - row_start]`,
    /// or zeros when `ids[t]` is outside `[row_start, row_start + rows)`.
    #[fusion(dtype = burn::tensor::DType::F32, shape = {
        burn::tensor::Shape::new([ids.num_elements(), *cols])
    })]
    fn ggml_dequantize_rows(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        ids: IntTensor<Self>,
        ggml_type: GgmlType,
        row_start: usize,
        rows: usize,
        cols: usize,
    ) -> FloatTensor<Self>;

    /// A packed product for any number of activation rows (prefill, training) over the weight
    /// rows `first..first + n` of `w` (`rows` rows of `cols`):
    /// - `transposed == false`: `y = x W[first..first + n]^T`, `x` `[m, cols]` f32 -> `[m, n]`;
    /// - `transposed == true`: `y = x W[first..first + n]`, `x` `[m, n]` f32 -> `[m, cols]`, the
    ///   backward pass's `dx = dy W`.
    ///
    /// Two paths, chosen per device ([`ggml_kernels::matmul::MatmulPath::for_client`]): one
    /// tile kernel ([`ggml_kernels::launch_dequantize_matmul`]) that decodes the blocks into
    /// workgroup memory, no dequantized copy in device memory; or rows dequantized at most
    /// [`crate::tensor::PREFILL_SCRATCH_BYTES`] at a time into a scratch
    /// ([`GgmlOps::ggml_dequantize_rows`]) and multiplied with the backend's matmul.
    #[fusion(dtype = x, shape = {
        let m = x.num_elements() / (if *transposed { *n } else { *cols }).max(1);
        burn::tensor::Shape::new([m, if *transposed { *cols } else { *n }])
    })]
    #[allow(clippy::too_many_arguments)]
    fn ggml_dequantize_matmul(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ggml_type: GgmlType,
        first: usize,
        n: usize,
        rows: usize,
        cols: usize,
        transposed: bool,
    ) -> FloatTensor<Self>;

    /// RMSNorm over the last dimension with its weight, one kernel
    /// ([`ggml_kernels::launch_rms_norm`]): `x` `[..., cols]` f32, `w` `[cols]` f32 ->
    /// `x / sqrt(mean(x^2) + eps) * w`, the shape of `x`.
    #[fusion(dtype = x, shape = x)]
    fn ggml_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;

    /// Rotary position embedding, one kernel ([`ggml_kernels::launch_rope`]): `x`
    /// `[n, heads, head_dim]` f32, `cos` and `sin` `[n, head_dim / 2]` f32 (token `t`'s angles)
    /// -> the shape of `x`; `neox` rotates dimensions `(i, i + head_dim / 2)`, otherwise
    /// `(2i, 2i + 1)`.
    #[fusion(dtype = x, shape = x)]
    fn ggml_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        neox: bool,
    ) -> FloatTensor<Self>;

    /// `act(gate) * up` elementwise, one kernel ([`ggml_kernels::launch_glu`]): ggml's GELU (tanh
    /// approximation) with `gelu`, SiLU otherwise; f32 tensors of one shape -> that shape.
    #[fusion(dtype = gate, shape = gate)]
    fn ggml_glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, gelu: bool) -> FloatTensor<Self>;

    /// [`GgmlOps::ggml_glu`] of a stacked gate/up projection: `gate_up` `[rows, 2 * width]` f32
    /// (gate in the first half of each row, up in the second) -> `[rows, width]`.
    #[fusion(dtype = gate_up, shape = {
        let [rows, cols] = crate::ops::rows_cols(gate_up);
        burn::tensor::Shape::new([rows, cols / 2])
    })]
    fn ggml_glu_stacked(gate_up: FloatTensor<Self>, gelu: bool) -> FloatTensor<Self>;

    /// The residual step, one kernel ([`ggml_kernels::launch_add_rms_norm`]): `x`, `o`
    /// `[rows, cols]` f32, `w_pre`, `w` `[cols]` f32 -> `(x + o', rms_norm(x + o', w))` with
    /// `o' = rms_norm(o, w_pre)` when `pre`, else `o` (`w_pre` unread), both `[rows, cols]`.
    #[fusion(meta = |x: &burn::backend::fusion::custom::TensorSpec, _o, _w_pre, _w, _eps, _pre| (x.clone(), x.clone()))]
    fn ggml_add_rms_norm(
        x: FloatTensor<Self>,
        o: FloatTensor<Self>,
        w_pre: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f32,
        pre: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// One step's heads into the KV cache, one kernel ([`ggml_kernels::launch_qk_rope_cache`]):
    /// `qk` `[n, qk_stride]` and `v` `[n, v_stride]` f32 (the projections, as `layout` places the
    /// heads), `norms` `[2 * head_dim]` (the query norm's weights, then the key norm's; read
    /// when `norm_eps` is set), `table` `[2 * positions * rope_dims / 2]` (cosines, then
    /// sines: [`crate::RopeTable`]), `rows` `[2n + slots * width]` u32 (each token's cache slot
    /// and position, then the block table: [`crate::KvPaging`]), paged caches `[n_head_kv,
    /// blocks * block, head_dim]`. Returns the rotated queries
    /// `[n, n_head, head_dim]` and the caches with each token's slot and position written (in
    /// place when no other tensor shares their buffers).
    #[fusion(meta = |qk: &burn::backend::fusion::custom::TensorSpec, _v, _norms, _table, _rows,
        k_cache: &burn::backend::fusion::custom::TensorSpec,
        v_cache: &burn::backend::fusion::custom::TensorSpec,
        layout: &ggml_kernels::QkRopeShape, _eps, _neox| (
        burn::backend::fusion::custom::TensorSpec::new(
            burn::tensor::Shape::new([layout.n, layout.n_head, layout.head_dim]), qk.dtype),
        k_cache.clone(),
        v_cache.clone(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn ggml_qk_rope_cache(
        qk: FloatTensor<Self>,
        v: FloatTensor<Self>,
        norms: FloatTensor<Self>,
        table: FloatTensor<Self>,
        rows: IntTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        layout: ggml_kernels::QkRopeShape,
        norm_eps: Option<f32>,
        neox: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// Causal grouped-query attention over the KV cache, one kernel (two past
    /// [`ggml_kernels::attention::ATTENTION_SPLIT`] visible keys;
    /// [`ggml_kernels::launch_attention`]): `q` `[n, n_head, head_dim]`, caches
    /// `[n_head_kv, blocks * block, head_dim]` f32, `rows` `[2n + slots * width]` u32 (each
    /// query row's cache slot and position, then the block table: [`crate::KvPaging`]) ->
    /// `[n, n_head * head_dim]`. Scores are `scale * q k^T`,
    /// soft-capped as `softcap * tanh(score / softcap)` when `softcap > 0` (Gemma 2).
    #[fusion(dtype = q, shape = burn::tensor::Shape::new([layout.n, layout.n_head * layout.head_dim]))]
    fn ggml_attention(
        q: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        rows: IntTensor<Self>,
        layout: ggml_kernels::AttentionShape,
        scale: f32,
        softcap: f32,
    ) -> FloatTensor<Self>;

    /// Causal depthwise convolution and SiLU over each sequence's rows, one kernel
    /// ([`ggml_kernels::launch_causal_conv`]): `x` `[n, cols]` (the inputs in its first `ch`
    /// columns), `weight` `[ch, d_conv]`, `window` `[slots * (d_conv - 1), ch]` f32, `rows`
    /// `[n * 2]` u32 (each row's slot and position). Returns the output `[n, ch]` and the
    /// windows after the pass (written in place when no other tensor shares their buffer).
    #[fusion(meta = |x: &burn::backend::fusion::custom::TensorSpec,
        w: &burn::backend::fusion::custom::TensorSpec,
        window: &burn::backend::fusion::custom::TensorSpec, _rows| (
        burn::backend::fusion::custom::TensorSpec::new(
            burn::tensor::Shape::new([x.shape[0], w.shape[0]]), x.dtype),
        window.clone(),
    ))]
    fn ggml_causal_conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        window: FloatTensor<Self>,
        rows: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gated delta rule over each sequence's rows, one kernel
    /// ([`ggml_kernels::launch_gated_delta_net`]): `qkv` `[n, cols]` (`q`, `k`
    /// `n_head_k * d_k` each, then `v` `n_head_v * d_v`, from column 0), `gates` `[n, cols']`
    /// (the raw `beta` projection at column `beta_off`, `alpha` after it, `n_head_v` each),
    /// `dt_bias`, `a` `[n_head_v]`, `state` `[slots * n_head_v, d_k, d_v]` f32, `rows`
    /// `[n * 2]` u32. Returns the output `[n, n_head_v * d_v]` and the states after the pass
    /// (written in place when no other tensor shares their buffer).
    #[fusion(meta = |qkv: &burn::backend::fusion::custom::TensorSpec, _gates, _dt, _a,
        state: &burn::backend::fusion::custom::TensorSpec, _rows,
        shape: &ggml_kernels::DeltaNetShape, _beta_off, _eps| (
        burn::backend::fusion::custom::TensorSpec::new(
            burn::tensor::Shape::new([qkv.shape[0], shape.value_dim()]), qkv.dtype),
        state.clone(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn ggml_gated_delta_net(
        qkv: FloatTensor<Self>,
        gates: FloatTensor<Self>,
        dt_bias: FloatTensor<Self>,
        a: FloatTensor<Self>,
        state: FloatTensor<Self>,
        rows: IntTensor<Self>,
        shape: ggml_kernels::DeltaNetShape,
        beta_off: usize,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The `k` largest values of each row of `x` `[rows, n]` f32 and their columns, best first
    /// (larger value, then smaller column), one or two kernels ([`ggml_kernels::top_k`]):
    /// `[rows, k]` f32 and `[rows, k]` u32. NaN and infinite values are skipped; a row with
    /// fewer than `k` finite values ends in [`ggml_kernels::top_k::NO_ID`].
    #[fusion(meta = |x: &burn::backend::fusion::custom::TensorSpec, k: &usize| {
        let rows = x.shape.num_elements() / x.shape[x.shape.num_dims() - 1].max(1);
        (
            burn::backend::fusion::custom::TensorSpec::new(burn::tensor::Shape::new([rows, *k]), x.dtype),
            burn::backend::fusion::custom::TensorSpec::new(
                burn::tensor::Shape::new([rows, *k]), burn::tensor::DType::U32),
        )
    })]
    fn ggml_top_k(x: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>);

    /// MoE routing, one kernel ([`ggml_kernels::launch_moe_route`]): router logits `[n, n_expert]`
    /// f32 -> each token's `k` experts' weights `[n, k]` f32 and ids `[n, k]` u32 (the
    /// softmax's `k` largest probabilities, best first; divided by their sum when `norm`).
    #[fusion(meta = |logits: &burn::backend::fusion::custom::TensorSpec, k: &usize, _norm| {
        let n = logits.shape.num_elements() / logits.shape[logits.shape.num_dims() - 1].max(1);
        (
            burn::backend::fusion::custom::TensorSpec::new(burn::tensor::Shape::new([n, *k]), logits.dtype),
            burn::backend::fusion::custom::TensorSpec::new(
                burn::tensor::Shape::new([n, *k]), burn::tensor::DType::U32),
        )
    })]
    fn ggml_moe_route(
        logits: FloatTensor<Self>,
        k: usize,
        norm: bool,
    ) -> (FloatTensor<Self>, IntTensor<Self>);

    /// The expert GEMV over one part of a bank of experts stacked by rows, one kernel
    /// ([`ggml_kernels::launch_gemv_id`], llama.cpp's `mul_mat_id`): `w` holds the bank's rows
    /// `shape.row_start..+shape.part_rows`, `x` `[ceil(slots / x_div), cols]` f32, `ids`
    /// `[slots]` u32 expert ids -> `[slots, rows]` f32, zero for rows in other parts.
    #[fusion(dtype = x, shape = burn::tensor::Shape::new([shape.slots, shape.rows]))]
    fn ggml_gemv_id(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ids: IntTensor<Self>,
        ggml_type: GgmlType,
        shape: ggml_kernels::GemvIdShape,
    ) -> FloatTensor<Self>;
}

/// `t`'s buffer, made its own first when another tensor shares it, so a kernel may write it in
/// place.
fn owned(t: CubeTensor) -> CubeTensor {
    let t = burn_cubecl::kernel::into_contiguous(t);
    if t.can_mut() { t } else { t.copy() }
}

/// `[rows, cols]` of `shape` seen as rows of its last dimension (`[0, 0]` for a scalar shape).
pub(crate) fn rows_cols(shape: &Shape) -> [usize; 2] {
    let cols = shape
        .num_dims()
        .checked_sub(1)
        .map_or(0, |last| shape[last]);
    [shape.num_elements() / cols.max(1), cols]
}

pub(crate) fn empty_f32(like: &CubeTensor, shape: Shape) -> CubeTensor {
    let client = like.client.clone();
    let handle = client.empty(shape.num_elements() * size_of::<f32>());
    CubeTensor::new_contiguous(client, like.device.clone(), shape, handle, DType::F32)
}

fn empty_u32(like: &CubeTensor, shape: Shape) -> CubeTensor {
    let client = like.client.clone();
    let handle = client.empty(shape.num_elements() * size_of::<u32>());
    CubeTensor::new_contiguous(client, like.device.clone(), shape, handle, DType::U32)
}

impl GgmlOps for CubeBackend {
    fn ggml_gemv(
        w: CubeTensor,
        grid: CubeTensor,
        x: CubeTensor,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
    ) -> CubeTensor {
        gemv_op(w, grid, x, ggml_type, rows, cols, None)
    }

    fn ggml_gemv_glu(
        w: CubeTensor,
        grid: CubeTensor,
        x: CubeTensor,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        gelu: bool,
    ) -> CubeTensor {
        gemv_op(w, grid, x, ggml_type, rows, cols, Some(gelu))
    }

    fn ggml_dequantize_rows(
        w: CubeTensor,
        grid: CubeTensor,
        ids: CubeTensor,
        ggml_type: GgmlType,
        row_start: usize,
        rows: usize,
        cols: usize,
    ) -> CubeTensor {
        assert_eq!(w.dtype, DType::U32, "ggml weights must be a U32 tensor");
        assert_eq!(grid.dtype, DType::U32, "a ggml grid must be a U32 tensor");
        assert_eq!(ids.dtype, DType::U32, "ids must be a U32 tensor");
        let ids = burn_cubecl::kernel::into_contiguous(ids);
        let n = ids.meta.shape().num_elements();
        let out = empty_f32(&ids, Shape::new([n, cols]));
        let client = ids.client.clone();
        ggml_kernels::launch_dequantize_rows(
            &client,
            ggml_type,
            w.into_buffer_arg(),
            grid.into_buffer_arg(),
            ids.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            row_start,
            rows,
            cols,
        )
        .unwrap_or_else(|e| panic!("ggml_dequantize_rows: {e}"));
        out
    }

    fn ggml_dequantize_matmul(
        w: CubeTensor,
        grid: CubeTensor,
        x: CubeTensor,
        ggml_type: GgmlType,
        first: usize,
        n: usize,
        rows: usize,
        cols: usize,
        transposed: bool,
    ) -> CubeTensor {
        dequantize_matmul_op(w, grid, x, ggml_type, first, n, rows, cols, transposed)
    }

    fn ggml_rms_norm(x: CubeTensor, w: CubeTensor, eps: f32) -> CubeTensor {
        assert_eq!(x.dtype, DType::F32, "ggml_rms_norm takes f32 activations");
        assert_eq!(w.dtype, DType::F32, "ggml_rms_norm takes an f32 weight");
        let x = burn_cubecl::kernel::into_contiguous(x);
        let w = burn_cubecl::kernel::into_contiguous(w);
        let shape = x.meta.shape().clone();
        let [rows, cols] = rows_cols(&shape);
        let y = empty_f32(&x, shape);
        let client = x.client.clone();
        ggml_kernels::launch_rms_norm(
            &client,
            x.into_buffer_arg(),
            w.into_buffer_arg(),
            y.clone().into_buffer_arg(),
            rows,
            cols,
            eps,
        )
        .unwrap_or_else(|e| panic!("ggml_rms_norm: {e}"));
        y
    }

    fn ggml_rope(x: CubeTensor, cos: CubeTensor, sin: CubeTensor, neox: bool) -> CubeTensor {
        for (t, what) in [(&x, "x"), (&cos, "cos"), (&sin, "sin")] {
            assert_eq!(t.dtype, DType::F32, "ggml_rope takes an f32 {what}");
        }
        let [x, cos, sin] = [x, cos, sin].map(burn_cubecl::kernel::into_contiguous);
        let shape = x.meta.shape().clone();
        assert_eq!(
            shape.num_dims(),
            3,
            "ggml_rope takes x [n, heads, head_dim]"
        );
        let (n, heads, head_dim) = (shape[0], shape[1], shape[2]);
        let y = empty_f32(&x, shape);
        let client = x.client.clone();
        ggml_kernels::launch_rope(
            &client,
            x.into_buffer_arg(),
            cos.into_buffer_arg(),
            sin.into_buffer_arg(),
            y.clone().into_buffer_arg(),
            n,
            heads,
            head_dim / 2,
            neox,
        )
        .unwrap_or_else(|e| panic!("ggml_rope: {e}"));
        y
    }

    fn ggml_glu(gate: CubeTensor, up: CubeTensor, gelu: bool) -> CubeTensor {
        assert_eq!(gate.dtype, DType::F32, "ggml_glu takes an f32 gate");
        assert_eq!(up.dtype, DType::F32, "ggml_glu takes an f32 up");
        let [gate, up] = [gate, up].map(burn_cubecl::kernel::into_contiguous);
        let shape = gate.meta.shape().clone();
        let len = shape.num_elements();
        assert_eq!(
            up.meta.shape().num_elements(),
            len,
            "ggml_glu: gate and up differ in size"
        );
        let y = empty_f32(&gate, shape);
        let client = gate.client.clone();
        ggml_kernels::launch_glu(
            &client,
            gate.into_buffer_arg(),
            up.into_buffer_arg(),
            y.clone().into_buffer_arg(),
            1,
            len,
            len,
            0,
            gelu,
        )
        .unwrap_or_else(|e| panic!("ggml_glu: {e}"));
        y
    }

    fn ggml_glu_stacked(gate_up: CubeTensor, gelu: bool) -> CubeTensor {
        assert_eq!(gate_up.dtype, DType::F32, "ggml_glu_stacked takes f32");
        let gate_up = burn_cubecl::kernel::into_contiguous(gate_up);
        let shape = gate_up.meta.shape().clone();
        let [rows, cols] = rows_cols(&shape);
        let width = cols / 2;
        let y = empty_f32(&gate_up, Shape::new([rows, width]));
        let client = gate_up.client.clone();
        ggml_kernels::launch_glu(
            &client,
            gate_up.clone().into_buffer_arg(),
            gate_up.into_buffer_arg(),
            y.clone().into_buffer_arg(),
            rows,
            width,
            cols,
            width,
            gelu,
        )
        .unwrap_or_else(|e| panic!("ggml_glu_stacked: {e}"));
        y
    }

    fn ggml_add_rms_norm(
        x: CubeTensor,
        o: CubeTensor,
        w_pre: CubeTensor,
        w: CubeTensor,
        eps: f32,
        pre: bool,
    ) -> (CubeTensor, CubeTensor) {
        for (t, what) in [(&x, "x"), (&o, "o"), (&w_pre, "w_pre"), (&w, "w")] {
            assert_eq!(t.dtype, DType::F32, "ggml_add_rms_norm takes an f32 {what}");
        }
        let [x, o, w_pre, w] = [x, o, w_pre, w].map(burn_cubecl::kernel::into_contiguous);
        let shape = x.meta.shape().clone();
        let [rows, cols] = rows_cols(&shape);
        let x_out = empty_f32(&x, shape.clone());
        let h = empty_f32(&x, shape);
        let client = x.client.clone();
        ggml_kernels::launch_add_rms_norm(
            &client,
            x.into_buffer_arg(),
            o.into_buffer_arg(),
            w_pre.into_buffer_arg(),
            w.into_buffer_arg(),
            x_out.clone().into_buffer_arg(),
            h.clone().into_buffer_arg(),
            rows,
            cols,
            eps,
            pre,
        )
        .unwrap_or_else(|e| panic!("ggml_add_rms_norm: {e}"));
        (x_out, h)
    }

    fn ggml_qk_rope_cache(
        qk: CubeTensor,
        v: CubeTensor,
        norms: CubeTensor,
        table: CubeTensor,
        rows: CubeTensor,
        k_cache: CubeTensor,
        v_cache: CubeTensor,
        layout: ggml_kernels::QkRopeShape,
        norm_eps: Option<f32>,
        neox: bool,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let inputs = [qk, v, norms, table];
        for t in &inputs {
            assert_eq!(t.dtype, DType::F32, "ggml_qk_rope_cache takes f32 tensors");
        }
        assert_eq!(rows.dtype, DType::U32, "ggml_qk_rope_cache takes u32 rows");
        let rows = burn_cubecl::kernel::into_contiguous(rows);
        let [qk, v, norms, table] = inputs.map(burn_cubecl::kernel::into_contiguous);
        let [k_cache, v_cache] = [k_cache, v_cache].map(owned);
        let q = empty_f32(&qk, Shape::new([layout.n, layout.n_head, layout.head_dim]));
        let client = qk.client.clone();
        ggml_kernels::launch_qk_rope_cache(
            &client,
            qk.into_buffer_arg(),
            v.into_buffer_arg(),
            norms.into_buffer_arg(),
            table.into_buffer_arg(),
            rows.into_buffer_arg(),
            q.clone().into_buffer_arg(),
            k_cache.clone().into_buffer_arg(),
            v_cache.clone().into_buffer_arg(),
            layout,
            norm_eps,
            neox,
        )
        .unwrap_or_else(|e| panic!("ggml_qk_rope_cache: {e}"));
        (q, k_cache, v_cache)
    }

    fn ggml_causal_conv(
        x: CubeTensor,
        weight: CubeTensor,
        window: CubeTensor,
        rows: CubeTensor,
    ) -> (CubeTensor, CubeTensor) {
        for t in [&x, &weight, &window] {
            assert_eq!(t.dtype, DType::F32, "ggml_causal_conv takes f32 tensors");
        }
        assert_eq!(rows.dtype, DType::U32, "ggml_causal_conv takes u32 rows");
        let [x, weight, rows] = [x, weight, rows].map(burn_cubecl::kernel::into_contiguous);
        let window = owned(window);
        let [n, x_stride] = rows_cols(x.meta.shape());
        let [ch, d_conv] = rows_cols(weight.meta.shape());
        let slots = rows_cols(window.meta.shape())[0] / d_conv.saturating_sub(1).max(1);
        let out = empty_f32(&x, Shape::new([n, ch]));
        let client = x.client.clone();
        ggml_kernels::launch_causal_conv(
            &client,
            x.into_buffer_arg(),
            weight.into_buffer_arg(),
            rows.into_buffer_arg(),
            window.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            n,
            ch,
            x_stride,
            d_conv,
            slots,
        )
        .unwrap_or_else(|e| panic!("ggml_causal_conv: {e}"));
        (out, window)
    }

    fn ggml_gated_delta_net(
        qkv: CubeTensor,
        gates: CubeTensor,
        dt_bias: CubeTensor,
        a: CubeTensor,
        state: CubeTensor,
        rows: CubeTensor,
        shape: ggml_kernels::DeltaNetShape,
        beta_off: usize,
        eps: f32,
    ) -> (CubeTensor, CubeTensor) {
        let inputs = [qkv, gates, dt_bias, a];
        for t in inputs.iter().chain([&state]) {
            assert_eq!(
                t.dtype,
                DType::F32,
                "ggml_gated_delta_net takes f32 tensors"
            );
        }
        assert_eq!(
            rows.dtype,
            DType::U32,
            "ggml_gated_delta_net takes u32 rows"
        );
        let rows = burn_cubecl::kernel::into_contiguous(rows);
        let [qkv, gates, dt_bias, a] = inputs.map(burn_cubecl::kernel::into_contiguous);
        let state = owned(state);
        let [n, qkv_stride] = rows_cols(qkv.meta.shape());
        let gate_stride = rows_cols(gates.meta.shape())[1];
        let slots = state.meta.shape()[0] / shape.n_head_v.max(1);
        let out = empty_f32(&qkv, Shape::new([n, shape.value_dim()]));
        let client = qkv.client.clone();
        let strides = ggml_kernels::DeltaNetStrides {
            qkv_stride,
            gate_stride,
            beta_off,
        };
        ggml_kernels::launch_gated_delta_net(
            &client,
            qkv.into_buffer_arg(),
            gates.into_buffer_arg(),
            dt_bias.into_buffer_arg(),
            a.into_buffer_arg(),
            rows.into_buffer_arg(),
            state.clone().into_buffer_arg(),
            out.clone().into_buffer_arg(),
            n,
            slots,
            shape,
            strides,
            eps,
        )
        .unwrap_or_else(|e| panic!("ggml_gated_delta_net: {e}"));
        (out, state)
    }

    fn ggml_attention(
        q: CubeTensor,
        k_cache: CubeTensor,
        v_cache: CubeTensor,
        rows: CubeTensor,
        layout: ggml_kernels::AttentionShape,
        scale: f32,
        softcap: f32,
    ) -> CubeTensor {
        assert_eq!(rows.dtype, DType::U32, "ggml_attention takes u32 rows");
        let [q, k_cache, v_cache, rows] =
            [q, k_cache, v_cache, rows].map(burn_cubecl::kernel::into_contiguous);
        let out = empty_f32(&q, Shape::new([layout.n, layout.n_head * layout.head_dim]));
        let client = q.client.clone();
        ggml_kernels::launch_attention(
            &client,
            q.into_buffer_arg(),
            k_cache.into_buffer_arg(),
            v_cache.into_buffer_arg(),
            rows.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            layout,
            scale,
            (softcap > 0.0).then_some(softcap),
        )
        .unwrap_or_else(|e| panic!("ggml_attention: {e}"));
        out
    }

    fn ggml_top_k(x: CubeTensor, k: usize) -> (CubeTensor, CubeTensor) {
        assert_eq!(x.dtype, DType::F32, "ggml_top_k takes f32");
        let x = burn_cubecl::kernel::into_contiguous(x);
        let [rows, n] = rows_cols(x.meta.shape());
        let values = empty_f32(&x, Shape::new([rows, k]));
        let client = x.client.clone();
        let ids = empty_u32(&x, Shape::new([rows, k]));
        ggml_kernels::launch_top_k(
            &client,
            x.into_buffer_arg(),
            values.clone().into_buffer_arg(),
            ids.clone().into_buffer_arg(),
            rows,
            n,
            k,
        )
        .unwrap_or_else(|e| panic!("ggml_top_k: {e}"));
        (values, ids)
    }

    fn ggml_moe_route(logits: CubeTensor, k: usize, norm: bool) -> (CubeTensor, CubeTensor) {
        assert_eq!(logits.dtype, DType::F32, "ggml_moe_route takes f32 logits");
        let logits = burn_cubecl::kernel::into_contiguous(logits);
        let [n, n_expert] = rows_cols(logits.meta.shape());
        let weights = empty_f32(&logits, Shape::new([n, k]));
        let ids = empty_u32(&logits, Shape::new([n, k]));
        let client = logits.client.clone();
        ggml_kernels::launch_moe_route(
            &client,
            logits.into_buffer_arg(),
            ids.clone().into_buffer_arg(),
            weights.clone().into_buffer_arg(),
            n,
            n_expert,
            k,
            norm,
        )
        .unwrap_or_else(|e| panic!("ggml_moe_route: {e}"));
        (weights, ids)
    }

    fn ggml_gemv_id(
        w: CubeTensor,
        grid: CubeTensor,
        x: CubeTensor,
        ids: CubeTensor,
        ggml_type: GgmlType,
        shape: ggml_kernels::GemvIdShape,
    ) -> CubeTensor {
        assert_eq!(w.dtype, DType::U32, "ggml weights must be a U32 tensor");
        assert_eq!(grid.dtype, DType::U32, "a ggml grid must be a U32 tensor");
        assert_eq!(x.dtype, DType::F32, "the expert GEMV takes f32 activations");
        assert_eq!(ids.dtype, DType::U32, "expert ids must be a U32 tensor");
        let [x, ids] = [x, ids].map(burn_cubecl::kernel::into_contiguous);
        let y = empty_f32(&x, Shape::new([shape.slots, shape.rows]));
        // The decode GEMV's layout where it is a split one; otherwise (own rows, a software
        // device) one unit per row.
        let config = match GemvConfig::for_client(&x.client) {
            c @ GemvConfig::Split { .. } => c,
            _ => GemvConfig::ROW_PER_UNIT,
        };
        let client = x.client.clone();
        ggml_kernels::launch_gemv_id(
            &client,
            ggml_type,
            w.into_buffer_arg(),
            grid.into_buffer_arg(),
            x.into_buffer_arg(),
            ids.into_buffer_arg(),
            y.clone().into_buffer_arg(),
            shape,
            config,
        )
        .unwrap_or_else(|e| panic!("ggml_gemv_id: {e}"));
        y
    }
}

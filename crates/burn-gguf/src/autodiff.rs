//! Gradients through the ggml-quant tensor type: [`GgmlOps`] for Burn's `Autodiff` backend
//! (DESIGN decision 10: gradients stop at the blocks).
//!
//! Packed weights are frozen. Their blocks are `Int` tensors, which autodiff never tracks, so
//! they get no gradient and are never dequantized whole. The products pass gradients to their
//! activations: for `y = x W^T`, `dx = dy W`, computed from the blocks by the transposed tile
//! matmul ([`GgmlOps::ggml_dequantize_matmul`]: blocks decoded into workgroup memory, or bounded
//! chunks of dequantized rows where the device has none), for GEMV rows
//! ([`GgmlOps::ggml_gemv`]) and for prefill-sized inputs alike. The backward pass keeps only a
//! reference to the blocks, never a dequantized copy.
//!
//! The fused layer ops (RMSNorm, the residual step, RoPE, the gated activation, the KV-cache
//! write and attention, delta-net, MoE routing and the expert GEMV) have no backward pass of
//! their own. Under `Autodiff` burn-gguf's wrappers ([`crate::rms_norm`], [`crate::rope`],
//! [`crate::attention()`], ...) run their Burn-op forms instead, since an autodiff device is not a
//! CubeCL one, and Burn's autodiff differentiates those (docs/finetune.md says why). Called
//! directly on a tracked tensor, these ops panic naming the wrapper to use; on untracked
//! tensors they run the inner backend's kernel, so inference on an autodiff device still works.
use crate::ops::GgmlOps;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, AutodiffBackend};
use gguf::GgmlType;

/// Rows `first..first + n` of one packed buffer holding `rows` rows of `cols` values: what a
/// product's backward pass keeps of its weight (the blocks, shared with the model: nothing is
/// copied).
struct PackedRows<B: GgmlOps> {
    w: IntTensor<B>,
    grid: IntTensor<B>,
    ggml_type: GgmlType,
    first: usize,
    n: usize,
    rows: usize,
    cols: usize,
    /// Whether the product is `y = x W` rather than `y = x W^T`.
    transposed: bool,
}

impl<B: GgmlOps> Clone for PackedRows<B> {
    fn clone(&self) -> Self {
        Self {
            w: self.w.clone(),
            grid: self.grid.clone(),
            ..*self
        }
    }
}

impl<B: GgmlOps> core::fmt::Debug for PackedRows<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "PackedRows {{ {}, rows {}..{} of [{}, {}], transposed {} }}",
            self.ggml_type,
            self.first,
            self.first + self.n,
            self.rows,
            self.cols,
            self.transposed
        )
    }
}

impl<B: GgmlOps> PackedRows<B> {
    /// The gradient of the product's input, straight from the blocks
    /// ([`GgmlOps::ggml_dequantize_matmul`]): `dy W[first..first + n]` (`dy` `[m, n]` ->
    /// `[m, cols]`) for `y = x W^T`, and `dy W^T` for the transposed product `y = x W`.
    fn dx(&self, dy: FloatTensor<B>) -> FloatTensor<B> {
        B::ggml_dequantize_matmul(
            self.w.clone(),
            self.grid.clone(),
            dy,
            self.ggml_type,
            self.first,
            self.n,
            self.rows,
            self.cols,
            !self.transposed,
        )
    }
}

/// The backward step of a packed product `y = x W^T`: `dx = dy W`, none for `W`.
#[derive(Debug)]
struct PackedProduct;

impl<B: GgmlOps> Backward<B, 1> for PackedProduct {
    type State = PackedRows<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let weight = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |dy| weight.dx(dy));
    }
}

/// `forward(x)` recorded as a packed product over `weight`'s rows when `x` is tracked.
fn packed_product<B: GgmlOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: PackedRows<B>,
    forward: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let (x, node) = x.into_parts();
    match PackedProduct
        .prepare::<C>([node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(weight, forward(x)),
        OpsKind::UnTracked(prep) => prep.finish(forward(x)),
    }
}

/// The inner tensor of an input to an op without a backward pass.
///
/// # Panics
/// If `t` is tracked: the gradient would silently stop there. `wrapper` names the function that
/// runs the op's Burn-op form under `Autodiff`.
fn untracked<B: GgmlOps, C: CheckpointStrategy>(
    t: FloatTensor<Autodiff<B, C>>,
    op: &str,
    wrapper: &str,
) -> FloatTensor<B> {
    assert!(
        !t.is_tracked(),
        "{op} has no backward pass; under Autodiff use {wrapper}, which runs Burn ops there"
    );
    t.into_primitive()
}

/// An inner tensor as an untracked autodiff one.
fn constant<B: GgmlOps, C: CheckpointStrategy>(t: FloatTensor<B>) -> FloatTensor<Autodiff<B, C>> {
    <Autodiff<B, C> as AutodiffBackend>::from_inner(t)
}

impl<B: GgmlOps, C: CheckpointStrategy> GgmlOps for Autodiff<B, C> {
    fn ggml_gemv(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
    ) -> FloatTensor<Self> {
        let weight = PackedRows::<B> {
            w: w.clone(),
            grid: grid.clone(),
            ggml_type,
            first: 0,
            n: rows,
            rows,
            cols,
            transposed: false,
        };
        packed_product::<B, C>(x, weight, |x| {
            B::ggml_gemv(w, grid, x, ggml_type, rows, cols)
        })
    }

    fn ggml_gemv_glu(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        gelu: bool,
    ) -> FloatTensor<Self> {
        let x = untracked::<B, C>(x, "ggml_gemv_glu", "GgmlLinear::forward_gated");
        constant::<B, C>(B::ggml_gemv_glu(w, grid, x, ggml_type, rows, cols, gelu))
    }

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
    ) -> FloatTensor<Self> {
        let weight = PackedRows::<B> {
            w: w.clone(),
            grid: grid.clone(),
            ggml_type,
            first,
            n,
            rows,
            cols,
            transposed,
        };
        packed_product::<B, C>(x, weight, |x| {
            B::ggml_dequantize_matmul(w, grid, x, ggml_type, first, n, rows, cols, transposed)
        })
    }

    fn ggml_dequantize_rows(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        ids: IntTensor<Self>,
        ggml_type: GgmlType,
        row_start: usize,
        rows: usize,
        cols: usize,
    ) -> FloatTensor<Self> {
        // A lookup of frozen rows (an embedding): gradient-free.
        constant::<B, C>(B::ggml_dequantize_rows(
            w, grid, ids, ggml_type, row_start, rows, cols,
        ))
    }

    fn ggml_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let [x, w] = [x, w].map(|t| untracked::<B, C>(t, "ggml_rms_norm", "burn_gguf::rms_norm"));
        constant::<B, C>(B::ggml_rms_norm(x, w, eps))
    }

    fn ggml_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        neox: bool,
    ) -> FloatTensor<Self> {
        let [x, cos, sin] =
            [x, cos, sin].map(|t| untracked::<B, C>(t, "ggml_rope", "burn_gguf::rope"));
        constant::<B, C>(B::ggml_rope(x, cos, sin, neox))
    }

    fn ggml_glu(gate: FloatTensor<Self>, up: FloatTensor<Self>, gelu: bool) -> FloatTensor<Self> {
        let [gate, up] = [gate, up].map(|t| untracked::<B, C>(t, "ggml_glu", "burn_gguf::gated"));
        constant::<B, C>(B::ggml_glu(gate, up, gelu))
    }

    fn ggml_glu_stacked(gate_up: FloatTensor<Self>, gelu: bool) -> FloatTensor<Self> {
        let gate_up = untracked::<B, C>(gate_up, "ggml_glu_stacked", "burn_gguf::gated_stacked");
        constant::<B, C>(B::ggml_glu_stacked(gate_up, gelu))
    }

    fn ggml_add_rms_norm(
        x: FloatTensor<Self>,
        o: FloatTensor<Self>,
        w_pre: FloatTensor<Self>,
        w: FloatTensor<Self>,
        eps: f32,
        pre: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [x, o, w_pre, w] = [x, o, w_pre, w]
            .map(|t| untracked::<B, C>(t, "ggml_add_rms_norm", "burn_gguf::add_rms_norm"));
        let (x, h) = B::ggml_add_rms_norm(x, o, w_pre, w, eps, pre);
        (constant::<B, C>(x), constant::<B, C>(h))
    }

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
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [qk, v, norms, table, k_cache, v_cache] = [qk, v, norms, table, k_cache, v_cache]
            .map(|t| untracked::<B, C>(t, "ggml_qk_rope_cache", "burn_gguf::qk_rope_cache"));
        let (q, k, v) = B::ggml_qk_rope_cache(
            qk, v, norms, table, rows, k_cache, v_cache, layout, norm_eps, neox,
        );
        (
            constant::<B, C>(q),
            constant::<B, C>(k),
            constant::<B, C>(v),
        )
    }

    fn ggml_attention(
        q: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        rows: IntTensor<Self>,
        layout: ggml_kernels::AttentionShape,
        scale: f32,
        softcap: f32,
    ) -> FloatTensor<Self> {
        let [q, k_cache, v_cache] = [q, k_cache, v_cache]
            .map(|t| untracked::<B, C>(t, "ggml_attention", "burn_gguf::attention"));
        constant::<B, C>(B::ggml_attention(
            q, k_cache, v_cache, rows, layout, scale, softcap,
        ))
    }

    fn ggml_causal_conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        window: FloatTensor<Self>,
        rows: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [x, weight, window] = [x, weight, window]
            .map(|t| untracked::<B, C>(t, "ggml_causal_conv", "burn_gguf::causal_conv_silu"));
        let (y, window) = B::ggml_causal_conv(x, weight, window, rows);
        (constant::<B, C>(y), constant::<B, C>(window))
    }

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
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [qkv, gates, dt_bias, a, state] = [qkv, gates, dt_bias, a, state]
            .map(|t| untracked::<B, C>(t, "ggml_gated_delta_net", "burn_gguf::gated_delta_net"));
        let (y, state) =
            B::ggml_gated_delta_net(qkv, gates, dt_bias, a, state, rows, shape, beta_off, eps);
        (constant::<B, C>(y), constant::<B, C>(state))
    }

    fn ggml_top_k(x: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>) {
        let x = untracked::<B, C>(x, "ggml_top_k", "burn_gguf::top_k");
        let (values, ids) = B::ggml_top_k(x, k);
        (constant::<B, C>(values), ids)
    }

    fn ggml_moe_route(
        logits: FloatTensor<Self>,
        k: usize,
        norm: bool,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        let logits = untracked::<B, C>(logits, "ggml_moe_route", "burn_gguf::moe_route");
        let (weights, ids) = B::ggml_moe_route(logits, k, norm);
        (constant::<B, C>(weights), ids)
    }

    fn ggml_gemv_id(
        w: IntTensor<Self>,
        grid: IntTensor<Self>,
        x: FloatTensor<Self>,
        ids: IntTensor<Self>,
        ggml_type: GgmlType,
        shape: ggml_kernels::GemvIdShape,
    ) -> FloatTensor<Self> {
        let x = untracked::<B, C>(x, "ggml_gemv_id", "GgmlExperts::forward");
        constant::<B, C>(B::ggml_gemv_id(w, grid, x, ids, ggml_type, shape))
    }
}

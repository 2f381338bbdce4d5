//! Attention over a KV cache that lives on the device, as Burn ops: the step that writes a
//! token's heads into the cache ([`qk_rope_cache`]) and attention over it ([`attention`]),
//! one kernel each on a CubeCL device, Burn ops elsewhere; and the RoPE angle table
//! ([`RopeTable`]) both read.
//!
//! A layer's cache is a pair of f32 tensors `[n_head_kv, capacity, head_dim]` (keys, values),
//! preallocated and written in place: a decode step copies nothing but the new token's heads.
use crate::nn::{RopeStyle, is_cube, rms_norm, rope};
use crate::ops::GgmlOps;
use burn::backend::Dispatch;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
pub use ggml_kernels::{AttentionShape, QkRopeShape};

/// Rotary angles of positions `0..positions`: `cos` and `sin` of
/// `p * base^(-2i / head_dim) / freq_factors[i]`, `[positions, head_dim / 2]` f32 each,
/// computed in f64 on the host once and kept on the device.
#[derive(Clone, Debug)]
pub struct RopeTable {
    /// `[positions, head_dim / 2]`.
    pub cos: Tensor<2>,
    /// `[positions, head_dim / 2]`.
    pub sin: Tensor<2>,
}

impl RopeTable {
    /// The table of `positions` positions for heads of `head_dim` (even) with RoPE base
    /// `base`; `freq_factors` (`head_dim / 2` values, llama.cpp `rope_freqs`) divide the
    /// frequencies where given.
    pub fn new(
        positions: usize,
        head_dim: usize,
        base: f32,
        freq_factors: Option<&[f32]>,
        device: &Device,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for i in 0..half {
                let factor = freq_factors.map_or(1.0, |f| f[i] as f64);
                let theta = (base as f64).powf(-2.0 * i as f64 / head_dim as f64) / factor;
                let a = p as f64 * theta;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [positions, half]), device),
            sin: Tensor::from_data(TensorData::new(sin, [positions, half]), device),
        }
    }

    /// Positions the table holds.
    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// The per-head RMSNorm of Q and K: their weights (`[head_dim]` f32 each) and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct QkNorm<'a> {
    /// `attn_q_norm`.
    pub q: &'a Tensor<1>,
    /// `attn_k_norm`.
    pub k: &'a Tensor<1>,
    /// `layer_norm_rms_epsilon`.
    pub eps: f32,
}

/// Writes one step's heads into a layer's KV cache: from the projections `qk` `[n, qk_stride]`
/// (query heads from column 0, key heads from `layout.k_off`) and `v` `[n, v_stride]` (value
/// heads from `layout.v_off`; `qk` and `v` may be one stacked Q/K/V projection), optionally
/// RMS-normalises Q and K per head (`norm`), rotates them by positions
/// `layout.past..layout.past + layout.n` of `table` (`style`), and stores K and V into
/// `k_cache` / `v_cache` `[n_head_kv, capacity, head_dim]` there. Returns the queries
/// `[n, n_head, head_dim]` and the caches.
///
/// On a CubeCL device this is one kernel ([`GgmlOps::ggml_qk_rope_cache`]) that writes the
/// caches in place (copying them first only if another tensor shares their buffers);
/// elsewhere Burn ops (`slice_assign`).
///
/// # Panics
/// If the shapes disagree with `layout` (a programming error in the caller), or on a
/// CubeCL device if the kernel's checks fail.
#[allow(clippy::too_many_arguments)]
pub fn qk_rope_cache(
    qk: Tensor<2>,
    v: Tensor<2>,
    norm: Option<QkNorm<'_>>,
    table: &RopeTable,
    style: RopeStyle,
    k_cache: Tensor<3>,
    v_cache: Tensor<3>,
    layout: QkRopeShape,
) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
    let QkRopeShape {
        n,
        n_head,
        n_head_kv,
        head_dim: hd,
        past,
        capacity,
        ..
    } = layout;
    assert!(
        qk.dims() == [n, layout.qk_stride]
            && v.dims() == [n, layout.v_stride]
            && k_cache.dims() == [n_head_kv, capacity, hd]
            && v_cache.dims() == [n_head_kv, capacity, hd]
            && past + n <= table.positions(),
        "qk_rope_cache: qk {:?}, v {:?}, caches {:?}/{:?}, {} table positions for {layout:?}",
        qk.dims(),
        v.dims(),
        k_cache.dims(),
        v_cache.dims(),
        table.positions()
    );
    if is_cube(&qk.device()) {
        // Unused placeholders when there is no norm: the kernel does not read them.
        let (qn, kn, eps) = match norm {
            Some(QkNorm { q, k, eps }) => (q.clone(), k.clone(), Some(eps)),
            None => {
                let len = table.cos.dims().iter().product::<usize>();
                let flat = |t: &Tensor<2>| t.clone().reshape([len]);
                (flat(&table.cos), flat(&table.sin), None)
            }
        };
        let (q, k_cache, v_cache) = Dispatch::ggml_qk_rope_cache(
            qk.into_dispatch(),
            v.into_dispatch(),
            qn.into_dispatch(),
            kn.into_dispatch(),
            table.cos.clone().into_dispatch(),
            table.sin.clone().into_dispatch(),
            k_cache.into_dispatch(),
            v_cache.into_dispatch(),
            layout,
            eps,
            style == RopeStyle::Neox,
        );
        return (
            Tensor::from_dispatch(q),
            Tensor::from_dispatch(k_cache),
            Tensor::from_dispatch(v_cache),
        );
    }
    let mut q = qk
        .clone()
        .narrow(1, 0, n_head * hd)
        .reshape([n, n_head, hd]);
    let mut k = qk
        .narrow(1, layout.k_off, n_head_kv * hd)
        .reshape([n, n_head_kv, hd]);
    let v = v
        .narrow(1, layout.v_off, n_head_kv * hd)
        .reshape([n, n_head_kv, hd]);
    if let Some(QkNorm { q: qn, k: kn, eps }) = norm {
        q = rms_norm(q, qn, eps);
        k = rms_norm(k, kn, eps);
    }
    let cos = table.cos.clone().narrow(0, past, n);
    let sin = table.sin.clone().narrow(0, past, n);
    let q = rope(q, &cos, &sin, style);
    let k = rope(k, &cos, &sin, style);
    let at = [0..n_head_kv, past..past + n, 0..hd];
    let k_cache = k_cache.slice_assign(at.clone(), k.swap_dims(0, 1));
    let v_cache = v_cache.slice_assign(at, v.swap_dims(0, 1));
    (q, k_cache, v_cache)
}

/// Causal grouped-query attention of `q` `[n, n_head, head_dim]` (positions
/// `layout.past..layout.past + n`) over a layer's cache `[n_head_kv, capacity, head_dim]`
/// (positions `0..past + n` written): softmax of `scale * q k^T` over the keys each query sees
/// (itself and before, within `layout.window` when set), times the values; query head `h`
/// reads KV head `h / (n_head / n_head_kv)`. Returns `[n, n_head * head_dim]` f32.
///
/// On a CubeCL device whose compiler takes workgroup shared memory this is one kernel (plus a
/// small combine kernel past [`ggml_kernels::attention::ATTENTION_SPLIT`] visible keys;
/// [`GgmlOps::ggml_attention`]), which never builds a mask; elsewhere Burn ops over the
/// cache's first `past + n` positions with an additive `[n, past + n]` mask.
///
/// # Panics
/// If the shapes disagree with `layout` (a programming error in the caller), or on a
/// CubeCL device if the kernel's checks fail.
pub fn attention(
    q: Tensor<3>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    layout: AttentionShape,
    scale: f32,
) -> Tensor<2> {
    let AttentionShape {
        n,
        n_head,
        n_head_kv,
        head_dim: hd,
        capacity,
        past,
        window,
    } = layout;
    assert!(
        q.dims() == [n, n_head, hd]
            && k_cache.dims() == [n_head_kv, capacity, hd]
            && v_cache.dims() == [n_head_kv, capacity, hd]
            && past + n <= capacity
            && n_head_kv > 0
            && n_head.is_multiple_of(n_head_kv),
        "attention: q {:?}, caches {:?}/{:?} for {layout:?}",
        q.dims(),
        k_cache.dims(),
        v_cache.dims()
    );
    let device = q.device();
    let kernel = is_cube(&device)
        && crate::cube_client(&device).is_some_and(|c| ggml_kernels::shared_memory_ok(&c));
    if kernel {
        return Tensor::from_dispatch(Dispatch::ggml_attention(
            q.into_dispatch(),
            k_cache.clone().into_dispatch(),
            v_cache.clone().into_dispatch(),
            layout,
            scale,
        ));
    }
    let total = past + n;
    let rep = n_head / n_head_kv;
    let k = k_cache.clone().narrow(1, 0, total);
    let v = v_cache.clone().narrow(1, 0, total);
    // Query heads g*rep..(g+1)*rep share KV head g.
    let qg = q.swap_dims(0, 1).reshape([n_head_kv, rep * n, hd]);
    let scores = qg.matmul(k.swap_dims(1, 2)) * scale as f64; // [nkv, rep*n, total]
    let mut scores = scores.reshape([n_head_kv, rep, n, total]);
    if let Some(mask) = attention_mask(past, n, window, &device) {
        scores = scores + mask.unsqueeze::<4>();
    }
    let probs = softmax(scores, 3).reshape([n_head_kv, rep * n, total]);
    probs
        .matmul(v)
        .reshape([n_head, n, hd])
        .swap_dims(0, 1)
        .reshape([n, n_head * hd])
}

/// Additive mask `[n, total]` for queries at positions `past..past + n` over keys `0..total`:
/// causal, and within `window` tokens when given; `None` when nothing is masked.
fn attention_mask(
    past: usize,
    n: usize,
    window: Option<usize>,
    device: &Device,
) -> Option<Tensor<2>> {
    let total = past + n;
    let limited = window.is_some_and(|w| total > w);
    if n == 1 && !limited {
        return None;
    }
    let mut m = vec![0.0f32; n * total];
    for t in 0..n {
        let p = past + t;
        for s in 0..total {
            let visible = s <= p && window.is_none_or(|w| p - s < w);
            if !visible {
                m[t * total + s] = f32::NEG_INFINITY;
            }
        }
    }
    Some(Tensor::from_data(TensorData::new(m, [n, total]), device))
}

//! Mixture-of-experts FFN on the device: routing ([`moe_route`]) and the experts
//! ([`GgmlExperts`]), both taking and giving device tensors, so a MoE layer reads nothing back
//! to the host (llama.cpp `build_moe_ffn`: `ggml_soft_max`, `ggml_top_k`, `ggml_mul_mat_id`).
use crate::Error;
use crate::nn::{Activation, DenseWeight, Weight, gated, is_cube};
use crate::ops::GgmlOps;
use crate::tensor::GgmlTensor;
use burn::backend::Dispatch;
use burn::module::Module;
use burn::tensor::{DType, Int, Tensor, TensorData};
use ggml_kernels::moe::{GemvIdShape, route_row};

/// Each token's `k` experts and their weights from its router logits: `logits`
/// `[n, n_expert]` f32 -> (`weights` `[n, k]` f32, `ids` `[n, k]` u32), the softmax's `k`
/// largest probabilities in decreasing order (equal ones by increasing expert id), divided by
/// their sum when `norm` (llama.cpp's `norm_w`). One kernel on a CubeCL device
/// ([`ggml_kernels::launch_moe_route`]); elsewhere on the host
/// ([`ggml_kernels::moe::route_row`]).
///
/// # Panics
/// If `k` is 0 or above `n_expert` (a programming error of the caller: the config checks it).
pub fn moe_route(logits: Tensor<2>, k: usize, norm: bool) -> (Tensor<2>, Tensor<2, Int>) {
    let [n, n_expert] = logits.dims();
    assert!(
        (1..=n_expert).contains(&k),
        "moe_route: {k} of {n_expert} experts"
    );
    let device = logits.device();
    if is_cube(&device) {
        let (weights, ids) = Dispatch::ggml_moe_route(logits.into_dispatch(), k, norm);
        return (Tensor::from_dispatch(weights), Tensor::from_dispatch(ids));
    }
    let data = logits.into_data().convert::<f32>();
    let rows = data.as_slice::<f32>().expect("f32 after convert");
    let (mut weights, mut ids) = (Vec::with_capacity(n * k), Vec::with_capacity(n * k));
    for row in rows.chunks_exact(n_expert) {
        let (i, w) = route_row(row, k, norm);
        ids.extend(i.iter().map(|&e| e as i64));
        weights.extend(w);
    }
    (
        Tensor::from_data(TensorData::new(weights, [n, k]), &device),
        Tensor::from_data(TensorData::new(ids, [n, k]), &device),
    )
}

/// Which rows of each expert of a bank a product takes: the bank is `[n_expert * expert_rows,
/// cols]`, expert `e`'s rows `e * expert_rows + row_offset ..` `+ rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRows {
    /// Experts in the bank.
    pub n_expert: usize,
    /// Rows of each expert.
    pub expert_rows: usize,
    /// The first row taken of each expert.
    pub row_offset: usize,
    /// Rows taken of each expert.
    pub rows: usize,
}

impl GgmlTensor {
    /// The expert product of a bank (this tensor, `[n_expert * expert_rows, cols]`):
    /// `y[s] = x[s / x_div] W_{ids[s]}^T` with `W_e` the rows `sel` takes of expert `e`, for
    /// `x` `[ceil(slots / x_div), cols]` f32 and `ids` `[slots]` u32 expert ids on the device ->
    /// `[slots, sel.rows]` f32. One fused GEMV per buffer of the bank
    /// ([`GgmlOps::ggml_gemv_id`]).
    pub fn matmul_id(
        &self,
        x: Tensor<2>,
        ids: Tensor<1, Int>,
        sel: ExpertRows,
        x_div: usize,
    ) -> Tensor<2> {
        let slots = ids.dims()[0];
        let cols = self.shape()[1];
        let ids = ids.cast(DType::U32);
        let mut out: Option<Tensor<2>> = None;
        for (words, row_start, part_rows) in self.part_words() {
            let shape = GemvIdShape {
                rows: sel.rows,
                cols,
                slots,
                x_div,
                expert_rows: sel.expert_rows,
                row_offset: sel.row_offset,
                row_start,
                part_rows,
                n_expert: sel.n_expert,
            };
            let y = Tensor::from_dispatch(Dispatch::ggml_gemv_id(
                words.into_dispatch(),
                self.grid().into_dispatch(),
                x.clone().into_dispatch(),
                ids.clone().into_dispatch(),
                self.ggml_type(),
                shape,
            ));
            out = Some(match out {
                None => y,
                Some(acc) => acc + y,
            });
        }
        out.expect("a GgmlTensor has at least one part")
    }
}

/// Bytes of dequantized expert rows [`DenseWeight::matmul_id`] gathers at once: slots beyond
/// it run in further passes, so a long prefill's `slots x rows x cols` gather stays bounded.
const DENSE_GATHER_BYTES: usize = 256 << 20;

impl DenseWeight {
    /// [`GgmlTensor::matmul_id`] of a dequantized bank with Burn ops: each slot's rows gathered
    /// (`[slots, rows, cols]`, in passes of at most 256 MiB of f32 rows) and
    /// multiplied by its input.
    pub fn matmul_id(
        &self,
        x: Tensor<2>,
        ids: Tensor<1, Int>,
        sel: ExpertRows,
        x_div: usize,
    ) -> Tensor<2> {
        self.matmul_id_within(x, ids, sel, x_div, DENSE_GATHER_BYTES)
    }

    /// [`DenseWeight::matmul_id`] gathering at most `budget` bytes of rows per pass.
    fn matmul_id_within(
        &self,
        x: Tensor<2>,
        ids: Tensor<1, Int>,
        sel: ExpertRows,
        x_div: usize,
        budget: usize,
    ) -> Tensor<2> {
        let slots = ids.dims()[0];
        let cols = self.shape()[1];
        let device = x.device();
        let per_slot = (sel.rows * cols * size_of::<f32>()).max(1);
        let pass = (budget / per_slot).clamp(1, slots.max(1));
        // Bank row of each (slot, row): ids[s] * expert_rows + row_offset + r.
        let offsets = Tensor::<1, Int>::arange(0..sel.rows as i64, &device);
        let ids = ids.cast(offsets.dtype());
        let mut outs = Vec::with_capacity(slots.div_ceil(pass));
        for start in (0..slots).step_by(pass) {
            let end = (start + pass).min(slots);
            let n = end - start;
            let first = ids
                .clone()
                .slice(start..end)
                .mul_scalar(sel.expert_rows as i64)
                .add_scalar(sel.row_offset as i64);
            let rows = first.reshape([n, 1]) + offsets.clone().reshape([1, sel.rows]);
            let w = self
                .rows_by(rows.reshape([n * sel.rows]))
                .reshape([n, sel.rows, cols]);
            let x_rows = Tensor::<1, Int>::arange(start as i64..end as i64, &device)
                .div_scalar(x_div as i64);
            let xs = x.clone().select(0, x_rows).reshape([n, cols, 1]);
            outs.push(w.matmul(xs).reshape([n, sel.rows]));
        }
        match outs.len() {
            0 => Tensor::zeros([0, sel.rows], &device),
            1 => outs.pop().expect("one pass"),
            _ => Tensor::cat(outs, 0),
        }
    }
}

impl Weight {
    /// The expert product of a bank ([`GgmlTensor::matmul_id`], [`DenseWeight::matmul_id`]).
    pub fn matmul_id(
        &self,
        x: Tensor<2>,
        ids: Tensor<1, Int>,
        sel: ExpertRows,
        x_div: usize,
    ) -> Tensor<2> {
        match self {
            Weight::Packed(t) => t.matmul_id(x, ids, sel, x_div),
            Weight::Dense(w) => w.matmul_id(x, ids, sel, x_div),
        }
    }
}

/// The routed experts of a MoE FFN (SiLU-gated, as llama.cpp's `build_moe_ffn` for qwen3moe),
/// their banks stacked by rows as the file stores them: `gate` `[n_expert * d_ff, d_model]`
/// (with `merged`, `[n_expert * 2 d_ff, d_model]`: each expert's gate rows then its up rows,
/// `ffn_gate_up_exps`), `up` `[n_expert * d_ff, d_model]` unless merged, `down`
/// `[n_expert * d_model, d_ff]`.
#[derive(Module, Debug)]
pub struct GgmlExperts {
    /// The gate bank, or the merged gate/up bank.
    pub gate: Weight,
    /// The up bank; `None` when `gate` holds both.
    pub up: Option<Weight>,
    /// The down bank.
    pub down: Weight,
    /// Experts in each bank.
    pub n_expert: usize,
}

impl GgmlExperts {
    /// Experts from their banks (see the struct docs).
    ///
    /// # Errors
    /// [`Error::Shape`] when the banks' shapes disagree or do not split into `n_expert`.
    pub fn new(
        gate: Weight,
        up: Option<Weight>,
        down: Weight,
        n_expert: usize,
    ) -> Result<Self, Error> {
        let experts = Self {
            gate,
            up,
            down,
            n_expert,
        };
        let ([d_ff, d_model], [down_rows, down_cols]) = (experts.ffn_shape(), experts.down.shape());
        let [gate_rows, gate_cols] = experts.gate.shape();
        let gate_per = if experts.up.is_some() { d_ff } else { 2 * d_ff };
        let ok = n_expert > 0
            && d_ff > 0
            && gate_rows == n_expert * gate_per
            && gate_cols == d_model
            && experts
                .up
                .as_ref()
                .is_none_or(|u| u.shape() == [n_expert * d_ff, d_model])
            && down_rows == n_expert * d_model
            && down_cols == d_ff;
        if !ok {
            return Err(Error::Shape(format!(
                "expert banks disagree for {n_expert} experts: gate {:?}, up {:?}, down {:?}",
                experts.gate.shape(),
                experts.up.as_ref().map(Weight::shape),
                experts.down.shape()
            )));
        }
        Ok(experts)
    }

    /// Experts in the bank.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// `[d_ff, d_model]`: one expert's gate (or up) projection.
    pub fn ffn_shape(&self) -> [usize; 2] {
        let [rows, d_model] = self.gate.shape();
        let per = rows / self.n_expert.max(1);
        [if self.up.is_some() { per } else { per / 2 }, d_model]
    }

    /// `y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))` with `e = ids[t, j]`,
    /// for `x` `[n, d_model]` and `ids` (u32 expert ids), `weights` `[n, k]` on the device (as
    /// [`moe_route`] gives them). Each slot runs its expert's projections
    /// ([`Weight::matmul_id`]): about six kernels a layer and nothing read back. Returns
    /// `[n, d_model]`.
    ///
    /// # Errors
    /// [`Error::Shape`] when `ids` and `weights` are not both `[n, k]`.
    pub fn forward(
        &self,
        x: Tensor<2>,
        ids: Tensor<2, Int>,
        weights: Tensor<2>,
    ) -> Result<Tensor<2>, Error> {
        let [n, _] = x.dims();
        let [n_ids, k] = ids.dims();
        if n_ids != n || weights.dims() != [n, k] {
            return Err(Error::Shape(format!(
                "experts: ids {:?} and weights {:?} for {n} tokens",
                ids.dims(),
                weights.dims()
            )));
        }
        let [d_ff, d_model] = self.ffn_shape();
        let slots = n * k;
        let ids = ids.reshape([slots]);
        let half = |row_offset: usize, expert_rows: usize| ExpertRows {
            n_expert: self.n_expert,
            expert_rows,
            row_offset,
            rows: d_ff,
        };
        let (gate, up) = match &self.up {
            Some(up) => (
                self.gate
                    .matmul_id(x.clone(), ids.clone(), half(0, d_ff), k),
                up.matmul_id(x, ids.clone(), half(0, d_ff), k),
            ),
            None => (
                self.gate
                    .matmul_id(x.clone(), ids.clone(), half(0, 2 * d_ff), k),
                self.gate.matmul_id(x, ids.clone(), half(d_ff, 2 * d_ff), k),
            ),
        };
        let act = gated(gate, up, Activation::Silu);
        let down = ExpertRows {
            n_expert: self.n_expert,
            expert_rows: d_model,
            row_offset: 0,
            rows: d_model,
        };
        let y = self.down.matmul_id(act, ids, down, 1);
        Ok((y.reshape([n, k, d_model]) * weights.reshape([n, k, 1]))
            .sum_dim(1)
            .reshape([n, d_model]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// The dense expert product in passes equals the product taken row by row on the host, for
    /// a bank in one part and in three.
    #[test]
    fn dense_matmul_id_in_passes() {
        let device = Device::flex();
        let (n_expert, expert_rows, cols) = (3, 4, 5);
        let bank: Vec<f32> = (0..n_expert * expert_rows * cols)
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let x: Vec<f32> = (0..2 * cols).map(|i| (i as f32) * 0.25 - 1.0).collect();
        // Two tokens, k = 3 slots each, sharing their token's input (x_div 3); the up half.
        let ids = [2i64, 0, 1, 1, 1, 2];
        let sel = ExpertRows {
            n_expert,
            expert_rows,
            row_offset: 2,
            rows: 2,
        };
        let mut expect = Vec::new();
        for (s, &e) in ids.iter().enumerate() {
            for r in 0..sel.rows {
                let row = e as usize * expert_rows + sel.row_offset + r;
                let xs = &x[(s / 3) * cols..][..cols];
                expect.push((0..cols).map(|c| bank[row * cols + c] * xs[c]).sum::<f32>());
            }
        }
        let whole = Tensor::<2>::from_data(
            TensorData::new(bank.clone(), [n_expert * expert_rows, cols]),
            &device,
        );
        // Parts of 5 rows: 0..5, 5..10, 10..12.
        let split = DenseWeight::from_values(
            bank.clone(),
            [n_expert * expert_rows, cols],
            &device,
            (5 * cols * size_of::<f32>()) as u64,
            burn::tensor::FloatDType::F32,
        )
        .unwrap();
        let x = Tensor::<2>::from_data(TensorData::new(x, [2, cols]), &device);
        let ids = Tensor::<1, Int>::from_data(TensorData::new(ids.to_vec(), [6]), &device);
        let per_slot = sel.rows * cols * size_of::<f32>();
        for w in [DenseWeight::new(whole), split] {
            for budget in [usize::MAX, per_slot, 4 * per_slot] {
                let y = w.matmul_id_within(x.clone(), ids.clone(), sel, 3, budget);
                assert_eq!(y.dims(), [6, sel.rows]);
                let got = y.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
                for (g, e) in got.iter().zip(&expect) {
                    assert!(
                        (g - e).abs() <= 1e-4 * e.abs().max(1.0),
                        "{got:?} vs {expect:?}"
                    );
                }
            }
        }
    }
}

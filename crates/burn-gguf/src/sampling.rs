//! What a sampler needs of a row of logits, taken on the device.
use burn::tensor::{Int, Tensor, TensorData};

use crate::nn::is_cube;
use crate::ops::GgmlOps;
use burn::backend::Dispatch;

pub use ggml_kernels::top_k::{NO_ID, TOP_K_MAX, top_k_row};

/// The `k` largest values of each row of `logits` `[rows, n]` f32 and their columns, best first
/// (larger value, then smaller column): `([rows, k]` f32, `[rows, k]` Int`)`. NaN and infinite
/// values are skipped; a row with fewer than `k` finite values ends in [`NO_ID`] columns. On a
/// CubeCL device one or two kernels ([`ggml_kernels::launch_top_k`]), so a sampler reads back
/// `k` pairs instead of the row; elsewhere on the host ([`ggml_kernels::top_k::top_k_row`]).
///
/// # Panics
/// If `k` is 0 or past [`TOP_K_MAX`], or a row is empty (programming errors of the caller).
pub fn top_k(logits: Tensor<2>, k: usize) -> (Tensor<2>, Tensor<2, Int>) {
    let [rows, n] = logits.dims();
    assert!(
        (1..=TOP_K_MAX).contains(&k) && n > 0,
        "top_k: k = {k} of rows of {n}"
    );
    let device = logits.device();
    if is_cube(&device) {
        let (values, ids) = Dispatch::ggml_top_k(logits.into_dispatch(), k);
        return (Tensor::from_dispatch(values), Tensor::from_dispatch(ids));
    }
    let data = logits.into_data().convert::<f32>();
    let row_values = data.as_slice::<f32>().expect("f32 after convert");
    let (mut values, mut ids) = (Vec::with_capacity(rows * k), Vec::with_capacity(rows * k));
    for row in row_values.chunks_exact(n) {
        let best = ggml_kernels::top_k::top_k_row(row, k);
        values.extend(best.iter().map(|b| b.0));
        ids.extend(best.iter().map(|b| b.1 as i64));
        values.resize(values.len() + k - best.len(), f32::MIN);
        ids.resize(ids.len() + k - best.len(), NO_ID as i64);
    }
    (
        Tensor::from_data(TensorData::new(values, [rows, k]), &device),
        Tensor::from_data(TensorData::new(ids, [rows, k]), &device),
    )
}

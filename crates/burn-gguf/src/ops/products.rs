//! The packed products on a CubeCL device: the fused GEMV ([`GgmlOps::ggml_gemv`],
//! [`GgmlOps::ggml_gemv_glu`]) and the product over many rows
//! ([`GgmlOps::ggml_dequantize_matmul`]: the tile kernel, or chunked dequantize + matmul).
use super::{GgmlOps, empty_f32};
use burn::backend::TensorMetadata;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::tensor::{DType, Shape, TensorData};
use cubecl::prelude::BufferArg;
use ggml_kernels::matmul::MatmulPath;
use ggml_kernels::{GemvConfig, GemvLaunch, MAX_GEMV_ROWS};
use gguf::GgmlType;

/// The fused GEMV of [`GgmlOps::ggml_gemv`] (`glu` `None`) and [`GgmlOps::ggml_gemv_glu`]
/// (`Some(gelu)`: `rows / 2` outputs) on a CubeCL device.
pub(super) fn gemv_op(
    w: CubeTensor,
    grid: CubeTensor,
    x: CubeTensor,
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
    glu: Option<bool>,
) -> CubeTensor {
    assert_eq!(w.dtype, DType::U32, "ggml weights must be a U32 tensor");
    assert_eq!(grid.dtype, DType::U32, "a ggml grid must be a U32 tensor");
    assert_eq!(x.dtype, DType::F32, "the ggml GEMV takes f32 activations");
    let x = burn_cubecl::kernel::into_contiguous(x);
    let m = x.meta.shape().num_elements() / cols.max(1);
    let out = if glu.is_some() { rows / 2 } else { rows };
    let y = empty_f32(&x, Shape::new([m, out]));
    let config = GemvConfig::for_client(&x.client);
    let client = x.client.clone();
    let launch = GemvLaunch {
        pass_rows: None,
        glu,
    };
    // Passes of at most MAX_GEMV_ROWS rows over views of x and y (the caller checked that
    // every pass starts at an aligned offset: `gemv_passes_fit`).
    let (w, grid) = (w.into_buffer_arg(), grid.into_buffer_arg());
    let arg = |b: &BufferArg| match b {
        // SAFETY: the same buffer, with the length it was given.
        BufferArg::Handle { handle } => unsafe {
            BufferArg::from_raw_parts_binding(handle.handle.clone(), b.len())
        },
        BufferArg::Alias { .. } => unreachable!("a tensor's buffer is not an alias"),
    };
    for start in (0..m).step_by(MAX_GEMV_ROWS) {
        let len = MAX_GEMV_ROWS.min(m - start);
        let view = |t: &CubeTensor, width: usize| {
            let bytes = (start * width * size_of::<f32>()) as u64;
            // SAFETY: rows start..start + len of a contiguous [m, width] f32 buffer.
            unsafe { BufferArg::from_raw_parts(t.handle.clone().offset_start(bytes), len * width) }
        };
        ggml_kernels::launch_gemv_with(
            &client,
            ggml_type,
            arg(&w),
            arg(&grid),
            view(&x, cols),
            view(&y, out),
            rows,
            cols,
            config,
            launch,
        )
        .unwrap_or_else(|e| panic!("ggml GEMV: {e}"));
    }
    y
}

/// Whether [`GgmlOps::ggml_gemv`] can take `m` activation rows of `cols` into `out` outputs in
/// passes of [`MAX_GEMV_ROWS`] over views of its buffers: one pass, or every pass's first row
/// of `x` and `y` at a multiple of the device's buffer-offset alignment (`align` bytes).
pub(crate) fn gemv_passes_fit(m: usize, cols: usize, out: usize, align: u64) -> bool {
    let pass = |width: usize| (MAX_GEMV_ROWS * width * size_of::<f32>()) as u64;
    m <= MAX_GEMV_ROWS
        || (align > 0 && pass(cols).is_multiple_of(align) && pass(out).is_multiple_of(align))
}

/// [`GgmlOps::ggml_dequantize_matmul`] on a CubeCL device: the tile kernel or the chunked
/// path, as [`MatmulPath::for_client`] chooses for the device and the product.
#[allow(clippy::too_many_arguments)]
pub(super) fn dequantize_matmul_op(
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
    assert_eq!(w.dtype, DType::U32, "ggml weights must be a U32 tensor");
    assert_eq!(grid.dtype, DType::U32, "a ggml grid must be a U32 tensor");
    assert_eq!(x.dtype, DType::F32, "the ggml matmul takes f32 activations");
    let x = burn_cubecl::kernel::into_contiguous(x);
    let m = x.meta.shape()[0];
    if MatmulPath::for_client(&x.client, transposed) == MatmulPath::Chunked {
        return chunked_matmul::<CubeBackend>(
            w, grid, x, ggml_type, first, n, rows, cols, transposed,
        );
    }
    let y = empty_f32(&x, Shape::new([m, if transposed { cols } else { n }]));
    let client = x.client.clone();
    ggml_kernels::launch_dequantize_matmul(
        &client,
        ggml_type,
        w.into_buffer_arg(),
        grid.into_buffer_arg(),
        x.into_buffer_arg(),
        y.clone().into_buffer_arg(),
        m,
        first,
        n,
        rows,
        cols,
        transposed,
    )
    .unwrap_or_else(|e| panic!("ggml_dequantize_matmul: {e}"));
    y
}

/// [`MatmulPath::Chunked`]: weight rows dequantized at most
/// [`crate::tensor::PREFILL_SCRATCH_BYTES`] at a time into a scratch and multiplied with Burn's
/// matmul; transposed, the chunks' products are summed.
#[allow(clippy::too_many_arguments)]
fn chunked_matmul<B: GgmlOps>(
    w: IntTensor<B>,
    grid: IntTensor<B>,
    x: FloatTensor<B>,
    ggml_type: GgmlType,
    first: usize,
    n: usize,
    rows: usize,
    cols: usize,
    transposed: bool,
) -> FloatTensor<B> {
    let (m, device) = (x.shape()[0], x.device());
    let chunk = crate::tensor::prefill_chunk_rows(cols);
    let mut outs = Vec::new();
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let ids: Vec<u32> = (first + start..first + start + len)
            .map(|r| r as u32)
            .collect();
        let ids = B::int_from_data(TensorData::new(ids, [len]), &device);
        let scratch =
            B::ggml_dequantize_rows(w.clone(), grid.clone(), ids, ggml_type, 0, rows, cols);
        outs.push(if transposed {
            let part = B::float_slice(
                x.clone(),
                &[
                    burn::tensor::Slice::from(0..m),
                    burn::tensor::Slice::from(start..start + len),
                ],
            );
            B::float_matmul(part, scratch)
        } else {
            B::float_matmul(x.clone(), B::float_transpose(scratch))
        });
    }
    let out = Shape::new([m, if transposed { cols } else { n }]);
    match outs.len() {
        0 => B::float_zeros(out, &device, DType::F32.into()),
        1 => outs.pop().expect("one chunk"),
        _ if transposed => outs.into_iter().reduce(B::float_add).expect("chunks"),
        _ => B::float_cat(outs, 1),
    }
}

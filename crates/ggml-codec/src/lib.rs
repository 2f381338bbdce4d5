//! CPU reference codecs for ggml block types: the oracle every GPU kernel is checked against, and
//! the dequantize fallback for backends without kernels.
//!
//! Block layouts follow llama.cpp `ggml/src/ggml-common.h`; decoders and quantizers are ports of
//! `ggml/src/ggml-quants.c` with the same f32 operation order, so results are bit-identical to
//! ggml (checked against `shared/fixtures/dequant`).
//!
//! Supported for dequantization: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, TQ1_0, TQ2_0, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q1_0, Q2_0, IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. Quantization: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! TQ1_0, TQ2_0, MXFP4.
//!
//! The IQ codebooks and other lookup tables of ggml live in [`grids`], their only copy in the
//! workspace.
//!
//! ```
//! use ggml_codec::{dequantize_to_vec, quantize_q8_0};
//! use gguf::GgmlType;
//! let x: Vec<f32> = (0..64).map(|i| i as f32 - 32.0).collect();
//! let q = quantize_q8_0(&x);
//! let y = dequantize_to_vec(GgmlType::Q8_0, &q, 64).unwrap();
//! assert!((y[0] - x[0]).abs() <= 32.0 / 127.0);
//! ```

#![warn(missing_docs)]
pub mod blocks;
pub mod grids;
pub mod quantize;

pub use blocks::{
    BlockBF16, BlockF16, BlockF32, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS,
    BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockNVFP4, BlockQ1_0, BlockQ2_0,
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockTQ1_0, BlockTQ2_0, GgmlBlock, IQ1S_DELTA, QK_K, bf16_to_f32, e8m0_to_fp32_half,
    fp16_to_f32, get_scale_min_k4, ue4m3_to_fp32,
};
pub use quantize::{
    f32_to_bf16, f32_to_fp16, quantize_bf16, quantize_f16, quantize_mxfp4, quantize_q4_0,
    quantize_q4_1, quantize_q5_0, quantize_q5_1, quantize_q8_0, quantize_tq1_0, quantize_tq2_0,
};

use gguf::GgmlType;

/// Errors of the CPU codec.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    /// The CPU codec has no decoder (or encoder) for this type yet.
    #[error("the CPU codec does not support ggml type {0}")]
    Unsupported(GgmlType),

    /// The element count is not a whole number of blocks.
    #[error("{n_elements} elements is not a multiple of the {ty} block size {block_size}")]
    NotBlockMultiple {
        /// The type.
        ty: GgmlType,
        /// Elements asked for.
        n_elements: u64,
        /// Elements per block of `ty`.
        block_size: usize,
    },

    /// The data length does not match the element count.
    #[error("{ty} data is {actual} bytes, expected {expected} bytes for {n_elements} elements")]
    Length {
        /// The type.
        ty: GgmlType,
        /// Elements asked for.
        n_elements: u64,
        /// Bytes expected (`ty.row_bytes(n_elements)`).
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
}

/// Whether [`dequantize`] supports `ty`.
pub fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | TQ1_0
            | TQ2_0
            | IQ4_NL
            | IQ4_XS
            | MXFP4
            | NVFP4
            | Q1_0
            | Q2_0
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
    )
}

/// Whether [`quantize()`] supports `ty`.
pub fn supports_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | TQ1_0 | TQ2_0 | MXFP4
    )
}

/// Checks that `data` holds exactly `n_elements` values of `ty`.
fn check_lengths(ty: GgmlType, data: &[u8], n_elements: u64) -> Result<(), CodecError> {
    let expected = ty
        .row_bytes(n_elements)
        .map_err(|_| CodecError::NotBlockMultiple {
            ty,
            n_elements,
            block_size: ty.block_size(),
        })?;
    if data.len() as u64 != expected {
        return Err(CodecError::Length {
            ty,
            n_elements,
            expected,
            actual: data.len() as u64,
        });
    }
    Ok(())
}

/// Decodes whole blocks of type `B` from `data` into `out` (`out.len() == blocks * B::BLOCK_SIZE`).
///
/// # Errors
/// [`CodecError::Length`] when `data` is not `out.len() / B::BLOCK_SIZE` blocks.
pub fn dequantize_blocks<B: GgmlBlock>(data: &[u8], out: &mut [f32]) -> Result<(), CodecError> {
    let n_elements = out.len() as u64;
    let length_err = || CodecError::Length {
        ty: B::TYPE,
        n_elements,
        expected: (out.len() / B::BLOCK_SIZE * std::mem::size_of::<B>()) as u64,
        actual: data.len() as u64,
    };
    if !out.len().is_multiple_of(B::BLOCK_SIZE) {
        return Err(CodecError::NotBlockMultiple {
            ty: B::TYPE,
            n_elements,
            block_size: B::BLOCK_SIZE,
        });
    }
    let blocks: &[B] = bytemuck::try_cast_slice(data).map_err(|_| length_err())?;
    if blocks.len() * B::BLOCK_SIZE != out.len() {
        return Err(length_err());
    }
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::BLOCK_SIZE)) {
        b.dequantize(o);
    }
    Ok(())
}

/// Dequantizes `out.len()` values of type `ty` from their raw ggml bytes into f32, bit-exactly as
/// ggml's `to_float` does.
///
/// `data` must be exactly `ty.row_bytes(out.len())` bytes: any whole number of blocks, e.g. one
/// row or a whole tensor (rows are stored back to back).
///
/// # Errors
/// [`CodecError::Unsupported`] for a type without a CPU decoder (see [`supports`]),
/// [`CodecError::NotBlockMultiple`] when `out.len()` is not a whole number of blocks, and
/// [`CodecError::Length`] when `data` has the wrong length. Never panics.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), CodecError> {
    if !supports(ty) {
        return Err(CodecError::Unsupported(ty));
    }
    check_lengths(ty, data, out.len() as u64)?;
    match ty {
        GgmlType::F32 => {
            // Plain copy; a dedicated path avoids the per-element trait call.
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        }
        GgmlType::F16 => dequantize_blocks::<BlockF16>(data, out),
        GgmlType::BF16 => dequantize_blocks::<BlockBF16>(data, out),
        GgmlType::Q4_0 => dequantize_blocks::<BlockQ4_0>(data, out),
        GgmlType::Q4_1 => dequantize_blocks::<BlockQ4_1>(data, out),
        GgmlType::Q5_0 => dequantize_blocks::<BlockQ5_0>(data, out),
        GgmlType::Q5_1 => dequantize_blocks::<BlockQ5_1>(data, out),
        GgmlType::Q8_0 => dequantize_blocks::<BlockQ8_0>(data, out),
        GgmlType::Q2_K => dequantize_blocks::<BlockQ2K>(data, out),
        GgmlType::Q3_K => dequantize_blocks::<BlockQ3K>(data, out),
        GgmlType::Q4_K => dequantize_blocks::<BlockQ4K>(data, out),
        GgmlType::Q5_K => dequantize_blocks::<BlockQ5K>(data, out),
        GgmlType::Q6_K => dequantize_blocks::<BlockQ6K>(data, out),
        GgmlType::TQ1_0 => dequantize_blocks::<BlockTQ1_0>(data, out),
        GgmlType::TQ2_0 => dequantize_blocks::<BlockTQ2_0>(data, out),
        GgmlType::IQ4_NL => dequantize_blocks::<BlockIQ4NL>(data, out),
        GgmlType::IQ4_XS => dequantize_blocks::<BlockIQ4XS>(data, out),
        GgmlType::MXFP4 => dequantize_blocks::<BlockMXFP4>(data, out),
        GgmlType::NVFP4 => dequantize_blocks::<BlockNVFP4>(data, out),
        GgmlType::Q1_0 => dequantize_blocks::<BlockQ1_0>(data, out),
        GgmlType::Q2_0 => dequantize_blocks::<BlockQ2_0>(data, out),
        GgmlType::IQ2_XXS => dequantize_blocks::<BlockIQ2XXS>(data, out),
        GgmlType::IQ2_XS => dequantize_blocks::<BlockIQ2XS>(data, out),
        GgmlType::IQ2_S => dequantize_blocks::<BlockIQ2S>(data, out),
        GgmlType::IQ3_XXS => dequantize_blocks::<BlockIQ3XXS>(data, out),
        GgmlType::IQ3_S => dequantize_blocks::<BlockIQ3S>(data, out),
        GgmlType::IQ1_S => dequantize_blocks::<BlockIQ1S>(data, out),
        GgmlType::IQ1_M => dequantize_blocks::<BlockIQ1M>(data, out),
        _ => Err(CodecError::Unsupported(ty)),
    }
}

/// Like [`dequantize`], into a new `Vec` of `n_elements` values.
///
/// # Errors
/// Those of [`dequantize`]. The length is checked before the output is allocated.
pub fn dequantize_to_vec(
    ty: GgmlType,
    data: &[u8],
    n_elements: usize,
) -> Result<Vec<f32>, CodecError> {
    if !supports(ty) {
        return Err(CodecError::Unsupported(ty));
    }
    check_lengths(ty, data, n_elements as u64)?;
    let mut out = vec![0.0f32; n_elements];
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

/// Quantizes f32 values to the raw ggml bytes of `ty`, exactly as ggml's reference quantizers
/// (`quantize_row_*_ref`) do. The result is `ty.row_bytes(src.len())` bytes.
///
/// # Errors
/// [`CodecError::Unsupported`] for a type without a CPU encoder (see [`supports_quantize`]) and
/// [`CodecError::NotBlockMultiple`] when `src.len()` is not a whole number of blocks.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, CodecError> {
    if !supports_quantize(ty) {
        return Err(CodecError::Unsupported(ty));
    }
    if !src.len().is_multiple_of(ty.block_size()) {
        return Err(CodecError::NotBlockMultiple {
            ty,
            n_elements: src.len() as u64,
            block_size: ty.block_size(),
        });
    }
    Ok(match ty {
        GgmlType::F32 => src.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => quantize_f16(src),
        GgmlType::BF16 => quantize_bf16(src),
        GgmlType::Q4_0 => quantize_q4_0(src),
        GgmlType::Q4_1 => quantize_q4_1(src),
        GgmlType::Q5_0 => quantize_q5_0(src),
        GgmlType::Q5_1 => quantize_q5_1(src),
        GgmlType::Q8_0 => quantize_q8_0(src),
        GgmlType::TQ1_0 => quantize_tq1_0(src),
        GgmlType::TQ2_0 => quantize_tq2_0(src),
        GgmlType::MXFP4 => quantize_mxfp4(src),
        _ => return Err(CodecError::Unsupported(ty)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<B: GgmlBlock>() {
        assert_eq!(B::TYPE.block_size(), B::BLOCK_SIZE, "{}", B::TYPE);
        assert_eq!(B::TYPE.type_size(), std::mem::size_of::<B>(), "{}", B::TYPE);
        assert_eq!(std::mem::align_of::<B>(), 1);
    }

    #[test]
    fn block_sizes_match_type_table() {
        check::<BlockF32>();
        check::<BlockF16>();
        check::<BlockBF16>();
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ2K>();
        check::<BlockQ3K>();
        check::<BlockQ4K>();
        check::<BlockQ5K>();
        check::<BlockQ6K>();
        check::<BlockTQ1_0>();
        check::<BlockTQ2_0>();
        check::<BlockIQ4NL>();
        check::<BlockIQ4XS>();
        check::<BlockMXFP4>();
        check::<BlockNVFP4>();
        check::<BlockQ1_0>();
        check::<BlockQ2_0>();
        check::<BlockIQ2XXS>();
        check::<BlockIQ2XS>();
        check::<BlockIQ2S>();
        check::<BlockIQ3XXS>();
        check::<BlockIQ3S>();
        check::<BlockIQ1S>();
        check::<BlockIQ1M>();
    }
}

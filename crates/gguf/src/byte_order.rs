//! Byte order of a GGUF file, and the byte swap of tensor data between big- and little-endian.
//!
//! GGUF files are little-endian unless written big-endian on purpose (gguf-py's
//! `GGUFWriter(endianess=GGUFEndian.BIG)` and `gguf_convert_endian.py`, for s390x hosts). Such a
//! file keeps the magic bytes `GGUF` and stores every header number, and the multi-byte fields of
//! the tensor data, big-endian. Plain element types (F32, F16, BF16, I16, I32, I64, F64) swap
//! element by element. Block-quantized types swap field by field, with the layouts that
//! gguf-py's `gguf_convert_endian.py` uses (llama.cpp ggml-common.h: the f16 `d` of `block_q4_0`
//! and `block_q8_0`, `d` and `dmin` of `block_q4_K`, `d` at byte 208 of `block_q6_K`; MXFP4 and
//! NVFP4 have no multi-byte field). Every other block type packs native-endian words into byte
//! arrays that no tool defines a big-endian form for, and is refused.

use crate::types::GgmlType;

/// Byte order of the numbers in a GGUF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ByteOrder {
    /// Little-endian: every file written by llama.cpp and gguf-py by default.
    #[default]
    Little,
    /// Big-endian.
    Big,
}

/// The multi-byte fields of one block of `ty` as `(byte offset, width in bytes)`, or `None` when
/// the type has no defined big-endian form.
pub fn block_fields(ty: GgmlType) -> Option<&'static [(usize, usize)]> {
    use GgmlType as T;
    Some(match ty {
        T::I8 | T::MXFP4 | T::NVFP4 => &[],
        T::F16 | T::BF16 | T::I16 | T::Q4_0 | T::Q8_0 => &[(0, 2)],
        T::F32 | T::I32 => &[(0, 4)],
        T::I64 | T::F64 => &[(0, 8)],
        T::Q4_K => &[(0, 2), (2, 2)],
        T::Q6_K => &[(208, 2)],
        _ => return None,
    })
}

/// Whether tensors of `ty` can be read from (and written to) a big-endian file.
pub fn swappable(ty: GgmlType) -> bool {
    block_fields(ty).is_some()
}

/// Reverses the byte order of every multi-byte field of every block in `data` (whole blocks of
/// `ty`), converting big-endian tensor data to little-endian or back.
///
/// # Errors
/// A message naming the type when it has no defined big-endian form ([`swappable`] is false) or
/// when `data` is not a whole number of blocks.
pub fn swap_tensor_data(ty: GgmlType, data: &mut [u8]) -> Result<(), String> {
    let fields = block_fields(ty).ok_or_else(|| {
        format!(
            "{ty} blocks have no defined big-endian layout (gguf-py's gguf_convert_endian.py \
             handles F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K, MXFP4 and NVFP4); convert the file \
             to little-endian first"
        )
    })?;
    let block_bytes = ty.type_size();
    if !data.len().is_multiple_of(block_bytes) {
        return Err(format!(
            "{} bytes is not a whole number of {ty} blocks of {block_bytes} bytes",
            data.len()
        ));
    }
    if fields.is_empty() {
        return Ok(());
    }
    for block in data.chunks_exact_mut(block_bytes) {
        for &(offset, width) in fields {
            block[offset..offset + width].reverse();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_lie_inside_their_block() {
        for &ty in GgmlType::all() {
            if let Some(fields) = block_fields(ty) {
                for &(offset, width) in fields {
                    assert!(offset + width <= ty.type_size(), "{ty}");
                    assert!(matches!(width, 2 | 4 | 8), "{ty}");
                }
            }
        }
    }

    #[test]
    fn q6_k_swaps_only_its_trailing_d() {
        let mut block: Vec<u8> = (0..210).map(|i| i as u8).collect();
        swap_tensor_data(GgmlType::Q6_K, &mut block).unwrap();
        assert_eq!(
            &block[..208],
            &(0..208).map(|i| i as u8).collect::<Vec<_>>()[..]
        );
        assert_eq!(&block[208..], &[209, 208]);
        assert!(swap_tensor_data(GgmlType::Q6_K, &mut block[..209]).is_err());
        assert!(swap_tensor_data(GgmlType::IQ2_XXS, &mut [0u8; 66]).is_err());
    }
}

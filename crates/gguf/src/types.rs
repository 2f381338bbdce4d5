//! The ggml type table: type ids, block sizes and bytes per block.
//!
//! Source: llama.cpp `ggml/include/ggml.h` (`enum ggml_type`), `ggml/src/ggml.c` (`type_traits`) and
//! `ggml/src/ggml-common.h` (block structs). Checked against `shared/fixtures/dequant/manifest.json`.

use std::fmt;
use std::str::FromStr;

use crate::error::GgufError;

/// A ggml tensor element type, with the id it has in GGUF files.
///
/// Variant names are the ggml names (`Q4_K`, `IQ2_XXS`, ...). Every id that llama.cpp still accepts is
/// here; retired ids (4, 5, 31..=33, 36..=38) are rejected by [`GgmlType::from_id`] with
/// [`GgufError::RetiredType`].
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 16-bit IEEE half float.
    F16 = 1,
    /// 32 values: fp16 scale `d`, 4-bit quants, `x = d * (q - 8)`.
    Q4_0 = 2,
    /// 32 values: fp16 `d` and min `m`, 4-bit quants, `x = d * q + m`.
    Q4_1 = 3,
    /// 32 values: fp16 `d`, 5-bit quants (4 low bits in `qs`, 5th bit in `qh`), `x = d * (q - 16)`.
    Q5_0 = 6,
    /// 32 values: fp16 `d` and `m`, 5-bit quants, `x = d * q + m`.
    Q5_1 = 7,
    /// 32 values: fp16 `d`, 8-bit signed quants, `x = d * q`.
    Q8_0 = 8,
    /// 32 values: fp16 `d` and `s`, 8-bit quants (activation type, rarely stored).
    Q8_1 = 9,
    /// 256-value super-block, 16 sub-blocks of 16, 2-bit quants with 4-bit scales and mins.
    Q2_K = 10,
    /// 256-value super-block, 16 sub-blocks of 16, 3-bit quants with 6-bit scales.
    Q3_K = 11,
    /// 256-value super-block, 8 sub-blocks of 32, 4-bit quants with 6-bit scales and mins.
    Q4_K = 12,
    /// 256-value super-block, 8 sub-blocks of 32, 5-bit quants with 6-bit scales and mins.
    Q5_K = 13,
    /// 256-value super-block, 16 sub-blocks of 16, 6-bit quants with 8-bit scales.
    Q6_K = 14,
    /// 256 values: f32 `d`, 8-bit quants and block sums (activation type).
    Q8_K = 15,
    /// Importance-matrix 2-bit type (2.06 bpw), grid based.
    IQ2_XXS = 16,
    /// Importance-matrix 2-bit type (2.31 bpw), grid based.
    IQ2_XS = 17,
    /// Importance-matrix 3-bit type (3.06 bpw), grid based.
    IQ3_XXS = 18,
    /// Importance-matrix 1-bit type (1.56 bpw), grid based.
    IQ1_S = 19,
    /// Non-linear 4-bit type, 32-value blocks.
    IQ4_NL = 20,
    /// Importance-matrix 3-bit type (3.44 bpw), grid based.
    IQ3_S = 21,
    /// Importance-matrix 2-bit type (2.56 bpw), grid based.
    IQ2_S = 22,
    /// Non-linear 4-bit type, 256-value super-blocks.
    IQ4_XS = 23,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit IEEE float.
    F64 = 28,
    /// Importance-matrix 1-bit type (1.75 bpw), grid based.
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary type, 1.69 bpw.
    TQ1_0 = 34,
    /// Ternary type, 2.06 bpw.
    TQ2_0 = 35,
    /// Microscaling FP4 (E2M1 values, E8M0 shared scale), 32-value blocks.
    MXFP4 = 39,
    /// NVIDIA FP4 (E2M1 values, four UE4M3 scales), 64-value blocks.
    NVFP4 = 40,
    /// 1-bit type (sign times fp16 scale), 128-value blocks.
    Q1_0 = 41,
    /// 2-bit type (`(q - 1) * d`), 64-value blocks.
    Q2_0 = 42,
}

/// One row of the type table: (type, name, elements per block, bytes per block, quantized).
struct TypeInfo {
    ty: GgmlType,
    name: &'static str,
    block_size: usize,
    type_size: usize,
    quantized: bool,
}

const fn info(
    ty: GgmlType,
    name: &'static str,
    block_size: usize,
    type_size: usize,
    quantized: bool,
) -> TypeInfo {
    TypeInfo {
        ty,
        name,
        block_size,
        type_size,
        quantized,
    }
}

/// The table, in id order (llama.cpp ggml.c `type_traits`).
const TABLE: &[TypeInfo] = &[
    info(GgmlType::F32, "F32", 1, 4, false),
    info(GgmlType::F16, "F16", 1, 2, false),
    info(GgmlType::Q4_0, "Q4_0", 32, 18, true),
    info(GgmlType::Q4_1, "Q4_1", 32, 20, true),
    info(GgmlType::Q5_0, "Q5_0", 32, 22, true),
    info(GgmlType::Q5_1, "Q5_1", 32, 24, true),
    info(GgmlType::Q8_0, "Q8_0", 32, 34, true),
    info(GgmlType::Q8_1, "Q8_1", 32, 36, true),
    info(GgmlType::Q2_K, "Q2_K", 256, 84, true),
    info(GgmlType::Q3_K, "Q3_K", 256, 110, true),
    info(GgmlType::Q4_K, "Q4_K", 256, 144, true),
    info(GgmlType::Q5_K, "Q5_K", 256, 176, true),
    info(GgmlType::Q6_K, "Q6_K", 256, 210, true),
    info(GgmlType::Q8_K, "Q8_K", 256, 292, true),
    info(GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, true),
    info(GgmlType::IQ2_XS, "IQ2_XS", 256, 74, true),
    info(GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, true),
    info(GgmlType::IQ1_S, "IQ1_S", 256, 50, true),
    info(GgmlType::IQ4_NL, "IQ4_NL", 32, 18, true),
    info(GgmlType::IQ3_S, "IQ3_S", 256, 110, true),
    info(GgmlType::IQ2_S, "IQ2_S", 256, 82, true),
    info(GgmlType::IQ4_XS, "IQ4_XS", 256, 136, true),
    info(GgmlType::I8, "I8", 1, 1, false),
    info(GgmlType::I16, "I16", 1, 2, false),
    info(GgmlType::I32, "I32", 1, 4, false),
    info(GgmlType::I64, "I64", 1, 8, false),
    info(GgmlType::F64, "F64", 1, 8, false),
    info(GgmlType::IQ1_M, "IQ1_M", 256, 56, true),
    info(GgmlType::BF16, "BF16", 1, 2, false),
    info(GgmlType::TQ1_0, "TQ1_0", 256, 54, true),
    info(GgmlType::TQ2_0, "TQ2_0", 256, 66, true),
    info(GgmlType::MXFP4, "MXFP4", 32, 17, true),
    info(GgmlType::NVFP4, "NVFP4", 64, 36, true),
    info(GgmlType::Q1_0, "Q1_0", 128, 18, true),
    info(GgmlType::Q2_0, "Q2_0", 64, 18, true),
];

/// Every live type, in id order.
const ALL: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::IQ1_M,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// Ids that once were ggml types and have been removed from GGUF, with their old names.
const RETIRED: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

impl GgmlType {
    fn info(self) -> &'static TypeInfo {
        // Every variant has a row (checked by the `table_in_sync` test).
        TABLE.iter().find(|i| i.ty == self).unwrap_or(&TABLE[0])
    }

    /// The type for a GGUF type id.
    ///
    /// # Errors
    /// [`GgufError::RetiredType`] for an id that was removed from ggml (e.g. 31, `Q4_0_4_4`), and
    /// [`GgufError::UnknownType`] for any other id that is not in the table.
    pub fn from_id(id: u32) -> Result<GgmlType, GgufError> {
        if let Some(t) = ALL.iter().find(|t| **t as u32 == id) {
            return Ok(*t);
        }
        if let Some((_, name)) = RETIRED.iter().find(|(rid, _)| *rid == id) {
            return Err(GgufError::RetiredType { id, name });
        }
        Err(GgufError::UnknownType(id))
    }

    /// The GGUF / ggml type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The ggml name in upper case as gguf-py writes it (`"Q4_K"`, `"F32"`, `"IQ2_XXS"`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per block (1 for the plain types F32, F16, BF16, I8..I64, F64).
    pub fn block_size(self) -> usize {
        self.info().block_size
    }

    /// Bytes per block (for plain types, bytes per element).
    pub fn type_size(self) -> usize {
        self.info().type_size
    }

    /// Whether the type is block-quantized (everything except the float and integer types).
    pub fn is_quantized(self) -> bool {
        self.info().quantized
    }

    /// Bytes taken by `n_elements` consecutive values of this type (one row, or any whole number of
    /// blocks).
    ///
    /// # Errors
    /// [`GgufError::NotBlockMultiple`] when `n_elements` is not a multiple of [`block_size`](Self::block_size),
    /// [`GgufError::Overflow`] if the byte count does not fit in `u64`.
    pub fn row_bytes(self, n_elements: u64) -> Result<u64, GgufError> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return Err(GgufError::NotBlockMultiple {
                ty: self,
                n_elements,
                block_size: self.block_size(),
            });
        }
        (n_elements / bs)
            .checked_mul(self.type_size() as u64)
            .ok_or_else(|| GgufError::Overflow {
                what: format!("byte size of {n_elements} {self} elements"),
            })
    }

    /// Every live type, in id order.
    pub fn all() -> &'static [GgmlType] {
        ALL
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GgmlType {
    type Err = GgufError;

    /// Parses a type name, case-insensitively (`"q4_k"`, `"Q4_K"`, `"bf16"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL.iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| GgufError::UnknownTypeName(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_in_sync() {
        assert_eq!(TABLE.len(), ALL.len());
        for (i, t) in TABLE.iter().enumerate() {
            assert_eq!(t.ty, ALL[i]);
            assert_eq!(format!("{:?}", t.ty), t.name);
            assert!(t.block_size > 0 && t.type_size > 0);
        }
    }

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()).unwrap(), t);
            assert_eq!(t.name().to_lowercase().parse::<GgmlType>().unwrap(), t);
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38] {
            assert!(matches!(
                GgmlType::from_id(id),
                Err(GgufError::RetiredType { .. })
            ));
        }
        assert!(matches!(
            GgmlType::from_id(43),
            Err(GgufError::UnknownType(43))
        ));
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512).unwrap(), 288);
        assert_eq!(GgmlType::F32.row_bytes(3).unwrap(), 12);
        assert!(GgmlType::Q4_K.row_bytes(4544).is_err());
        assert_eq!(GgmlType::Q8_0.row_bytes(4544).unwrap(), 142 * 34);
        assert!(GgmlType::F64.row_bytes(u64::MAX).is_err());
    }
}

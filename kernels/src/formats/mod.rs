//! Block decoders: one per ggml type, behind one `#[cube]` trait.
//!
//! Every decoder turns one 32-element *chunk* of a block into registers. A chunk is the unit of
//! work of every op (GEMV lanes, dequantize threads), so ops are written once, generic over
//! [`BlockDecode`]. Layouts follow llama.cpp `ggml/src/ggml-common.h`; the math follows
//! `ggml/src/ggml-quants.c` `dequantize_row_*`. The CPU codec (`ggml-codec`) is the oracle.
//!
//! `F32`, `F16` and `BF16` have one element per ggml block; here they are read as pseudo-blocks
//! of 32 elements, so their rows must be a multiple of 32 long (the host checks).
//!
//! This module holds the trait, the chunk forms and the codebook uploads; the decoders live in
//! one submodule per family (`legacy`, `k_quants`, `lut4`: 16-entry value tables, `low_bit`:
//! ternary and 1-/2-bit, `iq_grid`: the codebook IQ types), all re-exported here.
use crate::words::{
    bf16_to_f32, byte_i8_to_f32, f16_to_f32, i8_to_f32, read_u8, read_u16, read_u32,
};
use cubecl::prelude::*;
use gguf::GgmlType;

/// Elements decoded per [`BlockDecode::decode_chunk`] call, for every type.
pub const CHUNK_ELEMS: u32 = 32;

/// Host-side constants of a block format (plain Rust, read inside kernels with `comptime!`).
pub trait BlockFormat: 'static + Send + Sync {
    /// The ggml type this decoder reads.
    const TYPE: GgmlType;
    /// Elements per (pseudo-)block along a row.
    const BLOCK_ELEMS: u32;
    /// Bytes per (pseudo-)block.
    const BLOCK_BYTES: u32;
    /// Chunks of [`CHUNK_ELEMS`] per block.
    const CHUNKS: u32 = Self::BLOCK_ELEMS / CHUNK_ELEMS;
    /// Blocks the own-rows GEMV stages into registers per step ([`stage_blocks`]).
    const STAGE_BLOCKS: u32 = stage_blocks(Self::BLOCK_BYTES, Self::BLOCK_ELEMS);
    /// The codebook the decoder reads from its grid buffer ([`Grid::None`] for most types).
    const GRID: Grid = Grid::None;
    /// What [`BlockDecode::decode_chunk`] leaves in `out`: weights, or the chunk factored.
    const FORM: ChunkForm = ChunkForm::Weights;
}

/// How [`BlockDecode::decode_chunk`] leaves a chunk in `out`. A factored chunk is small exact
/// values and factors, the two half-chunk scales at `out[FACTOR_SCALES..]`:
/// - [`ChunkForm::Scaled`] and [`ChunkForm::ScaledOffsets`]: element `e` is
///   `scale[e / 16] * (out[e] + offset[e / 8])`, the four group offsets at
///   `out[FACTOR_OFFSETS..]` (zero for `Scaled`). The value plus its offset is exact in f32, so
///   the product is the format's one rounding (ggml's `dl * (grid + delta)` for IQ1,
///   `db * grid * sign` for IQ2).
/// - [`ChunkForm::ScaledBiases`]: element `e` is `scale[e / 16] * out[e] + bias[e / 16]`, the two
///   half-chunk biases at `out[FACTOR_BIASES..]`: ggml's `d * q - m` (Q4_K, Q5_K, Q2_K, with the
///   bias `-m`) and `d * q + m` (Q4_1, Q5_1), both of its roundings.
///
/// `decode_values()` multiplies the factors back out in the format's order of operations, so it
/// stays bit-exact. The own-rows GEMV multiplies by a scale once per 16 products and takes the
/// offsets or biases against sums of activations that all its weight rows share
/// (`sum_e (s q_e + b) x_e = s sum_e q_e x_e + b sum_e x_e`, llama.cpp's `mul_mat_vec` order):
/// a multiply (and an add) fewer per weight, with the GEMV's rounding (within
/// [`crate::check::GEMV_TOL`]) rather than the weights'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkForm {
    /// `out[0..32]` are the weights.
    Weights,
    /// Values and two scales (`out[0..34]`).
    Scaled,
    /// Values, two scales and four offsets (`out[0..38]`).
    ScaledOffsets,
    /// Values, two scales and two biases (`out[0..36]`).
    ScaledBiases,
}

impl ChunkForm {
    /// Whether the chunk is factored (not [`ChunkForm::Weights`]).
    pub const fn factored(self) -> bool {
        !matches!(self, ChunkForm::Weights)
    }

    /// Whether the chunk has group offsets ([`ChunkForm::ScaledOffsets`]).
    pub const fn offsets(self) -> bool {
        matches!(self, ChunkForm::ScaledOffsets)
    }

    /// Whether the chunk has half-chunk biases ([`ChunkForm::ScaledBiases`]).
    pub const fn biases(self) -> bool {
        matches!(self, ChunkForm::ScaledBiases)
    }

    /// Elements per activation sum the GEMV takes against this form's offsets (8) or biases
    /// (16); 0 when it has neither.
    pub const fn sum_elems(self) -> u32 {
        match self {
            ChunkForm::ScaledOffsets => 8,
            ChunkForm::ScaledBiases => 16,
            ChunkForm::Weights | ChunkForm::Scaled => 0,
        }
    }

    /// Activation sums of [`ChunkForm::sum_elems`] elements in a GEMV step of `step_elems`
    /// elements (0 when the form has neither offsets nor biases).
    pub const fn sum_groups(self, step_elems: u32) -> u32 {
        match self.sum_elems() {
            0 => 0,
            n => step_elems / n,
        }
    }

    /// Length of the `out` array [`BlockDecode::decode_chunk`] writes in this form.
    pub const fn out_len(self) -> u32 {
        match self {
            ChunkForm::Weights => CHUNK_ELEMS,
            ChunkForm::Scaled => FACTOR_OFFSETS,
            ChunkForm::ScaledOffsets => FACTOR_OFFSETS + 4,
            ChunkForm::ScaledBiases => FACTOR_BIASES + 2,
        }
    }
}

/// Where a factored chunk ([`ChunkForm`]) keeps its two half-chunk scales in `out`:
/// `out[FACTOR_SCALES + h]` for elements `16h..16h + 16`.
pub const FACTOR_SCALES: u32 = CHUNK_ELEMS;
/// Where a [`ChunkForm::ScaledOffsets`] chunk keeps its four group offsets:
/// `out[FACTOR_OFFSETS + g]` for elements `8g..8g + 8`.
pub const FACTOR_OFFSETS: u32 = CHUNK_ELEMS + 2;
/// Where a [`ChunkForm::ScaledBiases`] chunk keeps its two half-chunk biases:
/// `out[FACTOR_BIASES + h]` for elements `16h..16h + 16`.
pub const FACTOR_BIASES: u32 = CHUNK_ELEMS + 2;

/// Sets a factored chunk's two half-chunk scales ([`ChunkForm`]): `s0` for elements `0..16`,
/// `s1` for `16..32`.
#[cube]
fn set_scales(out: &mut Array<f32>, s0: f32, s1: f32) {
    out[FACTOR_SCALES as usize] = s0;
    out[comptime!(FACTOR_SCALES + 1) as usize] = s1;
}

/// Sets a [`ChunkForm::ScaledBiases`] chunk's two half-chunk biases: `b0` for elements `0..16`,
/// `b1` for `16..32`.
#[cube]
fn set_biases(out: &mut Array<f32>, b0: f32, b1: f32) {
    out[FACTOR_BIASES as usize] = b0;
    out[comptime!(FACTOR_BIASES + 1) as usize] = b1;
}

/// Blocks of `bytes` bytes and `elems` elements staged per step by the own-rows GEMV: the most
/// (a power of two) that stay within 256 bytes and 256 elements, so small blocks share the
/// vector loads that cover a misaligned start while the unrolled step's code stays small.
pub const fn stage_blocks(bytes: u32, elems: u32) -> u32 {
    let mut g = 1;
    while 2 * g * bytes <= 256 && 2 * g * elems <= 256 {
        g *= 2;
    }
    g
}

/// A codebook (ggml-common.h `iq*_grid`) that a decoder reads from a small device buffer, the
/// kernels' `grid` argument. The tables are `ggml_codec::grids`, the workspace's only copy.
#[derive(Clone, Copy, Debug)]
pub enum Grid {
    /// No codebook: the kernels still bind a one-vector (4-word) buffer.
    None,
    /// A grid of `u64` entries of 8 byte values, each one of three `levels`: the IQ2 grids
    /// (`iq2xxs_grid`, `iq2xs_grid`, `iq2s_grid`, [`IQ2_LEVELS`]) and `iq1s_grid`
    /// ([`IQ1_LEVELS`]). Uploaded as 2-bit level codes, value `j` of an entry at bits
    /// `2j..2j + 2` of 16, entry `i` in half `i % 2` of word `i / 2`: a quarter of the bytes,
    /// and one load per 8 values.
    Codes {
        /// The ggml-common.h table.
        table: &'static [u64],
        /// The byte value of each code.
        levels: [u8; 3],
    },
    /// `u32` entries, one word each.
    U32(&'static [u32]),
}

impl Grid {
    /// The buffer the kernels read, as `u32` words, whole 4-word vectors (four zero words for
    /// [`Grid::None`]).
    pub fn words(self) -> Vec<u32> {
        match self {
            Grid::None => vec![0; 4],
            Grid::Codes { table, levels } => table
                .chunks(2)
                .map(|pair| {
                    pair.iter().enumerate().fold(0, |word, (h, &e)| {
                        word | (level_codes(e, levels) << (16 * h))
                    })
                })
                .collect(),
            Grid::U32(t) => t.to_vec(),
        }
    }

    /// Whether there is a codebook ([`Grid::None`] has none).
    pub const fn has_table(self) -> bool {
        !matches!(self, Grid::None)
    }

    /// Length of [`Grid::words`].
    pub fn len_words(self) -> usize {
        match self {
            Grid::None => 4,
            Grid::Codes { table, .. } => table.len().div_ceil(2),
            Grid::U32(t) => t.len(),
        }
    }
}

/// The byte values of the IQ2 grids, in the order of their codes in [`Grid::Codes`].
pub const IQ2_LEVELS: [u8; 3] = [0x08, 0x19, 0x2b];

/// The byte values of `iq1s_grid` (int8 -1, 0, 1), in the order of their codes in
/// [`Grid::Codes`]: code `c` is the value `c - 1`.
pub const IQ1_LEVELS: [u8; 3] = [0xff, 0x00, 0x01];

/// [`IQ2_LEVELS`] as one word, level `c` in byte `c`.
const IQ2_LEVELS_WORD: u32 =
    IQ2_LEVELS[0] as u32 | (IQ2_LEVELS[1] as u32) << 8 | (IQ2_LEVELS[2] as u32) << 16;

/// The 16 bits of 2-bit level codes of one grid entry ([`Grid::Codes`]).
///
/// # Panics
/// If a byte of `entry` is not one of `levels`: the grids are static tables, and the unit test
/// `level_codes_round_trip` checks all four.
fn level_codes(entry: u64, levels: [u8; 3]) -> u32 {
    (0..8).fold(0, |codes, j| {
        let byte = (entry >> (8 * j)) as u8;
        let code = levels
            .iter()
            .position(|&l| l == byte)
            .expect("grid byte is one of its levels");
        codes | (code as u32) << (2 * j)
    })
}

/// Decodes chunk `chunk` (0..CHUNKS) of the block starting at byte `block` of the word stream
/// `w` into `out` (in row order, [`BlockFormat::FORM`], [`ChunkForm::out_len`] values). `grid`
/// is [`BlockFormat::GRID`] as words. `decode_values()` gives the weights of any type.
#[cube]
#[allow(missing_docs)] // CubeCL's expansion of the trait carries no docs
pub trait BlockDecode: BlockFormat {
    /// See the trait's docs.
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>);
}

/// Decodes a chunk as [`BlockDecode::decode_chunk`] does, into weights in `out[0..32]` for
/// every type: a factored chunk is multiplied out in place. `out` holds
/// `F::FORM.out_len()` values.
#[cube]
pub(crate) fn decode_values<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    block: u32,
    chunk: u32,
    out: &mut Array<f32>,
) {
    F::decode_chunk(w, grid, block, chunk, out);
    if comptime!(F::FORM.factored()) {
        #[unroll]
        for e in 0..CHUNK_ELEMS {
            let scale = out[comptime!(FACTOR_SCALES + e / 16) as usize];
            if comptime!(F::FORM.offsets()) {
                let offset = out[comptime!(FACTOR_OFFSETS + e / 8) as usize];
                out[e as usize] = scale * (out[e as usize] + offset);
            } else if comptime!(F::FORM.biases()) {
                let bias = out[comptime!(FACTOR_BIASES + e / 16) as usize];
                out[e as usize] = scale * out[e as usize] + bias;
            } else {
                out[e as usize] *= scale;
            }
        }
    }
}

mod iq_grid;
mod k_quants;
mod legacy;
mod low_bit;
mod lut4;

pub use iq_grid::*;
pub use k_quants::*;
pub use legacy::*;
pub use low_bit::*;
pub use lut4::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of the IQ2 and IQ1 grids, as the decoders upload them, reads back from its
    /// 2-bit codes the way the decoders read it (`iq2_group8`, `iq1_codes8`).
    #[test]
    fn level_codes_round_trip() {
        let grids = [
            IQ2XXS::GRID,
            IQ2XS::GRID,
            IQ2S::GRID,
            IQ1S::GRID,
            IQ1M::GRID,
        ];
        for grid in grids {
            let Grid::Codes { table, levels } = grid else {
                panic!("{grid:?} is not uploaded as codes");
            };
            let words = grid.words();
            assert_eq!(words.len(), grid.len_words());
            assert_eq!(words.len(), table.len() / 2);
            for (i, &entry) in table.iter().enumerate() {
                let codes = words[i / 2] >> (16 * (i % 2));
                for j in 0..8 {
                    let code = (codes >> (2 * j)) & 3;
                    let byte = (entry >> (8 * j)) as u8;
                    assert_eq!(levels[code as usize], byte, "entry {i} value {j}");
                    if levels == IQ2_LEVELS {
                        assert_eq!((IQ2_LEVELS_WORD >> (8 * code)) & 0xFF, u32::from(byte));
                    } else {
                        assert_eq!(code as i32 - 1, i32::from(byte as i8));
                    }
                }
            }
        }
    }
}

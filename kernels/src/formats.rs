//! Block decoders: one per ggml type, behind one `#[cube]` trait.
//!
//! Every decoder turns one 32-element *chunk* of a block into registers. A chunk is the unit of
//! work of every op (GEMV lanes, dequantize threads), so ops are written once, generic over
//! [`BlockDecode`]. Layouts follow llama.cpp `ggml/src/ggml-common.h`; the math follows
//! `ggml/src/ggml-quants.c` `dequantize_row_*`. The CPU codec (`ggml-codec`) is the oracle.
//!
//! `F32`, `F16` and `BF16` have one element per ggml block; here they are read as pseudo-blocks
//! of 32 elements, so their rows must be a multiple of 32 long (the host checks).
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

/// `F32`: 32 little-endian f32 per pseudo-block (128 bytes, always word aligned).
pub struct F32;
impl BlockFormat for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 128;
}
#[cube]
impl BlockDecode for F32 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for j in 0..32u32 {
            out[j as usize] = f32::reinterpret(w[(base + j) as usize]);
        }
    }
}

/// `F16`: 32 IEEE binary16 per pseudo-block (64 bytes, word aligned).
pub struct F16;
impl BlockFormat for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 64;
}
#[cube]
impl BlockDecode for F16 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for k in 0..16u32 {
            let word = w[(base + k) as usize];
            out[(2 * k) as usize] = f16_to_f32(word & 0xFFFF);
            out[(2 * k + 1) as usize] = f16_to_f32(word >> 16);
        }
    }
}

/// `BF16`: 32 bfloat16 per pseudo-block (64 bytes, word aligned).
pub struct BF16;
impl BlockFormat for BF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 64;
}
#[cube]
impl BlockDecode for BF16 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for k in 0..16u32 {
            let word = w[(base + k) as usize];
            out[(2 * k) as usize] = bf16_to_f32(word & 0xFFFF);
            out[(2 * k + 1) as usize] = bf16_to_f32(word >> 16);
        }
    }
}

/// `Q8_0`, llama.cpp `block_q8_0 { ggml_half d; int8_t qs[32]; }` (34 bytes): `y = d * qs`.
pub struct Q8_0;
impl BlockFormat for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 34;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q8_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for j in 0..4u32 {
                out[(4 * k + j) as usize] = byte_i8_to_f32(word, j);
            }
        }
    }
}

/// `Q5_0`, llama.cpp `block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }` (22 bytes):
/// element `j < 16` is the low nibble of `qs[j]` with bit `j` of `qh` as bit 4, element `j + 16`
/// the high nibble with bit `j + 16`; `y = d * (q - 16)`.
pub struct Q5_0;
impl BlockFormat for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 22;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q5_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        let qh = read_u32(w, block + 2);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 6 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let j = 4 * k + i;
                let b = (word >> (8 * i)) & 0xFF;
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                out[j as usize] = f32::cast_from((b & 0x0F) | xh0) - 16.0;
                out[(j + 16) as usize] = f32::cast_from((b >> 4) | xh1) - 16.0;
            }
        }
    }
}

/// llama.cpp `get_scale_min_k4(j, scales)` for the 12 packed bytes at byte `scales`: the 6-bit
/// scale in bits 0..8 of the result, the 6-bit min in bits 8..16.
#[cube]
pub(crate) fn scale_min_k4(w: &[u32], scales: u32, j: u32) -> u32 {
    let lo = j % 4;
    let a = read_u8(w, scales + lo);
    let b = read_u8(w, scales + lo + 4);
    let c = read_u8(w, scales + lo + 8);
    let high = j >= 4;
    let sc = select(high, (c & 0x0F) | ((a >> 6) << 4), a & 63);
    let m = select(high, (c >> 4) | ((b >> 6) << 4), b & 63);
    sc | (m << 8)
}

/// `Q4_K`, llama.cpp `block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12];
/// uint8_t qs[128]; }` (144 bytes, 256 elements): eight sub-blocks of 32 with 6-bit scale and
/// min packed in `scales` (`get_scale_min_k4`); `y = d * sc * q - dmin * m`. One chunk is one
/// sub-block: chunk `c` reads the low (`c` even) or high nibbles of `qs[32 * (c / 2)..][..32]`.
pub struct Q4K;
impl BlockFormat for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 144;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q4K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        set_scales(out, d1, d1);
        set_biases(out, -m1, -m1);
        let qs = block + 16 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 0x0F;
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

/// `Q6_K`, llama.cpp `block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16];
/// ggml_half d; }` (210 bytes, 256 elements): 6-bit quants split in low 4 bits (`ql`) and high
/// 2 bits (`qh`), 16 sub-blocks of 16 with int8 scales; `y = d * sc * (q - 32)`. Chunk `c`
/// covers elements `128 * (c / 4) + 32 * (c % 4)..` of the block.
pub struct Q6K;
impl BlockFormat for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 210;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q6K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let q = chunk % 4;
        let d = f16_to_f32(read_u16(w, block + 208));
        let ql = block + 64 * n + 32 * (q % 2);
        let ql_shift = (q / 2) * 4;
        let qh = block + 128 + 32 * n;
        let qh_shift = 2 * q;
        let sc = block + 192 + 8 * n + 2 * q;
        let d0 = d * i8_to_f32(read_u8(w, sc));
        let d1 = d * i8_to_f32(read_u8(w, sc + 1));
        // Elements 0..16 use scale `sc`, 16..32 scale `sc + 1`.
        set_scales(out, d0, d1);
        #[unroll]
        for k in 0..8u32 {
            let lw = read_u32(w, ql + 4 * k) >> ql_shift;
            let hw = read_u32(w, qh + 4 * k) >> qh_shift;
            #[unroll]
            for i in 0..4u32 {
                let v = ((lw >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 0x03) << 4);
                out[(4 * k + i) as usize] = f32::cast_from(v) - 32.0;
            }
        }
    }
}

/// `Q4_0`, llama.cpp `block_q4_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes): element `j < 16`
/// is the low nibble of `qs[j]`, element `j + 16` the high nibble; `y = d * (q - 8)`.
pub struct Q4_0;
impl BlockFormat for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q4_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = f32::cast_from(b & 0x0F) - 8.0;
                out[(4 * k + i + 16) as usize] = f32::cast_from(b >> 4) - 8.0;
            }
        }
    }
}

/// `Q4_1`, llama.cpp `block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }` (20 bytes):
/// nibbles as in Q4_0; `y = d * q + m`.
pub struct Q4_1;
impl BlockFormat for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 20;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q4_1 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
        set_scales(out, d, d);
        set_biases(out, m, m);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 4 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = f32::cast_from(b & 0x0F);
                out[(4 * k + i + 16) as usize] = f32::cast_from(b >> 4);
            }
        }
    }
}

/// `Q5_1`, llama.cpp `block_q5_1 { ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[16]; }`
/// (24 bytes): 5-bit quants as in Q5_0; `y = d * q + m`.
pub struct Q5_1;
impl BlockFormat for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 24;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q5_1 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
        set_scales(out, d, d);
        set_biases(out, m, m);
        let qh = read_u32(w, block + 4);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 8 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let j = 4 * k + i;
                let b = (word >> (8 * i)) & 0xFF;
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                out[j as usize] = f32::cast_from((b & 0x0F) | xh0);
                out[(j + 16) as usize] = f32::cast_from((b >> 4) | xh1);
            }
        }
    }
}

/// `Q2_K`, llama.cpp `block_q2_K { uint8_t scales[16]; uint8_t qs[64]; ggml_half d;
/// ggml_half dmin; }` (84 bytes, 256 elements): 2-bit quants, 16 sub-blocks of 16 with a 4-bit
/// scale (low nibble) and min (high nibble); `y = d * sc * q - dmin * m`. Chunk `c` takes bits
/// `2 * (c % 4)` of `qs[32 * (c / 4)..][..32]`, with scales `8 * (c / 4) + 2 * (c % 4)` and `+ 1`.
pub struct Q2K;
impl BlockFormat for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 84;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q2K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let shift = 2 * (chunk % 4);
        let d = f16_to_f32(read_u16(w, block + 80));
        let dmin = f16_to_f32(read_u16(w, block + 82));
        let s = block + 8 * n + 2 * (chunk % 4);
        let sc0 = read_u8(w, s);
        let sc1 = read_u8(w, s + 1);
        let d0 = d * f32::cast_from(sc0 & 0x0F);
        let m0 = dmin * f32::cast_from(sc0 >> 4);
        let d1 = d * f32::cast_from(sc1 & 0x0F);
        let m1 = dmin * f32::cast_from(sc1 >> 4);
        set_scales(out, d0, d1);
        set_biases(out, -m0, -m1);
        let qs = block + 16 + 32 * n;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 3;
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

/// `Q3_K`, llama.cpp `block_q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12];
/// ggml_half d; }` (110 bytes, 256 elements): 2 low bits in `qs`, the high bit in `hmask`
/// (clear means minus 4), 16 sub-blocks of 16 with 6-bit scales packed in `scales`;
/// `y = d * (sc - 32) * q`. Chunk `c` is laid out as in Q2_K, with `hmask` bit `c`.
pub struct Q3K;
impl BlockFormat for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 110;
    const FORM: ChunkForm = ChunkForm::Scaled;
}

/// Scale `k` (0..16) of a Q3_K block, from its 12 packed bytes at byte `scales`, minus 32.
#[cube]
fn q3k_scale(w: &[u32], scales: u32, k: u32) -> f32 {
    let g = k / 4;
    let b = k % 4;
    let lo = (read_u8(w, scales + (g % 2) * 4 + b) >> ((g / 2) * 4)) & 0x0F;
    let hi = (read_u8(w, scales + 8 + b) >> (2 * g)) & 3;
    f32::cast_from(lo | (hi << 4)) - 32.0
}

#[cube]
impl BlockDecode for Q3K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let j = chunk % 4;
        let d = f16_to_f32(read_u16(w, block + 108));
        let d0 = d * q3k_scale(w, block + 96, 8 * n + 2 * j);
        let d1 = d * q3k_scale(w, block + 96, 8 * n + 2 * j + 1);
        let qs = block + 32 + 32 * n;
        set_scales(out, d0, d1);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> (2 * j);
            let hm = read_u32(w, block + 4 * k) >> chunk;
            #[unroll]
            for i in 0..4u32 {
                let q = f32::cast_from((word >> (8 * i)) & 3);
                let h = select(((hm >> (8 * i)) & 1) == 1, 0.0f32, 4.0f32);
                out[(4 * k + i) as usize] = q - h;
            }
        }
    }
}

/// `Q5_K`, llama.cpp `block_q5_K { ggml_half d; ggml_half dmin; uint8_t scales[12];
/// uint8_t qh[32]; uint8_t qs[128]; }` (176 bytes, 256 elements): Q4_K's layout plus a fifth bit
/// per element in `qh` (bit `c` for chunk `c`); `y = d * sc * q - dmin * m`.
pub struct Q5K;
impl BlockFormat for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 176;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q5K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        set_scales(out, d1, d1);
        set_biases(out, -m1, -m1);
        let qs = block + 48 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            let hw = read_u32(w, block + 16 + 4 * k) >> chunk;
            #[unroll]
            for i in 0..4u32 {
                let q = ((word >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 1) << 4);
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

/// Packs bytes `4k..4k + 4` of a 16-entry int8 table little-endian into one word (entry `4k` in
/// the low byte), so kernels can hold the table in four `u32` constants.
const fn pack_i8x4(table: &[i8; 16], k: usize) -> u32 {
    (table[4 * k] as u8 as u32)
        | ((table[4 * k + 1] as u8 as u32) << 8)
        | ((table[4 * k + 2] as u8 as u32) << 16)
        | ((table[4 * k + 3] as u8 as u32) << 24)
}

/// `kvalues_iq4nl` (ggml-common.h), packed from `ggml_codec::grids::kvalues_iq4nl`.
const KV_IQ4NL_0: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 0);
const KV_IQ4NL_1: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 1);
const KV_IQ4NL_2: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 2);
const KV_IQ4NL_3: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 3);

/// `kvalues_mxfp4` / `kvalues_fp4` (ggml-common.h, doubled E2M1 values), packed from
/// `ggml_codec::grids::kvalues_mxfp4`.
const KV_FP4_0: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 0);
const KV_FP4_1: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 1);
const KV_FP4_2: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 2);
const KV_FP4_3: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 3);

/// Entry `q` (0..16) of a 16-entry int8 table packed in words `t0..t3`, as f32.
#[cube]
fn lut16_i8(t0: u32, t1: u32, t2: u32, t3: u32, q: u32) -> f32 {
    let hi = (q & 4) != 0;
    let lo_pair = select(hi, t1, t0);
    let hi_pair = select(hi, t3, t2);
    let word = select((q & 8) != 0, hi_pair, lo_pair);
    i8_to_f32((word >> (8 * (q & 3))) & 0xFF)
}

/// `kvalues_iq4nl[q]` as f32.
#[cube]
pub(crate) fn kvalue_iq4nl(q: u32) -> f32 {
    lut16_i8(KV_IQ4NL_0, KV_IQ4NL_1, KV_IQ4NL_2, KV_IQ4NL_3, q)
}

/// `kvalues_mxfp4[q]` (the doubled E2M1 value of nibble `q`) as f32.
#[cube]
pub(crate) fn kvalue_fp4(q: u32) -> f32 {
    lut16_i8(KV_FP4_0, KV_FP4_1, KV_FP4_2, KV_FP4_3, q)
}

/// ggml's `GGML_E8M0_TO_FP32_HALF` on the E8M0 byte `e`: `2^(e - 128)` built from its bits
/// (`e < 2` gives the subnormals `2^-128`, `2^-127`; `e = 255` gives `2^127`).
#[cube]
pub(crate) fn e8m0_to_f32_half(e: u32) -> f32 {
    let sub = 0x0020_0000u32 << (e & 1);
    let normal = (e - 1) << 23;
    f32::reinterpret(select(e < 2, sub, normal))
}

/// ggml's `ggml_ue4m3_to_fp32` on the UE4M3 byte `x`, halved (matching the doubled E2M1
/// values): `0` and `0x7F` give 0, exponent 0 is subnormal (`man * 2^-10` after halving),
/// otherwise `(1 + man / 8) * 2^(exp - 8)`. Bit 7 is ignored except in the zero test.
#[cube]
pub(crate) fn ue4m3_to_f32_half(x: u32) -> f32 {
    let exp = (x >> 3) & 0xF;
    let man = x & 7;
    let normal = f32::reinterpret(((exp + 119) << 23) | (man << 20));
    let sub = f32::cast_from(man) * 0.000_976_562_5;
    let r = select(exp == 0, sub, normal);
    select(x == 0x7F, 0.0f32, select(x == 0, 0.0f32, r))
}

/// `TQ2_0`, llama.cpp `block_tq2_0 { uint8_t qs[64]; ggml_half d; }` (66 bytes, 256 elements):
/// 2-bit ternary quants, `y = d * (q - 1)`. Element `n` is bits `2 * ((n % 128) / 32)` of byte
/// `32 * (n / 128) + n % 32`, so chunk `c` takes bits `2 * (c % 4)` of `qs[32 * (c / 4)..][..32]`.
pub struct TQ2_0;
impl BlockFormat for TQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 66;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for TQ2_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block + 64));
        set_scales(out, d, d);
        let qs = block + 32 * (chunk / 4);
        let shift = 2 * (chunk % 4);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 3;
                out[(4 * k + i) as usize] = f32::cast_from(q) - 1.0;
            }
        }
    }
}

/// `3^n` for `n` in 0..5.
#[cube]
fn pow3_u8(n: u32) -> u32 {
    select(n >= 4, 81u32, (0x1B09_0301u32 >> (8 * (n & 3))) & 0xFF)
}

/// `TQ1_0`, llama.cpp `block_tq1_0 { uint8_t qs[48]; uint8_t qh[4]; ggml_half d; }` (54 bytes,
/// 256 elements): base-3 packed trits, `y = d * (t - 1)` with trit `n` of byte `q` equal to
/// `((uint8)(q * 3^n) * 3) >> 8`. Chunk `c < 5` is trit `c` of `qs[0..32]`; chunks 5 and 6 are
/// trits `2 (c - 5)` and `2 (c - 5) + 1` of `qs[32..48]`; chunk 7 is trit 4 of `qs[32..48]`,
/// then value `16 + 4n + j` is trit `n` of `qh[j]`.
pub struct TQ1_0;
impl BlockFormat for TQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 54;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for TQ1_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block + 52));
        set_scales(out, d, d);
        let lo = chunk < 5;
        // 0, 1, 2 for chunks 5, 6, 7 (unused below 5).
        let c5 = (chunk + 3) % 8;
        let is7 = chunk == 7;
        #[unroll]
        for k in 0..8u32 {
            // Bytes `4k..4k + 4` of the chunk come from one 4-byte run with one power of 3.
            let addr_a = block + 32 + 4 * (k % 4);
            let n_a = 2 * c5 + k / 4;
            let addr_hi = select(k < 4, addr_a, select(is7, block + 48, addr_a));
            let n_hi = select(k < 4, n_a, select(is7, k % 4, n_a));
            let addr = select(lo, block + 4 * k, addr_hi);
            let p = pow3_u8(select(lo, chunk, n_hi));
            let word = read_u32(w, addr);
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 0xFF;
                let t = (((q * p) & 0xFF) * 3) >> 8;
                out[(4 * k + i) as usize] = f32::cast_from(t) - 1.0;
            }
        }
    }
}

/// `IQ4_NL`, llama.cpp `block_iq4_nl { ggml_half d; uint8_t qs[16]; }` (18 bytes): nibbles laid
/// out as in Q4_0, `y = d * kvalues_iq4nl[q]`.
pub struct IQ4NL;
impl BlockFormat for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ4NL {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        iq4_nibbles(w, block + 2, out);
    }
}

/// The 32 `kvalues_iq4nl[q]` of the 16 IQ4 nibble bytes at byte `qs`: element `j < 16` from the
/// low nibble of byte `j`, `j + 16` from its high nibble; the values of a [`ChunkForm::Scaled`]
/// chunk whose scale `d` makes `y = d * kvalues_iq4nl[q]` (IQ4_NL and IQ4_XS).
#[cube]
fn iq4_nibbles(w: &[u32], qs: u32, out: &mut Array<f32>) {
    #[unroll]
    for k in 0..4u32 {
        let word = read_u32(w, qs + 4 * k);
        #[unroll]
        for i in 0..4u32 {
            let b = (word >> (8 * i)) & 0xFF;
            out[(4 * k + i) as usize] = kvalue_iq4nl(b & 0x0F);
            out[(4 * k + i + 16) as usize] = kvalue_iq4nl(b >> 4);
        }
    }
}

/// `IQ4_XS`, llama.cpp `block_iq4_xs { ggml_half d; uint16_t scales_h; uint8_t scales_l[4];
/// uint8_t qs[128]; }` (136 bytes, 256 elements): eight sub-blocks of 32 (one per chunk) with a
/// 6-bit scale `ls` (low 4 bits in nibble `ib % 2` of `scales_l[ib / 2]`, top 2 bits at bit `2 ib`
/// of `scales_h`); `y = d * (ls - 32) * kvalues_iq4nl[q]`, nibbles as in IQ4_NL.
pub struct IQ4XS;
impl BlockFormat for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 136;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ4XS {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dh = read_u32(w, block);
        let d = f16_to_f32(dh & 0xFFFF);
        let scales_h = dh >> 16;
        let sl = (read_u8(w, block + 4 + chunk / 2) >> (4 * (chunk % 2))) & 0x0F;
        let ls = sl | (((scales_h >> (2 * chunk)) & 3) << 4);
        let dl = d * (f32::cast_from(ls) - 32.0);
        set_scales(out, dl, dl);
        iq4_nibbles(w, block + 8 + 16 * chunk, out);
    }
}

/// `MXFP4`, llama.cpp `block_mxfp4 { uint8_t e; uint8_t qs[16]; }` (17 bytes, so blocks start at
/// any byte offset): E8M0 shared scale, E2M1 nibbles laid out as in Q4_0;
/// `y = kvalues_mxfp4[q] * GGML_E8M0_TO_FP32_HALF(e)`.
pub struct MXFP4;
impl BlockFormat for MXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 17;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for MXFP4 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = e8m0_to_f32_half(read_u8(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 1 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = kvalue_fp4(b & 0x0F);
                out[(4 * k + i + 16) as usize] = kvalue_fp4(b >> 4);
            }
        }
    }
}

/// `NVFP4`, llama.cpp `block_nvfp4 { uint8_t d[4]; uint8_t qs[32]; }` (36 bytes, 64 elements):
/// four sub-blocks of 16 with UE4M3 scales `d[s]`; sub-block `s` reads `qs[8s..8s + 8]`, value
/// `j < 8` the low nibble of byte `j`, `j + 8` its high nibble;
/// `y = kvalues_mxfp4[q] * ggml_ue4m3_to_fp32(d[s]) / 2`. Chunk `c` is sub-blocks `2c`, `2c + 1`.
pub struct NVFP4;
impl BlockFormat for NVFP4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    const BLOCK_ELEMS: u32 = 64;
    const BLOCK_BYTES: u32 = 36;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for NVFP4 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let scales = read_u16(w, block + 2 * chunk);
        let qs = block + 4 + 16 * chunk;
        set_scales(
            out,
            ue4m3_to_f32_half(scales & 0xFF),
            ue4m3_to_f32_half(scales >> 8),
        );
        #[unroll]
        for h in 0..2u32 {
            #[unroll]
            for k in 0..2u32 {
                let word = read_u32(w, qs + 8 * h + 4 * k);
                #[unroll]
                for i in 0..4u32 {
                    let b = (word >> (8 * i)) & 0xFF;
                    out[(16 * h + 4 * k + i) as usize] = kvalue_fp4(b & 0x0F);
                    out[(16 * h + 4 * k + i + 8) as usize] = kvalue_fp4(b >> 4);
                }
            }
        }
    }
}

/// `Q1_0`, llama.cpp `block_q1_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes, 128 elements):
/// element `j` is bit `j % 8` of `qs[j / 8]`, `y = bit ? d : -d`.
pub struct Q1_0;
impl BlockFormat for Q1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
    const BLOCK_ELEMS: u32 = 128;
    const BLOCK_BYTES: u32 = 18;
}
#[cube]
impl BlockDecode for Q1_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let neg_d = -d;
        let bits = read_u32(w, block + 2 + 4 * chunk);
        #[unroll]
        for j in 0..32u32 {
            out[j as usize] = select(((bits >> j) & 1) != 0, d, neg_d);
        }
    }
}

/// `Q2_0`, llama.cpp `block_q2_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes, 64 elements):
/// element `j` is bits `2 * (j % 4)` of `qs[j / 4]`, `y = (q - 1) * d`.
pub struct Q2_0;
impl BlockFormat for Q2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
    const BLOCK_ELEMS: u32 = 64;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q2_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..2u32 {
            let word = read_u32(w, block + 2 + 8 * chunk + 4 * k);
            #[unroll]
            for j in 0..16u32 {
                let q = (word >> (2 * j)) & 3;
                out[(16 * k + j) as usize] = f32::cast_from(q) - 1.0;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Codebook (IQ) types. Every one has 8 sub-blocks of 32 per 256-element super-block, so chunk
// `c` is sub-block `ib = c`; a sub-block is 4 groups of 8 values, each group an entry of the
// type's grid (or two 4-value entries for the IQ3 types) with 8 sign bits. The grid comes from
// the kernels' `grid` buffer ([`Grid`]); the math and its order of operations follow
// `dequantize_row_iq*` of ggml-quants.c, so results are bit-exact.
// ---------------------------------------------------------------------------------------------

/// ggml's `ksigns_iq2xs[i]` for a 7-bit `i`: `i` plus bit 7 set when `i` has an odd number of set
/// bits (so every group has an even number of minus signs).
#[cube]
pub(crate) fn ksigns_iq2xs(i: u32) -> u32 {
    let mut p = i ^ (i >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    i | ((p & 1) << 7)
}

/// One 8-value group: values `0..4` are the bytes of `g0`, `4..8` those of `g1`, negated
/// where bit `j` of `signs` is set; written to `out[base..base + 8]`: the values of a
/// [`ChunkForm::Scaled`] chunk, whose scale `db` makes ggml's `db * grid * sign` (IQ3).
#[cube]
fn signed_group8(g0: u32, g1: u32, signs: u32, out: &mut Array<f32>, base: u32) {
    #[unroll]
    for j in 0..4u32 {
        let v0 = f32::cast_from((g0 >> (8 * j)) & 0xFF);
        let v1 = f32::cast_from((g1 >> (8 * j)) & 0xFF);
        out[(base + j) as usize] = with_sign_bit(v0, signs, j);
        out[(base + j + 4) as usize] = with_sign_bit(v1, signs, comptime!(j + 4));
    }
}

/// `v` negated when bit `j` of `signs` is set: the bit moved to the float's sign bit and
/// XORed in (two integer operations and a XOR, where a test and a select took five). Exact,
/// as a negation is.
#[cube]
fn with_sign_bit(v: f32, signs: u32, #[comptime] j: u32) -> f32 {
    let bit = if comptime!(j == 31) {
        signs & 0x8000_0000
    } else {
        (signs << comptime!(31 - j)) & 0x8000_0000
    };
    f32::reinterpret(u32::reinterpret(v) ^ bit)
}

/// The 2-bit codes of entry `idx` of a [`Grid::Codes`] grid, value `j` at bits `2j..2j + 2`
/// (bits 16 and up are the next entry's, or zero).
#[cube]
fn entry_codes(grid: &[u32], idx: u32) -> u32 {
    grid[(idx / 2) as usize] >> (16 * (idx % 2))
}

/// The 8 values of IQ2 grid entry `idx` ([`Grid::Codes`]), negated where bit `j` of `signs`
/// is set, to `out[base..base + 8]`: the values of a [`ChunkForm::Scaled`] chunk, whose scale
/// `db` makes ggml's `db * grid * sign`.
#[cube]
fn iq2_group8(grid: &[u32], idx: u32, signs: u32, out: &mut Array<f32>, base: u32) {
    let codes = entry_codes(grid, idx);
    #[unroll]
    for j in 0..8u32 {
        // Code `c` of value `j` as the shift `8c` of its byte in IQ2_LEVELS_WORD.
        let shift = if comptime!(j >= 2) {
            (codes >> comptime!(2 * j - 3)) & 0x18
        } else {
            (codes << comptime!(3 - 2 * j)) & 0x18
        };
        let v = f32::cast_from((IQ2_LEVELS_WORD >> shift) & 0xFF);
        out[(base + j) as usize] = with_sign_bit(v, signs, j);
    }
}

/// `IQ2_XXS`, llama.cpp `block_iq2_xxs { ggml_half d; uint16_t qs[32]; }` (66 bytes): sub-block
/// `ib` is two u32 `a0, a1` at `qs + 8ib`; byte `l` of `a0` indexes `iq2xxs_grid` for group `l`,
/// bits `7l..7l + 7` of `a1` index `ksigns_iq2xs`, `a1 >> 28` is the scale:
/// `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2XXS;
impl BlockFormat for IQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 66;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2xxs_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2XXS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let a0 = read_u32(w, block + 2 + 8 * chunk);
        let a1 = read_u32(w, block + 6 + 8 * chunk);
        let db = d * (0.5 + f32::cast_from(a1 >> 28)) * 0.25;
        set_scales(out, db, db);
        #[unroll]
        for l in 0..4u32 {
            let signs = ksigns_iq2xs((a1 >> (7 * l)) & 127);
            iq2_group8(grid, (a0 >> (8 * l)) & 0xFF, signs, out, 8 * l);
        }
    }
}

/// `IQ2_XS`, llama.cpp `block_iq2_xs { ggml_half d; uint16_t qs[32]; uint8_t scales[8]; }`
/// (74 bytes): `qs[4ib + l]` has the `iq2xs_grid` index in bits 0..9 and the `ksigns_iq2xs` index
/// in bits 9..16; groups 0-1 and 2-3 use the low and high nibble of `scales[ib]`:
/// `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2XS;
impl BlockFormat for IQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 74;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2xs_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2XS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = read_u8(w, block + 66 + chunk);
        let db0 = d * (0.5 + f32::cast_from(sc & 0x0F)) * 0.25;
        let db1 = d * (0.5 + f32::cast_from(sc >> 4)) * 0.25;
        set_scales(out, db0, db1);
        #[unroll]
        for h in 0..2u32 {
            let pair = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let q = (pair >> (16 * i)) & 0xFFFF;
                iq2_group8(grid, q & 511, ksigns_iq2xs(q >> 9), out, 8 * (2 * h + i));
            }
        }
    }
}

/// `IQ2_S`, llama.cpp `block_iq2_s { ggml_half d; uint8_t qs[64]; uint8_t qh[8];
/// uint8_t scales[8]; }` (82 bytes): group `l` of sub-block `ib` indexes `iq2s_grid` with
/// `qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8`, takes its signs from `qs[32 + 4ib + l]`, and the
/// scale in nibble `l / 2` of `scales[ib]`: `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2S;
impl BlockFormat for IQ2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 82;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2s_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = read_u8(w, block + 74 + chunk);
        let db0 = d * (0.5 + f32::cast_from(sc & 0x0F)) * 0.25;
        let db1 = d * (0.5 + f32::cast_from(sc >> 4)) * 0.25;
        let qs = read_u32(w, block + 2 + 4 * chunk);
        let signs = read_u32(w, block + 34 + 4 * chunk);
        let qh = read_u8(w, block + 66 + chunk);
        set_scales(out, db0, db1);
        #[unroll]
        for l in 0..4u32 {
            let idx = ((qs >> (8 * l)) & 0xFF) | ((qh << (8 - 2 * l)) & 0x300);
            iq2_group8(grid, idx, (signs >> (8 * l)) & 0xFF, out, 8 * l);
        }
    }
}

/// `IQ3_XXS`, llama.cpp `block_iq3_xxs { ggml_half d; uint8_t qs[3 * QK_K / 8]; }` (98 bytes):
/// `qs[8ib..8ib + 8]` index `iq3xxs_grid` (4 values each, two per group); the u32 at
/// `qs + 64 + 4ib` has the `ksigns_iq2xs` index of group `l` in bits `7l..7l + 7` and the scale in
/// its top 4 bits: `y = d * (0.5 + s) * 0.5 * grid * sign`.
pub struct IQ3XXS;
impl BlockFormat for IQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 98;
    const GRID: Grid = Grid::U32(&ggml_codec::grids::iq3xxs_grid);
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ3XXS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let aux = read_u32(w, block + 66 + 4 * chunk);
        let db = d * (0.5 + f32::cast_from(aux >> 28)) * 0.5;
        set_scales(out, db, db);
        #[unroll]
        for h in 0..2u32 {
            let q = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let l = 2 * h + i;
                let g0 = grid[((q >> (16 * i)) & 0xFF) as usize];
                let g1 = grid[((q >> (16 * i + 8)) & 0xFF) as usize];
                let signs = ksigns_iq2xs((aux >> (7 * l)) & 127);
                signed_group8(g0, g1, signs, out, 8 * l);
            }
        }
    }
}

/// `IQ3_S`, llama.cpp `block_iq3_s { ggml_half d; uint8_t qs[64]; uint8_t qh[8];
/// uint8_t signs[32]; uint8_t scales[4]; }` (110 bytes): each `qs` byte plus one bit of `qh[ib]`
/// indexes `iq3s_grid` (4 values); `signs[4ib + l]` has group `l`'s sign bits; sub-block `ib`
/// takes nibble `ib % 2` of `scales[ib / 2]`: `y = d * (1 + 2s) * grid * sign`.
pub struct IQ3S;
impl BlockFormat for IQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 110;
    const GRID: Grid = Grid::U32(&ggml_codec::grids::iq3s_grid);
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ3S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = (read_u8(w, block + 106 + chunk / 2) >> (4 * (chunk % 2))) & 0x0F;
        let db = d * f32::cast_from(1 + 2 * sc);
        set_scales(out, db, db);
        let qh = read_u8(w, block + 66 + chunk);
        let signs = read_u32(w, block + 74 + 4 * chunk);
        #[unroll]
        for h in 0..2u32 {
            let q = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let l = 2 * h + i;
                let i0 = ((q >> (16 * i)) & 0xFF) | ((qh << (8 - 2 * l)) & 256);
                let i1 = ((q >> (16 * i + 8)) & 0xFF) | ((qh << (7 - 2 * l)) & 256);
                let (g0, g1) = (grid[i0 as usize], grid[i1 as usize]);
                signed_group8(g0, g1, (signs >> (8 * l)) & 0xFF, out, 8 * l);
            }
        }
    }
}

/// The 8 level codes of `iq1s_grid` entry `idx` ([`Grid::Codes`], [`IQ1_LEVELS`]) as floats
/// in `out[base..base + 8]`: a code `c` is the value plus one, so with the group offset
/// `delta - 1` ([`iq1_factors`]) the weight is `dl * (c + (delta - 1))`, exact in the sum as
/// ggml's `grid + delta` is: the same one rounding.
#[cube]
fn iq1_codes8(grid: &[u32], idx: u32, out: &mut Array<f32>, base: u32) {
    let codes = entry_codes(grid, idx);
    #[unroll]
    for j in 0..8u32 {
        out[(base + j) as usize] = f32::cast_from((codes >> (2 * j)) & 3);
    }
}

/// Group `l`'s offset for a delta sign `neg` ([`iq1_codes8`]), in `out[FACTOR_OFFSETS + l]`.
#[cube]
fn iq1_offset(neg: bool, out: &mut Array<f32>, l: u32) {
    out[(FACTOR_OFFSETS + l) as usize] = select(neg, -IQ1_DELTA - 1.0, IQ1_DELTA - 1.0);
}

/// `IQ1S_DELTA` (= `IQ1M_DELTA`, ggml-common.h).
const IQ1_DELTA: f32 = ggml_codec::blocks::IQ1S_DELTA;

/// `IQ1_S`, llama.cpp `block_iq1_s { ggml_half d; uint8_t qs[32]; uint16_t qh[8]; }` (50 bytes):
/// group `l` of sub-block `ib` indexes `iq1s_grid` with `qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8`;
/// bits 12..15 of `qh[ib]` are the scale and bit 15 the delta's sign:
/// `y = d * (2s + 1) * (grid ± IQ1S_DELTA)`.
pub struct IQ1S;
impl BlockFormat for IQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 50;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq1s_grid,
        levels: IQ1_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::ScaledOffsets;
}
#[cube]
impl BlockDecode for IQ1S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let qh = read_u16(w, block + 34 + 2 * chunk);
        let dl = d * f32::cast_from(2 * ((qh >> 12) & 7) + 1);
        let neg = (qh & 0x8000) != 0;
        let qs = read_u32(w, block + 2 + 4 * chunk);
        set_scales(out, dl, dl);
        #[unroll]
        for l in 0..4u32 {
            let idx = ((qs >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8);
            iq1_codes8(grid, idx, out, 8 * l);
            iq1_offset(neg, out, l);
        }
    }
}

/// `IQ1_M`, llama.cpp `block_iq1_m { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; }`
/// (56 bytes): `scales` is 4 u16 `sc` whose top nibbles make the fp16 `d`; sub-block `ib` has
/// 3-bit scales at bits `6 (ib % 2)` (groups 0-1) and `+ 3` (groups 2-3) of `sc[ib / 2]`. Group
/// `l` indexes `iq1s_grid` with `qs[4ib + l]` plus 3 high bits from nibble `l % 2` of
/// `qh[2ib + l / 2]`, whose bit 3 is the delta's sign: `y = d * (2s + 1) * (grid ± IQ1M_DELTA)`.
pub struct IQ1M;
impl BlockFormat for IQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 56;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq1s_grid,
        levels: IQ1_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::ScaledOffsets;
}
#[cube]
impl BlockDecode for IQ1M {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let s01 = read_u32(w, block + 48);
        let s23 = read_u32(w, block + 52);
        let bits = ((s01 >> 12) & 0x000F)
            | ((s01 >> 24) & 0x00F0)
            | ((s23 >> 4) & 0x0F00)
            | ((s23 >> 16) & 0xF000);
        let d = f16_to_f32(bits);
        let sc = select(chunk < 4, s01, s23) >> (16 * ((chunk / 2) % 2) + 6 * (chunk % 2));
        let dl1 = d * f32::cast_from(2 * (sc & 7) + 1);
        let dl2 = d * f32::cast_from(2 * ((sc >> 3) & 7) + 1);
        let qs = read_u32(w, block + 4 * chunk);
        let qh = read_u16(w, block + 32 + 2 * chunk);
        set_scales(out, dl1, dl2);
        #[unroll]
        for l in 0..4u32 {
            let h = (qh >> (8 * (l / 2))) & 0xFF;
            let idx = ((qs >> (8 * l)) & 0xFF) | ((h << (8 - 4 * (l % 2))) & 0x700);
            let neg = (h & (0x08u32 << (4 * (l % 2)))) != 0;
            iq1_codes8(grid, idx, out, 8 * l);
            iq1_offset(neg, out, l);
        }
    }
}

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

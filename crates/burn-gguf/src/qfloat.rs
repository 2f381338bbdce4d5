//! ggml blocks as Burn's own quantized tensors (`DType::QFloat`), where one of Burn 0.22's
//! quantization schemes holds a ggml type without loss: Burn's ops (`dequantize`, quantized
//! `matmul`) then run the tensor, and it stays at its file size.
//!
//! | ggml type (llama.cpp ggml-common.h) | Burn scheme (symmetric, block 32 along the row, values packed in u32 words) |
//! |---|---|
//! | `block_q8_0` {f16 `d`, i8 `qs[32]`} | `Q8F` values `qs` as stored; scale `d` |
//! | `block_q4_0` {f16 `d`, u8 `qs[16]`} | `Q4F` values `nibble - 8` (4-bit two's complement, de-interleaved: ggml keeps element `j` and `j + 16` in one byte, Burn `2b` and `2b + 1`); scale `d` |
//! | `block_mxfp4` {u8 `e`, u8 `qs[16]`} | `E2M1` values (the nibble is the E2M1 code; `-0` is written as `+0`, as ggml decodes it); scale `2^(e - 127)` as f32 |
//! | `block_mxfp4`, other devices | `Q8F` values `kvalues_mxfp4[nibble]` (the doubled E2M1 values); scale ggml's `e8m0_to_fp32_half(e)` as f32 |
//!
//! The scale `d` is kept as f16 where the device binds f16 buffers, else as its exact f32 value.
//! MXFP4 takes the Q8 form on Burn's CPU backend (no E2M1 there), on devices that cannot hold
//! the E2M1 scheme, and for a tensor with a block of `e = 255` (2^128 has no f32). Every form
//! dequantizes to the CPU codec's values bit for bit (`tests/tests/qfloat.rs`).
//!
//! Keep these tensors in the file's `[out, in]` layout: Burn's CPU backend re-quantizes a
//! block-quantized tensor on a layout op (transpose, reshape, slice), which is lossy; on a
//! CubeCL device a transpose only changes strides. `nn::Linear` with
//! `LinearLayout::Col` takes `[out, in]` weights as they are.
use burn::tensor::quantization::{
    QuantScheme, QuantStore, QuantValue, ScaleDtype, quantized_data_len,
};
use burn::tensor::{DType, Device, Shape, TensorData};
use gguf::GgmlType;

use crate::Error;

/// Elements per block of every type mapped here.
const QK: usize = 32;

/// Whether [`to_qfloat`] maps `ty` (Q8_0, Q4_0, MXFP4).
pub fn maps(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::MXFP4)
}

fn scheme(value: QuantValue, scales: ScaleDtype) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(QuantStore::PackedU32(0))
        .per_block([QK as u8], scales)
}

/// The scheme [`to_qfloat`] gives a tensor of `ty` on `device` (`e_max`: the largest MXFP4 `e`
/// byte of the tensor), or `None` for a type not mapped here.
pub fn qfloat_scheme(ty: GgmlType, device: &Device, e_max: u8) -> Option<QuantScheme> {
    let cube = crate::cube_client(device).is_some();
    let usable = |s: QuantScheme| cube && device.supports_dtype(DType::QFloat(s));
    let d_scales = |value| {
        let f16 = scheme(value, ScaleDtype::F16);
        if usable(f16) {
            f16
        } else {
            scheme(value, ScaleDtype::F32)
        }
    };
    match ty {
        GgmlType::Q8_0 => Some(d_scales(QuantValue::Q8F)),
        GgmlType::Q4_0 => Some(d_scales(QuantValue::Q4F)),
        GgmlType::MXFP4 => {
            let e2m1 = scheme(QuantValue::E2M1, ScaleDtype::F32);
            Some(if e_max < 255 && usable(e2m1) {
                e2m1
            } else {
                scheme(QuantValue::Q8F, ScaleDtype::F32)
            })
        }
        _ => None,
    }
}

/// The largest `e` byte of the MXFP4 blocks `bytes` (0 for other types): what
/// [`qfloat_scheme`] needs to know of a tensor's data.
pub fn e_max(ty: GgmlType, bytes: &[u8]) -> u8 {
    match ty {
        GgmlType::MXFP4 => bytes.chunks_exact(17).map(|b| b[0]).max().unwrap_or(0),
        _ => 0,
    }
}

/// The blocks `bytes` of a tensor of ggml type `ty` and Burn-order `shape` (the last dimension
/// is ggml's `ne0`, along which the blocks run) as a Burn `QFloat` [`TensorData`] for `device`:
/// `Tensor::<D>::from_data(data, &device)` makes it a quantized tensor. See the module docs for
/// each type's scheme.
///
/// # Errors
/// [`Error::Unsupported`] for a type not mapped here; [`Error::Shape`] when the last dimension
/// is not a multiple of 32 or `bytes` is not the shape's size.
pub fn to_qfloat(
    ty: GgmlType,
    bytes: &[u8],
    shape: &[usize],
    device: &Device,
) -> Result<TensorData, Error> {
    let block_bytes = match ty {
        GgmlType::Q8_0 => 34,
        GgmlType::Q4_0 => 18,
        GgmlType::MXFP4 => 17,
        t => {
            return Err(Error::Unsupported {
                ggml_type: t,
                reason: "no Burn quantization scheme holds it losslessly (Q8_0, Q4_0, MXFP4 do)"
                    .into(),
            });
        }
    };
    let shape_err = |why: String| Error::Shape(format!("{ty} tensor of shape {shape:?}: {why}"));
    let last = *shape
        .last()
        .ok_or_else(|| shape_err("no dimension".into()))?;
    if last % QK != 0 {
        return Err(shape_err(format!(
            "the last dimension is not a multiple of {QK}"
        )));
    }
    let n: usize = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| shape_err("too many elements".into()))?;
    let blocks = n / QK;
    if blocks.checked_mul(block_bytes) != Some(bytes.len()) {
        return Err(shape_err(format!(
            "{} bytes, {blocks} blocks need {}",
            bytes.len(),
            blocks.saturating_mul(block_bytes)
        )));
    }
    let scheme = qfloat_scheme(ty, device, e_max(ty, bytes)).expect("mapped type");
    let block = scheme.block_scale().expect("per-block scheme");
    let (mut values, mut scales) = (Vec::with_capacity(n), Vec::with_capacity(blocks * 4));
    for b in bytes.chunks_exact(block_bytes) {
        match (ty, scheme.value) {
            (GgmlType::Q8_0, _) => {
                push_d(&mut scales, [b[0], b[1]], block.dtype);
                values.extend_from_slice(&b[2..34]);
            }
            (GgmlType::Q4_0, _) => {
                push_d(&mut scales, [b[0], b[1]], block.dtype);
                // (nibble - 8) as 4-bit two's complement is nibble ^ 8.
                pack_nibbles(&b[2..18], |q| q ^ 8, &mut values);
            }
            (_, QuantValue::E2M1) => {
                // 2^(e - 127): e = 0 is the subnormal 2^-127 (exact); e < 255 here.
                let s = match b[0] {
                    0 => f32::from_bits(0x0040_0000),
                    e => f32::from_bits(u32::from(e) << 23),
                };
                scales.extend_from_slice(&s.to_le_bytes());
                // Code 8 is -0 in E2M1; ggml's kvalues give +0.
                pack_nibbles(&b[1..17], |q| if q == 8 { 0 } else { q }, &mut values);
            }
            _ => {
                let d = ggml_codec::blocks::e8m0_to_fp32_half(b[0]);
                scales.extend_from_slice(&d.to_le_bytes());
                let kv = &ggml_codec::grids::kvalues_mxfp4;
                values.extend(b[1..17].iter().map(|&q| kv[usize::from(q & 0xF)] as u8));
                values.extend(b[1..17].iter().map(|&q| kv[usize::from(q >> 4)] as u8));
            }
        }
    }
    values.extend_from_slice(&scales);
    let shape = Shape::from(shape.to_vec());
    debug_assert_eq!(values.len(), quantized_data_len(&scheme, &shape));
    Ok(TensorData::from_bytes_vec(
        values,
        shape,
        DType::QFloat(scheme),
    ))
}

/// Appends ggml's f16 `d` (little-endian bytes) as a scale of `dtype` (F16 as it is, F32 its
/// exact value).
fn push_d(scales: &mut Vec<u8>, d: [u8; 2], dtype: ScaleDtype) {
    match dtype {
        ScaleDtype::F16 => scales.extend_from_slice(&d),
        _ => scales.extend_from_slice(&half::f16::from_le_bytes(d).to_f32().to_le_bytes()),
    }
}

/// Appends a block's 32 nibbles in element order, two per byte (element `2b` low, `2b + 1`
/// high: Burn's packing of 4-bit values into little-endian u32 words), from ggml's layout
/// (element `j` in the low nibble of `qs[j]`, element `j + 16` in its high nibble), each mapped
/// by `code`.
fn pack_nibbles(qs: &[u8], code: impl Fn(u8) -> u8, out: &mut Vec<u8>) {
    let element = |i: usize| {
        let q = if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 };
        code(q) & 0xF
    };
    out.extend((0..16).map(|b| element(2 * b) | element(2 * b + 1) << 4));
}

//! Writing Burn tensors into GGUF files, quantized with the CPU codec.
//!
//! The container side is [`gguf::GgufWriter`] (metadata, raw blocks of any type, alignment,
//! version and byte order); this module adds the step from a Burn tensor to ggml blocks.
use burn::tensor::Tensor;
use gguf::{GgmlType, GgufWriter};

use crate::Error;

/// Quantizes `tensor` to `ggml_type` with the CPU codec and appends it to `writer` as `name`.
///
/// `tensor` has any rank `D` from 1 to 4 in Burn order (`[..., cols]`, the last dimension is
/// the row) and any float dtype; it is read back to the host as f32. The GGUF `ne` is the
/// shape reversed (`[rows, cols]` becomes `ne = [cols, rows]`). The blocks are exactly those of
/// ggml's reference quantizers (`quantize_row_*_ref` in ggml-quants.c; see
/// [`ggml_codec::supports_quantize`] for the types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, TQ1_0, TQ2_0, MXFP4). Other types can be written as raw blocks with
/// [`GgufWriter::add_tensor`].
///
/// # Errors
/// [`Error::Unsupported`] when the codec has no quantizer for `ggml_type`; [`Error::Tensor`]
/// naming the tensor when the rank is above 4, the row length is not a whole number of
/// blocks, or reading the tensor back fails; the writer's [`gguf::GgufError`] otherwise.
pub fn add_quantized<const D: usize>(
    writer: &mut GgufWriter,
    name: &str,
    ggml_type: GgmlType,
    tensor: Tensor<D>,
) -> Result<(), Error> {
    let err = |reason: String| Error::Tensor {
        name: name.to_string(),
        reason,
    };
    if !ggml_codec::supports_quantize(ggml_type) {
        return Err(Error::Unsupported {
            ggml_type,
            reason: "the CPU codec has no quantizer for this type; write raw blocks with \
                     GgufWriter::add_tensor"
                .into(),
        });
    }
    if D > gguf::MAX_DIMS {
        return Err(err(format!(
            "rank {D} is above GGUF's {} dimensions",
            gguf::MAX_DIMS
        )));
    }
    let shape = tensor.shape().dims::<D>();
    let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    // Checked before quantizing (the writer checks it again): whole blocks per row.
    ggml_type
        .row_bytes(ne.first().copied().unwrap_or(1))
        .map_err(|e| err(e.to_string()))?;
    let values = tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| err(format!("reading the tensor back: {e:?}")))?;
    let blocks = ggml_codec::quantize(ggml_type, &values).map_err(|e| err(e.to_string()))?;
    writer.add_tensor(name, ggml_type, &ne, &blocks)?;
    Ok(())
}

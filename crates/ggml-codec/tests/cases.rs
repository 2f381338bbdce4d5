//! Hand-built blocks (cases C08, C09), error paths, unaligned input and quantize round trips.

use ggml_codec::{
    BlockQ4K, BlockQ5K, CodecError, GgmlBlock, dequantize, dequantize_blocks, dequantize_to_vec,
    get_scale_min_k4, quantize, quantize_q4_0, quantize_q5_0, quantize_q8_0,
};
use gguf::GgmlType;

/// Case C08: Q4_K sub-blocks 4..8 take their scale's top bits from bytes 0..4.
#[test]
fn c08_q4k_scale_min_unpacking() {
    let mut block = vec![0x00, 0x3C, 0x00, 0x00]; // d = 1.0, dmin = 0
    block.extend_from_slice(&[0xC1, 0x01, 0x01, 0x01, 0, 0, 0, 0, 0x05, 0x01, 0x01, 0x01]);
    block.extend_from_slice(&[0x11; 128]);
    assert_eq!(block.len(), 144);

    let scales: [u8; 12] = block[4..16].try_into().unwrap();
    assert_eq!(get_scale_min_k4(0, &scales), (1, 0));
    assert_eq!(get_scale_min_k4(4, &scales), (53, 0));
    assert_eq!(get_scale_min_k4(5, &scales), (1, 0));

    let y = dequantize_to_vec(GgmlType::Q4_K, &block, 256).unwrap();
    for (i, &v) in y.iter().enumerate() {
        let expected = if (128..160).contains(&i) { 53.0 } else { 1.0 };
        assert_eq!(v, expected, "element {i}");
    }

    // The same through the block trait.
    let b: &BlockQ4K = bytemuck::from_bytes(&block);
    let mut out = [0.0f32; 256];
    b.dequantize(&mut out);
    assert_eq!(out[128], 53.0);
    assert_eq!(out[160], 1.0);
}

/// Case C09: Q5_K's 5th bit of value `l` in sub-block `s` is bit `s` of `qh[l]`.
#[test]
fn c09_q5k_high_bit_layout() {
    let mut block = vec![0x00, 0x3C, 0x00, 0x00]; // d = 1.0, dmin = 0
    block.extend_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
    let mut qh = [0u8; 32];
    qh[0] = 0x04;
    block.extend_from_slice(&qh);
    block.extend_from_slice(&[0u8; 128]);
    assert_eq!(block.len(), 176);
    let y = dequantize_to_vec(GgmlType::Q5_K, &block, 256).unwrap();
    for (i, &v) in y.iter().enumerate() {
        let expected = if i == 64 { 16.0 } else { 0.0 };
        assert_eq!(v, expected, "element {i}");
    }
    let b: &BlockQ5K = bytemuck::from_bytes(&block);
    assert_eq!(b.qh[0], 0x04);
}

#[test]
fn errors_not_panics() {
    // Wrong data length.
    let e = dequantize_to_vec(GgmlType::Q8_0, &[0u8; 33], 32).unwrap_err();
    assert_eq!(
        e,
        CodecError::Length {
            ty: GgmlType::Q8_0,
            n_elements: 32,
            expected: 34,
            actual: 33
        }
    );
    assert!(e.to_string().contains("34"));
    let mut out = vec![0.0; 64];
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut out).is_err());
    assert!(dequantize(GgmlType::F32, &[0u8; 255], &mut out).is_err());
    // Not a whole number of blocks.
    let e = dequantize_to_vec(GgmlType::Q4_K, &[0u8; 144], 100).unwrap_err();
    assert!(matches!(e, CodecError::NotBlockMultiple { .. }), "{e:?}");
    // Unsupported types.
    for ty in [
        GgmlType::IQ2_XXS,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::Q8_K,
        GgmlType::I32,
    ] {
        let n = ty.block_size();
        let data = vec![0u8; ty.type_size()];
        assert_eq!(
            dequantize_to_vec(ty, &data, n).unwrap_err(),
            CodecError::Unsupported(ty)
        );
        assert!(quantize(ty, &vec![0.0; n]).is_err());
    }
    assert!(quantize(GgmlType::Q8_0, &[0.0; 33]).is_err());
    assert!(dequantize_blocks::<BlockQ4K>(&[0u8; 143], &mut [0.0; 256]).is_err());
    assert!(dequantize_blocks::<BlockQ4K>(&[0u8; 144], &mut [0.0; 512]).is_err());
    // Empty input is fine.
    assert!(
        dequantize_to_vec(GgmlType::Q4_K, &[], 0)
            .unwrap()
            .is_empty()
    );
}

/// Blocks can start at any byte offset (18-byte Q4_0 blocks straddle word boundaries).
#[test]
fn unaligned_input() {
    let x: Vec<f32> = (0..96).map(|i| (i as f32 - 40.0) * 0.37).collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::F16,
    ] {
        let q = quantize(ty, &x).unwrap();
        let aligned = dequantize_to_vec(ty, &q, 96).unwrap();
        let mut shifted = vec![0xAAu8];
        shifted.extend_from_slice(&q);
        let unaligned = dequantize_to_vec(ty, &shifted[1..], 96).unwrap();
        assert_eq!(aligned, unaligned, "{ty}");
    }
}

#[test]
fn quantize_round_trips_within_one_step() {
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    for (ty, q) in [
        (GgmlType::Q8_0, quantize_q8_0(&x)),
        (GgmlType::Q5_0, quantize_q5_0(&x)),
        (GgmlType::Q4_0, quantize_q4_0(&x)),
        (GgmlType::Q4_1, quantize(GgmlType::Q4_1, &x).unwrap()),
        (GgmlType::Q5_1, quantize(GgmlType::Q5_1, &x).unwrap()),
        (GgmlType::BF16, quantize(GgmlType::BF16, &x).unwrap()),
        (GgmlType::F32, quantize(GgmlType::F32, &x).unwrap()),
    ] {
        assert_eq!(q.len() as u64, ty.row_bytes(256).unwrap());
        let y = dequantize_to_vec(ty, &q, 256).unwrap();
        for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
            let amax = bx.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let range = bx.iter().fold(f32::MIN, |a, &v| a.max(v))
                - bx.iter().fold(f32::MAX, |a, &v| a.min(v));
            let step = match ty {
                GgmlType::Q8_0 => amax / 127.0,
                GgmlType::Q5_0 => amax / 16.0,
                GgmlType::Q4_0 => amax / 8.0,
                GgmlType::Q4_1 => range / 15.0,
                GgmlType::Q5_1 => range / 31.0,
                _ => amax / 128.0,
            };
            // Q4_0 / Q5_0 clamp the value opposite the signed max to one step less (as ggml does).
            let tol = match ty {
                GgmlType::Q4_0 | GgmlType::Q5_0 => step * 1.01,
                _ => step * 0.51,
            };
            for (a, b) in bx.iter().zip(by) {
                assert!((a - b).abs() <= tol + 1e-3 * amax, "{ty}: {a} vs {b}");
            }
        }
    }
    // All-zero blocks quantize to d = 0 and decode to zeros.
    let zeros = vec![0.0f32; 64];
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let y = dequantize_to_vec(ty, &quantize(ty, &zeros).unwrap(), 64).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

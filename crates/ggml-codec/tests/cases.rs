//! Hand-built blocks (cases C08, C09, C11), error paths, unaligned input and quantize round trips.

use ggml_codec::{
    BlockQ4K, BlockQ5K, CodecError, GgmlBlock, dequantize, dequantize_blocks, dequantize_to_vec,
    e8m0_to_fp32_half, get_scale_min_k4, quantize, quantize_q4_0, quantize_q5_0, quantize_q8_0,
    quantize_tq2_0, supports, supports_quantize, ue4m3_to_fp32,
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
    for ty in [GgmlType::Q8_K, GgmlType::I32] {
        let n = ty.block_size();
        let data = vec![0u8; ty.type_size()];
        assert_eq!(
            dequantize_to_vec(ty, &data, n).unwrap_err(),
            CodecError::Unsupported(ty)
        );
        assert!(quantize(ty, &vec![0.0; n]).is_err());
    }
    // Decodable but without a CPU encoder.
    for ty in [GgmlType::IQ2_XXS, GgmlType::NVFP4, GgmlType::Q4_K] {
        assert!(supports(ty) && !supports_quantize(ty));
        assert_eq!(
            quantize(ty, &vec![0.0; ty.block_size()]).unwrap_err(),
            CodecError::Unsupported(ty)
        );
    }
    assert!(quantize(GgmlType::Q8_0, &[0.0; 33]).is_err());
    assert!(quantize(GgmlType::TQ2_0, &[0.0; 255]).is_err());
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

/// Case C11: TQ2_0 stores four 2-bit planes per 32-byte chunk: element `n` is in byte
/// `32 * (n / 128) + n % 32` at shift `2 * ((n % 128) / 32)`, not four consecutive elements per
/// byte.
#[test]
fn c11_tq2_0_bit_plane_layout() {
    let mut block = vec![0x64];
    block.extend_from_slice(&[0x55; 63]);
    block.extend_from_slice(&[0x00, 0x3C]); // d = 1.0
    assert_eq!(block.len(), 66);

    let y = dequantize_to_vec(GgmlType::TQ2_0, &block, 256).unwrap();
    for (i, &v) in y.iter().enumerate() {
        let expected = match i {
            0 => -1.0,
            64 => 1.0,
            _ => 0.0,
        };
        assert_eq!(v, expected, "element {i}");
    }
    // A consecutive-packing reader would give -1, 0, +1, 0 at elements 0..4.
    assert_eq!(&y[..4], &[-1.0, 0.0, 0.0, 0.0]);

    // The quantizer writes the same layout back.
    assert_eq!(quantize_tq2_0(&y), block);
}

/// The scale conversions of MXFP4 (E8M0, halved) and NVFP4 (UE4M3, halved) at their edges.
#[test]
fn fp4_scale_conversions() {
    assert_eq!(e8m0_to_fp32_half(0).to_bits(), 0x0020_0000); // 2^-128
    assert_eq!(e8m0_to_fp32_half(1).to_bits(), 0x0040_0000); // 2^-127
    assert_eq!(e8m0_to_fp32_half(2), 2f32.powi(-126));
    assert_eq!(e8m0_to_fp32_half(127), 0.5);
    assert_eq!(e8m0_to_fp32_half(255), 2f32.powi(127));

    assert_eq!(ue4m3_to_fp32(0), 0.0);
    assert_eq!(ue4m3_to_fp32(0x7F), 0.0);
    assert_eq!(ue4m3_to_fp32(0x38), 0.5); // exp 7, man 0: 1.0, halved
    assert_eq!(ue4m3_to_fp32(0x01), 2f32.powi(-10)); // subnormal 1 * 2^-9, halved
    assert_eq!(ue4m3_to_fp32(0x7E), 448.0 / 2.0); // largest finite E4M3
    assert_eq!(ue4m3_to_fp32(0xB8), ue4m3_to_fp32(0x38)); // bit 7 ignored
}

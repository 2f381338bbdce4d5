//! Bit-exactness against ggml: `shared/fixtures/dequant/<TYPE>.blocks.bin` dequantized must equal
//! `<TYPE>.dequant_ggml.f32` bit for bit, for the synthetic rows and the real Gemma blocks, and the
//! reference quantizers must reproduce ggml's block bytes from `source_f32.bin`.

use ggml_codec::{dequantize, dequantize_to_vec, quantize, supports, supports_quantize};
use gguf::GgmlType;
use serde_json::Value;

/// `../shared/fixtures/dequant` beside the checkout, found from the package directory cargo
/// runs the test in (not a path baked in at compile time, so a build reused from another clone
/// works).
fn dequant_dir() -> String {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    format!("{dir}/../../../shared/fixtures/dequant")
}

/// Types with a CPU decoder, all of which have fixture files.
const DECODED: &[GgmlType] = &[
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

fn read(name: &str) -> Vec<u8> {
    let path = format!("{}/{name}", dequant_dir());
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn manifest() -> Value {
    serde_json::from_slice(&read("manifest.json")).unwrap()
}

/// Asserts bit equality, reporting the first mismatch and the mismatch count.
fn assert_bits_eq(what: &str, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    let diffs: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != expected[i].to_bits())
        .collect();
    if let Some(&i) = diffs.first() {
        panic!(
            "{what}: {} of {} values differ; first at {i}: got {} ({:#010x}), ggml {} ({:#010x})",
            diffs.len(),
            got.len(),
            got[i],
            got[i].to_bits(),
            expected[i],
            expected[i].to_bits()
        );
    }
}

fn check_blocks(what: &str, ty: GgmlType, blocks_file: &str, dequant_file: &str, row_len: usize) {
    let blocks = read(blocks_file);
    let expected = f32s(&read(dequant_file));
    let got = dequantize_to_vec(ty, &blocks, expected.len()).unwrap();
    assert_bits_eq(what, &got, &expected);

    // Row by row, through the slice API, gives the same values.
    let row_bytes = ty.row_bytes(row_len as u64).unwrap() as usize;
    let mut row = vec![0.0f32; row_len];
    for (r, (src, exp)) in blocks
        .chunks_exact(row_bytes)
        .zip(expected.chunks_exact(row_len))
        .enumerate()
    {
        dequantize(ty, src, &mut row).unwrap();
        assert_bits_eq(&format!("{what} row {r}"), &row, exp);
    }
}

#[test]
fn dequantize_matches_ggml_bit_for_bit() {
    let m = manifest();
    // Every type with fixture files is decoded.
    for name in m["types"].as_object().unwrap().keys() {
        let ty: GgmlType = name.parse().unwrap();
        assert!(
            DECODED.contains(&ty),
            "{name} has fixtures but is not checked"
        );
    }
    for &ty in DECODED {
        assert!(supports(ty));
        let entry = &m["types"][ty.name()];
        assert_eq!(entry["ggml_type_id"].as_u64().unwrap(), ty.id() as u64);
        // The manifest has no block size for Q2_0 (unknown to gguf-py); its byte count is
        // checked in `type_table_matches_manifest`.
        if let Some(bs) = entry["block_size"].as_u64() {
            assert_eq!(bs, ty.block_size() as u64, "{ty}");
            assert_eq!(
                entry["type_size"].as_u64().unwrap(),
                ty.type_size() as u64,
                "{ty}"
            );
        }
        check_blocks(
            ty.name(),
            ty,
            entry["blocks_file"].as_str().unwrap(),
            entry["dequant_file"].as_str().unwrap(),
            256,
        );
    }
}

#[test]
fn dequantize_real_gemma_blocks_bit_for_bit() {
    let m = manifest();
    let real = m["gemma_real_blocks"].as_object().unwrap();
    assert_eq!(real.len(), 4);
    for (name, e) in real {
        let ty: GgmlType = e["type"].as_str().unwrap().parse().unwrap();
        let row_len = e["row_len"].as_u64().unwrap() as usize;
        let rows = e["rows"].as_u64().unwrap() as usize;
        let blocks = read(e["blocks_file"].as_str().unwrap());
        assert_eq!(
            blocks.len() as u64,
            ty.row_bytes((row_len * rows) as u64).unwrap()
        );
        check_blocks(
            name,
            ty,
            e["blocks_file"].as_str().unwrap(),
            e["dequant_file"].as_str().unwrap(),
            row_len,
        );
    }
}

/// The type table agrees with the manifest for every type it lists (ids, block and type sizes).
#[test]
fn type_table_matches_manifest() {
    let m = manifest();
    for (name, e) in m["types"].as_object().unwrap() {
        let ty: GgmlType = name.parse().unwrap();
        assert_eq!(
            ty.id() as u64,
            e["ggml_type_id"].as_u64().unwrap(),
            "{name}"
        );
        let n_bytes = e["bytes"].as_u64().unwrap();
        assert_eq!(ty.row_bytes(128 * 256).unwrap(), n_bytes, "{name}");
        if let Some(bs) = e["block_size"].as_u64() {
            assert_eq!(ty.block_size() as u64, bs, "{name}");
            assert_eq!(
                ty.type_size() as u64,
                e["type_size"].as_u64().unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn quantize_matches_ggml_bytes() {
    let source = f32s(&read("source_f32.bin"));
    assert_eq!(source.len(), 128 * 256);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ] {
        assert!(supports_quantize(ty));
        let got = quantize(ty, &source).unwrap();
        let expected = read(&format!("{}.blocks.bin", ty.name()));
        assert_eq!(got.len(), expected.len(), "{ty}");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            let n = (0..got.len()).filter(|&i| got[i] != expected[i]).count();
            panic!(
                "{ty}: {n} bytes differ; first at byte {i} (block {}): got {:#04x}, ggml {:#04x}",
                i / ty.type_size(),
                got[i],
                expected[i]
            );
        }
    }
    // The named entry points are the same functions.
    assert_eq!(ggml_codec::quantize_q8_0(&source), read("Q8_0.blocks.bin"));
    assert_eq!(ggml_codec::quantize_q5_0(&source), read("Q5_0.blocks.bin"));
    assert_eq!(ggml_codec::quantize_q4_0(&source), read("Q4_0.blocks.bin"));
    assert_eq!(
        ggml_codec::quantize_tq1_0(&source),
        read("TQ1_0.blocks.bin")
    );
    assert_eq!(
        ggml_codec::quantize_tq2_0(&source),
        read("TQ2_0.blocks.bin")
    );
    assert_eq!(
        ggml_codec::quantize_mxfp4(&source),
        read("MXFP4.blocks.bin")
    );
}

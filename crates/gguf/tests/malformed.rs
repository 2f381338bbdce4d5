//! Malformed, truncated and crafted files (cases C02, C05, C07): each is rejected with a typed
//! error that names the key or tensor, quickly and without panicking.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetadataValue};

/// Two F32 tensors of 64 elements (256 bytes each, so the file ends exactly at the last tensor).
fn two_tensor_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("test".into()));
    let a: Vec<f32> = (0..64).map(|i| i as f32).collect();
    w.add_tensor("first.weight", GgmlType::F32, &[64], &f32_bytes(&a))
        .unwrap();
    w.add_tensor("last.weight", GgmlType::F32, &[8, 8], &f32_bytes(&a))
        .unwrap();
    w.to_bytes().unwrap()
}

fn tensor_error_name(e: &GgufError) -> &str {
    match e {
        GgufError::Tensor { name, .. } => name,
        other => panic!("expected a tensor error, got {other:?}"),
    }
}

/// Case C02: a file missing its last byte names the last tensor.
#[test]
fn c02_truncated_file_names_last_tensor() {
    let mut bytes = two_tensor_file();
    assert!(GgufFile::from_bytes(bytes.clone()).is_ok());
    let full_len = bytes.len();
    bytes.pop();
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(tensor_error_name(&e), "last.weight");
    let msg = e.to_string();
    assert!(msg.contains("'last.weight'"), "{msg}");
    assert!(msg.contains("past the end of the file"), "{msg}");
    assert!(msg.contains(&format!("({} bytes)", full_len - 1)), "{msg}");
}

/// Case C02 variant: a tensor whose offset points 1 byte past the end of the data section.
#[test]
fn c02_offset_past_data_section() {
    // With alignment 1 any offset is allowed, so the bounds check itself is exercised.
    let mut w = GgufWriter::new();
    w.alignment(1);
    w.add_tensor("a", GgmlType::F32, &[64], &[0u8; 256])
        .unwrap();
    w.add_tensor("b", GgmlType::F32, &[64], &[0u8; 256])
        .unwrap();
    let mut bytes = w.to_bytes().unwrap();
    let at = tensor_offset_field(&bytes, "b");
    put_u64(&mut bytes, at, 256 + 1);
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(tensor_error_name(&e), "b");
    assert!(e.to_string().contains("past the end"), "{e}");

    // Default alignment: offset = data section length + 1 is rejected too (misaligned or past the end).
    let mut bytes = two_tensor_file();
    let at = tensor_offset_field(&bytes, "last.weight");
    put_u64(&mut bytes, at, 512 + 1);
    let e = GgufFile::from_bytes(bytes.clone()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "last.weight");
    put_u64(&mut bytes, at, 512 + 32);
    let e = GgufFile::from_bytes(bytes.clone()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "last.weight");
    assert!(e.to_string().contains("past the end"), "{e}");
    // Offsets that overflow u64 arithmetic.
    put_u64(&mut bytes, at, u64::MAX - 31);
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(tensor_error_name(&e), "last.weight");
}

/// Every prefix of a valid file is rejected (or, for the full file, accepted), never a panic.
#[test]
fn every_truncation_is_an_error() {
    let bytes = two_tensor_file();
    for len in 0..bytes.len() {
        assert!(
            GgufFile::from_bytes(bytes[..len].to_vec()).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
}

fn assert_fast(start: Instant) {
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
}

/// Case C05 (1): a string length of 0x7FFF_FFFF_FFFF_FFFF.
#[test]
fn c05_giant_string_length() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name")
        .u32(8)
        .u64(0x7FFF_FFFF_FFFF_FFFF)
        .bytes(&[b'a'; 64]);
    let start = Instant::now();
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_fast(start);
    assert!(matches!(e, GgufError::Limit { .. }), "{e:?}");
    assert!(e.to_string().contains("general.name"), "{e}");

    // A length under the limit but over the remaining bytes is a truncation, not an allocation.
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(1 << 29).bytes(&[b'a'; 64]);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
    assert!(e.to_string().contains("general.name"), "{e}");

    // A giant key length.
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(&[0; 64]);
    assert!(GgufFile::from_bytes(r.finish()).is_err());
}

/// Case C05 (2): a tensor with n_dims = 0xFFFFFFFF.
#[test]
fn c05_absurd_n_dims() {
    let mut r = Raw::header(3, 1, 0);
    r.str("t").u32(0xFFFF_FFFF).zeros(64);
    let start = Instant::now();
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_fast(start);
    assert_eq!(tensor_error_name(&e), "t");
    assert!(e.to_string().contains("n_dims"), "{e}");

    // Five dims is over the limit too.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0).pad(32).zeros(32);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "t");
}

/// Case C05 (3): an ARRAY of ARRAY nested 10 000 deep.
#[test]
fn c05_deeply_nested_arrays() {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 0..10_000 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(1).u32(7);
    let start = Instant::now();
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_fast(start);
    assert!(matches!(e, GgufError::Metadata { .. }), "{e:?}");
    assert!(e.to_string().contains("deep"), "{e}");
    assert!(e.to_string().contains("nested"), "{e}");

    // Depth 2 (an array of arrays of scalars) is fine.
    let mut r = Raw::header(3, 0, 1);
    r.str("ok").u32(9).u32(9).u64(2);
    r.u32(4).u64(1).u32(7);
    r.u32(8).u64(1).str("x");
    let f = GgufFile::from_bytes(r.finish()).unwrap();
    assert_eq!(
        f.get("ok").unwrap().value_type_name(),
        "ARRAY[ARRAY[UINT32]]"
    );
}

/// Case C05 (4): an array whose element type is 99, and a value type of 99.
#[test]
fn c05_unknown_value_types() {
    let mut r = Raw::header(3, 0, 1);
    r.str("bad.array").u32(9).u32(99).u64(1).zeros(16);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(matches!(e, GgufError::Metadata { .. }), "{e:?}");
    assert!(
        e.to_string().contains("bad.array") && e.to_string().contains("99"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str("bad.value").u32(99).zeros(16);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(e.to_string().contains("bad.value"), "{e}");

    // Array counts are checked against the bytes left before allocating.
    let mut r = Raw::header(3, 0, 1);
    r.str("huge").u32(9).u32(6).u64(u64::MAX / 2).zeros(16);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
    let mut r = Raw::header(3, 0, 1);
    r.str("huge_strings").u32(9).u32(8).u64(1 << 40).zeros(16);
    assert!(GgufFile::from_bytes(r.finish()).is_err());

    // Bools must be 0 or 1.
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(7).u8(2);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(e.to_string().contains("'b'"), "{e}");
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let r = Raw::header(3, u64::MAX, 0);
    assert!(matches!(
        GgufFile::from_bytes(r.finish()).unwrap_err(),
        GgufError::Limit { .. }
    ));
    let r = Raw::header(3, 0, u64::MAX);
    assert!(matches!(
        GgufFile::from_bytes(r.finish()).unwrap_err(),
        GgufError::Limit { .. }
    ));
    // Under the limits but more than the file can hold.
    let r = Raw::header(3, 1 << 20, 1 << 20);
    assert!(matches!(
        GgufFile::from_bytes(r.finish()).unwrap_err(),
        GgufError::Truncated { .. }
    ));
}

/// Case C07: a Q4_K tensor whose rows are not a whole number of 256-value blocks.
#[test]
fn c07_row_not_multiple_of_block_size() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[4544, 1], GgmlType::Q4_K.id(), 0)
        .pad(32)
        .zeros(18 * 144);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "w");
    let msg = e.to_string();
    assert!(
        msg.contains("4544") && msg.contains("256") && msg.contains("Q4_K"),
        "{msg}"
    );

    // The same shape in Q8_0 (142 blocks of 32) loads.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[4544, 1], GgmlType::Q8_0.id(), 0)
        .pad(32)
        .zeros(142 * 34);
    let f = GgufFile::from_bytes(r.finish()).unwrap();
    assert_eq!(f.tensor("w").unwrap().n_bytes, 142 * 34);
}

/// Case C07 variant: retired type ids are rejected with their name, without dividing by zero.
#[test]
fn c07_retired_type_ids() {
    for (id, name) in [
        (4, "Q4_2"),
        (5, "Q4_3"),
        (31, "Q4_0_4_4"),
        (36, "IQ4_NL_4_4"),
    ] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("w", &[2880, 1], id, 0).pad(32).zeros(4096);
        let e = GgufFile::from_bytes(r.finish()).unwrap_err();
        assert_eq!(tensor_error_name(&e), "w");
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains(&id.to_string()), "{msg}");
        assert!(
            GgmlType::from_id(id)
                .unwrap_err()
                .to_string()
                .contains(name)
        );
    }
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[32, 1], 1000, 0).pad(32).zeros(4096);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(
        e.to_string().contains("1000") && e.to_string().contains("'w'"),
        "{e}"
    );
}

/// A model mixing Q4_K and Q5_0 tensors loads.
#[test]
fn c07_mixed_types_load() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", GgmlType::Q4_K, &[256, 2], &[0u8; 288])
        .unwrap();
    w.add_tensor("b", GgmlType::Q5_0, &[640, 2], &[0u8; 20 * 22 * 2])
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensor("b").unwrap().ggml_type, GgmlType::Q5_0);
}

#[test]
fn bad_alignment() {
    for (value, needle) in [
        (0u32, "power of two"),
        (3, "power of two"),
        (48, "power of two"),
    ] {
        let mut w = GgufWriter::new();
        w.alignment(64);
        w.add_tensor("t", GgmlType::F32, &[1], &[0u8; 4]).unwrap();
        let mut bytes = w.to_bytes().unwrap();
        let at = after_string(&bytes, "general.alignment") + 4;
        put_u32(&mut bytes, at, value);
        let e = GgufFile::from_bytes(bytes).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("general.alignment") && msg.contains(needle),
            "{msg}"
        );
    }
    // Wrong value type.
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetadataValue::U64(32));
    assert!(w.to_bytes().is_err());
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(10).u64(32);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(e.to_string().contains("UINT32"), "{e}");
}

#[test]
fn misaligned_tensor_offset() {
    let mut bytes = two_tensor_file();
    let at = tensor_offset_field(&bytes, "last.weight");
    put_u64(&mut bytes, at, 8);
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(tensor_error_name(&e), "last.weight");
    assert!(e.to_string().contains("alignment"), "{e}");
}

#[test]
fn overlapping_tensor_data_is_an_error() {
    // Two 32-byte F32 tensors, the second starting 16 bytes into the first.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("first", &[8], 0, 0).tensor("second", &[8], 0, 32);
    r.pad(32).zeros(64);
    assert!(GgufFile::from_bytes(r.0.clone()).is_ok());
    let mut r = Raw::header(3, 2, 0);
    r.tensor("first", &[8], 0, 32).tensor("second", &[8], 0, 0);
    r.pad(32).zeros(64);
    assert!(
        GgufFile::from_bytes(r.0.clone()).is_ok(),
        "order in the table does not matter"
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("first", &[16], 0, 0).tensor("second", &[8], 0, 32);
    r.pad(32).zeros(64);
    let e = GgufFile::from_bytes(r.0).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("'second'") && msg.contains("overlaps tensor 'first'"),
        "{msg}"
    );
}

#[test]
fn duplicate_names() {
    let mut w = GgufWriter::new();
    w.add_tensor("aa", GgmlType::F32, &[1], &[0u8; 4]).unwrap();
    w.add_tensor("ab", GgmlType::F32, &[1], &[0u8; 4]).unwrap();
    let mut bytes = w.to_bytes().unwrap();
    let at = after_string(&bytes, "ab");
    bytes[at - 1] = b'a';
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert_eq!(tensor_error_name(&e), "aa");
    assert!(e.to_string().contains("duplicate"), "{e}");

    let mut w = GgufWriter::new();
    w.add_metadata("k.x", MetadataValue::U8(1));
    w.add_metadata("k.y", MetadataValue::U8(2));
    let mut bytes = w.to_bytes().unwrap();
    let at = after_string(&bytes, "k.y");
    bytes[at - 1] = b'x';
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(matches!(e, GgufError::Metadata { .. }), "{e:?}");
    assert!(
        e.to_string().contains("k.x") && e.to_string().contains("duplicate"),
        "{e}"
    );
}

#[test]
fn zero_dimension_is_rejected() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("z", &[4, 0], 0, 0).pad(32).zeros(32);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "z");
    // Element counts that overflow.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("big", &[1 << 32, 1 << 32, 1 << 32], 0, 0)
        .pad(32)
        .zeros(32);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert_eq!(tensor_error_name(&e), "big");
}

#[test]
fn versions_and_magic() {
    let bytes = two_tensor_file();

    // v2 has the same layout as v3 (64-bit counts).
    let mut v2 = bytes.clone();
    put_u32(&mut v2, 4, 2);
    let f = GgufFile::from_bytes(v2).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 2);

    // Versions 4 and 0 are refused in either byte order; v1 and big-endian files are read
    // (tests/versions.rs).
    for v in [0u32, 4, 4 << 24, 0x0102_0304] {
        let mut b = bytes.clone();
        put_u32(&mut b, 4, v);
        let e = GgufFile::from_bytes(b).unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version, .. } if version == v),
            "{e:?}"
        );
    }

    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(bad).unwrap_err(),
        GgufError::BadMagic { .. }
    ));
    assert!(matches!(
        GgufFile::from_bytes(b"PK\x03".to_vec()).unwrap_err(),
        GgufError::BadMagic { .. }
    ));
    assert!(matches!(
        GgufFile::from_bytes(b"GG".to_vec()).unwrap_err(),
        GgufError::Truncated { .. }
    ));
    assert!(GgufFile::from_bytes(Vec::new()).is_err());
}

#[test]
fn invalid_utf8_is_an_error() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(2).bytes(&[0xC3, 0x28]);
    let e = GgufFile::from_bytes(r.finish()).unwrap_err();
    assert!(matches!(e, GgufError::InvalidString { .. }), "{e:?}");
    assert!(e.to_string().contains("'k'"), "{e}");
}

//! Writer -> reader round trips: every metadata type, shapes (C03), alignment, typed getters.

mod common;

use common::*;
use gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetadataArray, MetadataValue};

fn all_values() -> Vec<(&'static str, MetadataValue)> {
    use MetadataValue as V;
    vec![
        ("general.architecture", V::String("test".into())),
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(65000)),
        ("t.i16", V::I16(-32000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(1.5e-6)),
        ("t.bool_t", V::Bool(true)),
        ("t.bool_f", V::Bool(false)),
        ("t.string", V::String("héllo wörld ✓".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f64", V::F64(std::f64::consts::PI)),
        ("a.u8", V::Array(MetadataArray::U8(vec![0, 1, 255]))),
        ("a.i8", V::Array(MetadataArray::I8(vec![-128, 0, 127]))),
        ("a.u16", V::Array(MetadataArray::U16(vec![1, 65535]))),
        ("a.i16", V::Array(MetadataArray::I16(vec![-1, 2]))),
        ("a.u32", V::Array(MetadataArray::U32(vec![7, 8, 9]))),
        ("a.i32", V::Array(MetadataArray::I32(vec![-7, 8, -9]))),
        ("a.f32", V::Array(MetadataArray::F32(vec![-1000.0, 0.25]))),
        (
            "a.bool",
            V::Array(MetadataArray::Bool(vec![true, false, true])),
        ),
        (
            "a.string",
            V::Array(MetadataArray::String(vec![
                "<pad>".into(),
                "".into(),
                "▁the".into(),
            ])),
        ),
        ("a.u64", V::Array(MetadataArray::U64(vec![u64::MAX, 0]))),
        ("a.i64", V::Array(MetadataArray::I64(vec![i64::MIN, 3]))),
        ("a.f64", V::Array(MetadataArray::F64(vec![1e300, -0.5]))),
        ("a.empty", V::Array(MetadataArray::F32(vec![]))),
        (
            "a.nested",
            V::Array(MetadataArray::Array(vec![
                MetadataArray::I32(vec![1, 2]),
                MetadataArray::String(vec!["x".into()]),
                MetadataArray::U8(vec![]),
            ])),
        ),
    ]
}

#[test]
fn every_metadata_type_round_trips() {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add_metadata(k, v);
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    let expected = all_values();
    assert_eq!(f.metadata().len(), expected.len());
    for ((k, v), (ek, ev)) in f.metadata().iter().zip(&expected) {
        assert_eq!(k, ek);
        assert_eq!(v, ev, "{k}");
        assert_eq!(f.get(k), Some(ev));
    }
    assert_eq!(f.architecture().unwrap(), "test");
    assert_eq!(f.get("a.f32").unwrap().value_type_name(), "ARRAY[FLOAT32]");
    assert_eq!(
        f.get("a.string").unwrap().value_type_name(),
        "ARRAY[STRING]"
    );
    assert_eq!(
        f.get("a.nested").unwrap().value_type_name(),
        "ARRAY[ARRAY[INT32]]"
    );
    assert_eq!(f.get("t.u32").unwrap().value_type_name(), "UINT32");
    assert_eq!(f.get("t.f64").unwrap().value_type_name(), "FLOAT64");
    assert!(f.tensors().is_empty());
}

#[test]
fn typed_getters() {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add_metadata(k, v);
    }
    w.add_metadata("t.i32_small", MetadataValue::I32(42));
    w.add_metadata("t.u64_small", MetadataValue::U64(7));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();

    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_u32("t.i32_small").unwrap(), 42);
    assert_eq!(f.get_u32("t.u64_small").unwrap(), 7);
    assert!(matches!(f.get_u32("t.i8"), Err(GgufError::KeyType { .. })));
    assert!(matches!(f.get_u32("t.u64"), Err(GgufError::KeyType { .. })));
    assert!(matches!(f.get_u32("t.f32"), Err(GgufError::KeyType { .. })));
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert!(f.get_u64("t.i16").is_err());
    assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_i64("t.i8").unwrap(), -100);
    assert!(f.get_i64("t.u64").is_err());
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5e-6);
    assert_eq!(f.get_f32("t.f64").unwrap(), std::f64::consts::PI as f32);
    assert!(f.get_f32("t.u32").is_err());
    assert!(f.get_bool("t.bool_t").unwrap());
    assert!(!f.get_bool("t.bool_f").unwrap());
    assert!(f.get_bool("t.u8").is_err());
    assert_eq!(f.get_str("t.string").unwrap(), "héllo wörld ✓");
    assert_eq!(f.get_str_array("a.string").unwrap()[2], "▁the");
    assert_eq!(f.get_f32_array("a.f32").unwrap(), &[-1000.0, 0.25]);
    assert_eq!(f.get_i32_array("a.i32").unwrap(), &[-7, 8, -9]);
    assert_eq!(f.get_array("a.u8").unwrap().len(), 3);

    // Only ARRAY[FLOAT32] / ARRAY[INT32] are accepted (case C06).
    let e = f.get_f32_array("a.u8").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("a.u8") && msg.contains("ARRAY[FLOAT32]") && msg.contains("ARRAY[UINT8]"),
        "{msg}"
    );
    assert!(f.get_i32_array("a.u32").is_err());
    assert!(f.get_str_array("a.f32").is_err());

    // Missing keys are named.
    let e = f.get_u32("no.such.key").unwrap_err();
    assert!(matches!(e, GgufError::MissingKey { .. }));
    assert!(e.to_string().contains("no.such.key"));
    assert!(f.get_str("no.such.key").is_err());

    // Optional getters.
    assert_eq!(f.get_opt_u32("no.such.key").unwrap(), None);
    assert_eq!(f.get_opt_u32("t.u16").unwrap(), Some(65000));
    assert!(f.get_opt_u32("t.string").is_err());
    assert_eq!(f.get_opt_f32("no.such.key").unwrap(), None);
    assert_eq!(f.get_opt_f32("t.f32").unwrap(), Some(1.5e-6));
    assert!(f.get_opt_f32("t.bool_t").is_err());
    assert_eq!(f.get_opt_bool("no.such.key").unwrap(), None);
    assert_eq!(f.get_opt_bool("t.bool_t").unwrap(), Some(true));
    assert!(f.get_opt_bool("t.u8").is_err());
    assert_eq!(f.get_opt_str("no.such.key").unwrap(), None);
    assert_eq!(f.get_opt_str("general.architecture").unwrap(), Some("test"));
    assert!(f.get_opt_str("t.u8").is_err());
}

/// Case C03: ggml `ne = [10, 4]` is the Burn shape `[4, 10]`, and the data is untouched.
#[test]
fn c03_dims_are_reversed() {
    let mut a = vec![0.0f32; 40];
    for i in 0..4 {
        a[i * 10 + i] = 1.0;
    }
    a[10] = 5.0;
    let data = f32_bytes(&a);
    let mut w = GgufWriter::new();
    w.add_tensor("A", GgmlType::F32, &[10, 4], &data).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let t = f.tensor("A").unwrap();
    assert_eq!(t.ne, vec![10, 4]);
    assert_eq!(t.shape(), vec![4, 10]);
    assert_eq!(t.n_elements(), 40);
    assert_eq!(t.n_bytes, 160);
    assert_eq!(t.row_len(), 10);
    assert_eq!(t.n_rows(), 4);
    let bytes = f.tensor_data(t);
    assert_eq!(bytes, &data[..]);
    assert_eq!(f.tensor_bytes("A").unwrap(), &data[..]);
    let vals: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let at = |r: usize, c: usize| vals[r * 10 + c];
    assert_eq!(at(1, 0), 5.0);
    assert_eq!(at(1, 1), 1.0);
    assert_eq!(at(0, 1), 0.0);
}

#[test]
fn tensors_of_several_types_and_ranks() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("x".into()));
    w.add_tensor("q4k", GgmlType::Q4_K, &[512, 3], &vec![7u8; 2 * 144 * 3])
        .unwrap();
    w.add_tensor("q50", GgmlType::Q5_0, &[32, 3], &[1u8; 22 * 3])
        .unwrap();
    w.add_tensor("q80", GgmlType::Q8_0, &[4544, 1], &vec![2u8; 142 * 34])
        .unwrap();
    w.add_tensor("experts", GgmlType::F16, &[4, 3, 2], &[3u8; 48])
        .unwrap();
    w.add_tensor("four", GgmlType::I8, &[1, 2, 3, 4], &[4u8; 24])
        .unwrap();
    w.add_tensor("scalar", GgmlType::F32, &[], &[0, 0, 128, 63])
        .unwrap();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let names: Vec<_> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["q4k", "q50", "q80", "experts", "four", "scalar"]);
    for t in f.tensors() {
        assert_eq!(t.offset % 32, 0);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(f.tensor_file_offset(t) % 32, 0);
    }
    assert_eq!(f.tensor("q4k").unwrap().n_bytes, 864);
    assert!(
        f.tensor_data(f.tensor("q4k").unwrap())
            .iter()
            .all(|&b| b == 7)
    );
    assert_eq!(f.tensor("experts").unwrap().shape(), vec![2, 3, 4]);
    assert_eq!(f.tensor("four").unwrap().shape(), vec![4, 3, 2, 1]);
    let s = f.tensor("scalar").unwrap();
    assert_eq!(s.shape(), Vec::<usize>::new());
    assert_eq!(s.n_elements(), 1);
    assert_eq!(f.tensor_data(s), &1.0f32.to_le_bytes());
    let e = f.tensor_bytes("nope").unwrap_err();
    assert!(matches!(e, GgufError::MissingTensor { .. }));
    assert!(e.to_string().contains("nope"));
    assert!(f.tensor("nope").is_none());
}

#[test]
fn custom_alignment() {
    let mut w = GgufWriter::new();
    w.alignment(64);
    w.add_tensor("a", GgmlType::F32, &[3], &[0u8; 12]).unwrap();
    w.add_tensor("b", GgmlType::F32, &[5], &[1u8; 20]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_u32("general.alignment").unwrap(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("b").unwrap().offset, 64);
    assert_eq!(f.tensor_bytes("b").unwrap(), &[1u8; 20]);

    // Alignment 1 is a power of two too.
    let mut w = GgufWriter::new();
    w.alignment(1);
    w.add_tensor("a", GgmlType::F32, &[3], &[0u8; 12]).unwrap();
    w.add_tensor("b", GgmlType::F16, &[1], &[1u8; 2]).unwrap();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.tensor("b").unwrap().offset, 12);
    assert_eq!(f.file_size(), bytes.len() as u64);
}

#[test]
fn open_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    );
    w.add_tensor(
        "w",
        GgmlType::F32,
        &[2, 2],
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
    )
    .unwrap();
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(
        f.tensor_bytes("w").unwrap(),
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0])[..]
    );
    assert!(format!("{f:?}").contains("n_tensors: 1"));

    let e = GgufFile::open(dir.path().join("missing.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("missing.gguf"));

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(GgufFile::open(&empty).is_err());
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    // Data length must match.
    let e = w
        .add_tensor("a", GgmlType::F32, &[4], &[0u8; 15])
        .unwrap_err();
    assert!(e.to_string().contains("'a'"), "{e}");
    // Row not a whole number of blocks.
    let e = w
        .add_tensor("w", GgmlType::Q4_K, &[4544, 1], &[0u8; 18 * 144])
        .unwrap_err();
    assert!(e.to_string().contains("4544"), "{e}");
    assert!(w.add_tensor("z", GgmlType::F32, &[0], &[]).is_err());
    assert!(
        w.add_tensor("five", GgmlType::F32, &[1, 1, 1, 1, 1], &[0u8; 4])
            .is_err()
    );

    let mut w = GgufWriter::new();
    w.add_metadata("k", MetadataValue::U8(1));
    w.add_metadata("k", MetadataValue::U8(2));
    assert!(w.to_bytes().is_err());

    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::F32, &[1], &[0u8; 4]).unwrap();
    w.add_tensor("t", GgmlType::F32, &[1], &[0u8; 4]).unwrap();
    assert!(w.to_bytes().is_err());

    let mut w = GgufWriter::new();
    w.alignment(3);
    assert!(w.to_bytes().is_err());

    let mut w = GgufWriter::new();
    w.add_metadata(
        "deep",
        MetadataValue::Array(MetadataArray::Array(vec![MetadataArray::Array(vec![])])),
    );
    assert!(w.to_bytes().is_err());
}

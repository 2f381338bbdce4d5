//! GGUF v1/v2/v3 and big-endian files: hand-built bytes, gguf-py's big-endian conversion, and
//! writer round trips in every version and byte order.

use std::path::PathBuf;

use gguf::{ByteOrder, GgmlType, GgufError, GgufFile, GgufWriter, MetadataArray, MetadataValue};

/// Hand-built file bytes, numbers in either byte order, counts of 4 (v1) or 8 bytes.
struct Bytes {
    out: Vec<u8>,
    big: bool,
    count_bytes: usize,
}

impl Bytes {
    fn new(version: u32, big: bool) -> Bytes {
        let mut b = Bytes {
            out: b"GGUF".to_vec(),
            big,
            count_bytes: if version == 1 { 4 } else { 8 },
        };
        b.u32(version);
        b
    }
    fn num(&mut self, le: &[u8]) -> &mut Self {
        let mut v = le.to_vec();
        if self.big {
            v.reverse();
        }
        self.out.extend_from_slice(&v);
        self
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.num(&x.to_le_bytes())
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.num(&x.to_le_bytes())
    }
    fn f32(&mut self, x: f32) -> &mut Self {
        self.num(&x.to_le_bytes())
    }
    fn count(&mut self, n: u64) -> &mut Self {
        let le = n.to_le_bytes();
        let w = self.count_bytes;
        self.num(&le[..w])
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.count(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
        self
    }
    fn pad(&mut self, align: usize) -> &mut Self {
        while !self.out.len().is_multiple_of(align) {
            self.out.push(0);
        }
        self
    }
}

const FLOATS: [f32; 8] = [1.0, -2.5, 3.25, 0.0, 1e-3, -7.0, 65504.0, 0.5];

/// One file: `general.architecture = "llama"`, `a = [1.5f32, -2.0]`, `n = 7u32`, and tensor `t`
/// (F32, ne [4, 2]) holding [`FLOATS`].
fn hand_built(version: u32, big: bool) -> Vec<u8> {
    let mut b = Bytes::new(version, big);
    b.count(1).count(3);
    b.str("general.architecture").u32(8).str("llama");
    b.str("a").u32(9).u32(6).count(2).f32(1.5).f32(-2.0);
    b.str("n").u32(4).u32(7);
    b.str("t").u32(2).count(4).count(2).u32(0).u64(0);
    b.pad(32);
    for x in FLOATS {
        b.f32(x);
    }
    b.out
}

fn check_hand_built(f: &GgufFile) {
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_f32_array("a").unwrap(), &[1.5, -2.0]);
    assert_eq!(f.get_u32("n").unwrap(), 7);
    let t = f.tensor("t").unwrap();
    assert_eq!(t.ne, vec![4, 2]);
    assert_eq!(t.shape(), vec![2, 4]);
    let le: Vec<u8> = FLOATS.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(f.tensor_data(t), &le[..]);
}

#[test]
fn every_version_in_both_byte_orders_by_hand() {
    for version in 1..=3 {
        for big in [false, true] {
            let f = GgufFile::from_bytes(hand_built(version, big))
                .unwrap_or_else(|e| panic!("v{version} big={big}: {e}"));
            assert_eq!(f.version(), version);
            let order = if big {
                ByteOrder::Big
            } else {
                ByteOrder::Little
            };
            assert_eq!(f.byte_order(), order);
            check_hand_built(&f);
        }
    }
}

#[test]
fn v1_counts_are_32_bit() {
    // A v1 file read as if its counts were 64-bit would be garbage: check the layout is v1's by
    // truncating inside the 4-byte tensor count.
    let bytes = hand_built(1, false);
    let e = GgufFile::from_bytes(bytes[..10].to_vec()).unwrap_err();
    assert!(e.to_string().contains("tensor count"), "{e}");
    // A v1 string length of 2^32 - 1 (all ones in 4 bytes) is past the end of the file.
    let mut b = Bytes::new(1, false);
    b.count(0).count(1).u32(u32::MAX);
    let e = GgufFile::from_bytes(b.out).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
}

fn data_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("tests")
        .join("data")
}

/// gguf-py's `gguf_convert_endian.py` output reads to the same metadata and tensor bytes as the
/// little-endian file it was made from (tools/make_endian_fixtures.py).
#[test]
fn gguf_py_big_endian_conversion_reads_identically() {
    let le = GgufFile::open(data_dir().join("gguf-py-le.gguf")).unwrap();
    let be = GgufFile::open(data_dir().join("gguf-py-be.gguf")).unwrap();
    assert_eq!(le.byte_order(), ByteOrder::Little);
    assert_eq!(be.byte_order(), ByteOrder::Big);
    assert_eq!(be.version(), 3);
    assert_eq!(le.metadata(), be.metadata());
    assert_eq!(be.get_u32("test.u32").unwrap(), 123_456_789);
    assert_eq!(be.get_i64("test.i64").unwrap(), -(1i64 << 40) - 7);
    assert_eq!(be.get_str("test.string").unwrap(), "big-endian ✓");
    assert_eq!(be.get_i32_array("test.i32s").unwrap(), &[1, -2, 300_000]);
    assert_eq!(le.tensors(), be.tensors());
    let types: Vec<GgmlType> = be.tensors().iter().map(|t| t.ggml_type).collect();
    use GgmlType as T;
    for ty in [
        T::F32,
        T::F16,
        T::BF16,
        T::Q4_0,
        T::Q8_0,
        T::Q4_K,
        T::Q6_K,
        T::MXFP4,
    ] {
        assert!(types.contains(&ty), "{ty} missing from the fixture");
    }
    for t in be.tensors() {
        assert_eq!(le.tensor_data(t), be.tensor_data(t), "{}", t.name);
    }
    // The file on disk holds other bytes for every type with multi-byte fields: the swap ran.
    let on_disk = std::fs::read(data_dir().join("gguf-py-be.gguf")).unwrap();
    for t in be.tensors().iter().filter(|t| t.ggml_type != T::MXFP4) {
        let off = be.tensor_file_offset(t) as usize;
        let raw = &on_disk[off..off + t.n_bytes as usize];
        assert_ne!(raw, le.tensor_data(t), "{} was not swapped", t.name);
    }
}

fn sample_writer(types: &[GgmlType]) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("x".into()));
    w.add_metadata("k.u16", MetadataValue::U16(0xBEEF));
    w.add_metadata("k.f64", MetadataValue::F64(-0.1));
    w.add_metadata(
        "k.nested",
        MetadataValue::Array(MetadataArray::Array(vec![
            MetadataArray::U64(vec![1, u64::MAX]),
            MetadataArray::String(vec!["s".into()]),
        ])),
    );
    for (i, &ty) in types.iter().enumerate() {
        let ne = [ty.block_size() as u64 * 2, 3];
        let n = ty.row_bytes(ne[0]).unwrap() as usize * 3;
        let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
        w.add_tensor(format!("t{i}"), ty, &ne, &data).unwrap();
    }
    w
}

#[test]
fn writer_round_trips_every_version_and_byte_order() {
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|&t| gguf::byte_order::swappable(t))
        .collect();
    let reference = GgufFile::from_bytes(sample_writer(&types).to_bytes().unwrap()).unwrap();
    for version in 1..=3 {
        for order in [ByteOrder::Little, ByteOrder::Big] {
            let mut w = sample_writer(&types);
            w.version(version).byte_order(order);
            let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
            assert_eq!((f.version(), f.byte_order()), (version, order));
            assert_eq!(f.metadata(), reference.metadata());
            assert_eq!(f.tensors(), reference.tensors());
            for t in f.tensors() {
                assert_eq!(f.tensor_data(t), reference.tensor_data(t), "{}", t.name);
            }
        }
    }
}

#[test]
fn big_endian_block_types_without_a_layout_are_refused() {
    // The writer refuses them...
    let mut w = sample_writer(&[GgmlType::IQ2_XXS]);
    w.byte_order(ByteOrder::Big);
    let e = w.to_bytes().unwrap_err();
    assert!(e.to_string().contains("'t0'"), "{e}");
    // ... and so does the reader, for a big-endian file that has one: take a big-endian file of
    // Q4_0 and relabel the tensor's type id as IQ4_NL (same 18-byte block).
    let mut w = GgufWriter::new();
    w.byte_order(ByteOrder::Big);
    w.add_tensor("blk.0.ffn_down.weight", GgmlType::Q4_0, &[32], &[0u8; 18])
        .unwrap();
    let mut bytes = w.to_bytes().unwrap();
    let name = b"blk.0.ffn_down.weight";
    let at = bytes.windows(name.len()).position(|s| s == name).unwrap() + name.len() + 4 + 8;
    assert_eq!(bytes[at..at + 4], GgmlType::Q4_0.id().to_be_bytes());
    bytes[at..at + 4].copy_from_slice(&GgmlType::IQ4_NL.id().to_be_bytes());
    let e = GgufFile::from_bytes(bytes).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("blk.0.ffn_down.weight"), "{msg}");
    assert!(
        msg.contains("big-endian") && msg.contains("IQ4_NL"),
        "{msg}"
    );
}

#[test]
fn writer_refuses_unknown_versions() {
    for version in [0, 4] {
        let mut w = sample_writer(&[GgmlType::F32]);
        w.version(version);
        let e = w.to_bytes().unwrap_err();
        assert!(e.to_string().contains(&format!("version {version}")), "{e}");
    }
}

/// One small tensor of every ggml type (as `write_every_type` writes for gguf-py) reads back
/// with the same type, shape and bytes, in every version and byte order that can hold it.
#[test]
fn a_file_with_every_ggml_type_reads_back_identically() {
    for version in 1..=3 {
        for order in [ByteOrder::Little, ByteOrder::Big] {
            let types: Vec<GgmlType> = GgmlType::all()
                .iter()
                .copied()
                .filter(|&t| order == ByteOrder::Little || gguf::byte_order::swappable(t))
                .collect();
            let mut w = sample_writer(&types);
            w.version(version).byte_order(order);
            let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
            assert_eq!(f.tensors().len(), types.len());
            for (i, (t, &ty)) in f.tensors().iter().zip(&types).enumerate() {
                let ne = [ty.block_size() as u64 * 2, 3];
                let n = ty.row_bytes(ne[0]).unwrap() as usize * 3;
                let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
                assert_eq!((t.ggml_type, &t.ne[..]), (ty, &ne[..]), "{ty}");
                assert_eq!(f.tensor_data(t), &data[..], "{ty} v{version} {order:?}");
            }
        }
    }
    assert_eq!(GgmlType::all().len(), 35);
}

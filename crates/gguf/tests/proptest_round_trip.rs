//! Property tests of the writer through the reader: for any metadata (every value type, arrays
//! nested to the reader's depth limit, any float bit pattern), any tensors (every ggml type, 0 to
//! 4 dimensions, any bytes), any GGUF version, byte order and alignment, the file reads back to
//! the same values, and writing what was read gives the same bytes again.

use std::collections::BTreeMap;

use gguf::{ByteOrder, GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue};
use proptest::collection::vec;
use proptest::prelude::*;

fn f32_bits() -> impl Strategy<Value = f32> {
    any::<u32>().prop_map(f32::from_bits)
}

fn f64_bits() -> impl Strategy<Value = f64> {
    any::<u64>().prop_map(f64::from_bits)
}

fn scalar_array() -> impl Strategy<Value = MetadataArray> {
    use MetadataArray as A;
    let n = 0..5usize;
    prop_oneof![
        vec(any::<u8>(), n.clone()).prop_map(A::U8),
        vec(any::<i8>(), n.clone()).prop_map(A::I8),
        vec(any::<u16>(), n.clone()).prop_map(A::U16),
        vec(any::<i16>(), n.clone()).prop_map(A::I16),
        vec(any::<u32>(), n.clone()).prop_map(A::U32),
        vec(any::<i32>(), n.clone()).prop_map(A::I32),
        vec(f32_bits(), n.clone()).prop_map(A::F32),
        vec(any::<bool>(), n.clone()).prop_map(A::Bool),
        vec(".{0,8}", n.clone()).prop_map(A::String),
        vec(any::<u64>(), n.clone()).prop_map(A::U64),
        vec(any::<i64>(), n.clone()).prop_map(A::I64),
        vec(f64_bits(), n).prop_map(A::F64),
    ]
}

fn value() -> impl Strategy<Value = MetadataValue> {
    use MetadataValue as V;
    prop_oneof![
        any::<u8>().prop_map(V::U8),
        any::<i8>().prop_map(V::I8),
        any::<u16>().prop_map(V::U16),
        any::<i16>().prop_map(V::I16),
        any::<u32>().prop_map(V::U32),
        any::<i32>().prop_map(V::I32),
        f32_bits().prop_map(V::F32),
        any::<bool>().prop_map(V::Bool),
        ".{0,16}".prop_map(V::String),
        any::<u64>().prop_map(V::U64),
        any::<i64>().prop_map(V::I64),
        f64_bits().prop_map(V::F64),
        scalar_array().prop_map(V::Array),
        vec(scalar_array(), 0..4).prop_map(|a| V::Array(MetadataArray::Array(a))),
    ]
}

/// One tensor: a type, `ne` (row length a whole number of blocks), and bytes of the right size.
fn tensor(types: Vec<GgmlType>) -> impl Strategy<Value = (GgmlType, Vec<u64>, Vec<u8>)> {
    (proptest::sample::select(types), vec(1..4u64, 0..=4)).prop_flat_map(|(ty, mut ne)| {
        let block = ty.block_size() as u64;
        match ne.first_mut() {
            Some(first) => *first *= block,
            None if block != 1 => ne.push(block),
            None => {}
        }
        let rows: u64 = ne.iter().skip(1).product();
        let n = ty.row_bytes(ne.first().copied().unwrap_or(1)).unwrap() * rows;
        (Just(ty), Just(ne), vec(any::<u8>(), n as usize))
    })
}

#[derive(Debug, Clone)]
struct File {
    version: u32,
    byte_order: ByteOrder,
    alignment: Option<u32>,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<(GgmlType, Vec<u64>, Vec<u8>)>,
}

impl File {
    fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        w.version(self.version).byte_order(self.byte_order);
        if let Some(a) = self.alignment {
            w.alignment(a);
        }
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone());
        }
        for (i, (ty, ne, data)) in self.tensors.iter().enumerate() {
            w.add_tensor(format!("blk.{i}.weight"), *ty, ne, data)
                .unwrap();
        }
        w
    }
}

fn file() -> impl Strategy<Value = File> {
    (1..=3u32, any::<bool>()).prop_flat_map(|(version, big)| {
        let types: Vec<GgmlType> = GgmlType::all()
            .iter()
            .copied()
            .filter(|&t| !big || gguf::byte_order::swappable(t))
            .collect();
        let order = if big {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        };
        (
            Just(version),
            Just(order),
            proptest::option::of((0..=10u32).prop_map(|s| 1 << s)),
            proptest::collection::btree_map("[a-z][a-z0-9_.]{0,15}", value(), 0..8),
            vec(tensor(types), 0..5),
        )
            .prop_map(|(version, byte_order, alignment, metadata, tensors)| File {
                version,
                byte_order,
                alignment,
                metadata,
                tensors,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn write_read_write_is_identity(spec in file()) {
        let w = spec.writer();
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        prop_assert_eq!(f.version(), spec.version);
        prop_assert_eq!(f.byte_order(), spec.byte_order);
        prop_assert_eq!(f.alignment(), spec.alignment.unwrap_or(32) as u64);
        prop_assert_eq!(f.data_offset() % f.alignment(), 0);
        prop_assert_eq!(f.tensors().len(), spec.tensors.len());
        for (i, (t, (ty, ne, data))) in f.tensors().iter().zip(&spec.tensors).enumerate() {
            prop_assert_eq!(&t.name, &format!("blk.{i}.weight"));
            prop_assert_eq!(t.ggml_type, *ty);
            prop_assert_eq!(&t.ne, ne);
            prop_assert_eq!(t.offset % f.alignment(), 0);
            prop_assert_eq!(f.tensor_data(t), &data[..]);
        }
        // Values: every key present with its value (Debug text, so that NaN equals itself;
        // the byte comparison below checks the bits).
        let n_keys = spec.metadata.len() + usize::from(spec.alignment.is_some());
        prop_assert_eq!(f.metadata().len(), n_keys);
        for (k, v) in &spec.metadata {
            prop_assert_eq!(format!("{:?}", f.get(k)), format!("{:?}", Some(v)));
        }

        // Writing what was read gives the same bytes: nothing was lost or reordered.
        let mut again = GgufWriter::new();
        again.version(f.version()).byte_order(f.byte_order());
        for (k, v) in f.metadata() {
            again.add_metadata(k.clone(), v.clone());
        }
        for t in f.tensors() {
            again.add_tensor(t.name.clone(), t.ggml_type, &t.ne, f.tensor_data(t)).unwrap();
        }
        prop_assert_eq!(again.to_bytes().unwrap(), bytes);
    }
}

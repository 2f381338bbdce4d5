//! The GGUF reader on structure-aware input: a file described by `arbitrary` (any version, byte
//! order, alignment, metadata of every value type with nested arrays, tensors of every type) is
//! written by the writer; it must read back identically. Then byte patches and a truncation,
//! also chosen by the input, are applied where they matter (the header), and the reader must
//! answer `Ok` or a typed error without panicking.
#![no_main]

use arbitrary::Unstructured;
use gguf::{ByteOrder, GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue};
use libfuzzer_sys::fuzz_target;

#[path = "check.rs"]
mod check;

/// A metadata array of at most depth 2 (the reader's limit), short.
fn array(u: &mut Unstructured<'_>, depth: usize) -> arbitrary::Result<MetadataArray> {
    let n = u.int_in_range(0..=6)?;
    macro_rules! vec_of {
        ($variant:ident) => {
            MetadataArray::$variant((0..n).map(|_| u.arbitrary()).collect::<Result<_, _>>()?)
        };
    }
    Ok(match u.int_in_range(0..=12)? {
        0 => vec_of!(U8),
        1 => vec_of!(I8),
        2 => vec_of!(U16),
        3 => vec_of!(I16),
        4 => vec_of!(U32),
        5 => vec_of!(I32),
        6 => vec_of!(F32),
        7 => vec_of!(Bool),
        8 => vec_of!(String),
        9 => vec_of!(U64),
        10 => vec_of!(I64),
        11 => vec_of!(F64),
        _ if depth < gguf::MAX_ARRAY_DEPTH => MetadataArray::Array(
            (0..n)
                .map(|_| array(u, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        _ => vec_of!(U8),
    })
}

fn value(u: &mut Unstructured<'_>) -> arbitrary::Result<MetadataValue> {
    use MetadataValue as V;
    Ok(match u.int_in_range(0..=12)? {
        0 => V::U8(u.arbitrary()?),
        1 => V::I8(u.arbitrary()?),
        2 => V::U16(u.arbitrary()?),
        3 => V::I16(u.arbitrary()?),
        4 => V::U32(u.arbitrary()?),
        5 => V::I32(u.arbitrary()?),
        6 => V::F32(u.arbitrary()?),
        7 => V::Bool(u.arbitrary()?),
        8 => V::String(u.arbitrary()?),
        9 => V::U64(u.arbitrary()?),
        10 => V::I64(u.arbitrary()?),
        11 => V::F64(u.arbitrary()?),
        _ => V::Array(array(u, 1)?),
    })
}

/// One input: the file to write, then byte patches (offset, value) and a truncation.
struct Case {
    writer: GgufWriter,
    patches: Vec<(usize, u8)>,
    truncate: Option<usize>,
}

fn build(u: &mut Unstructured<'_>) -> arbitrary::Result<Case> {
    let mut w = GgufWriter::new();
    w.version(u.int_in_range(1..=3)?);
    let big = u.arbitrary::<bool>()?;
    if big {
        w.byte_order(ByteOrder::Big);
    }
    if u.arbitrary::<bool>()? {
        w.alignment(1 << u.int_in_range(0..=8)?);
    }
    for i in 0..u.int_in_range(0..=6)? {
        let key = if u.arbitrary()? {
            u.arbitrary::<String>()?
        } else {
            format!("k.{i}")
        };
        w.add_metadata(key, value(u)?);
    }
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|&t| !big || gguf::byte_order::swappable(t))
        .collect();
    for i in 0..u.int_in_range(0..=4)? {
        let ty = *u.choose(&types)?;
        let n_dims = u.int_in_range(0..=gguf::MAX_DIMS)?;
        let mut ne: Vec<u64> = (0..n_dims)
            .map(|_| u.int_in_range(1..=3u64))
            .collect::<Result<_, _>>()?;
        if let Some(first) = ne.first_mut() {
            *first *= ty.block_size() as u64;
        } else if ty.block_size() != 1 {
            ne.push(ty.block_size() as u64);
        }
        let rows: u64 = ne.iter().skip(1).product();
        let n = ty.row_bytes(ne.first().copied().unwrap_or(1)).unwrap_or(0) * rows;
        let data: Vec<u8> = (0..n).map(|_| u.arbitrary()).collect::<Result<_, _>>()?;
        let name = if u.arbitrary()? {
            u.arbitrary::<String>()?
        } else {
            format!("t.{i}")
        };
        // Bad shapes and names are the writer's to refuse; that is not a finding.
        let _ = w.add_tensor(name, ty, &ne, &data);
    }
    let patches: Vec<(usize, u8)> = (0..u.int_in_range(0..=4)?)
        .map(|_| Ok((u.int_in_range(0..=512usize)?, u.arbitrary()?)))
        .collect::<arbitrary::Result<_>>()?;
    let truncate = if u.arbitrary()? {
        Some(u.arbitrary::<usize>()?)
    } else {
        None
    };
    Ok(Case {
        writer: w,
        patches,
        truncate,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(Case {
        writer: w,
        patches,
        truncate,
    }) = build(&mut u)
    else {
        return;
    };
    // Duplicate keys or names, or an arbitrary key that is the alignment with a bad value: the
    // writer refuses, which is its job.
    let Ok(bytes) = w.to_bytes() else {
        return;
    };
    let f = GgufFile::from_bytes(bytes.clone()).expect("the reader accepts what the writer wrote");
    check::accepted(&f);
    // The same file, little-endian v3: every field reads back identically.
    let mut le = w.clone();
    le.version(3).byte_order(ByteOrder::Little);
    let g = GgufFile::from_bytes(le.to_bytes().expect("writes")).expect("reads");
    // Debug text, not `==`: a NaN value is equal to itself here (f32 Debug prints every NaN alike).
    assert_eq!(format!("{:?}", f.metadata()), format!("{:?}", g.metadata()));
    assert_eq!(f.tensors(), g.tensors());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t), g.tensor_data(t));
    }

    let mut bytes = bytes;
    for (at, b) in patches {
        if let Some(x) = bytes.get_mut(at) {
            *x = b;
        }
    }
    if let Some(n) = truncate {
        bytes.truncate(n % (bytes.len() + 1));
    }
    if let Ok(f) = GgufFile::from_bytes(bytes) {
        check::accepted(&f);
    }
});

//! Parsing a GGUF header: the bounds-checked cursor over the file's bytes, the metadata values
//! and arrays, the tensor table and the data section's placement, for [`crate::reader`].
//!
//! The file is untrusted input: every count, length, offset and size is checked with checked
//! arithmetic against the bytes that remain, before anything is allocated.

use std::collections::HashMap;

use crate::byte_order::ByteOrder;
use crate::error::GgufError;
use crate::metadata::{MetadataArray, MetadataValue, MetadataValueType};
use crate::reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_KV,
    MAX_STRING_LEN, MAX_TENSORS, MAX_VERSION, MIN_VERSION, TensorInfo,
};
use crate::types::GgmlType;

/// What [`parse`] found.
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) byte_order: ByteOrder,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, MetadataValue)>,
    pub(crate) key_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
}

/// A bounds-checked reader over the file bytes, in the file's byte order and count width.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    byte_order: ByteOrder,
    /// GGUF v1: counts, lengths and dimensions are `u32`, not `u64`.
    counts_u32: bool,
}

/// Decodes a fixed-size number in the file's byte order.
macro_rules! decode {
    ($t:ty, $bytes:expr, $order:expr) => {
        match $order {
            ByteOrder::Little => <$t>::from_le_bytes($bytes),
            ByteOrder::Big => <$t>::from_be_bytes($bytes),
        }
    };
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            what: what(),
            offset: self.pos as u64,
        };
        if n > self.remaining() {
            return Err(truncated());
        }
        // n <= remaining <= usize::MAX, so the cast is lossless.
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        let order = self.byte_order;
        self.array(what).map(|b| decode!(u32, b, order))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let order = self.byte_order;
        self.array(what).map(|b| decode!(u64, b, order))
    }

    /// Bytes of a count or length field: 4 in GGUF v1, else 8.
    fn count_width(&self) -> u64 {
        if self.counts_u32 { 4 } else { 8 }
    }

    /// A count, length or dimension: `u32` in GGUF v1, `u64` after.
    fn count(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        if self.counts_u32 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    /// Reads a GGUF string (u64 length + UTF-8 bytes). `what` names it in errors.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let start = self.pos as u64;
        let len = self.count(&|| format!("length of {}", what()))?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::Limit {
                what: format!("length of {} (at byte offset {start})", what()),
                value: len,
                limit: MAX_STRING_LEN,
            });
        }
        let bytes = self.take(len, &|| format!("{} ({len} bytes)", what()))?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidString {
                what: format!("{} ({e})", what()),
                offset: start,
            }),
        }
    }
}

/// Capacity to reserve for `count` elements of `T` without reserving more than the bytes left.
fn bounded_capacity<T>(count: u64, remaining: u64) -> usize {
    let max = remaining / std::mem::size_of::<T>().max(1) as u64;
    count.min(max) as usize
}

fn read_scalar(
    cur: &mut Cursor<'_>,
    ty: MetadataValueType,
    key: &str,
) -> Result<MetadataValue, GgufError> {
    use MetadataValueType as T;
    let what = || format!("value of metadata key '{key}'");
    let order = cur.byte_order;
    Ok(match ty {
        T::U8 => MetadataValue::U8(u8::from_le_bytes(cur.array(&what)?)),
        T::I8 => MetadataValue::I8(i8::from_le_bytes(cur.array(&what)?)),
        T::U16 => MetadataValue::U16(decode!(u16, cur.array(&what)?, order)),
        T::I16 => MetadataValue::I16(decode!(i16, cur.array(&what)?, order)),
        T::U32 => MetadataValue::U32(decode!(u32, cur.array(&what)?, order)),
        T::I32 => MetadataValue::I32(decode!(i32, cur.array(&what)?, order)),
        T::F32 => MetadataValue::F32(decode!(f32, cur.array(&what)?, order)),
        T::U64 => MetadataValue::U64(decode!(u64, cur.array(&what)?, order)),
        T::I64 => MetadataValue::I64(decode!(i64, cur.array(&what)?, order)),
        T::F64 => MetadataValue::F64(decode!(f64, cur.array(&what)?, order)),
        T::Bool => {
            let offset = cur.pos as u64;
            let [b] = cur.array(&what)?;
            MetadataValue::Bool(parse_bool(b, key, offset)?)
        }
        T::String => MetadataValue::String(cur.string(&what)?),
        T::Array => MetadataValue::Array(read_array(cur, key, 1)?),
    })
}

fn parse_bool(b: u8, key: &str, offset: u64) -> Result<bool, GgufError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::Metadata {
            key: key.to_string(),
            reason: format!("BOOL at byte offset {offset} has value {b}, expected 0 or 1"),
        }),
    }
}

fn value_type(id: u32, key: &str, role: &str) -> Result<MetadataValueType, GgufError> {
    MetadataValueType::from_id(id).ok_or_else(|| GgufError::Metadata {
        key: key.to_string(),
        reason: format!("{role} type id {id} is not a GGUF value type (0..=12)"),
    })
}

/// Reads the body of an array (element type, count, elements). `depth` is 1 for a top-level array.
fn read_array(cur: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetadataArray, GgufError> {
    use MetadataValueType as T;
    let what = || format!("array header of metadata key '{key}'");
    let ty = value_type(cur.u32(&what)?, key, "array element")?;
    let count = cur.count(&what)?;
    if ty == T::Array && depth + 1 > MAX_ARRAY_DEPTH {
        return Err(GgufError::Metadata {
            key: key.to_string(),
            reason: format!("arrays are nested more than {MAX_ARRAY_DEPTH} levels deep"),
        });
    }
    // Smallest encoding of one element: fixed size, or a string's length field, or a nested
    // array's type + count. The count must fit in the bytes left before anything is allocated.
    let min_size = ty.fixed_size().map_or(
        match ty {
            T::String => cur.count_width(),
            _ => 4 + cur.count_width(),
        },
        |n| n as u64,
    );
    let needed = count.checked_mul(min_size);
    if needed.is_none_or(|n| n > cur.remaining()) {
        return Err(GgufError::Truncated {
            what: format!(
                "ARRAY[{}] of {count} elements for metadata key '{key}'",
                ty.name()
            ),
            offset: cur.pos as u64,
        });
    }
    let elem_what = || format!("array element of metadata key '{key}'");
    // For fixed-size types the whole payload is present (checked above): take it at once.
    let order = cur.byte_order;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            let bytes = cur.take(count * min_size, &elem_what)?;
            MetadataArray::$variant(
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| decode!($t, c.try_into().unwrap_or_default(), order))
                    .collect(),
            )
        }};
    }
    Ok(match ty {
        T::U8 => MetadataArray::U8(cur.take(count, &elem_what)?.to_vec()),
        T::I8 => fixed!(I8, i8),
        T::U16 => fixed!(U16, u16),
        T::I16 => fixed!(I16, i16),
        T::U32 => fixed!(U32, u32),
        T::I32 => fixed!(I32, i32),
        T::F32 => fixed!(F32, f32),
        T::U64 => fixed!(U64, u64),
        T::I64 => fixed!(I64, i64),
        T::F64 => fixed!(F64, f64),
        T::Bool => {
            let offset = cur.pos as u64;
            let bytes = cur.take(count, &elem_what)?;
            let mut v = Vec::with_capacity(bytes.len());
            for (i, &b) in bytes.iter().enumerate() {
                v.push(parse_bool(b, key, offset + i as u64)?);
            }
            MetadataArray::Bool(v)
        }
        T::String => {
            let mut v = Vec::with_capacity(bounded_capacity::<String>(count, cur.remaining()));
            for _ in 0..count {
                v.push(cur.string(&elem_what)?);
            }
            MetadataArray::String(v)
        }
        T::Array => {
            let mut v =
                Vec::with_capacity(bounded_capacity::<MetadataArray>(count, cur.remaining()));
            for _ in 0..count {
                v.push(read_array(cur, key, depth + 1)?);
            }
            MetadataArray::Array(v)
        }
    })
}

/// Checks the magic and version, and sets the cursor's byte order and count width from the
/// version field. Returns the version.
fn parse_preamble(cur: &mut Cursor<'_>) -> Result<u32, GgufError> {
    if cur.buf.len() < 4 {
        if !GGUF_MAGIC.starts_with(cur.buf) {
            return Err(GgufError::BadMagic {
                found: cur.buf.to_vec(),
            });
        }
        return Err(GgufError::Truncated {
            what: "magic".into(),
            offset: 0,
        });
    }
    let magic: [u8; 4] = cur.array(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let raw: [u8; 4] = cur.array(&|| "version".into())?;
    let (le, be) = (u32::from_le_bytes(raw), u32::from_be_bytes(raw));
    let supported = MIN_VERSION..=MAX_VERSION;
    // Versions are small numbers, so the order that reads one is the file's byte order (a
    // version >= 2^24 read little-endian would be ambiguous; none exists).
    let version = if supported.contains(&le) {
        cur.byte_order = ByteOrder::Little;
        le
    } else if supported.contains(&be) {
        cur.byte_order = ByteOrder::Big;
        be
    } else {
        return Err(GgufError::UnsupportedVersion {
            version: le,
            reason: format!(
                "supported versions are {MIN_VERSION} to {MAX_VERSION}, little- or big-endian"
            ),
        });
    };
    cur.counts_u32 = version == 1;
    Ok(version)
}

/// Parses and checks a whole header: every count, length, offset and shape against the bytes
/// that remain (see the [`crate::reader`] module docs for the layout).
pub(crate) fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        byte_order: ByteOrder::Little,
        counts_u32: false,
    };
    let version = parse_preamble(&mut cur)?;
    let n_tensors = cur.count(&|| "tensor count".into())?;
    let n_kv = cur.count(&|| "metadata key/value count".into())?;
    if n_tensors > MAX_TENSORS {
        return Err(GgufError::Limit {
            what: "tensor count".into(),
            value: n_tensors,
            limit: MAX_TENSORS,
        });
    }
    if n_kv > MAX_KV {
        return Err(GgufError::Limit {
            what: "metadata key/value count".into(),
            value: n_kv,
            limit: MAX_KV,
        });
    }
    // Each key/value takes at least a key length + 4 (type) + 1 (value) bytes, and each tensor
    // info a name length + 4 (n_dims) + 4 (type) + 8 (offset) bytes. Both counts are bounded
    // above, so this cannot overflow.
    let w = cur.count_width();
    let min_header = n_kv * (w + 5) + n_tensors * (w + 16);
    if min_header > cur.remaining() {
        return Err(GgufError::Truncated {
            what: format!("{n_kv} metadata entries and {n_tensors} tensor infos"),
            offset: cur.pos as u64,
        });
    }

    // Metadata.
    let mut metadata = Vec::with_capacity(bounded_capacity::<(String, MetadataValue)>(
        n_kv,
        cur.remaining(),
    ));
    let mut key_index = HashMap::new();
    for i in 0..n_kv {
        let key = cur.string(&|| format!("key of metadata entry {i}"))?;
        let ty_id = cur.u32(&|| format!("value type of metadata key '{key}'"))?;
        let ty = value_type(ty_id, &key, "value")?;
        let value = read_scalar(&mut cur, ty, &key)?;
        if key_index.contains_key(&key) {
            return Err(GgufError::Metadata {
                key,
                reason: "duplicate key".into(),
            });
        }
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    // Alignment.
    let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => *a,
        Some(MetadataValue::U32(a)) => {
            return Err(GgufError::Metadata {
                key: ALIGNMENT_KEY.into(),
                reason: format!("alignment {a} is not a power of two"),
            });
        }
        Some(v) => {
            return Err(GgufError::Metadata {
                key: ALIGNMENT_KEY.into(),
                reason: format!("must be UINT32, found {}", v.value_type_name()),
            });
        }
    } as u64;

    // Tensor infos.
    let mut tensors: Vec<TensorInfo> =
        Vec::with_capacity(bounded_capacity::<TensorInfo>(n_tensors, cur.remaining()));
    let mut tensor_index = HashMap::new();
    for i in 0..n_tensors {
        let name = cur.string(&|| format!("name of tensor info {i}"))?;
        let tensor_err = |reason: String| GgufError::Tensor {
            name: name.clone(),
            reason,
        };
        let n_dims = cur.u32(&|| format!("n_dims of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(tensor_err(format!(
                "n_dims is {n_dims}, the maximum is {MAX_DIMS}"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for j in 0..n_dims {
            let d = cur.count(&|| format!("ne[{j}] of tensor '{name}'"))?;
            if d == 0 {
                return Err(tensor_err(format!("dimension ne[{j}] is 0")));
            }
            ne.push(d);
        }
        let type_id = cur.u32(&|| format!("type of tensor '{name}'"))?;
        let offset = cur.u64(&|| format!("data offset of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(type_id).map_err(|e| tensor_err(e.to_string()))?;

        let mut n_elements: u64 = 1;
        for &d in &ne {
            n_elements = n_elements
                .checked_mul(d)
                .filter(|&n| usize::try_from(n).is_ok() && i64::try_from(n).is_ok())
                .ok_or_else(|| tensor_err(format!("element count of shape {ne:?} overflows")))?;
        }
        let row_len = ne.first().copied().unwrap_or(1);
        if row_len % ggml_type.block_size() as u64 != 0 {
            return Err(tensor_err(format!(
                "row length ne[0] = {row_len} is not a multiple of the {ggml_type} block size {}",
                ggml_type.block_size()
            )));
        }
        let n_bytes = ggml_type
            .row_bytes(row_len)
            .ok()
            .and_then(|rb| rb.checked_mul(n_elements / row_len))
            .ok_or_else(|| tensor_err(format!("byte size of shape {ne:?} overflows")))?;
        if offset % alignment != 0 {
            return Err(tensor_err(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.contains_key(&name) {
            return Err(tensor_err("duplicate tensor name".into()));
        }
        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            ggml_type,
            ne,
            offset,
            n_bytes,
        });
    }

    // Data section.
    let header_end = cur.pos as u64;
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Overflow {
            what: "data section offset".into(),
        })?;
    let file_size = buf.len() as u64;
    for t in &tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_size => {}
            (Some(start), Some(end)) => {
                return Err(GgufError::Tensor {
                    name: t.name.clone(),
                    reason: format!(
                        "data [{start}..{end}) (offset {} in the data section, {} bytes) lies past the end of the file ({file_size} bytes); the file is truncated or corrupt",
                        t.offset, t.n_bytes
                    ),
                });
            }
            _ => {
                return Err(GgufError::Tensor {
                    name: t.name.clone(),
                    reason: format!(
                        "data offset {} + size {} overflows a 64-bit file offset",
                        t.offset, t.n_bytes
                    ),
                });
            }
        }
    }

    // Tensor data must not overlap: a file whose tensors alias each other's bytes is corrupt or
    // crafted (ggml requires them laid out one after another).
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // a.offset + a.n_bytes fits in u64: checked against the file size above.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Tensor {
                name: b.name.clone(),
                reason: format!(
                    "data at offset {} overlaps tensor '{}' (offset {}, {} bytes) in the data section",
                    b.offset, a.name, a.offset, a.n_bytes
                ),
            });
        }
    }

    Ok(Header {
        version,
        byte_order: cur.byte_order,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

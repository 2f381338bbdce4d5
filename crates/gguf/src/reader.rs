//! The GGUF reader: parses and checks the header, then hands out zero-copy tensor data.
//!
//! Format source: the GGUF spec, `docs/gguf.md` in ggml-org/ggml. Layout of a v2/v3 file: magic
//! `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata key/values, the tensor
//! infos (name, u32 n_dims, n_dims x u64 `ne`, u32 ggml type, u64 offset relative to the data
//! section), padding to the alignment, then the data section. GGUF v1 (llama.cpp before
//! 2023-10) is the same with 32-bit counts: tensor and metadata counts, string and array lengths
//! and `ne`. Numbers are little-endian, or all big-endian in a big-endian file (see
//! [`crate::byte_order`]), which is detected from the version field.
//!
//! The file is untrusted input: every count, length, offset and size is checked with checked
//! arithmetic against the bytes that remain, before anything is allocated.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

#[cfg(not(target_family = "wasm"))]
use memmap2::Mmap;

use crate::byte_order::{ByteOrder, swap_tensor_data};
use crate::error::GgufError;
use crate::metadata::{MetadataArray, MetadataValue, MetadataValueType, key_type_error};
use crate::types::GgmlType;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// The metadata key that overrides the alignment (must be a `UINT32` power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Longest string (key or value) accepted, in bytes.
pub const MAX_STRING_LEN: u64 = 1 << 30;
/// Most tensors accepted in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata key/values accepted in one file.
pub const MAX_KV: u64 = 1 << 20;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted: an array of arrays of scalars is depth 2.
pub const MAX_ARRAY_DEPTH: usize = 2;
/// Oldest GGUF version read (v1: 32-bit counts and lengths).
pub const MIN_VERSION: u32 = 1;
/// Newest GGUF version read.
pub const MAX_VERSION: u32 = 3;

/// One tensor of the file's tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order: `ne[0]` is the row length (fastest varying). 0 to 4 entries, each >= 1.
    pub ne: Vec<u64>,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data: `row_bytes(ne[0]) * ne[1] * ne[2] * ne[3]`.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The shape in Burn (row-major) order: `ne` reversed. ggml `ne = [640, 1024]` gives `[1024, 640]`.
    ///
    /// Dimensions are converted with `as usize`; the reader checked that the element count fits in `usize`.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements (1 for a tensor with no dimensions).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Row length: `ne[0]` (1 for a tensor with no dimensions).
    pub fn row_len(&self) -> u64 {
        self.ne.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `ne[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.ne
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// The bytes behind a [`GgufFile`].
enum Storage {
    /// A read-only memory map (not on wasm, which has no files to map).
    #[cfg(not(target_family = "wasm"))]
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_family = "wasm"))]
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            #[cfg(not(target_family = "wasm"))]
            Storage::Mmap(m) => m.to_vec(),
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed, checked GGUF file that owns its bytes (a read-only memory map or a buffer).
///
/// All header checks happen in [`GgufFile::open`] / [`GgufFile::from_bytes`]: afterwards every
/// tensor's data range is known to lie inside the file, so [`GgufFile::tensor_data`] is a plain slice.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    byte_order: ByteOrder,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetadataValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("byte_order", &self.byte_order)
            .field("file_size", &self.file_size())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps a GGUF file read-only, then parses and checks its header.
    ///
    /// The file must not be modified or truncated by another process while the `GgufFile` lives
    /// (the usual memory-map caveat). On wasm, where there is nothing to map, the file is read
    /// (a browser has no file system: there, pass the bytes to [`GgufFile::from_bytes`]).
    ///
    /// # Errors
    /// [`GgufError::Io`] when the file cannot be opened or mapped, and any parse error of
    /// [`GgufFile::from_bytes`].
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        #[cfg(target_family = "wasm")]
        {
            let bytes = std::fs::read(path).map_err(io_err)?;
            Self::from_bytes(bytes)
        }
        #[cfg(not(target_family = "wasm"))]
        {
            Self::open_mapped(path, io_err)
        }
    }

    #[cfg(not(target_family = "wasm"))]
    fn open_mapped(
        path: &Path,
        io_err: impl Fn(std::io::Error) -> GgufError,
    ) -> Result<GgufFile, GgufError> {
        let file = std::fs::File::open(path).map_err(&io_err)?;
        let len = file.metadata().map_err(&io_err)?.len();
        if len == 0 {
            return Err(GgufError::Truncated {
                what: "magic".into(),
                offset: 0,
            });
        }
        // SAFETY: the map is read-only and the file is not written through it. As with every
        // memory map, the caller must not let another process truncate or rewrite the file while
        // it is mapped (documented on this function).
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::from_storage(Storage::Mmap(map))
    }

    /// Parses and checks a GGUF file held in memory.
    ///
    /// A big-endian file's tensor data is byte-swapped to little-endian in place (see
    /// [`crate::byte_order`]), so [`tensor_data`](Self::tensor_data) always returns
    /// little-endian data; [`open`](Self::open) copies such a file into memory to do so.
    ///
    /// # Errors
    /// A typed [`GgufError`] naming the key, tensor or offset for any malformed, truncated or
    /// unsupported input. Never panics.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let header = parse(storage.bytes())?;
        let storage = match header.byte_order {
            ByteOrder::Little => storage,
            ByteOrder::Big => {
                let mut bytes = storage.into_vec();
                for t in &header.tensors {
                    // In bounds: parse checked every tensor's range against the file size.
                    let start = (header.data_offset + t.offset) as usize;
                    let data = &mut bytes[start..start + t.n_bytes as usize];
                    swap_tensor_data(t.ggml_type, data).map_err(|reason| GgufError::Tensor {
                        name: t.name.clone(),
                        reason: format!("big-endian file: {reason}"),
                    })?;
                }
                Storage::Owned(bytes)
            }
        };
        Ok(GgufFile {
            storage,
            version: header.version,
            byte_order: header.byte_order,
            alignment: header.alignment,
            data_offset: header.data_offset,
            metadata: header.metadata,
            key_index: header.key_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
        })
    }

    /// GGUF version (1, 2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Byte order of the file's numbers. Tensor data from [`tensor_data`](Self::tensor_data) is
    /// little-endian either way; [`as_bytes`](Self::as_bytes) of a big-endian file has a
    /// big-endian header and little-endian tensor data.
    pub fn byte_order(&self) -> ByteOrder {
        self.byte_order
    }

    /// Alignment of the data section and of every tensor's data, in bytes (a power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file (the header end rounded up to the alignment).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// All metadata key/values, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The value of a metadata key, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn value(&self, key: &str) -> Result<&MetadataValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// A `u32` value: any integer type (`UINT8` .. `INT64`) whose value fits in `u32`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type or an out-of-range value.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.value(key)?;
        v.to_u32()
            .ok_or_else(|| key_type_error(key, "an integer that fits in UINT32", v))
    }

    /// A `u64` value: any integer type whose value is non-negative.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type or a negative value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.value(key)?;
        v.to_u64()
            .ok_or_else(|| key_type_error(key, "a non-negative integer", v))
    }

    /// An `i64` value: any integer type whose value fits in `i64`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type or an out-of-range value.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.value(key)?;
        v.to_i64()
            .ok_or_else(|| key_type_error(key, "an integer that fits in INT64", v))
    }

    /// An `f32` value: `FLOAT32`, or `FLOAT64` rounded to `f32`.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.value(key)?;
        v.to_f32()
            .ok_or_else(|| key_type_error(key, "FLOAT32 or FLOAT64", v))
    }

    /// A `BOOL` value.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.value(key)?;
        v.as_bool().ok_or_else(|| key_type_error(key, "BOOL", v))
    }

    /// A `STRING` value.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for another type.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.value(key)?;
        v.as_str().ok_or_else(|| key_type_error(key, "STRING", v))
    }

    /// An `ARRAY` value of any element type.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for a non-array.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray, GgufError> {
        let v = self.value(key)?;
        v.as_array().ok_or_else(|| key_type_error(key, "ARRAY", v))
    }

    /// An `ARRAY[STRING]` value.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for any other type.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        let v = self.value(key)?;
        match v {
            MetadataValue::Array(MetadataArray::String(a)) => Ok(a),
            _ => Err(key_type_error(key, "ARRAY[STRING]", v)),
        }
    }

    /// An `ARRAY[FLOAT32]` value. No other element type is accepted (case C06: a `UINT8` array
    /// must not be reinterpreted as floats).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for any other type.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        let v = self.value(key)?;
        match v {
            MetadataValue::Array(MetadataArray::F32(a)) => Ok(a),
            _ => Err(key_type_error(key, "ARRAY[FLOAT32]", v)),
        }
    }

    /// An `ARRAY[INT32]` value. No other element type is accepted.
    ///
    /// # Errors
    /// [`GgufError::MissingKey`], or [`GgufError::KeyType`] for any other type.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        let v = self.value(key)?;
        match v {
            MetadataValue::Array(MetadataArray::I32(a)) => Ok(a),
            _ => Err(key_type_error(key, "ARRAY[INT32]", v)),
        }
    }

    /// Like [`get_u32`](Self::get_u32), but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`GgufError::KeyType`] when the key is present with another type or an out-of-range value.
    pub fn get_opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.opt(key, Self::get_u32)
    }

    /// Like [`get_u64`](Self::get_u64), but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`GgufError::KeyType`] when the key is present with another type or a negative value.
    pub fn get_opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.opt(key, Self::get_u64)
    }

    /// Like [`get_f32`](Self::get_f32), but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`GgufError::KeyType`] when the key is present with another type.
    pub fn get_opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.opt(key, Self::get_f32)
    }

    /// Like [`get_bool`](Self::get_bool), but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`GgufError::KeyType`] when the key is present with another type.
    pub fn get_opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.opt(key, Self::get_bool)
    }

    /// Like [`get_str`](Self::get_str), but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`GgufError::KeyType`] when the key is present with another type.
    pub fn get_opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.get_str(key).map(Some)
    }

    fn opt<T>(
        &self,
        key: &str,
        get: impl Fn(&Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        get(self, key).map(Some)
    }

    /// `general.architecture` (e.g. `"gemma3"`, `"qwen3"`).
    ///
    /// # Errors
    /// [`GgufError::MissingKey`] or [`GgufError::KeyType`].
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of a tensor, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute byte offset of a tensor's data in the file (`data_offset() + info.offset`, saturating).
    pub fn tensor_file_offset(&self, info: &TensorInfo) -> u64 {
        self.data_offset.saturating_add(info.offset)
    }

    /// The raw bytes of a tensor (`info.n_bytes` long), borrowed from the file without copying.
    ///
    /// The reader checked every tensor of this file, so this never fails for an info taken from
    /// [`tensors`](Self::tensors) or [`tensor`](Self::tensor). For an info that does not fit this
    /// file it returns an empty slice rather than panicking.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let range = self
            .tensor_file_offset(info)
            .checked_add(info.n_bytes)
            .and_then(|end| {
                let start = usize::try_from(self.tensor_file_offset(info)).ok()?;
                let end = usize::try_from(end).ok()?;
                Some(start..end)
            });
        range
            .and_then(|r| self.storage.bytes().get(r))
            .unwrap_or(&[])
    }

    /// The raw bytes of the tensor called `name`.
    ///
    /// # Errors
    /// [`GgufError::MissingTensor`] naming the tensor when it is absent.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            name: name.to_string(),
        })?;
        Ok(self.tensor_data(info))
    }
}

/// What [`parse`] found.
struct Header {
    version: u32,
    byte_order: ByteOrder,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetadataValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
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

fn parse(buf: &[u8]) -> Result<Header, GgufError> {
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

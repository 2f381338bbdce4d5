//! The GGUF reader: opens a file or a buffer, checks its header, hands out zero-copy tensor data.
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
use crate::header::parse;
use crate::metadata::{MetadataArray, MetadataValue, key_type_error};
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

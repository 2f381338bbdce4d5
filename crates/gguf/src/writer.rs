//! An in-memory GGUF writer (v3 by default; v1 and v2, little- or big-endian on request).
//!
//! Layout follows the GGUF spec (`docs/gguf.md` in ggml-org/ggml) and gguf-py's `GGUFWriter`:
//! header, metadata, tensor infos, zero padding to the alignment, then each tensor's data, each
//! padded with zeros to the alignment. Tensor data is given little-endian (as every ggml type's
//! bytes are defined) and swapped field by field for a big-endian file ([`crate::byte_order`]).

use std::collections::HashSet;
use std::path::Path;

use crate::byte_order::{ByteOrder, swap_tensor_data};
use crate::error::GgufError;
use crate::metadata::{MetadataArray, MetadataValue};
use crate::reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_VERSION,
    MIN_VERSION,
};
use crate::types::GgmlType;

/// A tensor queued in a [`GgufWriter`].
#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory: GGUF v3, little-endian, alignment 32 unless set otherwise.
///
/// ```
/// use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", MetadataValue::String("test".into()));
/// w.add_tensor("a", GgmlType::F32, &[2, 1], &[0u8; 8]).unwrap();
/// let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
/// assert_eq!(file.tensor("a").unwrap().shape(), vec![1, 2]);
/// ```
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    byte_order: ByteOrder,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self {
            version: MAX_VERSION,
            byte_order: ByteOrder::Little,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    /// An empty writer (GGUF v3, little-endian, alignment 32, no metadata, no tensors).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the GGUF version written: 1 (32-bit counts, lengths and dimensions), 2 or 3 (the
    /// default). [`to_bytes`](Self::to_bytes) checks it, and that v1's counts fit in 32 bits.
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the byte order written (little-endian by default). A big-endian file can hold only
    /// the types [`crate::byte_order::swappable`] accepts; [`to_bytes`](Self::to_bytes) checks it.
    pub fn byte_order(&mut self, byte_order: ByteOrder) -> &mut Self {
        self.byte_order = byte_order;
        self
    }

    /// Sets the data alignment in bytes by writing `general.alignment` as `UINT32` (replacing any
    /// earlier value). It must be a power of two; [`to_bytes`](Self::to_bytes) checks it.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        self.metadata
            .push((ALIGNMENT_KEY.to_string(), MetadataValue::U32(alignment)));
        self
    }

    /// Appends a metadata key/value. Keys must be unique ([`to_bytes`](Self::to_bytes) checks it).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: MetadataValue) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Appends a tensor. `ne` is in ggml order (`ne[0]` = row length, at most 4 dims, each >= 1) and
    /// `data` holds its raw bytes, exactly `row_bytes(ne[0]) * ne[1] * ...` long.
    ///
    /// # Errors
    /// [`GgufError::Tensor`] naming the tensor for a bad shape, a row length that is not a whole
    /// number of blocks, or a data length that does not match.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        ne: &[u64],
        data: &[u8],
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        let err = |reason: String| GgufError::Tensor {
            name: name.clone(),
            reason,
        };
        if ne.len() > MAX_DIMS {
            return Err(err(format!(
                "{} dimensions, the maximum is {MAX_DIMS}",
                ne.len()
            )));
        }
        if let Some(j) = ne.iter().position(|&d| d == 0) {
            return Err(err(format!("dimension ne[{j}] is 0")));
        }
        let row_len = ne.first().copied().unwrap_or(1);
        let rows = ne
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let row_bytes = ggml_type
            .row_bytes(row_len)
            .map_err(|e| err(e.to_string()))?;
        let expected = rows
            .and_then(|r| row_bytes.checked_mul(r))
            .ok_or_else(|| err(format!("byte size of shape {ne:?} overflows")))?;
        if data.len() as u64 != expected {
            return Err(err(format!(
                "data is {} bytes, expected {expected} for {ggml_type} with ne {ne:?}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            ty: ggml_type,
            ne: ne.to_vec(),
            data: data.to_vec(),
        });
        Ok(self)
    }

    /// The alignment in effect: `general.alignment` if set, else 32.
    fn effective_alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT as u64),
            Some((_, MetadataValue::U32(a))) if a.is_power_of_two() => Ok(*a as u64),
            Some((_, v)) => Err(GgufError::Writer(format!(
                "{ALIGNMENT_KEY} must be a UINT32 power of two, got {} {v:?}",
                v.value_type_name()
            ))),
        }
    }

    /// Serializes the file in the chosen version and byte order.
    ///
    /// # Errors
    /// [`GgufError::Writer`] for duplicate keys or tensor names, a bad `general.alignment`, arrays
    /// nested deeper than the reader accepts, an unsupported version, a count or length over
    /// 32 bits in a v1 file, or a tensor type with no big-endian form in a big-endian file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        if !(MIN_VERSION..=MAX_VERSION).contains(&self.version) {
            return Err(GgufError::Writer(format!(
                "GGUF version {} (supported: {MIN_VERSION} to {MAX_VERSION})",
                self.version
            )));
        }
        let alignment = self.effective_alignment()?;
        let mut keys = HashSet::new();
        for (k, v) in &self.metadata {
            if !keys.insert(k.as_str()) {
                return Err(GgufError::Writer(format!("duplicate metadata key '{k}'")));
            }
            if let MetadataValue::Array(a) = v
                && a.depth() > MAX_ARRAY_DEPTH
            {
                return Err(GgufError::Writer(format!(
                    "metadata key '{k}': arrays nested more than {MAX_ARRAY_DEPTH} levels deep"
                )));
            }
        }
        let mut names = HashSet::new();
        for t in &self.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::Writer(format!(
                    "duplicate tensor name '{}'",
                    t.name
                )));
            }
        }

        let mut out = Encoder {
            out: Vec::new(),
            byte_order: self.byte_order,
            counts_u32: self.version == 1,
        };
        out.out.extend_from_slice(&GGUF_MAGIC);
        out.u32(self.version);
        out.count(self.tensors.len() as u64, "tensor count")?;
        out.count(self.metadata.len() as u64, "metadata count")?;
        for (k, v) in &self.metadata {
            out.string(k)?;
            out.u32(v.value_type().id());
            out.value(v)?;
        }
        let padded = |n: u64| n.div_ceil(alignment) * alignment;
        let mut offset = 0u64;
        for t in &self.tensors {
            out.string(&t.name)?;
            out.u32(t.ne.len() as u32);
            for &d in &t.ne {
                out.count(d, &t.name)?;
            }
            out.u32(t.ty.id());
            out.u64(offset);
            offset += padded(t.data.len() as u64);
        }
        let mut out = out.out;
        out.resize(padded(out.len() as u64) as usize, 0);
        for t in &self.tensors {
            let start = out.len();
            out.extend_from_slice(&t.data);
            if self.byte_order == ByteOrder::Big {
                swap_tensor_data(t.ty, &mut out[start..]).map_err(|e| {
                    GgufError::Writer(format!("tensor '{}' in a big-endian file: {e}", t.name))
                })?;
            }
            out.resize(padded(out.len() as u64) as usize, 0);
        }
        Ok(out)
    }

    /// Serializes the file and writes it to `path`.
    ///
    /// # Errors
    /// Those of [`to_bytes`](Self::to_bytes), and [`GgufError::Io`] when writing fails.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let bytes = self.to_bytes()?;
        std::fs::write(path.as_ref(), bytes).map_err(|source| GgufError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        })
    }
}

/// Writes numbers in the file's byte order and count width.
struct Encoder {
    out: Vec<u8>,
    byte_order: ByteOrder,
    /// GGUF v1: counts, lengths and dimensions are `u32`.
    counts_u32: bool,
}

/// Appends the bytes of a fixed-size number in the encoder's byte order.
macro_rules! encode {
    ($enc:expr, $x:expr) => {{
        let x = $x;
        match $enc.byte_order {
            ByteOrder::Little => $enc.out.extend_from_slice(&x.to_le_bytes()),
            ByteOrder::Big => $enc.out.extend_from_slice(&x.to_be_bytes()),
        }
    }};
}

impl Encoder {
    fn u32(&mut self, x: u32) {
        encode!(self, x);
    }

    fn u64(&mut self, x: u64) {
        encode!(self, x);
    }

    /// A count, length or dimension: `u32` in v1 (an error if it does not fit), else `u64`.
    fn count(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        if self.counts_u32 {
            let n = u32::try_from(n).map_err(|_| {
                GgufError::Writer(format!("{what}: {n} does not fit the 32 bits of GGUF v1"))
            })?;
            self.u32(n);
        } else {
            self.u64(n);
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<(), GgufError> {
        self.count(s.len() as u64, "string length")?;
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    /// Writes a value body (without its type id).
    fn value(&mut self, v: &MetadataValue) -> Result<(), GgufError> {
        match v {
            MetadataValue::U8(x) => self.out.push(*x),
            MetadataValue::I8(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            MetadataValue::U16(x) => encode!(self, x),
            MetadataValue::I16(x) => encode!(self, x),
            MetadataValue::U32(x) => encode!(self, x),
            MetadataValue::I32(x) => encode!(self, x),
            MetadataValue::F32(x) => encode!(self, x),
            MetadataValue::Bool(x) => self.out.push(u8::from(*x)),
            MetadataValue::String(s) => self.string(s)?,
            MetadataValue::Array(a) => self.array(a)?,
            MetadataValue::U64(x) => encode!(self, x),
            MetadataValue::I64(x) => encode!(self, x),
            MetadataValue::F64(x) => encode!(self, x),
        }
        Ok(())
    }

    /// Writes an array body: element type, count, elements.
    fn array(&mut self, a: &MetadataArray) -> Result<(), GgufError> {
        self.u32(a.element_type().id());
        self.count(a.len() as u64, "array length")?;
        macro_rules! each {
            ($v:expr) => {
                for x in $v {
                    encode!(self, x);
                }
            };
        }
        match a {
            MetadataArray::U8(v) => self.out.extend_from_slice(v),
            MetadataArray::I8(v) => self.out.extend(v.iter().map(|&x| x as u8)),
            MetadataArray::U16(v) => each!(v),
            MetadataArray::I16(v) => each!(v),
            MetadataArray::U32(v) => each!(v),
            MetadataArray::I32(v) => each!(v),
            MetadataArray::F32(v) => each!(v),
            MetadataArray::Bool(v) => self.out.extend(v.iter().map(|&b| u8::from(b))),
            MetadataArray::String(v) => {
                for s in v {
                    self.string(s)?;
                }
            }
            MetadataArray::U64(v) => each!(v),
            MetadataArray::I64(v) => each!(v),
            MetadataArray::F64(v) => each!(v),
            MetadataArray::Array(v) => {
                for inner in v {
                    self.array(inner)?;
                }
            }
        }
        Ok(())
    }
}

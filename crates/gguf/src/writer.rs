//! A small in-memory GGUF v3 writer, used to build test files and simple conversions.
//!
//! Layout follows the GGUF spec (`docs/gguf.md` in ggml-org/ggml) and gguf-py's `GGUFWriter`:
//! header, metadata, tensor infos, zero padding to the alignment, then each tensor's data, each
//! padded with zeros to the alignment.

use std::collections::HashSet;
use std::path::Path;

use crate::error::GgufError;
use crate::metadata::{MetadataArray, MetadataValue};
use crate::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::types::GgmlType;

/// A tensor queued in a [`GgufWriter`].
#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory.
///
/// ```
/// use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", MetadataValue::String("test".into()));
/// w.add_tensor("a", GgmlType::F32, &[2, 1], &[0u8; 8]).unwrap();
/// let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
/// assert_eq!(file.tensor("a").unwrap().shape(), vec![1, 2]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty writer (alignment 32, no metadata, no tensors).
    pub fn new() -> Self {
        Self::default()
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

    /// Serializes the file (GGUF v3, little-endian).
    ///
    /// # Errors
    /// [`GgufError::Writer`] for duplicate keys or tensor names, a bad `general.alignment`, or
    /// arrays nested deeper than the reader accepts.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
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

        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            write_value(&mut out, v);
        }
        let padded = |n: u64| n.div_ceil(alignment) * alignment;
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += padded(t.data.len() as u64);
        }
        out.resize(padded(out.len() as u64) as usize, 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
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

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes a value body (without its type id).
fn write_value(out: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(u8::from(*x)),
        MetadataValue::String(s) => write_string(out, s),
        MetadataValue::Array(a) => write_array(out, a),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Writes an array body: element type, count, elements.
fn write_array(out: &mut Vec<u8>, a: &MetadataArray) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetadataArray::U8(v) => out.extend_from_slice(v),
        MetadataArray::I8(v) => le!(v),
        MetadataArray::U16(v) => le!(v),
        MetadataArray::I16(v) => le!(v),
        MetadataArray::U32(v) => le!(v),
        MetadataArray::I32(v) => le!(v),
        MetadataArray::F32(v) => le!(v),
        MetadataArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetadataArray::String(v) => v.iter().for_each(|s| write_string(out, s)),
        MetadataArray::U64(v) => le!(v),
        MetadataArray::I64(v) => le!(v),
        MetadataArray::F64(v) => le!(v),
        MetadataArray::Array(v) => v.iter().for_each(|inner| write_array(out, inner)),
    }
}

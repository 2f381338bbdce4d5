//! GGUF metadata values.
//!
//! Source: the GGUF spec, `docs/gguf.md` in ggml-org/ggml (`gguf_metadata_value_type`).

use crate::error::GgufError;

/// The value type ids of the GGUF spec (`gguf_metadata_value_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetadataValueType {
    /// `UINT8`
    U8 = 0,
    /// `INT8`
    I8 = 1,
    /// `UINT16`
    U16 = 2,
    /// `INT16`
    I16 = 3,
    /// `UINT32`
    U32 = 4,
    /// `INT32`
    I32 = 5,
    /// `FLOAT32`
    F32 = 6,
    /// `BOOL` (one byte, 0 or 1)
    Bool = 7,
    /// `STRING` (u64 length, then UTF-8 bytes, no terminator)
    String = 8,
    /// `ARRAY` (u32 element type, u64 count, then the elements)
    Array = 9,
    /// `UINT64`
    U64 = 10,
    /// `INT64`
    I64 = 11,
    /// `FLOAT64`
    F64 = 12,
}

impl MetadataValueType {
    /// The type for a GGUF value type id, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<Self> {
        use MetadataValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The id written in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The GGUF spec name (`UINT32`, `FLOAT32`, `STRING`, `ARRAY`, ...).
    pub fn name(self) -> &'static str {
        use MetadataValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    /// Bytes per value for fixed-size types; `None` for `STRING` and `ARRAY`.
    pub fn fixed_size(self) -> Option<usize> {
        use MetadataValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// `UINT8`
    U8(u8),
    /// `INT8`
    I8(i8),
    /// `UINT16`
    U16(u16),
    /// `INT16`
    I16(i16),
    /// `UINT32`
    U32(u32),
    /// `INT32`
    I32(i32),
    /// `FLOAT32`
    F32(f32),
    /// `BOOL`
    Bool(bool),
    /// `STRING` (valid UTF-8)
    String(String),
    /// `ARRAY[...]`
    Array(MetadataArray),
    /// `UINT64`
    U64(u64),
    /// `INT64`
    I64(i64),
    /// `FLOAT64`
    F64(f64),
}

/// A metadata array: all elements have the one type the file declares.
///
/// Arrays of arrays are allowed to one level of nesting (an `ARRAY[ARRAY[T]]`, where each inner
/// array declares its own element type); deeper nesting is rejected by the reader.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    /// `ARRAY[UINT8]`
    U8(Vec<u8>),
    /// `ARRAY[INT8]`
    I8(Vec<i8>),
    /// `ARRAY[UINT16]`
    U16(Vec<u16>),
    /// `ARRAY[INT16]`
    I16(Vec<i16>),
    /// `ARRAY[UINT32]`
    U32(Vec<u32>),
    /// `ARRAY[INT32]`
    I32(Vec<i32>),
    /// `ARRAY[FLOAT32]`
    F32(Vec<f32>),
    /// `ARRAY[BOOL]`
    Bool(Vec<bool>),
    /// `ARRAY[STRING]`
    String(Vec<String>),
    /// `ARRAY[UINT64]`
    U64(Vec<u64>),
    /// `ARRAY[INT64]`
    I64(Vec<i64>),
    /// `ARRAY[FLOAT64]`
    F64(Vec<f64>),
    /// `ARRAY[ARRAY[...]]`
    Array(Vec<MetadataArray>),
}

impl MetadataValue {
    /// The value type of this value.
    pub fn value_type(&self) -> MetadataValueType {
        use MetadataValueType as T;
        match self {
            MetadataValue::U8(_) => T::U8,
            MetadataValue::I8(_) => T::I8,
            MetadataValue::U16(_) => T::U16,
            MetadataValue::I16(_) => T::I16,
            MetadataValue::U32(_) => T::U32,
            MetadataValue::I32(_) => T::I32,
            MetadataValue::F32(_) => T::F32,
            MetadataValue::Bool(_) => T::Bool,
            MetadataValue::String(_) => T::String,
            MetadataValue::Array(_) => T::Array,
            MetadataValue::U64(_) => T::U64,
            MetadataValue::I64(_) => T::I64,
            MetadataValue::F64(_) => T::F64,
        }
    }

    /// The GGUF type name: `UINT32`, `STRING`, `ARRAY[FLOAT32]`, `ARRAY[ARRAY[INT32]]`, ...
    pub fn value_type_name(&self) -> String {
        match self {
            MetadataValue::Array(a) => a.value_type_name(),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as a signed 128-bit integer, for any integer type (not `BOOL`).
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `u32`, for any integer type whose value fits.
    pub fn to_u32(&self) -> Option<u32> {
        self.as_integer().and_then(|v| u32::try_from(v).ok())
    }

    /// The value as `u64`, for any integer type whose value is non-negative.
    pub fn to_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// The value as `i64`, for any integer type whose value fits.
    pub fn to_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// The value as `f32`, for `FLOAT32` and `FLOAT64` (rounded to nearest).
    pub fn to_f32(&self) -> Option<f32> {
        match *self {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The value of a `BOOL`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value of a `STRING`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value of an `ARRAY`.
    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetadataArray {
    /// The element type of this array.
    pub fn element_type(&self) -> MetadataValueType {
        use MetadataValueType as T;
        match self {
            MetadataArray::U8(_) => T::U8,
            MetadataArray::I8(_) => T::I8,
            MetadataArray::U16(_) => T::U16,
            MetadataArray::I16(_) => T::I16,
            MetadataArray::U32(_) => T::U32,
            MetadataArray::I32(_) => T::I32,
            MetadataArray::F32(_) => T::F32,
            MetadataArray::Bool(_) => T::Bool,
            MetadataArray::String(_) => T::String,
            MetadataArray::U64(_) => T::U64,
            MetadataArray::I64(_) => T::I64,
            MetadataArray::F64(_) => T::F64,
            MetadataArray::Array(_) => T::Array,
        }
    }

    /// The GGUF type name: `ARRAY[FLOAT32]`, `ARRAY[STRING]`, `ARRAY[ARRAY[INT32]]` (the inner
    /// type is the first inner array's; `ARRAY[ARRAY]` when the outer array is empty).
    pub fn value_type_name(&self) -> String {
        match self {
            MetadataArray::Array(v) => match v.first() {
                Some(inner) => format!("ARRAY[{}]", inner.value_type_name()),
                None => "ARRAY[ARRAY]".to_string(),
            },
            a => format!("ARRAY[{}]", a.element_type().name()),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nesting depth: 1 for an array of scalars or strings, 2 for an array of arrays of scalars.
    pub fn depth(&self) -> usize {
        match self {
            MetadataArray::Array(v) => 1 + v.iter().map(|a| a.depth()).max().unwrap_or(1),
            _ => 1,
        }
    }
}

/// Builds the error for a key whose value has the wrong type.
pub(crate) fn key_type_error(key: &str, expected: &str, found: &MetadataValue) -> GgufError {
    let found = match found.as_integer() {
        // Say the value too when an integer was out of range for the requested type.
        Some(v) => format!("{} {v}", found.value_type_name()),
        None => found.value_type_name(),
    };
    GgufError::KeyType {
        key: key.to_string(),
        expected: expected.to_string(),
        found,
    }
}

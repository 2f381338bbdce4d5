//! The error type of the GGUF reader, writer and type table.

use std::path::PathBuf;

use crate::types::GgmlType;

/// Everything that can go wrong reading, writing or interpreting a GGUF file.
///
/// Every variant that concerns one metadata key or tensor carries its name, and every truncation
/// carries the byte offset where more data was expected, so a message can be shown to a user as is.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening, mapping or writing a file failed.
    #[error("I/O error on '{}': {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file does not start with the bytes `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The first (up to) four bytes of the file.
        found: Vec<u8>,
    },

    /// The GGUF version is not 1, 2 or 3 (in either byte order).
    #[error("unsupported GGUF version {version}: {reason}")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
        /// Why, in words.
        reason: String,
    },

    /// The file ends before a field that the header says is there.
    #[error("file truncated: {what} at byte offset {offset} runs past the end of the file")]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset in the file where it starts.
        offset: u64,
    },

    /// A string (key, value or tensor name) is not valid UTF-8.
    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidString {
        /// Which string.
        what: String,
        /// Byte offset of its length field.
        offset: u64,
    },

    /// A metadata entry is malformed (bad value type, invalid UTF-8, duplicate key, bad alignment, ...).
    #[error("metadata key '{key}': {reason}")]
    Metadata {
        /// The key (or a description of the entry when the key itself could not be read).
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// A metadata key that was asked for is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key.
        key: String,
    },

    /// A metadata key has a value of another type than the one asked for.
    #[error("metadata key '{key}' must be {expected}, found {found}")]
    KeyType {
        /// The key.
        key: String,
        /// The accepted type(s), in GGUF names (`UINT32`, `ARRAY[FLOAT32]`, ...).
        expected: String,
        /// The type in the file (and the value, when it was out of range).
        found: String,
    },

    /// A tensor info entry is invalid (shape, type, offset, data range, duplicate name, ...).
    #[error("tensor '{name}': {reason}")]
    Tensor {
        /// The tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// A tensor that was asked for is absent.
    #[error("tensor '{name}' not found in the GGUF file")]
    MissingTensor {
        /// The tensor name.
        name: String,
    },

    /// A ggml type id that is not known.
    #[error("unknown ggml type id {0}")]
    UnknownType(u32),

    /// A ggml type name that is not known (from [`std::str::FromStr`]).
    #[error("unknown ggml type name '{0}'")]
    UnknownTypeName(String),

    /// A ggml type id that has been removed from ggml and GGUF.
    #[error(
        "ggml type id {id} ({name}) has been removed from ggml and is no longer supported in GGUF files; re-convert the model"
    )]
    RetiredType {
        /// The id.
        id: u32,
        /// The name it had.
        name: &'static str,
    },

    /// An element count that is not a whole number of blocks.
    #[error("{n_elements} elements is not a multiple of the {ty} block size {block_size}")]
    NotBlockMultiple {
        /// The type.
        ty: GgmlType,
        /// The element count.
        n_elements: u64,
        /// Elements per block of `ty`.
        block_size: usize,
    },

    /// A count or size above one of the reader's limits.
    #[error("{what} is {value}, above the limit of {limit}")]
    Limit {
        /// What was counted.
        what: String,
        /// The value found.
        value: u64,
        /// The limit.
        limit: u64,
    },

    /// Size arithmetic overflowed.
    #[error("integer overflow computing {what}")]
    Overflow {
        /// What was computed.
        what: String,
    },

    /// The writer was given something it cannot write.
    #[error("GGUF writer: {0}")]
    Writer(String),
}

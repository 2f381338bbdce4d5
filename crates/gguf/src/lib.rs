//! GGUF container: reader, writer, metadata values, tensor table and the ggml type table.
//!
//! The reader ([`GgufFile`]) memory-maps a file (or takes a buffer), checks every count, length,
//! offset and shape in the header, and then hands out zero-copy slices of the tensor data. Shapes
//! are kept in ggml order in [`TensorInfo::ne`]; [`TensorInfo::shape`] gives the Burn (reversed)
//! order. Format source: the GGUF spec, `docs/gguf.md` in ggml-org/ggml, and llama.cpp's
//! `ggml/src/gguf.cpp`.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("model.gguf")?;
//! println!("{} with {} tensors", file.architecture()?, file.tensors().len());
//! let embd = file.tensor("token_embd.weight").expect("present");
//! let bytes: &[u8] = file.tensor_data(embd);
//! # Ok::<(), gguf::GgufError>(())
//! ```

#![warn(missing_docs)]
pub mod byte_order;
pub mod error;
mod header;
pub mod metadata;
pub mod reader;
pub mod types;
pub mod writer;

pub use byte_order::ByteOrder;
pub use error::GgufError;
pub use metadata::{MetadataArray, MetadataValue, MetadataValueType};
pub use reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufFile, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_KV,
    MAX_STRING_LEN, MAX_TENSORS, MAX_VERSION, MIN_VERSION, TensorInfo,
};
pub use types::GgmlType;
pub use writer::GgufWriter;

//! burn-gguf: the ggml-quant tensor type for Burn.
//!
//! A GGUF file's quantized blocks go to the device unchanged ([`GgmlTensor`]); CubeCL kernels
//! (`ggml-kernels`) decode them in registers, fused into the matrix-vector product, through a
//! Burn backend extension ([`ops::GgmlOps`]) that works on `CubeBackend` and on
//! `Fusion<CubeBackend>`. Packed modules ([`GgmlLinear`], [`GgmlEmbedding`], [`GgmlExperts`]) wrap
//! the type, and
//! [`GgufLoader`] builds them from a file, falling back to dequantization, explicitly and
//! reported, when no kernel fits. [`GgufStore`] loads a GGUF file into any Burn module through
//! `burn-store` (`model.load_from(&mut store)`), dequantized. [`write::add_quantized`] goes the
//! other way: a Burn tensor, quantized by the CPU codec, into a [`gguf::GgufWriter`].
//! [`qfloat`] turns the ggml types Burn's own quantization holds losslessly (Q8_0, Q4_0, MXFP4)
//! into Burn `QFloat` tensors; [`select_device`] picks a wgpu adapter or the CPU backend.
//!
//! ```no_run
//! use burn::tensor::Tensor;
//! use burn_gguf::{GgufConfig, GgufLoader};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = gguf::GgufFile::open("model.gguf")?;
//! let device = burn_gguf::select_device(None)?; // the default wgpu adapter
//! let loader = GgufLoader::new(&file, &device, GgufConfig::default());
//! let attn_q = loader.linear("blk.0.attn_q.weight")?; // the file's blocks, on the device
//! let x = Tensor::<2>::ones([1, 640], &device); // [tokens, in]
//! let y = attn_q.forward(x); // fused dequantize + GEMV: [tokens, out]
//! println!("{:?}\n{}", y.dims(), loader.report());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
pub mod attention;
pub mod autodiff;
pub mod delta_net;
pub mod device;
pub mod loader;
pub mod lora;
pub mod moe;
pub mod nn;
pub mod ops;
pub mod qfloat;
pub mod sampling;
pub mod store;
pub mod tensor;
pub mod write;

pub use attention::{
    AttentionShape, CacheRows, KvPaging, QkNorm, QkRopeShape, RopeTable, attention, block_pieces,
    qk_rope_cache, slot_positions,
};
pub use delta_net::{DeltaNetShape, causal_conv_silu, gated_delta_net};
pub use device::{Adapter, adapters, select_device};
pub use ggml_kernels::matmul::MatmulPath;
pub use loader::{GgufConfig, GgufLoader, LoadEntry, LoadKind, LoadReport, plan};
pub use lora::{LoraAdapter, LoraConfig, LoraLinear};
pub use moe::{ExpertRows, GgmlExperts, moe_route};
pub use nn::{
    Activation, DenseWeight, GgmlEmbedding, GgmlLinear, RopeStyle, Weight, add_rms_norm, gated,
    gated_stacked, rms_norm, rope,
};
pub use sampling::top_k;
pub use store::{GgufStore, GgufStoreError};
pub use tensor::GgmlTensor;

use burn::backend::DispatchDevice;
use burn::tensor::Device;
use gguf::GgmlType;

/// Errors of the burn-gguf layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The container is malformed.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// A tensor is missing or unusable.
    #[error("tensor '{name}': {reason}")]
    Tensor {
        /// The GGUF tensor name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No kernel path for this type on this device.
    #[error("{ggml_type}: {reason}")]
    Unsupported {
        /// The ggml type.
        ggml_type: GgmlType,
        /// Why it has no path.
        reason: String,
    },
    /// Shapes that do not fit.
    #[error("{0}")]
    Shape(String),
    /// A device choice names no usable device ([`select_device`]).
    #[error("{0}")]
    Device(String),
}

/// The CubeCL compute client behind a Burn device, if it is a CubeCL one (with or without
/// autodiff: packed tensors live on the inner device either way).
pub fn cube_client(device: &Device) -> Option<cubecl::client::Client> {
    dispatch_cube_client(device.as_dispatch())
}

fn dispatch_cube_client(device: &DispatchDevice) -> Option<cubecl::client::Client> {
    match device {
        DispatchDevice::Cube(d) => Some(d.clone().client()),
        DispatchDevice::Autodiff(d) => dispatch_cube_client(d),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// Whether `device` is a software CubeCL device, whose kernels run on the host's CPU cores
/// ([`ggml_kernels::is_software_device`]).
pub fn is_software_device(device: &Device) -> bool {
    cube_client(device).is_some_and(|c| ggml_kernels::is_software_device(&c))
}

/// Largest single buffer the device takes, in bytes (its storage buffer binding limit, 128 MiB
/// on lavapipe), or `None` for a device that is not a CubeCL one.
pub fn max_buffer_bytes(device: &Device) -> Option<u64> {
    /// Used when a device states no limit.
    const DEFAULT: u64 = 128 << 20;
    cube_client(device).map(|c| match c.properties().memory.max_page_size {
        0 => DEFAULT,
        n => n,
    })
}

/// Bytes of device memory in use on `device` (every stream's pools: CubeCL's
/// `MemoryUsage::bytes_in_use`), or `None` for a device that is not a CubeCL one.
pub fn device_memory_in_use(device: &Device) -> Option<u64> {
    cube_client(device).map(|c| {
        c.memory_report(cubecl::MemoryScope::Device)
            .usage()
            .bytes_in_use
    })
}

/// The default wgpu device (`DefaultDevice`: the first adapter wgpu finds; lavapipe here).
pub fn default_device() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)
}

//! Kernel sources: each variant compiled to WGSL without launching it (`cargo xtask kernel-gen`).
use crate::formats::*;
use crate::{GemvConfig, KernelError, dequantize, gemv, with_format};
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::{Compiler, WgpuCompilationOptions};
use gguf::GgmlType;

/// One op of one ggml type with its comptime parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Fused GEMV for `m` activation rows.
    Gemv { config: GemvConfig, m: u32 },
    /// Dequantize rows by id.
    DequantizeRows,
}

/// The WGSL source of `variant` for `ty`, compiled for `client`'s device properties.
///
/// # Errors
/// No kernel for `ty`, or a compiler error.
pub fn wgsl(client: &Client, ty: GgmlType, variant: Variant) -> Result<String, KernelError> {
    let handle = client.empty(64);
    // SAFETY: dummy arguments of a kernel that is compiled, never launched.
    let arg = || unsafe { BufferArg::from_raw_parts(handle.clone(), 16) };
    let (props, target) = (
        client.properties_shared(),
        client.target_properties_shared(),
    );
    let one = CubeCount::Static(1, 1, 1);
    with_format!(ty, F => {
        let definition = match variant {
            Variant::Gemv { config, m } => gemv::gemv::create_dummy_kernel::<F>(
                props, target, one, CubeDim::new_2d(config.lanes, config.rows_per_cube),
                arg(), arg(), arg(), arg(), 1u32, F::BLOCK_ELEMS, m, config.lanes, config.rows_per_cube, config.plane,
            ).define(),
            Variant::DequantizeRows => dequantize::dequantize_rows::create_dummy_kernel::<F>(
                props, target, one, CubeDim::new_1d(64), arg(), arg(), arg(), arg(), 0u32, 1u32, F::BLOCK_ELEMS,
            ).define(),
        };
        cubecl::wgpu::WgslCompiler
            .compile(definition, &WgpuCompilationOptions::default())
            .map(|s| s.to_string())
            .map_err(|e| KernelError::Shape { op: "wgsl", reason: e.to_string() })
    }, Err(KernelError::Unsupported(ty)))
}

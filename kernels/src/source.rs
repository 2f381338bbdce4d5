//! Kernel sources: each variant compiled without launching it (`cargo xtask kernel-gen`), for
//! the three targets wgpu runs: WGSL (CubeCL's WGSL compiler; wgpu's `webgpu` path, translated by
//! naga on every native API), SPIR-V (CubeCL's own SPIR-V compiler: Burn's `vulkan` feature) and
//! MSL (CubeCL's C++ compiler with the Metal dialect: Burn's `metal` feature).
use crate::formats::*;
use crate::{GemvConfig, KernelError, dequantize, gemv, glu, matmul, with_format};
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::{Compiler, WgpuCompilationOptions};
use gguf::GgmlType;

/// One op of one ggml type with its comptime parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Fused GEMV whose unrolled code holds `m_pass` activation rows
    /// ([`GemvConfig::pass_rows`]; it serves every `m` with that pass width).
    Gemv {
        /// The layout.
        config: GemvConfig,
        /// Activation rows of the unrolled pass.
        m_pass: u32,
    },
    /// The fused GEMV of a stacked gate/up projection with the gated activation as its
    /// epilogue ([`crate::launch_gemv_glu`]), GELU (SiLU differs in the activation alone).
    GemvGlu {
        /// The layout.
        config: GemvConfig,
        /// Activation rows of the unrolled pass.
        m_pass: u32,
    },
    /// Dequantize rows by id.
    DequantizeRows,
    /// The tile matmul ([`crate::launch_dequantize_matmul`]), `x W^T` or transposed `x W`.
    DequantizeMatmul {
        /// `y = x W` (the backward pass's product) rather than `y = x W^T`.
        transposed: bool,
    },
}

/// A shader language a variant is compiled to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// WebGPU Shading Language (text).
    Wgsl,
    /// Vulkan SPIR-V (binary words).
    Spirv,
    /// Metal Shading Language (text).
    Msl,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 3] = [Target::Wgsl, Target::Spirv, Target::Msl];

    /// The file extension of this target's sources.
    pub fn extension(self) -> &'static str {
        match self {
            Target::Wgsl => "wgsl",
            Target::Spirv => "spv",
            Target::Msl => "metal",
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "wgsl" => Ok(Target::Wgsl),
            "spirv" => Ok(Target::Spirv),
            "msl" => Ok(Target::Msl),
            other => Err(format!("unknown target '{other}' (wgsl, spirv, msl)")),
        }
    }
}

/// The WGSL source of `variant` for `ty`, compiled for `client`'s device properties.
///
/// # Errors
/// No kernel for `ty`, or a compiler error.
pub fn wgsl(client: &Client, ty: GgmlType, variant: Variant) -> Result<String, KernelError> {
    let bytes = source(client, ty, variant, Target::Wgsl)?;
    String::from_utf8(bytes).map_err(|e| compile_err(Target::Wgsl, e.to_string()))
}

/// The source of `variant` for `ty` in `target`: UTF-8 text for WGSL and MSL, a SPIR-V module
/// (little-endian words) for SPIR-V. The kernel is expanded with `client`'s device properties.
///
/// # Errors
/// No kernel for `ty`, or a compiler error.
pub fn source(
    client: &Client,
    ty: GgmlType,
    variant: Variant,
    target: Target,
) -> Result<Vec<u8>, KernelError> {
    let handle = client.empty(64);
    // SAFETY: dummy arguments of a kernel that is compiled, never launched.
    let arg = || unsafe { BufferArg::from_raw_parts(handle.clone(), 16) };
    let (props, target_props) = (
        client.properties_shared(),
        client.target_properties_shared(),
    );
    let one = CubeCount::Static(1, 1, 1);
    let definition = with_format!(ty, F => match variant {
        Variant::Gemv { config: config @ GemvConfig::Split { .. }, m_pass } => {
            let (lanes, rows_per_cube, plane) = config.kernel_args();
            gemv::gemv::create_dummy_kernel::<F>(
                props, target_props, one, config.cube_dim(), arg(), arg(), arg(), arg(), 1u32,
                F::BLOCK_ELEMS, m_pass, m_pass, lanes, rows_per_cube, plane,
            ).define()
        }
        Variant::Gemv { config: config @ GemvConfig::OwnRows { .. }, m_pass } => {
            let (lanes, own_rows, plane) = config.kernel_args();
            gemv::gemv_rows::create_dummy_kernel::<F>(
                props, target_props, one, config.cube_dim(), arg(), arg(), arg(), arg(), 1u32,
                F::BLOCK_ELEMS, m_pass, m_pass, lanes, plane, own_rows, glu::GLU_NONE,
            ).define()
        }
        Variant::GemvGlu { config: config @ GemvConfig::Split { .. }, m_pass } => {
            let (lanes, rows_per_cube, plane) = config.kernel_args();
            gemv::gemv_glu::create_dummy_kernel::<F>(
                props, target_props, one, config.cube_dim(), arg(), arg(), arg(), arg(), 2u32,
                F::BLOCK_ELEMS, m_pass, m_pass, lanes, rows_per_cube, plane, glu::GLU_GELU,
            ).define()
        }
        Variant::GemvGlu { config: config @ GemvConfig::OwnRows { .. }, m_pass } => {
            let (lanes, own_rows, plane) = config.kernel_args();
            gemv::gemv_rows::create_dummy_kernel::<F>(
                props, target_props, one, config.cube_dim(), arg(), arg(), arg(), arg(), 2u32,
                F::BLOCK_ELEMS, m_pass, m_pass, lanes, plane, own_rows, glu::GLU_GELU,
            ).define()
        }
        Variant::DequantizeRows => dequantize::dequantize_rows::create_dummy_kernel::<F>(
            props, target_props, one, CubeDim::new_1d(64), arg(), arg(), arg(), arg(), 0u32, 1u32,
            F::BLOCK_ELEMS,
        ).define(),
        Variant::DequantizeMatmul { transposed } => {
            let side = matmul::MM_UNITS_SIDE;
            matmul::dequantize_matmul::create_dummy_kernel::<F>(
                props, target_props, one, CubeDim::new_2d(side, side), arg(), arg(), arg(), arg(),
                1u32, 0u32, 1u32, F::BLOCK_ELEMS, transposed,
            ).define()
        }
    }, return Err(KernelError::Unsupported(ty)));
    // The compilers panic on some unsupported input: a panic is this variant's compile error.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compile(definition, target)))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(compile_err(target, format!("compiler panicked: {msg}")))
        })
}

fn compile(
    definition: cubecl::prelude::KernelDefinition,
    target: Target,
) -> Result<Vec<u8>, KernelError> {
    match target {
        Target::Wgsl => cubecl::wgpu::WgslCompiler
            .compile(definition, &WgpuCompilationOptions::default())
            .map(|s| s.to_string().into_bytes())
            .map_err(|e| compile_err(target, e.to_string())),
        Target::Spirv => {
            let mut options = WgpuCompilationOptions {
                supports_vulkan_compiler: true,
                ..Default::default()
            };
            // What a Vulkan 1.2 device guarantees: SPIR-V 1.5, 128 bytes of push constants,
            // 4-wide vectors.
            options.vulkan.max_spirv_version = (1, 5);
            options.vulkan.push_constant_size = 128;
            options.vulkan.max_vector_size = 4;
            cubecl_spirv::SpirvCompiler
                .compile(definition, &options)
                .map(|k| {
                    k.assembled_module
                        .iter()
                        .flat_map(|w| w.to_le_bytes())
                        .collect()
                })
                .map_err(|e| compile_err(target, e.to_string()))
        }
        Target::Msl => {
            let mut options = cubecl_cpp::shared::CompilationOptions::default();
            // As CubeCL's Metal runtime sets it: per-op fast math through `fast::` (MSL 3+).
            options.supports_features.fast_math = true;
            cubecl_cpp::shared::CppCompiler::<cubecl_cpp::target::Metal>::default()
                .compile(definition, &options)
                .map(|k| k.to_string().into_bytes())
                .map_err(|e| compile_err(target, e.to_string()))
        }
    }
}

fn compile_err(target: Target, reason: String) -> KernelError {
    KernelError::Shape {
        op: match target {
            Target::Wgsl => "wgsl",
            Target::Spirv => "spirv",
            Target::Msl => "msl",
        },
        reason,
    }
}

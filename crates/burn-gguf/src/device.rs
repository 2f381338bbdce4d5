//! Choosing a device: the wgpu adapters this machine has, and Burn's CPU backend.
//!
//! [`adapters`] lists what wgpu finds on the graphics API a default device would come up on
//! (Vulkan where it has an adapter, else Metal, else DX12, as CubeCL's `Auto` settles), and
//! [`select_device`] turns a command-line choice (an index into that list, part of an adapter's
//! name, or `cpu`) into a Burn [`Device`].
use burn::tensor::{Device, DeviceKind};
use cubecl::wgpu::wgpu;

/// One wgpu adapter, as `burn-gguf devices` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    /// Position in [`adapters`]'s list: what a numeric choice picks.
    pub index: usize,
    /// The adapter's name, e.g. `NVIDIA H200` or `llvmpipe (LLVM 19.1.7, 256 bits)` (lavapipe).
    pub name: String,
    /// The graphics API, e.g. `Vulkan`.
    pub backend: String,
    /// wgpu's device type: `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// The driver and its version, as the adapter reports them.
    pub driver: String,
    /// The Burn device kind that addresses this adapter (each type counts from zero on its own),
    /// or `None` for a type Burn cannot name (`Other`).
    pub kind: Option<DeviceKind>,
}

/// The wgpu adapters of the first graphics API (Vulkan, Metal, DX12) that has any, in wgpu's
/// order; empty when none has one.
pub fn adapters() -> Vec<Adapter> {
    for backend in [
        wgpu::Backend::Vulkan,
        wgpu::Backend::Metal,
        wgpu::Backend::Dx12,
    ] {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backend.into(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let infos: Vec<wgpu::AdapterInfo> =
            futures_lite::future::block_on(instance.enumerate_adapters(backend.into()))
                .iter()
                .map(wgpu::Adapter::get_info)
                .collect();
        if !infos.is_empty() {
            return describe(infos);
        }
    }
    Vec::new()
}

/// Numbers each adapter as CubeCL does: every device type counts from zero on its own.
fn describe(infos: Vec<wgpu::AdapterInfo>) -> Vec<Adapter> {
    let (mut discrete, mut integrated, mut virtual_gpu) = (0, 0, 0);
    let next = |n: &mut usize| {
        *n += 1;
        *n - 1
    };
    infos
        .into_iter()
        .enumerate()
        .map(|(index, info)| {
            let kind = match info.device_type {
                wgpu::DeviceType::DiscreteGpu => Some(DeviceKind::DiscreteGpu(next(&mut discrete))),
                wgpu::DeviceType::IntegratedGpu => {
                    Some(DeviceKind::IntegratedGpu(next(&mut integrated)))
                }
                wgpu::DeviceType::VirtualGpu => {
                    Some(DeviceKind::VirtualGpu(next(&mut virtual_gpu)))
                }
                wgpu::DeviceType::Cpu => Some(DeviceKind::Cpu),
                wgpu::DeviceType::Other => None,
            };
            Adapter {
                index,
                name: info.name,
                backend: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                driver: format!("{} {}", info.driver, info.driver_info)
                    .trim()
                    .to_string(),
                kind,
            }
        })
        .collect()
}

/// The device a command-line choice names:
/// - `None`, `""` or `default`: [`crate::default_device`] (wgpu's default adapter);
/// - `cpu`: Burn's CPU backend (`burn-flex`), where every weight is dequantized at load;
/// - a number: that entry of [`adapters`];
/// - anything else: the one adapter whose name contains it, ignoring case.
///
/// # Errors
/// [`crate::Error::Device`] naming the choice and listing the adapters when nothing or more than
/// one adapter matches, or the adapter's type has no Burn device kind.
pub fn select_device(choice: Option<&str>) -> Result<Device, crate::Error> {
    let choice = choice.map(str::trim).unwrap_or("");
    if choice.is_empty() || choice.eq_ignore_ascii_case("default") {
        return Ok(crate::default_device());
    }
    if choice.eq_ignore_ascii_case("cpu") {
        return Ok(Device::flex());
    }
    adapter_kind(choice).map(Device::wgpu)
}

/// The Burn device kind of the one adapter of [`adapters`] that `choice` names (an index, or part
/// of its name ignoring case).
///
/// # Errors
/// As [`select_device`].
pub fn adapter_kind(choice: &str) -> Result<DeviceKind, crate::Error> {
    pick(choice, &adapters())
}

/// [`select_device`]'s choice among `all`.
fn pick(choice: &str, all: &[Adapter]) -> Result<DeviceKind, crate::Error> {
    let listed = || {
        if all.is_empty() {
            "no wgpu adapter found".to_string()
        } else {
            all.iter()
                .map(|a| format!("{}: {} ({}, {})", a.index, a.name, a.device_type, a.backend))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    let fail =
        |why: &str| crate::Error::Device(format!("--device '{choice}': {why} ({})", listed()));
    let found: Vec<&Adapter> = match choice.parse::<usize>() {
        Ok(i) => all.iter().filter(|a| a.index == i).collect(),
        Err(_) => {
            let needle = choice.to_lowercase();
            all.iter()
                .filter(|a| a.name.to_lowercase().contains(&needle))
                .collect()
        }
    };
    match found.as_slice() {
        [] => Err(fail("no such adapter")),
        [one] => one
            .kind
            .clone()
            .ok_or_else(|| fail("Burn cannot address this adapter type")),
        _ => Err(fail("more than one adapter matches")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(index: usize, name: &str, kind: Option<DeviceKind>) -> Adapter {
        Adapter {
            index,
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: "DiscreteGpu".into(),
            driver: String::new(),
            kind,
        }
    }

    #[test]
    fn picks_by_index_and_name() {
        let all = [
            adapter(0, "NVIDIA H200", Some(DeviceKind::DiscreteGpu(0))),
            adapter(1, "llvmpipe (LLVM 19)", Some(DeviceKind::Cpu)),
            adapter(2, "Odd", None),
        ];
        assert_eq!(pick("1", &all).unwrap(), DeviceKind::Cpu);
        assert_eq!(pick("h200", &all).unwrap(), DeviceKind::DiscreteGpu(0));
        let e = pick("3", &all).unwrap_err().to_string();
        assert!(e.contains("'3'") && e.contains("0: NVIDIA H200"), "{e}");
        let e = pick("i", &all).unwrap_err().to_string(); // NVIDIA, llvmpipe
        assert!(e.contains("more than one"), "{e}");
        assert!(
            pick("odd", &all)
                .unwrap_err()
                .to_string()
                .contains("cannot address")
        );
        assert!(
            pick("x", &[])
                .unwrap_err()
                .to_string()
                .contains("no wgpu adapter")
        );
    }
}

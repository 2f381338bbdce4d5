//! LoRA adapters of a [`Decoder`]: made for training ([`DecoderLora::new`]), read from and
//! written to llama.cpp's GGUF adapter format ([`DecoderLora::from_gguf`],
//! [`DecoderLora::to_gguf`]), and applied unmerged beside the packed weights.
//!
//! The format (llama.cpp `src/llama-adapter.cpp`, `convert_lora_to_gguf.py`): metadata
//! `general.type` = `adapter`, `general.architecture` = the base model's, `adapter.type` =
//! `lora`, `adapter.lora.alpha` (f32); per adapted weight `W` named `blk.N.attn_q.weight`, two
//! tensors `blk.N.attn_q.weight.lora_a` with `ne = [in, r]` (Burn `[r, in]`) and
//! `blk.N.attn_q.weight.lora_b` with `ne = [r, out]` (Burn `[out, r]`), F32 or F16. llama.cpp
//! adds `scale * alpha / r * B (A x)` to `W x` (`scale` from `--lora-scaled`, 1 by default;
//! `alpha` 0 means no `alpha / r` factor).
use crate::Error;
use crate::decoder::Decoder;
use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use burn_gguf::{LoraAdapter, LoraConfig};
use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};

/// Suffix of an adapter's `A` tensor after the base weight's name.
pub const LORA_A: &str = ".lora_a";
/// Suffix of an adapter's `B` tensor after the base weight's name.
pub const LORA_B: &str = ".lora_b";

/// One adapted weight of a decoder: its layer and its GGUF name within the layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraTarget {
    /// The layer index `N` of `blk.N.`.
    pub layer: usize,
    /// The tensor's name without `blk.N.` and `.weight` (`attn_q`, `ffn_down`, ...).
    pub name: String,
}

impl LoraTarget {
    /// The base weight's full GGUF name, `blk.N.NAME.weight`.
    pub fn weight_name(&self) -> String {
        format!("blk.{}.{}.weight", self.layer, self.name)
    }
}

/// The LoRA adapters of a decoder's projections: a Burn `Module` whose only parameters are the
/// adapters' `A` and `B`, so an optimizer over it trains them and nothing else. Passed to
/// [`Decoder::forward_batch_with`] (training, per-request adapters) or attached with
/// [`Decoder::set_lora`] (every generation path then applies it).
#[derive(Module, Debug)]
pub struct DecoderLora {
    adapters: Vec<LoraAdapter>,
    /// What each adapter adapts, in `adapters` order.
    #[module(skip)]
    targets: Vec<LoraTarget>,
    /// The factor every update is multiplied by (llama.cpp `--lora-scaled`), 1 for training.
    #[module(skip)]
    user_scale: f32,
}

impl DecoderLora {
    /// New adapters of `config` on `decoder`'s projections named in `config.targets`, on
    /// `device` (an autodiff device to train them). `B` starts at zero, so the adapted model
    /// starts equal to the base.
    ///
    /// # Errors
    /// [`Error::Adapter`] for rank 0, no target, or a target no layer of the model has
    /// (naming it and the ones it has).
    pub fn new(decoder: &Decoder, config: &LoraConfig, device: &Device) -> Result<Self, Error> {
        if config.rank == 0 {
            return Err(Error::Adapter(
                "LoRA rank 0: the rank must be at least 1".into(),
            ));
        }
        if config.targets.is_empty() {
            return Err(Error::Adapter("no LoRA target named".into()));
        }
        if !(0.0..1.0).contains(&config.dropout) {
            return Err(Error::Adapter(format!(
                "LoRA dropout {} is not in [0, 1)",
                config.dropout
            )));
        }
        let have = decoder.lora_targets();
        for want in &config.targets {
            if !have.iter().any(|(t, _)| &t.name == want) {
                let mut names: Vec<&str> = have.iter().map(|(t, _)| t.name.as_str()).collect();
                names.dedup();
                return Err(Error::Adapter(format!(
                    "LoRA target '{want}': the model has no such projection (it has: {})",
                    names.join(", ")
                )));
            }
        }
        let (targets, adapters) = have
            .iter()
            .filter(|(t, _)| config.targets.contains(&t.name))
            .map(|(t, shape)| (t.clone(), LoraAdapter::new(*shape, config, device)))
            .unzip();
        Ok(Self {
            adapters,
            targets,
            user_scale: 1.0,
        })
    }

    /// Reads an adapter file written in llama.cpp's format for `decoder`, onto `device`, its
    /// updates multiplied by `user_scale` (`--lora-scale`).
    ///
    /// # Errors
    /// [`Error::Adapter`] naming the key or tensor when the file is not a LoRA adapter, is for
    /// another architecture, has a tensor the model lacks or does not adapt, an unpaired
    /// `lora_a`/`lora_b`, a shape that does not fit the base weight, or a type other than F32,
    /// F16 or BF16. Nothing is loaded when any tensor is refused.
    pub fn from_gguf(
        file: &GgufFile,
        decoder: &Decoder,
        user_scale: f32,
        device: &Device,
    ) -> Result<Self, Error> {
        let key = |k: &str| file.get_opt_str(k).map_err(Error::from);
        if key("general.type")? != Some("adapter") {
            return Err(Error::Adapter(
                "general.type: not 'adapter' (is this a model rather than an adapter?)".into(),
            ));
        }
        if key("adapter.type")? != Some("lora") {
            return Err(Error::Adapter(format!(
                "adapter.type: {:?}, expected 'lora'",
                key("adapter.type")?
            )));
        }
        let arch = key("general.architecture")?;
        if arch != Some(decoder.config().architecture.as_str()) {
            return Err(Error::Adapter(format!(
                "general.architecture: the adapter is for {arch:?}, the model is {}",
                decoder.config().architecture
            )));
        }
        let alpha = file.get_opt_f32("adapter.lora.alpha")?.unwrap_or(0.0);
        if !alpha.is_finite() || alpha < 0.0 {
            return Err(Error::Adapter(format!(
                "adapter.lora.alpha: {alpha} is not a finite non-negative number"
            )));
        }
        let have = decoder.lora_targets();
        let mut found = Vec::new();
        for info in file.tensors() {
            let (base, is_a) = match (
                info.name.strip_suffix(LORA_A),
                info.name.strip_suffix(LORA_B),
            ) {
                (Some(b), _) => (b, true),
                (_, Some(b)) => (b, false),
                _ => {
                    return Err(Error::Adapter(format!(
                        "tensor '{}': not a '{LORA_A}' or '{LORA_B}' tensor",
                        info.name
                    )));
                }
            };
            let Some((target, shape)) = have.iter().find(|(t, _)| t.weight_name() == base) else {
                return Err(Error::Adapter(format!(
                    "tensor '{}': the model has no adapted weight '{base}' (LoRA applies to \
                     the attention and dense FFN projections)",
                    info.name
                )));
            };
            if is_a {
                let b_name = format!("{base}{LORA_B}");
                let Some(b_info) = file.tensor(&b_name) else {
                    return Err(Error::Adapter(format!(
                        "tensor '{}' has no '{b_name}'",
                        info.name
                    )));
                };
                let a_shape = info.shape();
                let b_shape = b_info.shape();
                let [out, inp] = *shape;
                let ok = a_shape.len() == 2
                    && b_shape.len() == 2
                    && a_shape[1] == inp
                    && b_shape[0] == out
                    && a_shape[0] == b_shape[1]
                    && a_shape[0] > 0;
                if !ok {
                    return Err(Error::Adapter(format!(
                        "tensors '{}' {a_shape:?} and '{b_name}' {b_shape:?} do not fit \
                         '{base}' [{out}, {inp}]: expected [r, {inp}] and [{out}, r]",
                        info.name
                    )));
                }
                found.push((target.clone(), info.name.clone(), b_name));
            } else if file.tensor(&format!("{base}{LORA_A}")).is_none() {
                return Err(Error::Adapter(format!(
                    "tensor '{}' has no '{base}{LORA_A}'",
                    info.name
                )));
            }
        }
        if found.is_empty() {
            return Err(Error::Adapter(
                "the adapter file has no LoRA tensors".into(),
            ));
        }
        let mut targets = Vec::with_capacity(found.len());
        let mut adapters = Vec::with_capacity(found.len());
        for (target, a_name, b_name) in found {
            let a = read_f32(file, &a_name, device)?;
            let b = read_f32(file, &b_name, device)?;
            // llama.cpp: alpha 0 means no alpha / r factor, the same as alpha = r.
            let rank = a.dims()[0] as f32;
            let alpha = if alpha == 0.0 { rank } else { alpha };
            adapters.push(LoraAdapter::from_tensors(a, b, alpha, 0.0));
            targets.push(target);
        }
        Ok(Self {
            adapters,
            targets,
            user_scale,
        })
    }

    /// The adapter file in llama.cpp's format (F32 tensors) for a base model of
    /// `architecture`.
    ///
    /// # Errors
    /// [`Error::Adapter`] when the adapters differ in `alpha` (the format has one), or
    /// [`Error::Device`] when a tensor cannot be read back.
    pub fn to_gguf(&self, architecture: &str) -> Result<GgufWriter, Error> {
        let alpha = self.adapters.first().map_or(0.0, |a| a.alpha);
        if self.adapters.iter().any(|a| a.alpha != alpha) {
            return Err(Error::Adapter(
                "adapters with different alphas cannot share one file".into(),
            ));
        }
        let mut w = GgufWriter::new();
        w.add_metadata("general.type", MetadataValue::String("adapter".into()))
            .add_metadata(
                "general.architecture",
                MetadataValue::String(architecture.into()),
            )
            .add_metadata("adapter.type", MetadataValue::String("lora".into()))
            .add_metadata("adapter.lora.alpha", MetadataValue::F32(alpha));
        for (t, a) in self.targets.iter().zip(&self.adapters) {
            let base = t.weight_name();
            for (suffix, m) in [(LORA_A, a.a.val()), (LORA_B, a.b.val())] {
                let [rows, cols] = m.dims();
                let values = crate::host_f32(m)?;
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                w.add_tensor(
                    format!("{base}{suffix}"),
                    GgmlType::F32,
                    &[cols as u64, rows as u64],
                    &bytes,
                )?;
            }
        }
        Ok(w)
    }

    /// The adapted weights, in order.
    pub fn targets(&self) -> &[LoraTarget] {
        &self.targets
    }

    /// The adapters, in [`Self::targets`] order.
    pub fn adapters(&self) -> &[LoraAdapter] {
        &self.adapters
    }

    /// The factor every update is multiplied by.
    pub fn user_scale(&self) -> f32 {
        self.user_scale
    }

    /// These adapters with their updates multiplied by `scale` instead.
    pub fn with_user_scale(mut self, scale: f32) -> Self {
        self.user_scale = scale;
        self
    }

    /// Trainable values: `sum(r * (in + out))` over the adapters.
    pub fn num_values(&self) -> usize {
        self.adapters
            .iter()
            .map(|a| {
                let [out, inp] = a.shape();
                a.rank() * (inp + out)
            })
            .sum()
    }

    /// `self` and `other` applied together (llama.cpp's several `--lora` files), each with its
    /// own scale folded into its adapters' `alpha`.
    pub fn merge(self, other: Self) -> Self {
        let fold = |l: Self| {
            let s = l.user_scale;
            l.adapters
                .into_iter()
                .map(move |mut a| {
                    a.alpha *= s;
                    a
                })
                .zip(l.targets)
                .collect::<Vec<_>>()
        };
        let (adapters, targets) = fold(self).into_iter().chain(fold(other)).unzip();
        Self {
            adapters,
            targets,
            user_scale: 1.0,
        }
    }

    /// The sum of the updates of layer `layer`'s weight `name` for `x` `[n, in]`, or `None`
    /// when no adapter adapts it.
    pub(crate) fn delta(&self, layer: usize, name: &str, x: &Tensor<2>) -> Option<Tensor<2>> {
        self.targets
            .iter()
            .zip(&self.adapters)
            .filter(|(t, _)| t.layer == layer && t.name == name)
            .map(|(_, a)| a.forward(x.clone(), self.user_scale))
            .reduce(|acc, d| acc + d)
    }

    /// The updates of a stacked projection whose output is `parts` (`(name, width)`, in
    /// column order) side by side, zeros for a part without an adapter; `None` when no part
    /// has one.
    pub(crate) fn delta_stacked(
        &self,
        layer: usize,
        parts: &[(&str, usize)],
        x: &Tensor<2>,
    ) -> Option<Tensor<2>> {
        let deltas: Vec<Option<Tensor<2>>> = parts
            .iter()
            .map(|(name, _)| self.delta(layer, name, x))
            .collect();
        if deltas.iter().all(Option::is_none) {
            return None;
        }
        let n = x.dims()[0];
        let device = x.device();
        Some(Tensor::cat(
            deltas
                .into_iter()
                .zip(parts)
                .map(|(d, (_, width))| d.unwrap_or_else(|| Tensor::zeros([n, *width], &device)))
                .collect(),
            1,
        ))
    }
}

/// A 2-D F32, F16 or BF16 tensor of `file` as an f32 Burn tensor `[rows, cols]` on `device`.
fn read_f32(file: &GgufFile, name: &str, device: &Device) -> Result<Tensor<2>, Error> {
    let info = file
        .tensor(name)
        .ok_or_else(|| Error::Adapter(format!("tensor '{name}' is missing")))?;
    if !matches!(
        info.ggml_type,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
    ) {
        return Err(Error::Adapter(format!(
            "tensor '{name}': type {}, expected F32, F16 or BF16",
            info.ggml_type
        )));
    }
    let shape = info.shape();
    let [rows, cols] = shape[..] else {
        return Err(Error::Adapter(format!(
            "tensor '{name}': shape {shape:?} is not 2-D"
        )));
    };
    let bytes = file.tensor_bytes(name)?;
    let mut values = vec![0.0f32; rows * cols];
    ggml_codec::dequantize(info.ggml_type, bytes, &mut values)
        .map_err(|e| Error::Adapter(format!("tensor '{name}': {e}")))?;
    if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
        return Err(Error::Adapter(format!(
            "tensor '{name}': value {bad} is not finite"
        )));
    }
    Ok(Tensor::from_data(
        TensorData::new(values, [rows, cols]),
        device,
    ))
}

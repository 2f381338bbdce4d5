//! GGUF-to-Burn loader: packed weights where a kernel fits, explicit dequantization otherwise.
use crate::moe::GgmlExperts;
use crate::nn::{DenseWeight, GgmlEmbedding, GgmlLinear, Weight};
use crate::tensor::GgmlTensor;
use crate::{Error, cube_client};
use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use gguf::{GgmlType, GgufFile, TensorInfo};
use std::fmt;
use std::sync::Mutex;

/// How the loader treats quantized weights (the rules of Transformers' `GgufConfig`: packed
/// unless asked or impossible).
#[derive(Clone, Debug)]
pub struct GgufConfig {
    /// Dequantize every weight at load into dense tensors, even where a kernel exists.
    pub dequantize: bool,
    /// Storage type of dequantized weights (default f32; f16 / bf16 halve their memory, their
    /// products cast activations to it and back). Packed weights compute in f32 whatever this
    /// says: a type other than f32 is then logged as a warning, inputs and outputs being cast.
    pub dtype: FloatDType,
}

impl Default for GgufConfig {
    fn default() -> Self {
        Self {
            dequantize: false,
            dtype: FloatDType::F32,
        }
    }
}

/// What the loader did with one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadKind {
    /// Raw blocks uploaded; decoded by the kernels.
    Packed,
    /// Dequantized on the CPU at load into a dense f32 tensor, with the reason.
    Dequantized(String),
    /// A small tensor (norms, biases) loaded dense, as ggml does too.
    Dense,
}

/// One line of a [`LoadReport`].
#[derive(Clone, Debug)]
pub struct LoadEntry {
    /// Tensor name in the file.
    pub name: String,
    /// Its ggml type.
    pub ggml_type: GgmlType,
    /// Burn-order shape.
    pub shape: Vec<usize>,
    /// What was done.
    pub kind: LoadKind,
}

/// Every tensor loaded and how: the queryable record of fallbacks.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    /// In load order.
    pub entries: Vec<LoadEntry>,
}

impl LoadReport {
    /// Entries that fell back to dequantization.
    pub fn dequantized(&self) -> impl Iterator<Item = &LoadEntry> {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, LoadKind::Dequantized(_)))
    }

    /// Number of packed tensors.
    pub fn packed_count(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.kind == LoadKind::Packed)
            .count()
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let deq = self.dequantized().count();
        write!(
            f,
            "{} tensors: {} packed, {} dequantized",
            self.entries.len(),
            self.packed_count(),
            deq
        )?;
        // One line per reason, naming the first few tensors.
        let mut reasons: Vec<(&str, Vec<&LoadEntry>)> = Vec::new();
        for e in self.dequantized() {
            if let LoadKind::Dequantized(why) = &e.kind {
                match reasons.iter_mut().find(|(r, _)| r == why) {
                    Some((_, v)) => v.push(e),
                    None => reasons.push((why, vec![e])),
                }
            }
        }
        for (why, entries) in reasons {
            let names: Vec<String> = entries
                .iter()
                .take(4)
                .map(|e| format!("{} ({})", e.name, e.ggml_type))
                .collect();
            let more = entries.len().saturating_sub(names.len());
            write!(
                f,
                "\n  {} dequantized because {why}: {}",
                entries.len(),
                names.join(", ")
            )?;
            if more > 0 {
                write!(f, " and {more} more")?;
            }
        }
        Ok(())
    }
}

/// What [`GgufLoader`] does with the tensor `info` on `device` under `config`, decided without
/// loading it: rank-1 tensors (norms, biases) load dense; 2-D weights and 3-D expert banks are
/// packed when a kernel decodes the type at this shape on this device, else dequantized, with
/// the reason.
pub fn plan(info: &TensorInfo, device: &Device, config: &GgufConfig) -> LoadKind {
    let shape = info.shape();
    if shape.len() < 2 {
        return LoadKind::Dense;
    }
    if config.dequantize {
        return LoadKind::Dequantized("GgufConfig::dequantize is set".into());
    }
    let Some(max_buffer) = crate::max_buffer_bytes(device) else {
        return LoadKind::Dequantized("the device is not a CubeCL device".into());
    };
    // A matrix, or one expert of a bank: rows are the second-to-last dimension.
    let rows = shape[shape.len() - 2];
    let cols = shape[shape.len() - 1];
    match GgmlTensor::rows_per_buffer(info.ggml_type, [rows, cols], max_buffer) {
        Ok(_) => LoadKind::Packed,
        Err(e) => LoadKind::Dequantized(e.to_string()),
    }
}

type Progress<'a> = Box<dyn Fn(u64) + Send + Sync + 'a>;

/// Loads tensors of one GGUF file onto one Burn device.
pub struct GgufLoader<'a> {
    file: &'a GgufFile,
    device: Device,
    config: GgufConfig,
    report: Mutex<LoadReport>,
    progress: Option<Progress<'a>>,
}

impl<'a> GgufLoader<'a> {
    /// A loader for `file` onto `device`.
    pub fn new(file: &'a GgufFile, device: &Device, config: GgufConfig) -> Self {
        if config.dtype != FloatDType::F32 && !config.dequantize && cube_client(device).is_some() {
            tracing::warn!(
                dtype = ?config.dtype,
                "packed weights compute in f32: inputs and outputs are cast, only dequantized \
                 weights are stored in this dtype"
            );
        }
        Self {
            file,
            device: device.clone(),
            config,
            report: Mutex::default(),
            progress: None,
        }
    }

    /// Calls `f(bytes)` after each tensor is loaded with its size in the file (progress bars).
    pub fn with_progress(mut self, f: impl Fn(u64) + Send + Sync + 'a) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The file being loaded.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The target device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// What has been loaded so far, and how.
    pub fn report(&self) -> LoadReport {
        self.report.lock().expect("report lock").clone()
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo, Error> {
        self.file.tensor(name).ok_or_else(|| Error::Tensor {
            name: name.into(),
            reason: "missing from the file".into(),
        })
    }

    fn record(&self, info: &TensorInfo, kind: LoadKind) {
        if let LoadKind::Dequantized(why) = &kind
            && !self.config.dequantize
        {
            tracing::warn!(tensor = %info.name, ggml_type = %info.ggml_type, "dequantized at load: {why}");
        }
        self.report
            .lock()
            .expect("report lock")
            .entries
            .push(LoadEntry {
                name: info.name.clone(),
                ggml_type: info.ggml_type,
                shape: info.shape(),
                kind,
            });
        if let Some(p) = &self.progress {
            p(info.n_bytes);
        }
    }

    /// The whole tensor `info` dequantized on the CPU. A dense tensor of [`GgufLoader::dense`]
    /// lives in one device buffer, so one larger than the device's largest buffer is an error
    /// here rather than a failed allocation later.
    fn dense_values(&self, info: &TensorInfo) -> Result<Vec<f32>, Error> {
        let n = usize::try_from(info.n_elements()).map_err(|_| Error::Tensor {
            name: info.name.clone(),
            reason: "too many elements".into(),
        })?;
        let f32_bytes = info.n_elements().saturating_mul(size_of::<f32>() as u64);
        if let Some(max) = crate::max_buffer_bytes(&self.device).filter(|&max| f32_bytes > max) {
            return Err(Error::Tensor {
                name: info.name.clone(),
                reason: format!(
                    "dequantized it takes {f32_bytes} bytes of f32, more than the device's \
                     largest buffer ({max} bytes); dense fallback of a tensor this large is not \
                     supported"
                ),
            });
        }
        let bytes = self.file.tensor_data(info);
        ggml_codec::dequantize_to_vec(info.ggml_type, bytes, n).map_err(|e| Error::Tensor {
            name: info.name.clone(),
            reason: e.to_string(),
        })
    }

    /// `bytes`, a `[rows, cols]` matrix of `info`'s type, as a [`Weight`]: packed when a kernel
    /// decodes the type on this device, else dequantized, with the reason.
    fn matrix(
        &self,
        info: &TensorInfo,
        bytes: &[u8],
        shape: [usize; 2],
    ) -> Result<(Weight, Option<String>), Error> {
        let packed = match plan(info, &self.device, &self.config) {
            LoadKind::Dequantized(why) => Err(why),
            LoadKind::Packed | LoadKind::Dense => {
                GgmlTensor::from_bytes(bytes, info.ggml_type, shape, &self.device)
                    .map_err(|e| e.to_string())
            }
        };
        match packed {
            Ok(t) => Ok((Weight::Packed(t), None)),
            Err(why) => {
                let tensor_err = |reason: String| Error::Tensor {
                    name: info.name.clone(),
                    reason,
                };
                let n = shape[0] * shape[1];
                let values = ggml_codec::dequantize_to_vec(info.ggml_type, bytes, n)
                    .map_err(|e| tensor_err(e.to_string()))?;
                // Split by rows into device buffers, as packed tensors are.
                let max_buffer = crate::max_buffer_bytes(&self.device).unwrap_or(u64::MAX);
                let w = DenseWeight::from_values(
                    values,
                    shape,
                    &self.device,
                    max_buffer,
                    self.config.dtype,
                )
                .map_err(|e| tensor_err(e.to_string()))?;
                Ok((Weight::Dense(w), Some(why)))
            }
        }
    }

    /// A 2-D weight `name` (ggml `ne = [cols, rows]`) as a [`Weight`] `[rows, cols]`: packed when
    /// a kernel decodes its type on this device, dequantized (and reported) otherwise.
    ///
    /// # Errors
    /// Missing tensor, not 2-D, or a type neither the kernels nor the CPU codec decode.
    pub fn weight(&self, name: &str) -> Result<Weight, Error> {
        let info = self.info(name)?;
        let shape: [usize; 2] = info.shape().try_into().map_err(|_| Error::Tensor {
            name: name.into(),
            reason: format!("expected a 2-D weight, found shape {:?}", info.shape()),
        })?;
        let (w, why) = self.matrix(info, self.file.tensor_data(info), shape)?;
        self.record(info, why.map_or(LoadKind::Packed, LoadKind::Dequantized));
        Ok(w)
    }

    /// A 3-D expert bank `name` `[n_expert, rows, cols]` (Burn order; ggml `ne = [cols, rows,
    /// n_expert]`) as one [`Weight`] `[n_expert * rows, cols]`, the experts stacked by rows as
    /// the file stores them, and `n_expert`.
    fn expert_bank(&self, name: &str) -> Result<(Weight, usize), Error> {
        let info = self.info(name)?;
        let [n_expert, rows, cols]: [usize; 3] =
            info.shape().try_into().map_err(|_| Error::Tensor {
                name: name.into(),
                reason: format!("expected a 3-D expert bank, found shape {:?}", info.shape()),
            })?;
        // No overflow: the reader checked the bank's size against the file.
        let (w, why) = self.matrix(info, self.file.tensor_data(info), [n_expert * rows, cols])?;
        self.record(info, why.map_or(LoadKind::Packed, LoadKind::Dequantized));
        Ok((w, n_expert))
    }

    /// MoE experts from separate banks `gate`, `up` `[n_expert, d_ff, d_model]` and `down`
    /// `[n_expert, d_model, d_ff]` (llama.cpp `ffn_{gate,up,down}_exps`).
    ///
    /// # Errors
    /// Missing tensors, wrong ranks, or banks whose expert counts or shapes differ (the tensor
    /// named).
    pub fn experts(&self, gate: &str, up: &str, down: &str) -> Result<GgmlExperts, Error> {
        let (gate_w, n_expert) = self.expert_bank(gate)?;
        let (up_w, n_up) = self.expert_bank(up)?;
        let (down_w, n_down) = self.expert_bank(down)?;
        same_experts(n_expert, &[(up, n_up), (down, n_down)])?;
        GgmlExperts::new(gate_w, Some(up_w), down_w, n_expert).map_err(|e| Error::Tensor {
            name: gate.into(),
            reason: e.to_string(),
        })
    }

    /// MoE experts from a merged `gate_up` bank `[n_expert, 2 d_ff, d_model]` whose first `d_ff`
    /// rows per expert are the gate (as mainline llama.cpp writes `ffn_gate_up_exps`, case C20)
    /// and `down` `[n_expert, d_model, d_ff]`. The merged bank stays one tensor: each half is
    /// read in place ([`crate::ExpertRows`]).
    ///
    /// # Errors
    /// As [`GgufLoader::experts`], and an odd number of `gate_up` rows.
    pub fn experts_merged(&self, gate_up: &str, down: &str) -> Result<GgmlExperts, Error> {
        let (gate_up_w, n_expert) = self.expert_bank(gate_up)?;
        let (down_w, n_down) = self.expert_bank(down)?;
        same_experts(n_expert, &[(down, n_down)])?;
        GgmlExperts::new(gate_up_w, None, down_w, n_expert).map_err(|e| Error::Tensor {
            name: gate_up.into(),
            reason: e.to_string(),
        })
    }

    /// A Linear layer without bias from the 2-D weight `name` (see [`GgufLoader::weight`]).
    ///
    /// # Errors
    /// As [`GgufLoader::weight`].
    pub fn linear(&self, name: &str) -> Result<GgmlLinear, Error> {
        Ok(GgmlLinear {
            weight: self.weight(name)?,
            bias: None,
        })
    }

    /// One Linear layer (no bias) whose weight stacks the rows of the 2-D weights `names` in
    /// order: `[sum of rows, cols]`, so projections that share an input run as one GEMV
    /// (llama.cpp's fused `attn_qkv`; here Q/K/V or gate/up). The blocks stay the file's:
    /// stacking rows of one ggml type is concatenating their bytes. Returns `None`, loading
    /// nothing, unless every weight would be packed, all share one ggml type and row length,
    /// and the stack fits one device buffer; the caller then loads them one by one.
    ///
    /// # Errors
    /// A missing tensor or one that is not 2-D.
    pub fn stacked_linear(&self, names: &[&str]) -> Result<Option<GgmlLinear>, Error> {
        let mut infos = Vec::with_capacity(names.len());
        for name in names {
            let info = self.info(name)?;
            let shape: [usize; 2] = info.shape().try_into().map_err(|_| Error::Tensor {
                name: (*name).into(),
                reason: format!("expected a 2-D weight, found shape {:?}", info.shape()),
            })?;
            infos.push((info, shape));
        }
        let Some(&(first, [_, cols])) = infos.first() else {
            return Ok(None);
        };
        let same = infos
            .iter()
            .all(|(i, [_, c])| i.ggml_type == first.ggml_type && *c == cols);
        let packed = infos
            .iter()
            .all(|(i, _)| plan(i, &self.device, &self.config) == LoadKind::Packed);
        let rows: usize = infos.iter().map(|(_, [r, _])| r).sum();
        let Some(max_buffer) = crate::max_buffer_bytes(&self.device) else {
            return Ok(None);
        };
        let fits = GgmlTensor::rows_per_buffer(first.ggml_type, [rows, cols], max_buffer)
            .is_ok_and(|per| per >= rows);
        if !(same && packed && fits && infos.len() > 1) {
            return Ok(None);
        }
        let mut bytes = Vec::new();
        for (info, _) in &infos {
            bytes.extend_from_slice(self.file.tensor_data(info));
        }
        let t = GgmlTensor::from_bytes(&bytes, first.ggml_type, [rows, cols], &self.device)?;
        for (info, _) in &infos {
            self.record(info, LoadKind::Packed);
        }
        Ok(Some(GgmlLinear {
            weight: Weight::Packed(t),
            bias: None,
        }))
    }

    /// An embedding table from the 2-D weight `name` `[vocab, dim]`.
    ///
    /// # Errors
    /// As [`GgufLoader::weight`].
    pub fn embedding(&self, name: &str) -> Result<GgmlEmbedding, Error> {
        Ok(GgmlEmbedding {
            weight: self.weight(name)?,
        })
    }

    /// A small tensor's values decoded on the host (row-major f32, the CPU codec), for values a
    /// model needs on the host at load (RoPE frequency factors): no device round trip, so it
    /// works where a blocking read-back does not (wasm). Not recorded in the [`LoadReport`].
    ///
    /// # Errors
    /// Missing tensor, too large for the device's buffers, or a type the CPU codec does not
    /// decode.
    pub fn host_values(&self, name: &str) -> Result<Vec<f32>, Error> {
        self.dense_values(self.info(name)?)
    }

    /// A small tensor (norm weights, biases) dequantized into a dense f32 Burn tensor of rank
    /// `D` (Burn-order shape).
    ///
    /// # Errors
    /// Missing tensor, rank not `D`, or a type the CPU codec does not decode.
    pub fn dense<const D: usize>(&self, name: &str) -> Result<Tensor<D>, Error> {
        let info = self.info(name)?;
        let shape: [usize; D] = info.shape().try_into().map_err(|_| Error::Tensor {
            name: name.into(),
            reason: format!("expected rank {D}, found shape {:?}", info.shape()),
        })?;
        let values = self.dense_values(info)?;
        let t = Tensor::<D>::from_data(TensorData::new(values, shape), &self.device);
        self.record(info, LoadKind::Dense);
        Ok(t)
    }
}

/// Checks that the other banks of a MoE FFN have the first bank's `n_expert` experts.
fn same_experts(n_expert: usize, others: &[(&str, usize)]) -> Result<(), Error> {
    match others.iter().find(|(_, n)| *n != n_expert) {
        Some((name, n)) => Err(Error::Tensor {
            name: (*name).into(),
            reason: format!("{n} experts where the gate bank has {n_expert}"),
        }),
        None => Ok(()),
    }
}

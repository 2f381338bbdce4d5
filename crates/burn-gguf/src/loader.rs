//! GGUF-to-Burn loader: packed weights where a kernel fits, explicit dequantization otherwise.
use crate::nn::{GgmlEmbedding, GgmlLinear, Weight};
use crate::tensor::GgmlTensor;
use crate::{Error, cube_client};
use burn::tensor::{Device, Tensor, TensorData};
use gguf::{GgmlType, GgufFile, TensorInfo};
use std::fmt;
use std::sync::Mutex;

/// How the loader treats quantized weights.
#[derive(Clone, Debug, Default)]
pub struct GgufConfig {
    /// Dequantize every weight at load into dense f32 tensors, even where a kernel exists.
    pub dequantize: bool,
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

    /// The tensor dequantized on the CPU. A dense tensor lives in one device buffer, so one larger
    /// than the device's largest buffer is an error here rather than a failed allocation later.
    fn dense_values(&self, info: &TensorInfo) -> Result<Vec<f32>, Error> {
        let n = usize::try_from(info.n_elements()).map_err(|_| Error::Tensor {
            name: info.name.clone(),
            reason: "too many elements".into(),
        })?;
        let bytes = info.n_elements().saturating_mul(size_of::<f32>() as u64);
        if let Some(max) = crate::max_buffer_bytes(&self.device).filter(|&max| bytes > max) {
            return Err(Error::Tensor {
                name: info.name.clone(),
                reason: format!(
                    "dequantized it takes {bytes} bytes of f32, more than the device's largest \
                     buffer ({max} bytes); dense fallback of a tensor this large is not supported"
                ),
            });
        }
        ggml_codec::dequantize_to_vec(info.ggml_type, self.file.tensor_data(info), n).map_err(|e| {
            Error::Tensor {
                name: info.name.clone(),
                reason: e.to_string(),
            }
        })
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
        let why_not = if self.config.dequantize {
            Some("GgufConfig::dequantize is set".to_string())
        } else if cube_client(&self.device).is_none() {
            Some("the device is not a CubeCL device".to_string())
        } else {
            None
        };
        let packed = match why_not {
            Some(why) => Err(why),
            None => GgmlTensor::from_bytes(
                self.file.tensor_data(info),
                info.ggml_type,
                shape,
                &self.device,
            )
            .map_err(|e| e.to_string()),
        };
        match packed {
            Ok(t) => {
                self.record(info, LoadKind::Packed);
                Ok(Weight::Packed(t))
            }
            Err(why) => {
                let values = self.dense_values(info)?;
                let t = Tensor::<2>::from_data(TensorData::new(values, shape), &self.device);
                self.record(info, LoadKind::Dequantized(why));
                Ok(Weight::Dense(t))
            }
        }
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

    /// An embedding table from the 2-D weight `name` `[vocab, dim]`.
    ///
    /// # Errors
    /// As [`GgufLoader::weight`].
    pub fn embedding(&self, name: &str) -> Result<GgmlEmbedding, Error> {
        Ok(GgmlEmbedding {
            weight: self.weight(name)?,
        })
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

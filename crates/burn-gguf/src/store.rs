//! [`GgufStore`]: a `burn-store` [`ModuleStore`] over a GGUF file, so any Burn module loads
//! GGUF weights as it loads safetensors or PyTorch ones:
//!
//! ```no_run
//! use burn_gguf::GgufStore;
//! use burn::store::{ModuleSnapshot, PyTorchToBurnAdapter};
//! # fn load<M: burn::module::Module>(model: &mut M) -> Result<(), burn_gguf::GgufStoreError> {
//! let mut store = GgufStore::from_file("model.gguf")
//!     .with_key_remapping(r"^blk\.(\d+)\.attn_q\.", "layers.$1.attn.q.")
//!     .with_from_adapter(PyTorchToBurnAdapter) // `nn::Linear` weights are [in, out] in Burn
//!     .allow_partial(true);
//! let result = model.load_from(&mut store)?;
//! println!("{result}");
//! # Ok(()) }
//! ```
//!
//! Every tensor of the file is offered under its GGUF name (`blk.0.attn_q.weight`, after key
//! remapping) with its shape in Burn order (ggml's `ne` reversed: `[rows, cols]` for a
//! matrix, as PyTorch stores a `Linear` weight). F32, F16 and BF16 tensors keep their dtype
//! (Burn casts them to the parameter's); every other ggml type is dequantized to f32 on the
//! host with `ggml-codec`, bit-exactly as llama.cpp dequantizes it, when the parameter is
//! loaded. Filters, remapping, adapters, `allow_partial` and `validate` behave as in
//! `burn-store`'s other stores; the file's metadata (hyper-parameters, tokenizer) is
//! [`GgufStore::file`].
//!
//! Packed modules ([`crate::GgmlLinear`], [`crate::GgmlEmbedding`], [`crate::moe::GgmlExperts`])
//! keep the blocks quantized: they are not Burn parameters, so they load by tensor name from the
//! same store through [`GgufStore::loader`]. A model may hold both kinds: build it with its
//! packed fields from the loader, then `load_from` the store for the rest (the packed tensors
//! show as unused in the [`ApplyResult`]).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use burn::store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn::store::{
    ApplyResult, IdentityAdapter, KeyRemapper, ModuleAdapter, ModuleSnapshot, ModuleStore,
    PathFilter,
};
use burn::tensor::{DType, TensorData};
use gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

/// Errors of a [`GgufStore`].
#[derive(Debug, thiserror::Error)]
pub enum GgufStoreError {
    /// The file could not be opened or is not a valid GGUF file.
    #[error("{path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: GgufError,
    },
    /// A tensor whose type the CPU codec cannot dequantize, or whose shape does not fit.
    #[error("tensor '{name}': {reason}")]
    Tensor {
        /// The GGUF tensor name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Applying to the module failed with `validate` on (every error listed, naming the
    /// module path and the tensor).
    #[error("loading the module from the GGUF file failed: {0}")]
    Validation(String),
    /// Tensors the module needs are not in the file (and `allow_partial` is off).
    #[error("tensors missing from the GGUF file: {0}")]
    Missing(String),
    /// Saving a module to GGUF is not a store operation: use [`crate::write`].
    #[error("GgufStore reads GGUF files; write one with burn_gguf::write")]
    WriteUnsupported,
}

/// A `burn-store` [`ModuleStore`] that reads a GGUF file (see the [module docs](self)).
pub struct GgufStore {
    path: PathBuf,
    file: Option<Arc<GgufFile>>,
    filter: PathFilter,
    remapper: KeyRemapper,
    from_adapter: Box<dyn ModuleAdapter>,
    validate: bool,
    allow_partial: bool,
    skip_enum_variants: bool,
    native: Option<burn::tensor::Device>,
    cache: Option<BTreeMap<String, PackTensor>>,
}

impl GgufStore {
    /// A store over the GGUF file at `path`, opened (memory-mapped) on first use. Defaults:
    /// no filter, no remapping, the identity adapter, `validate` on, `allow_partial` off.
    pub fn from_file(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            file: None,
            filter: PathFilter::new(),
            remapper: KeyRemapper::new(),
            from_adapter: Box::new(IdentityAdapter),
            validate: true,
            allow_partial: false,
            skip_enum_variants: false,
            native: None,
            cache: None,
        }
    }

    /// A store over an opened file.
    pub fn from_gguf(file: Arc<GgufFile>) -> Self {
        Self {
            file: Some(file),
            ..Self::from_file(PathBuf::new())
        }
    }

    /// The file, opened on first use: its metadata (`general.architecture`, hyper-parameters,
    /// the tokenizer's vocabulary) and tensor table.
    ///
    /// # Errors
    /// [`GgufStoreError::Open`] when the file cannot be opened or parsed.
    pub fn file(&mut self) -> Result<&Arc<GgufFile>, GgufStoreError> {
        if self.file.is_none() {
            let f = GgufFile::open(&self.path).map_err(|source| GgufStoreError::Open {
                path: self.path.clone(),
                source,
            })?;
            self.file = Some(Arc::new(f));
        }
        Ok(self.file.as_ref().expect("opened above"))
    }

    /// Only tensors whose (remapped) module path the filter accepts are applied.
    pub fn filter(mut self, filter: PathFilter) -> Self {
        self.filter = filter;
        self
    }

    /// Only module paths matching the regular expression `pattern` are applied.
    ///
    /// # Panics
    /// An invalid regular expression (as `burn-store`'s other stores).
    pub fn with_regex(mut self, pattern: impl AsRef<str>) -> Self {
        self.filter = self.filter.with_regex(pattern);
        self
    }

    /// Only the module path `path` (and others given so) is applied.
    pub fn with_full_path(mut self, path: impl Into<String>) -> Self {
        self.filter = self.filter.with_full_path(path);
        self
    }

    /// Renames the file's tensors with `remapper` before they are matched to module paths.
    pub fn remap(mut self, remapper: KeyRemapper) -> Self {
        self.remapper = remapper;
        self.cache = None;
        self
    }

    /// Renames tensors matching the regular expression `from` to `to` (`$1` for groups), e.g.
    /// `(r"^blk\.(\d+)\.", "layers.$1.")`.
    ///
    /// # Panics
    /// An invalid regular expression (as `burn-store`'s other stores).
    pub fn with_key_remapping(mut self, from: impl AsRef<str>, to: impl Into<String>) -> Self {
        self.remapper = self
            .remapper
            .clone()
            .add_pattern(from, to)
            .expect("Invalid regex pattern");
        self.cache = None;
        self
    }

    /// Whether errors while applying (a shape or dtype that does not fit) fail the load
    /// (default true).
    pub fn validate(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// Whether parameters missing from the file are allowed (default false): the
    /// [`ApplyResult`] then lists them.
    pub fn allow_partial(mut self, allow: bool) -> Self {
        self.allow_partial = allow;
        self
    }

    /// Skips enum variant names in module paths (as `burn-store`'s other stores).
    pub fn skip_enum_variants(mut self, skip: bool) -> Self {
        self.skip_enum_variants = skip;
        self
    }

    /// Transforms tensors as they are applied, e.g. `PyTorchToBurnAdapter` to transpose the
    /// `[out, in]` matrices of the file into `nn::Linear`'s `[in, out]`.
    pub fn with_from_adapter(mut self, adapter: impl ModuleAdapter + 'static) -> Self {
        self.from_adapter = Box::new(adapter);
        self
    }

    /// Keeps the tensors of the ggml types that one of Burn's quantization schemes holds without
    /// loss (Q8_0, Q4_0, MXFP4) quantized, as Burn `QFloat` tensors for `device`
    /// ([`crate::qfloat`]), instead of dequantizing them: Burn's own quantized ops run them, at
    /// the file's size. They keep the file's `[out, in]` layout (an `nn::Linear` takes them
    /// with `LinearLayout::Col`; `PyTorchToBurnAdapter` leaves quantized tensors as they are).
    pub fn keep_quantized(mut self, device: &burn::tensor::Device) -> Self {
        self.native = Some(device.clone());
        self.cache = None;
        self
    }

    /// A [`crate::GgufLoader`] over this store's file, for packed modules by tensor name
    /// (`loader.linear("blk.0.attn_q.weight")`, `embedding`, `experts`, and the
    /// [`crate::LoadReport`] of what was packed). Names are the file's: the store's key
    /// remapping does not apply. Drop the loader before `load_from(&mut store)`.
    ///
    /// # Errors
    /// [`GgufStoreError::Open`] when the file cannot be opened or parsed.
    pub fn loader(
        &mut self,
        device: &burn::tensor::Device,
        config: crate::GgufConfig,
    ) -> Result<crate::GgufLoader<'_>, GgufStoreError> {
        let file: &GgufFile = self.file()?;
        Ok(crate::GgufLoader::new(file, device, config))
    }

    fn ensure_cache(&mut self) -> Result<&BTreeMap<String, PackTensor>, GgufStoreError> {
        if self.cache.is_none() {
            let file = self.file()?.clone();
            let mut tensors = Vec::with_capacity(file.tensors().len());
            for info in file.tensors() {
                tensors.push(lazy_tensor(&file, info, self.native.as_ref())?);
            }
            if !self.remapper.is_empty() {
                tensors = self.remapper.remap(tensors).0;
            }
            self.cache = Some(tensors.into_iter().map(|t| (t.name.clone(), t)).collect());
        }
        Ok(self.cache.as_ref().expect("filled above"))
    }
}

/// The tensor `info` of `file`, its data produced when the applier reads it: F32, F16 and BF16
/// as stored, the types [`crate::qfloat`] maps as Burn `QFloat` data for `native`'s device when
/// it is given, other types dequantized to f32.
fn lazy_tensor(
    file: &Arc<GgufFile>,
    info: &TensorInfo,
    native: Option<&burn::tensor::Device>,
) -> Result<PackTensor, GgufStoreError> {
    let err = |reason: String| GgufStoreError::Tensor {
        name: info.name.clone(),
        reason,
    };
    if let Some(device) = native.filter(|_| crate::qfloat::maps(info.ggml_type)) {
        let bytes = file.tensor_data(info);
        let (file, name, ty, shape, device) = (
            file.clone(),
            info.name.clone(),
            info.ggml_type,
            info.shape(),
            device.clone(),
        );
        let scheme = crate::qfloat::qfloat_scheme(ty, &device, crate::qfloat::e_max(ty, bytes))
            .expect("a mapped type");
        let provider = move || -> Result<TensorData, PackError> {
            let info = file
                .tensor(&name)
                .ok_or_else(|| PackError::ValidationError(format!("tensor '{name}' vanished")))?;
            crate::qfloat::to_qfloat(ty, file.tensor_data(info), &shape, &device)
                .map_err(|e| PackError::ValidationError(format!("tensor '{name}': {e}")))
        };
        return Ok(burn::store::bridge::deferred(
            info.name.clone(),
            DType::QFloat(scheme),
            info.shape().into(),
            None,
            provider,
        ));
    }
    let dtype = match info.ggml_type {
        GgmlType::F32 => DType::F32,
        GgmlType::F16 => DType::F16,
        GgmlType::BF16 => DType::BF16,
        t if ggml_codec::supports(t) => DType::F32,
        t => return Err(err(format!("ggml type {t:?} has no CPU decoder"))),
    };
    let n = usize::try_from(info.n_elements()).map_err(|_| err("too many elements".into()))?;
    let (file, name, ty, shape) = (
        file.clone(),
        info.name.clone(),
        info.ggml_type,
        info.shape(),
    );
    let stored = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let provider = move || -> Result<TensorData, PackError> {
        let info = file
            .tensor(&name)
            .ok_or_else(|| PackError::ValidationError(format!("tensor '{name}' vanished")))?;
        let bytes = file.tensor_data(info);
        if stored {
            return Ok(TensorData::from_bytes_vec(
                bytes.to_vec(),
                shape.clone(),
                dtype,
            ));
        }
        let values = ggml_codec::dequantize_to_vec(ty, bytes, n)
            .map_err(|e| PackError::ValidationError(format!("tensor '{name}': {e}")))?;
        Ok(TensorData::new(values, shape.clone()))
    };
    Ok(burn::store::bridge::deferred(
        info.name.clone(),
        dtype,
        info.shape().into(),
        None,
        provider,
    ))
}

impl ModuleStore for GgufStore {
    type Error = GgufStoreError;

    fn collect_from<M: ModuleSnapshot>(&mut self, _module: &M) -> Result<(), Self::Error> {
        Err(GgufStoreError::WriteUnsupported)
    }

    fn apply_to<M: ModuleSnapshot>(&mut self, module: &mut M) -> Result<ApplyResult, Self::Error> {
        let tensors: Vec<PackTensor> = self.ensure_cache()?.values().cloned().collect();
        let filter = (!self.filter.is_empty()).then(|| self.filter.clone());
        let result = module.apply(
            tensors,
            filter,
            Some(self.from_adapter.clone()),
            self.skip_enum_variants,
        );
        if self.validate && !result.errors.is_empty() {
            return Err(GgufStoreError::Validation(format!("{:?}", result.errors)));
        }
        if !self.allow_partial && !result.missing.is_empty() {
            return Err(GgufStoreError::Missing(format!(
                "{result}\nUse `.allow_partial(true)` for an ApplyResult that lists them."
            )));
        }
        Ok(result)
    }

    fn get_tensor(&mut self, name: &str) -> Result<Option<&PackTensor>, Self::Error> {
        Ok(self.ensure_cache()?.get(name))
    }

    fn get_all_tensors(&mut self) -> Result<&BTreeMap<String, PackTensor>, Self::Error> {
        self.ensure_cache()
    }

    fn keys(&mut self) -> Result<Vec<String>, Self::Error> {
        Ok(self.ensure_cache()?.keys().cloned().collect())
    }
}

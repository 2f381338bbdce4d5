//! [`GgmlTensor`]: a 2-D ggml-quant tensor whose blocks live on the device unchanged.
use crate::Error;
use crate::ops::GgmlOps;
use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use ggml_kernels::{grid_words, kernel_block_elems, words_for_bytes, words_len};

/// Activation rows one fused GEMV pass takes (each weight read once for all of them).
pub use ggml_kernels::MAX_GEMV_ROWS;
use gguf::GgmlType;
use std::sync::Mutex;

/// Largest f32 scratch one prefill chunk dequantizes (bytes), so a weight is never dequantized
/// whole.
pub const PREFILL_SCRATCH_BYTES: usize = 64 << 20;

/// Most activation rows [`GgmlTensor::matmul_t`] runs as fused GEMVs, in passes of
/// [`MAX_GEMV_ROWS`] (a batched decode step: one row per sequence); more rows (a prompt) take
/// the dequantize-and-matmul path.
pub const GEMV_BATCH_ROWS: usize = 64;

/// One row range of a [`GgmlTensor`], held in its own device buffer.
#[derive(Clone, Debug)]
struct Part {
    /// Raw blocks as `U32` words (`ggml_kernels::words_for_bytes`), shape `[words]`.
    words: Tensor<1, Int>,
    /// First row of the tensor this part holds.
    row_start: usize,
    /// Rows in this part.
    rows: usize,
}

/// A 2-D ggml-quant tensor: shape `[rows, cols]` in Burn order (ggml `ne = [cols, rows]`), blocks
/// running along `cols`. The bytes are the GGUF file's, unchanged, split by rows into parts
/// that each fit one device storage buffer (lavapipe caps them at 128 MiB; Gemma 3's
/// 262144 x 640 Q8_0 `token_embd` is 178 MB).
#[derive(Clone, Debug)]
pub struct GgmlTensor {
    ggml_type: GgmlType,
    shape: [usize; 2],
    parts: Vec<Part>,
    /// The type's codebook ([`grid_words`]), shared by every tensor of this type on the device.
    grid: Tensor<1, Int>,
}

/// A constant of a module: moved between devices with it (the blocks re-uploaded as they are),
/// never a trainable parameter.
impl burn::module::Module for GgmlTensor {
    fn visit<V: burn::module::ModuleVisitor>(&self, _visitor: &mut V) {}

    fn map<M: burn::module::ModuleMapper>(self, _mapper: &mut M) -> Self {
        self
    }

    fn to_device(self, device: &Device) -> Self {
        // Buffer limits are checked at upload; parts are moved as they are.
        let grid = grid_tensor(self.ggml_type, device).unwrap_or(self.grid);
        Self {
            parts: self
                .parts
                .into_iter()
                .map(|p| Part {
                    words: p.words.to_device(device),
                    ..p
                })
                .collect(),
            grid,
            ..self
        }
    }

    fn fork(self, device: &Device) -> Self {
        self.to_device(device)
    }

    fn collect_devices(&self, mut devices: burn::module::Devices) -> burn::module::Devices {
        for p in &self.parts {
            let device = p.words.device();
            if !devices.contains(&device) {
                devices.push(device);
            }
        }
        devices
    }

    fn materialize(self) -> Self {
        self
    }

    fn valid(&self) -> Self {
        self.clone()
    }

    fn train(self) -> Self {
        self
    }
}

impl burn::module::ModuleDisplayDefault for GgmlTensor {
    fn content(&self, content: burn::module::Content) -> Option<burn::module::Content> {
        content
            .add_single(&format!(
                "GgmlTensor {{type: {}, shape: {:?}, parts: {}}}",
                self.ggml_type,
                self.shape,
                self.parts.len()
            ))
            .optional()
    }
}

impl burn::module::ModuleDisplay for GgmlTensor {}

/// Codebooks already on a device, one per (ggml type, device): at most 16 KiB each.
static GRIDS: Mutex<Vec<(GgmlType, Device, Tensor<1, Int>)>> = Mutex::new(Vec::new());

/// The codebook tensor of `ty` on `device`, uploaded on first use.
fn grid_tensor(ty: GgmlType, device: &Device) -> Option<Tensor<1, Int>> {
    let mut grids = GRIDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, t)) = grids.iter().find(|(t, d, _)| *t == ty && d == device) {
        return Some(t.clone());
    }
    let words = grid_words(ty)?;
    let len = words.len();
    let t = Tensor::<1, Int>::from_data(TensorData::new(words, [len]), (device, DType::U32));
    grids.push((ty, device.clone(), t.clone()));
    Some(t)
}

impl GgmlTensor {
    /// Uploads `bytes` (`rows` rows of `cols` elements of `ggml_type`, as in a GGUF data section)
    /// to `device`, split by rows into buffers of at most the device's buffer limit
    /// ([`crate::max_buffer_bytes`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when no kernel decodes `ggml_type` or the device is not a CubeCL
    /// one; [`Error::Shape`] when `cols` is not a multiple of the kernel block or `bytes` has the
    /// wrong length.
    pub fn from_bytes(
        bytes: &[u8],
        ggml_type: GgmlType,
        shape: [usize; 2],
        device: &Device,
    ) -> Result<Self, Error> {
        let max_buffer = crate::max_buffer_bytes(device).ok_or_else(|| Error::Unsupported {
            ggml_type,
            reason: "the device is not a CubeCL device".into(),
        })?;
        Self::from_bytes_with_limit(bytes, ggml_type, shape, device, max_buffer)
    }

    /// [`GgmlTensor::from_bytes`] with buffers of at most `max_buffer` bytes (rows are never split;
    /// each buffer also holds up to `ggml_kernels::PAD_BYTES` of padding).
    ///
    /// # Errors
    /// As [`GgmlTensor::from_bytes`], and [`Error::Shape`] when one row does not fit `max_buffer`.
    pub fn from_bytes_with_limit(
        bytes: &[u8],
        ggml_type: GgmlType,
        shape: [usize; 2],
        device: &Device,
        max_buffer: u64,
    ) -> Result<Self, Error> {
        let [rows, cols] = shape;
        let rows_per_part = Self::rows_per_buffer(ggml_type, shape, max_buffer)?;
        let row_bytes = ggml_type
            .row_bytes(cols as u64)
            .map_err(|e| Error::Shape(e.to_string()))? as usize;
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(Error::Shape(format!(
                "{ggml_type} tensor [{rows}, {cols}] needs {rows} x {row_bytes} bytes, got {}",
                bytes.len()
            )));
        }
        let parts = (0..rows)
            .step_by(rows_per_part)
            .map(|row_start| {
                let n = rows_per_part.min(rows - row_start);
                let chunk = &bytes[row_start * row_bytes..(row_start + n) * row_bytes];
                let words = words_for_bytes(chunk);
                debug_assert_eq!(words.len(), words_len(chunk.len()));
                let len = words.len();
                let words = Tensor::<1, Int>::from_data(
                    TensorData::new(words, [len]),
                    (device, DType::U32),
                );
                Part {
                    words,
                    row_start,
                    rows: n,
                }
            })
            .collect();
        Ok(Self {
            ggml_type,
            shape,
            parts,
            grid: grid_tensor(ggml_type, device).ok_or_else(|| Error::Unsupported {
                ggml_type,
                reason: "no kernel decodes this type".into(),
            })?,
        })
    }

    /// Whether a `[rows, cols]` tensor of `ggml_type` can be packed in buffers of at most
    /// `max_buffer` bytes, and if so how many rows each buffer holds.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when no kernel decodes `ggml_type`; [`Error::Shape`] when `cols` is
    /// not a positive multiple of the kernel block, or one row does not fit a buffer.
    pub fn rows_per_buffer(
        ggml_type: GgmlType,
        shape: [usize; 2],
        max_buffer: u64,
    ) -> Result<usize, Error> {
        let [rows, cols] = shape;
        let max_buffer = max_buffer.min(u32::MAX as u64) as usize;
        let be = kernel_block_elems(ggml_type).ok_or_else(|| Error::Unsupported {
            ggml_type,
            reason: "no kernel decodes this type".into(),
        })?;
        if cols == 0 || rows == 0 || !cols.is_multiple_of(be) {
            return Err(Error::Shape(format!(
                "{ggml_type} tensor [{rows}, {cols}]: row length is not a positive multiple of {be}"
            )));
        }
        let row_bytes = ggml_type
            .row_bytes(cols as u64)
            .map_err(|e| Error::Shape(e.to_string()))? as usize;
        let rows_per_part = max_buffer.saturating_sub(ggml_kernels::PAD_BYTES) / row_bytes;
        if rows_per_part == 0 {
            return Err(Error::Shape(format!(
                "one row of {row_bytes} bytes exceeds the device's {max_buffer}-byte buffers"
            )));
        }
        Ok(rows_per_part)
    }

    /// The ggml type of the blocks.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// `[rows, cols]` (Burn order).
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// Device buffers this tensor is split into.
    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }

    /// Each part's blocks (`U32` words), first row and rows, in row order.
    pub(crate) fn part_words(&self) -> impl Iterator<Item = (Tensor<1, Int>, usize, usize)> + '_ {
        self.parts
            .iter()
            .map(|p| (p.words.clone(), p.row_start, p.rows))
    }

    /// The type's codebook ([`grid_words`]) on the device.
    pub(crate) fn grid(&self) -> Tensor<1, Int> {
        self.grid.clone()
    }

    /// The device the blocks live on.
    pub fn device(&self) -> Device {
        self.parts[0].words.device()
    }

    /// `x W^T`: `x` `[m, cols]` f32 -> `[m, rows]` f32. Up to [`GEMV_BATCH_ROWS`] rows use the
    /// fused GEMV, in passes of [`MAX_GEMV_ROWS`] rows (each reads the weight once); more rows
    /// (prefill) take [`GgmlOps::ggml_dequantize_matmul`] (the tile kernel, or at most
    /// [`PREFILL_SCRATCH_BYTES`] of weight rows dequantized at a time and Burn's matmul). On an
    /// autodiff device the GEMV takes at most
    /// [`MAX_GEMV_ROWS`] rows (one pass). Either way the blocks get no gradient and `x` gets
    /// `dy W` ([`crate::autodiff`]).
    ///
    /// # Panics
    /// If `x`'s last dimension is not `cols` (a programming error in the caller's shapes).
    pub fn matmul_t(&self, x: Tensor<2>) -> Tensor<2> {
        let [m, k] = x.dims();
        let [_, cols] = self.shape;
        assert_eq!(
            k, cols,
            "GgmlTensor::matmul_t: x has {k} columns, the weight {cols}"
        );
        let device = x.device();
        // Under autodiff (training) more than one GEMV pass of rows takes the dequantize +
        // matmul path, as llama.cpp's GPU backends leave mat-vec past 8 columns: the backward
        // pass dequantizes the rows anyway (on lavapipe the two measured within noise for
        // Gemma's ~50-token sequences, docs/finetune.md).
        let batch_rows = match device.is_autodiff() {
            true => MAX_GEMV_ROWS,
            false => GEMV_BATCH_ROWS,
        };
        let in_one_op = m <= MAX_GEMV_ROWS
            || (m <= batch_rows
                && (self.parts.iter()).all(|p| self.passes_fit(&device, m, cols, p.rows)));
        if !in_one_op && m <= batch_rows {
            return Tensor::cat(
                passes(x, m).into_iter().map(|x| self.matmul_t(x)).collect(),
                0,
            );
        }
        let outs: Vec<Tensor<2>> = if in_one_op {
            self.parts
                .iter()
                .map(|p| {
                    Tensor::from_dispatch(Dispatch::ggml_gemv(
                        p.words.clone().into_dispatch(),
                        self.grid.clone().into_dispatch(),
                        x.clone().into_dispatch(),
                        self.ggml_type,
                        p.rows,
                        cols,
                    ))
                })
                .collect()
        } else {
            // One product per buffer; the op bounds its own scratch where it needs one.
            (self.parts.iter())
                .map(|p| self.matmul_t_part(x.clone(), p, 0, p.rows))
                .collect()
        };
        if outs.len() == 1 {
            outs.into_iter().next().unwrap()
        } else {
            Tensor::cat(outs, 1)
        }
    }

    /// `act(x W_gate^T) * (x W_up^T)` of a stacked gate/up projection (this tensor: the gate's
    /// `rows / 2` rows, then up's) in one fused GEMV ([`GgmlOps::ggml_gemv_glu`]): `x`
    /// `[m, cols]` f32 -> `[m, rows / 2]` f32, ggml's GELU (tanh approximation) when `gelu`,
    /// else SiLU, in passes of [`MAX_GEMV_ROWS`] rows. `None` where that kernel does not apply
    /// (more than [`GEMV_BATCH_ROWS`] rows, an odd row count, or the blocks split over several
    /// buffers): the caller runs the GEMV and the activation apart.
    ///
    /// # Panics
    /// If `x`'s last dimension is not `cols` (a programming error in the caller's shapes).
    pub fn matmul_t_gated(&self, x: Tensor<2>, gelu: bool) -> Option<Tensor<2>> {
        let [m, k] = x.dims();
        let [rows, cols] = self.shape;
        assert_eq!(
            k, cols,
            "GgmlTensor::matmul_t_gated: x has {k} columns, the weight {cols}"
        );
        if m > GEMV_BATCH_ROWS || rows % 2 == 1 || self.parts.len() != 1 {
            return None;
        }
        if m > MAX_GEMV_ROWS && !self.passes_fit(&x.device(), m, cols, rows / 2) {
            let outs = passes(x, m)
                .into_iter()
                .map(|x| self.matmul_t_gated(x, gelu))
                .collect::<Option<Vec<_>>>()?;
            return Some(Tensor::cat(outs, 0));
        }
        let p = &self.parts[0];
        Some(Tensor::from_dispatch(Dispatch::ggml_gemv_glu(
            p.words.clone().into_dispatch(),
            self.grid.clone().into_dispatch(),
            x.into_dispatch(),
            self.ggml_type,
            p.rows,
            cols,
            gelu,
        )))
    }

    /// Row ranges `(first, n)` that cover the tensor in order, each within one device buffer
    /// and at most [`PREFILL_SCRATCH_BYTES`] of f32 once dequantized: the pieces of
    /// [`Self::matmul_t_rows`] (a large vocabulary's output head, a piece at a time).
    pub fn row_chunks(&self) -> Vec<(usize, usize)> {
        let parts = self.parts.iter().map(|p| (p.row_start, p.rows));
        row_chunks_of(parts, self.shape[1])
    }

    /// `x W[first..first + n]^T`: `x` `[m, cols]` f32 -> `[m, n]` f32, one
    /// [`GgmlOps::ggml_dequantize_matmul`] (under `Autodiff`, `dx` comes from the blocks again:
    /// nothing is kept).
    ///
    /// # Panics
    /// If the rows are not within one of [`Self::row_chunks`]'s buffers or `x`'s last dimension
    /// is not `cols` (programming errors in the caller).
    pub fn matmul_t_rows(&self, x: Tensor<2>, first: usize, n: usize) -> Tensor<2> {
        let cols = self.shape[1];
        assert_eq!(
            x.dims()[1],
            cols,
            "GgmlTensor::matmul_t_rows: x {:?}",
            x.dims()
        );
        let p = self
            .parts
            .iter()
            .find(|p| (p.row_start..p.row_start + p.rows).contains(&first))
            .filter(|p| first + n <= p.row_start + p.rows && n > 0)
            .unwrap_or_else(|| panic!("rows {first}..{} span buffers", first + n));
        self.matmul_t_part(x, p, first - p.row_start, n)
    }

    /// `x P[first..first + n]^T` over rows of one buffer `p` ([`GgmlOps::ggml_dequantize_matmul`]).
    fn matmul_t_part(&self, x: Tensor<2>, p: &Part, first: usize, n: usize) -> Tensor<2> {
        Tensor::from_dispatch(Dispatch::ggml_dequantize_matmul(
            p.words.clone().into_dispatch(),
            self.grid.clone().into_dispatch(),
            x.into_dispatch(),
            self.ggml_type,
            first,
            n,
            p.rows,
            self.shape[1],
            false,
        ))
    }

    /// Whether one GEMV op takes `m` rows of `cols` into `out` outputs in passes over views of
    /// its buffers ([`crate::ops::gemv_passes_fit`]) on `device`.
    fn passes_fit(&self, device: &Device, m: usize, cols: usize, out: usize) -> bool {
        crate::cube_client(device).is_some_and(|c| {
            crate::ops::gemv_passes_fit(m, cols, out, c.properties().memory.alignment)
        })
    }

    /// Dequantizes the rows `ids` (embedding lookup): `[ids.len(), cols]` f32.
    ///
    /// # Errors
    /// [`Error::Shape`] if an id is not below `rows`.
    pub fn gather_rows(&self, ids: &[u32]) -> Result<Tensor<2>, Error> {
        let [rows, _] = self.shape;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= rows) {
            return Err(Error::Shape(format!(
                "row id {bad} out of range for {rows} rows"
            )));
        }
        let device = self.device();
        let mut out: Option<Tensor<2>> = None;
        // Only the parts that hold one of the rows (a decoding step's one id is one launch);
        // the first for no ids.
        let mut parts: Vec<&Part> = self
            .parts
            .iter()
            .filter(|p| {
                ids.iter()
                    .any(|&id| (p.row_start..p.row_start + p.rows).contains(&(id as usize)))
            })
            .collect();
        if parts.is_empty() {
            parts.extend(self.parts.first());
        }
        for p in parts {
            let part = self.dequantize_part_rows(p, ids.to_vec(), p.row_start, &device);
            out = Some(match out {
                None => part,
                Some(acc) => acc + part,
            });
        }
        Ok(out.expect("a GgmlTensor has at least one part"))
    }

    /// The whole tensor dequantized on the device, `[rows, cols]` f32 (tests and fallbacks).
    pub fn dequantize(&self) -> Tensor<2> {
        let ids: Vec<u32> = (0..self.shape[0] as u32).collect();
        self.gather_rows(&ids).expect("ids are in range")
    }

    fn dequantize_part_rows(
        &self,
        p: &Part,
        ids: Vec<u32>,
        row_start: usize,
        device: &Device,
    ) -> Tensor<2> {
        let n = ids.len();
        let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), (device, DType::U32));
        Tensor::from_dispatch(Dispatch::ggml_dequantize_rows(
            p.words.clone().into_dispatch(),
            self.grid.clone().into_dispatch(),
            ids.into_dispatch(),
            self.ggml_type,
            row_start,
            p.rows,
            self.shape[1],
        ))
    }
}

/// Weight rows of `cols` values one prefill chunk dequantizes: at most
/// [`PREFILL_SCRATCH_BYTES`] of f32, at least one row.
pub(crate) fn prefill_chunk_rows(cols: usize) -> usize {
    (PREFILL_SCRATCH_BYTES / (cols.max(1) * size_of::<f32>())).max(1)
}

/// Row ranges `(first, n)` covering buffers of `(row_start, rows)` rows of `cols` values in
/// order, each within one buffer and at most [`prefill_chunk_rows`] long.
pub(crate) fn row_chunks_of(
    parts: impl Iterator<Item = (usize, usize)>,
    cols: usize,
) -> Vec<(usize, usize)> {
    let chunk = prefill_chunk_rows(cols);
    parts
        .flat_map(|(row_start, rows)| {
            (0..rows)
                .step_by(chunk)
                .map(move |s| (row_start + s, chunk.min(rows - s)))
        })
        .collect()
}

/// `x` `[m, cols]` in passes of at most [`MAX_GEMV_ROWS`] rows.
fn passes(x: Tensor<2>, m: usize) -> Vec<Tensor<2>> {
    (0..m)
        .step_by(MAX_GEMV_ROWS)
        .map(|start| x.clone().narrow(0, start, MAX_GEMV_ROWS.min(m - start)))
        .collect()
}

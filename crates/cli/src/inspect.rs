//! `burn-gguf inspect`: what a GGUF file holds, and any tensor's values from the CPU codec or the
//! device kernels (to diff by hand).
use burn_gguf::{GgmlTensor, LoadKind};
use gguf::{GgufFile, MetadataArray, MetadataValue, TensorInfo};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

/// Elements of an array shown at each end.
const SHOWN: usize = 5;

fn scalar(v: &MetadataValue) -> String {
    match v {
        MetadataValue::String(s) => format!("{s:?}"),
        MetadataValue::Array(a) => array(a),
        MetadataValue::U8(x) => x.to_string(),
        MetadataValue::I8(x) => x.to_string(),
        MetadataValue::U16(x) => x.to_string(),
        MetadataValue::I16(x) => x.to_string(),
        MetadataValue::U32(x) => x.to_string(),
        MetadataValue::I32(x) => x.to_string(),
        MetadataValue::U64(x) => x.to_string(),
        MetadataValue::I64(x) => x.to_string(),
        MetadataValue::F32(x) => x.to_string(),
        MetadataValue::F64(x) => x.to_string(),
        MetadataValue::Bool(x) => x.to_string(),
    }
}

/// `[a, b, c, ..., y, z]` with the first and last [`SHOWN`] elements.
fn abbreviate<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let n = items.len();
    let parts: Vec<String> = if n <= 2 * SHOWN {
        items.iter().map(&show).collect()
    } else {
        let mut p: Vec<String> = items[..SHOWN].iter().map(&show).collect();
        p.push(format!("... ({} more)", n - 2 * SHOWN));
        p.extend(items[n - SHOWN..].iter().map(&show));
        p
    };
    format!("[{}]", parts.join(", "))
}

fn array(a: &MetadataArray) -> String {
    match a {
        MetadataArray::U8(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::I8(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::U16(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::I16(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::U32(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::I32(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::U64(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::I64(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::F32(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::F64(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::Bool(v) => abbreviate(v, |x| x.to_string()),
        MetadataArray::String(v) => abbreviate(v, |x| format!("{x:?}")),
        MetadataArray::Array(v) => abbreviate(v, array),
    }
}

/// The report for `file`: header, metadata (arrays abbreviated), the tensor table (Burn-order
/// shapes, and what the loader would do with each tensor on `device`: packed, dense, or
/// dequantized and why), and a histogram of ggml types with bits per weight.
pub fn summary(file: &GgufFile, device: &burn::tensor::Device) -> String {
    let mut out = String::new();
    let tensors = file.tensors();
    let _ = writeln!(
        out,
        "GGUF v{} ({}), {} bytes, alignment {}, data section at byte {}, {} metadata keys, {} tensors",
        file.version(),
        match file.byte_order() {
            gguf::ByteOrder::Little => "little-endian",
            gguf::ByteOrder::Big => "big-endian, tensor data swapped on read",
        },
        file.file_size(),
        file.alignment(),
        file.data_offset(),
        file.metadata().len(),
        tensors.len()
    );
    let _ = writeln!(out, "\nmetadata:");
    for (k, v) in file.metadata() {
        let _ = writeln!(out, "  {k} ({}) = {}", v.value_type_name(), scalar(v));
    }
    let _ = writeln!(
        out,
        "\ntensors (shape in Burn order, rows last-dim blocks; load plan on this device):"
    );
    let config = burn_gguf::GgufConfig::default();
    for t in tensors {
        let plan = match burn_gguf::plan(t, device, &config) {
            LoadKind::Packed => "packed".to_string(),
            LoadKind::Dense => "dense".to_string(),
            LoadKind::Dequantized(why) => format!("dequantized: {why}"),
        };
        let _ = writeln!(
            out,
            "  {:<40} {:<8} {:>20} {:>12} bytes  {plan}",
            t.name,
            t.ggml_type.name(),
            format!("{:?}", t.shape()),
            t.n_bytes
        );
    }
    let mut hist: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for t in tensors {
        let e = hist.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.n_bytes;
    }
    let _ = writeln!(out, "\ntypes:");
    let bpw = |bytes: u64, n: u64| bytes as f64 * 8.0 / (n.max(1)) as f64;
    for (ty, (count, n, bytes)) in &hist {
        let _ = writeln!(
            out,
            "  {ty:<8} {count:>4} tensors {n:>12} weights {bytes:>12} bytes {:>7.3} bits/weight",
            bpw(*bytes, *n)
        );
    }
    let n: u64 = tensors.iter().map(TensorInfo::n_elements).sum();
    let bytes: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    let _ = writeln!(
        out,
        "  total    {:>4} tensors {n:>12} weights {bytes:>12} bytes {:>7.3} bits/weight",
        tensors.len(),
        bpw(bytes, n)
    );
    out
}

/// Values of tensor `name`, in Burn row-major order: from the CPU codec, or (`kernels`) from the
/// device kernels (the tensor is uploaded packed and dequantized there).
///
/// # Errors
/// Missing tensor, a type without a codec (or without a kernel, with `kernels`), or a device error.
pub fn tensor_values(file: &GgufFile, name: &str, kernels: bool) -> Result<Vec<f32>, String> {
    let info = file
        .tensor(name)
        .ok_or_else(|| format!("no tensor '{name}' in the file"))?;
    let n = usize::try_from(info.n_elements()).map_err(|e| e.to_string())?;
    let bytes = file.tensor_data(info);
    if !kernels {
        return ggml_codec::dequantize_to_vec(info.ggml_type, bytes, n)
            .map_err(|e| format!("tensor '{name}': {e}"));
    }
    // All leading dims are rows of the last one.
    let cols = *info
        .shape()
        .last()
        .ok_or_else(|| format!("tensor '{name}' has no dims"))?;
    let rows = n / cols.max(1);
    let dev = burn_gguf::default_device();
    let t = GgmlTensor::from_bytes(bytes, info.ggml_type, [rows, cols], &dev)
        .map_err(|e| format!("tensor '{name}': {e}"))?;
    let data = t
        .dequantize()
        .try_into_data()
        .map_err(|e| format!("device: {e:?}"))?;
    data.try_to_vec::<f32>()
        .map_err(|e| format!("device: {e:?}"))
}

/// Runs `inspect`: the summary, or one value per line of tensor `tensor`.
///
/// # Errors
/// As [`tensor_values`], and unreadable files.
pub fn run(path: &std::path::Path, tensor: Option<&str>, kernels: bool) -> Result<(), String> {
    let file = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut stdout = std::io::stdout().lock();
    match tensor {
        None => stdout.write_all(summary(&file, &burn_gguf::default_device()).as_bytes()),
        Some(name) => {
            let values = tensor_values(&file, name, kernels)?;
            let mut s = String::with_capacity(values.len() * 12);
            for v in values {
                let _ = writeln!(s, "{v}");
            }
            stdout.write_all(s.as_bytes())
        }
    }
    .or_else(|e| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Ok(())
        } else {
            Err(e.to_string())
        }
    })
}

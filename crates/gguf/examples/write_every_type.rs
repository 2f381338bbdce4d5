//! Writes a GGUF file with one small tensor of every ggml type and metadata of every value type,
//! plus a JSON manifest of what was written, for an independent reader to check
//! (`tools/check_gguf_py.py` reads the file with gguf-py, the `gguf` package on PyPI).
//!
//! `cargo run -p gguf --example write_every_type -- OUT_DIR [--exclude TYPE,...]` writes
//! `OUT_DIR/every_type.gguf` and `OUT_DIR/every_type.json`. `--exclude` leaves out types the
//! other reader does not read as ggml defines them: gguf-py 0.19.0, the newest on PyPI, lacks
//! Q2_0 (ggml type 42) and sizes a Q8_1 block as 40 bytes, where ggml-common.h `block_q8_1` is 36
//! (two f16 and 32 int8 since 2023).

use std::path::PathBuf;

use gguf::{GgmlType, GgufWriter, MetadataArray, MetadataValue};

/// A value as the manifest states it: GGUF type name and a JSON value (floats as their bit
/// patterns, so that the check is exact).
fn manifest_value(v: &MetadataValue) -> serde_json::Value {
    use MetadataValue as V;
    let (ty, value) = match v {
        V::U8(x) => ("UINT8", serde_json::json!(x)),
        V::I8(x) => ("INT8", serde_json::json!(x)),
        V::U16(x) => ("UINT16", serde_json::json!(x)),
        V::I16(x) => ("INT16", serde_json::json!(x)),
        V::U32(x) => ("UINT32", serde_json::json!(x)),
        V::I32(x) => ("INT32", serde_json::json!(x)),
        V::F32(x) => ("FLOAT32", serde_json::json!({ "f32_bits": x.to_bits() })),
        V::Bool(x) => ("BOOL", serde_json::json!(x)),
        V::String(x) => ("STRING", serde_json::json!(x)),
        V::U64(x) => ("UINT64", serde_json::json!(x)),
        V::I64(x) => ("INT64", serde_json::json!(x)),
        V::F64(x) => ("FLOAT64", serde_json::json!({ "f64_bits": x.to_bits() })),
        V::Array(a) => {
            let items: Vec<serde_json::Value> = match a {
                MetadataArray::String(s) => s.iter().map(|x| serde_json::json!(x)).collect(),
                MetadataArray::I32(s) => s.iter().map(|x| serde_json::json!(x)).collect(),
                MetadataArray::F32(s) => s
                    .iter()
                    .map(|x| serde_json::json!({ "f32_bits": x.to_bits() }))
                    .collect(),
                MetadataArray::U8(s) => s.iter().map(|x| serde_json::json!(x)).collect(),
                other => panic!("no manifest form for {other:?}"),
            };
            let elem = a.element_type().name();
            return serde_json::json!({ "type": "ARRAY", "element_type": elem, "value": items });
        }
    };
    serde_json::json!({ "type": ty, "value": value })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: write_every_type OUT_DIR [--exclude TYPE,...]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = PathBuf::from(args.first().ok_or(usage)?);
    let exclude: Vec<GgmlType> = match args.get(1).map(String::as_str) {
        None => Vec::new(),
        Some("--exclude") => args
            .get(2)
            .ok_or(usage)?
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(usage.into()),
    };
    std::fs::create_dir_all(&out)?;
    use MetadataValue as V;
    let metadata = vec![
        ("general.architecture", V::String("llama".into())),
        ("test.u8", V::U8(250)),
        ("test.i8", V::I8(-5)),
        ("test.u16", V::U16(60000)),
        ("test.i16", V::I16(-30000)),
        ("test.u32", V::U32(4_000_000_000)),
        ("test.i32", V::I32(-2_000_000_000)),
        ("test.f32", V::F32(-0.1)),
        ("test.bool", V::Bool(true)),
        ("test.string", V::String("ggml ✓".into())),
        ("test.u64", V::U64(u64::MAX - 1)),
        ("test.i64", V::I64(i64::MIN + 1)),
        ("test.f64", V::F64(std::f64::consts::E)),
        (
            "test.strings",
            V::Array(MetadataArray::String(vec![
                "<s>".into(),
                "".into(),
                "▁a".into(),
            ])),
        ),
        (
            "test.i32s",
            V::Array(MetadataArray::I32(vec![-1, 0, 1 << 30])),
        ),
        (
            "test.f32s",
            V::Array(MetadataArray::F32(vec![1.5, -0.0, 1e-30])),
        ),
        ("test.u8s", V::Array(MetadataArray::U8(vec![0, 255]))),
    ];
    let mut w = GgufWriter::new();
    let mut manifest_kv = serde_json::Map::new();
    for (k, v) in &metadata {
        w.add_metadata(*k, v.clone());
        manifest_kv.insert(k.to_string(), manifest_value(v));
    }
    let mut manifest_tensors = Vec::new();
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|t| !exclude.contains(t))
        .collect();
    for (i, &ty) in types.iter().enumerate() {
        // Two rows of one block each (or 32 elements of the plain types); deterministic bytes.
        let ne = [ty.block_size().max(32) as u64, 2];
        let n = ty.row_bytes(ne[0])? as usize * 2;
        let data: Vec<u8> = (0..n).map(|j| (j * 37 + i * 11 + 5) as u8).collect();
        let name = format!("tensor.{}", ty.name());
        w.add_tensor(&name, ty, &ne, &data)?;
        manifest_tensors.push(serde_json::json!({
            "name": name,
            "type": ty.name(),
            "type_id": ty.id(),
            "ne": ne,
            "hex": data.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        }));
    }
    let gguf_path = out.join("every_type.gguf");
    w.write(&gguf_path)?;
    let manifest = serde_json::json!({ "metadata": manifest_kv, "tensors": manifest_tensors });
    std::fs::write(
        out.join("every_type.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    println!(
        "wrote {} ({} tensors, {} metadata keys)",
        gguf_path.display(),
        types.len(),
        metadata.len()
    );
    Ok(())
}

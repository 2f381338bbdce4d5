//! The real Gemma 3 270M Q4_K_M file, checked against `shared/fixtures/gemma/
//! gemma3_270m_q4_k_m_metadata.json`. Skipped (with a note) when the model is absent.
//! Path: `$BURN_GGUF_GEMMA`, else `$HOME/.cache/burn-gguf/models/gemma-3-270m-q4_k_m.gguf`.

use std::path::PathBuf;

use gguf::{GgmlType, GgufError, GgufFile, MetadataArray, MetadataValue};
use serde_json::Value;

/// `../shared/fixtures` beside the checkout, found from the package directory cargo runs the
/// test in (not a path baked in at compile time, so a build reused from another clone works).
fn fixtures() -> String {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    format!("{dir}/../../../shared/fixtures")
}

fn gemma_path() -> Option<PathBuf> {
    let path = match std::env::var_os("BURN_GGUF_GEMMA") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache/burn-gguf/models/gemma-3-270m-q4_k_m.gguf"),
    };
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "note: Gemma model not found at {}; skipping (set BURN_GGUF_GEMMA)",
            path.display()
        );
        None
    }
}

fn metadata_json() -> Value {
    let path = format!("{}/gemma/gemma3_270m_q4_k_m_metadata.json", fixtures());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn check_array(key: &str, a: &MetadataArray, expected: &Value) {
    let len = expected["len"].as_u64().unwrap() as usize;
    assert_eq!(a.len(), len, "{key}");
    let first5 = expected["first5"].as_array().unwrap();
    let last3 = expected["last3"].as_array().unwrap();
    let check = |i: usize, e: &Value| match a {
        MetadataArray::String(v) => assert_eq!(v[i], e.as_str().unwrap(), "{key}[{i}]"),
        MetadataArray::F32(v) => assert_eq!(v[i] as f64, e.as_f64().unwrap(), "{key}[{i}]"),
        MetadataArray::I32(v) => assert_eq!(v[i] as i64, e.as_i64().unwrap(), "{key}[{i}]"),
        other => panic!("{key}: unexpected array type {}", other.value_type_name()),
    };
    for (i, e) in first5.iter().enumerate() {
        check(i, e);
    }
    for (j, e) in last3.iter().enumerate() {
        check(len - last3.len() + j, e);
    }
}

#[test]
fn gemma_header_matches_fixture() {
    let Some(path) = gemma_path() else { return };
    let json = metadata_json();
    let f = GgufFile::open(&path).unwrap();

    assert_eq!(f.version(), 3);
    assert_eq!(f.file_size(), json["size_bytes"].as_u64().unwrap());
    assert_eq!(f.tensors().len(), 236);
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), 6_525_120);
    assert_eq!(
        f.data_offset(),
        json["data_section_offset"].as_u64().unwrap()
    );
    assert_eq!(f.architecture().unwrap(), "gemma3");

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.ne, vec![640, 262_144]);
    assert_eq!(embd.shape(), vec![262_144, 640]);
    assert_eq!(embd.n_bytes, 178_257_920);
    assert_eq!(embd.offset, 2560);
    assert_eq!(f.tensor_data(embd).len(), 178_257_920);
    assert!(f.tensor("output.weight").is_none());

    // Every tensor, in file order.
    let tensors = json["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensors().len());
    for (t, e) in f.tensors().iter().zip(tensors) {
        assert_eq!(t.name, e["name"].as_str().unwrap());
        assert_eq!(
            t.ggml_type.name(),
            e["type"].as_str().unwrap(),
            "{}",
            t.name
        );
        let ne: Vec<u64> = e["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.ne, ne, "{}", t.name);
        assert_eq!(t.n_bytes, e["n_bytes"].as_u64().unwrap(), "{}", t.name);
        assert_eq!(
            t.offset,
            e["offset_in_data"].as_u64().unwrap(),
            "{}",
            t.name
        );
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    }

    // Every key/value: type name and value (arrays: length, first 5 and last 3).
    let kvs = json["metadata"].as_object().unwrap();
    assert_eq!(kvs.len(), f.metadata().len());
    for (key, value) in f.metadata() {
        let e = &kvs[key.as_str()];
        assert_eq!(
            value.value_type_name(),
            e["type"].as_str().unwrap(),
            "{key}"
        );
        match value {
            MetadataValue::Array(a) => check_array(key, a, e),
            MetadataValue::String(s) => assert_eq!(s, e["value"].as_str().unwrap(), "{key}"),
            MetadataValue::U32(v) => assert_eq!(*v as u64, e["value"].as_u64().unwrap(), "{key}"),
            MetadataValue::F32(v) => assert_eq!(*v as f64, e["value"].as_f64().unwrap(), "{key}"),
            MetadataValue::Bool(v) => assert_eq!(*v, e["value"].as_bool().unwrap(), "{key}"),
            other => panic!("{key}: unexpected type {}", other.value_type_name()),
        }
    }
    assert_eq!(f.get_u32("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(f.get_f32("gemma3.rope.freq_base").unwrap(), 1e6);
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap()[2],
        "<bos>"
    );
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        262_144
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        262_144
    );
    assert!(f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
}

/// Case C02 on the real file: drop the last byte and the last tensor (by data offset) is named.
#[test]
fn gemma_truncated_by_one_byte() {
    let Some(path) = gemma_path() else { return };
    let json = metadata_json();
    let last = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|t| t["offset_in_data"].as_u64().unwrap())
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.pop();
    match GgufFile::from_bytes(bytes).unwrap_err() {
        GgufError::Tensor { name, reason } => {
            assert_eq!(name, last);
            assert!(reason.contains("past the end of the file"), "{reason}");
        }
        other => panic!("expected a tensor error, got {other}"),
    }
}

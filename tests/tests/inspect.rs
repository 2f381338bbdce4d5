//! `burn-gguf inspect`: the summary of a real file, and the CPU codec and the device kernels
//! giving bit-identical values for one tensor of every type in the fixtures.
use burn_gguf_cli::inspect::{summary, tensor_values};
use burn_gguf_tests::fixtures;
use gguf::GgufFile;
use std::collections::BTreeMap;

#[test]
fn summary_of_gemma_lists_header_types_and_tensors() {
    let file = GgufFile::open(burn_gguf_tests::gemma_path()).unwrap();
    let s = summary(&file, &burn_gguf::default_device());
    assert!(s.starts_with("GGUF v3 (little-endian), 253113024 bytes, alignment 32, data section at byte 6525120, 33 metadata keys, 236 tensors"), "{s}");
    assert!(s.contains("token_embd.weight"), "{s}");
    // The load plan column: weights packed (token_embd's 178 MB split across buffers), norms
    // dense.
    let line = |name: &str| {
        s.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap()
    };
    assert!(line("token_embd.weight ").ends_with("packed"), "{s}");
    assert!(line("blk.0.attn_q.weight ").ends_with("packed"), "{s}");
    assert!(line("blk.0.attn_norm.weight ").ends_with("dense"), "{s}");
    assert!(s.contains("[262144, 640]"), "{s}");
    // Arrays are abbreviated: 262144 tokens shown as 5 + 5.
    assert!(s.contains("tokenizer.ggml.tokens (ARRAY[STRING]) = [\"<pad>\", \"<eos>\", \"<bos>\", \"<unk>\", \"<mask>\", ... (262134 more)"), "{s}");
    for line in [
        "  Q8_0       10 tensors",
        "  Q5_0       81 tensors",
        "  Q4_K       27 tensors",
        "  Q6_K        9 tensors",
        "  F32       109 tensors",
    ] {
        assert!(s.contains(line), "missing {line:?} in\n{s}");
    }
}

#[test]
fn codec_and_device_values_are_identical_for_every_type_with_a_kernel() {
    let mut seen = BTreeMap::new();
    let mut all = std::collections::BTreeSet::new();
    let mut paths: Vec<_> = std::fs::read_dir(fixtures().join("gguf"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "gguf") && !p.to_string_lossy().contains("imatrix")
        })
        .collect();
    paths.sort();
    for path in paths {
        let file = GgufFile::open(&path).unwrap();
        for t in file.tensors() {
            all.insert(t.ggml_type);
            if seen.contains_key(&t.ggml_type) {
                continue;
            }
            let cpu = tensor_values(&file, &t.name, false).unwrap();
            let dev = tensor_values(&file, &t.name, true).unwrap();
            assert_eq!(cpu.len(), dev.len());
            for (i, (a, b)) in cpu.iter().zip(&dev).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} {} ({}) [{i}]: codec {a}, device {b}",
                    path.display(),
                    t.name,
                    t.ggml_type
                );
            }
            seen.insert(t.ggml_type, t.name.clone());
        }
    }
    // Every type in the fixtures (F32, F16, Q4_0 .. Q8_0, the K-quants, the IQ and TQ types:
    // 23) has a kernel, and one tensor of each was compared.
    assert_eq!(seen.len(), all.len(), "{seen:?}");
    assert_eq!(all.len(), 23, "{all:?}");
}

//! Deterministic fuzz loop: mutated and truncated copies of a valid file must give `Ok` or `Err`,
//! never a panic, and every accepted file must give in-bounds tensor data.

use gguf::{GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue};

/// xorshift64*: small, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn base_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("qwen3".into()),
    );
    w.add_metadata("qwen3.block_count", MetadataValue::U32(2));
    w.add_metadata("qwen3.rope.freq_base", MetadataValue::F32(1e6));
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(MetadataArray::String(vec![
            "a".into(),
            "bc".into(),
            "<|im_end|>".into(),
        ])),
    );
    w.add_metadata(
        "tokenizer.ggml.scores",
        MetadataValue::Array(MetadataArray::F32(vec![0.0, -1.0, -2.0])),
    );
    w.add_metadata(
        "nested",
        MetadataValue::Array(MetadataArray::Array(vec![MetadataArray::I32(vec![1, 2])])),
    );
    w.add_metadata("flag", MetadataValue::Bool(true));
    w.add_tensor("token_embd.weight", GgmlType::Q8_0, &[32, 3], &[1u8; 102])
        .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        GgmlType::Q4_K,
        &[256, 1],
        &[2u8; 144],
    )
    .unwrap();
    w.add_tensor("output_norm.weight", GgmlType::F32, &[8], &[3u8; 32])
        .unwrap();
    w.to_bytes().unwrap()
}

fn exercise(bytes: Vec<u8>) -> bool {
    let len = bytes.len() as u64;
    let Ok(f) = GgufFile::from_bytes(bytes) else {
        return false;
    };
    {
        for t in f.tensors() {
            let data = f.tensor_data(t);
            assert_eq!(data.len() as u64, t.n_bytes);
            assert!(f.tensor_file_offset(t) + t.n_bytes <= len);
            assert_eq!(t.shape().len(), t.ne.len());
        }
        for (k, v) in f.metadata() {
            let _ = v.value_type_name();
            let _ = f.get_u32(k);
            let _ = f.get_f32(k);
            let _ = f.get_str(k);
            let _ = f.get_f32_array(k);
            let _ = f.get_str_array(k);
        }
        let _ = f.architecture();
    }
    true
}

#[test]
fn mutated_files_never_panic() {
    let base = base_file();
    assert!(exercise(base.clone()));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut n_ok = 0;
    let specials = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x09, 0x08, 0x04];
    for iter in 0..30_000 {
        let mut bytes = base.clone();
        let n_mut = 1 + rng.below(6);
        for _ in 0..n_mut {
            // Most mutations hit the header, where they matter.
            let limit = if rng.below(4) == 0 {
                bytes.len()
            } else {
                400.min(bytes.len())
            };
            let at = rng.below(limit);
            bytes[at] = match rng.below(3) {
                0 => rng.next() as u8,
                1 => specials[rng.below(specials.len())],
                _ => bytes[at] ^ (1 << rng.below(8)),
            };
        }
        if iter % 5 == 0 {
            let cut = rng.below(bytes.len() + 1);
            bytes.truncate(cut);
        }
        n_ok += usize::from(exercise(bytes));
    }
    // Mutations of data and padding bytes still parse: the loop exercises accepted files too.
    eprintln!("{n_ok} of 30000 mutated files parsed");
    assert!(n_ok > 1000, "{n_ok}");
}

#[test]
fn random_bytes_after_magic_never_panic() {
    let mut rng = Rng(12345);
    for _ in 0..5_000 {
        let mut bytes = b"GGUF\x03\0\0\0".to_vec();
        let n = rng.below(300);
        for _ in 0..n {
            // Small values make plausible counts and type ids.
            let b = if rng.below(2) == 0 {
                rng.below(13) as u8
            } else {
                rng.next() as u8
            };
            bytes.push(b);
        }
        let _ = exercise(bytes);
    }
}

/// Every single-byte change of every header byte to a few values.
#[test]
fn exhaustive_header_byte_changes() {
    let base = base_file();
    let header_len = GgufFile::from_bytes(base.clone()).unwrap().data_offset() as usize;
    for at in 0..header_len {
        for v in [0x00u8, 0x01, 0x09, 0x0C, 0x20, 0x7F, 0xFF] {
            let mut bytes = base.clone();
            bytes[at] = v;
            let _ = exercise(bytes);
        }
    }
}

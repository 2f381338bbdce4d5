//! Shared helpers of the integration tests: fixture paths, the real Gemma model, deterministic
//! inputs and reference math.
use std::path::PathBuf;

/// `../shared/fixtures` beside the checkout, found from the package directory cargo runs the
/// tests in (not a path baked in at compile time, so a build reused from another clone works).
pub fn fixtures() -> PathBuf {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    PathBuf::from(dir).join("../../shared/fixtures")
}

/// Reads a fixture file (panics with the path if it is missing: fixtures are part of the
/// test setup).
pub fn read_fixture(rel: &str) -> Vec<u8> {
    let p = fixtures().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// A fixture file of little-endian f32 values.
pub fn read_f32s(rel: &str) -> Vec<f32> {
    read_fixture(rel)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A fixture JSON file.
pub fn read_json(rel: &str) -> serde_json::Value {
    serde_json::from_slice(&read_fixture(rel)).unwrap_or_else(|e| panic!("fixture {rel}: {e}"))
}

/// The real Gemma 3 270M Q4_K_M file: `$BURN_GGUF_GEMMA`, else the cache (fetched on first use).
pub fn gemma_path() -> PathBuf {
    if let Some(p) = std::env::var_os("BURN_GGUF_GEMMA") {
        return PathBuf::from(p);
    }
    burn_gguf_cli::fetch::ensure_model("gemma3-270m")
        .unwrap_or_else(|e| panic!("Gemma 3 270M model: {e}"))
}

/// Deterministic pseudo-random values in [-1, 1) (`ggml_kernels::check::rand_f32`).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    ggml_kernels::check::rand_f32(n, seed)
}

/// `ids` parsed from a JSON array.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Teacher-forced logits of `tokens` through `model` from an empty cache, `[tokens.len(), vocab]`
/// row-major.
pub fn teacher_forced_logits(model: &burn_gguf_models::Decoder, tokens: &[u32]) -> Vec<f32> {
    use burn_gguf_models::CausalLm;
    let mut cache = model.new_cache();
    model
        .forward(tokens, &mut cache, true)
        .expect("forward")
        .try_into_data()
        .expect("device read-back")
        .try_to_vec::<f32>()
        .expect("f32 logits")
}

/// The largest `|a[i] - b[i]|` (the slices must be equally long).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The index of the largest value of `row` (the first of equals).
pub fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// Loads the decoder of `path` on the default device, packed or (`dequantize`) with every
/// weight dequantized; packed, it asserts that no tensor fell back to dequantization.
pub fn load_decoder(path: &std::path::Path, dequantize: bool) -> burn_gguf_models::Decoder {
    let file = gguf::GgufFile::open(path).expect("fixture");
    let device = burn_gguf::default_device();
    let config = burn_gguf::GgufConfig {
        dequantize,
        ..burn_gguf::GgufConfig::default()
    };
    let loader = burn_gguf::GgufLoader::new(&file, &device, config);
    let model = burn_gguf_models::Decoder::load(&loader).expect("load");
    if !dequantize {
        let fell_back: Vec<_> = loader
            .report()
            .dequantized()
            .map(|e| e.name.clone())
            .collect();
        assert!(fell_back.is_empty(), "{path:?}: dequantized {fell_back:?}");
    }
    model
}

/// Checks every file of `arch/reference_logits_<arch>.json` (three: F32, Q4_K_M, Q8_0), packed
/// and dequantized: teacher-forced logits within `tol` of `*.numpy.logits.f32` (exact math,
/// `arch/README.md`), and the reference's argmax (and greedy ids) on every row whose
/// top-1/top-2 margin is at least 1e-3. Returns the worst difference per file and path.
pub fn check_arch_fixtures(arch: &str, tol: f32) -> Vec<(String, bool, f32)> {
    let reference = read_json(&format!("arch/reference_logits_{arch}.json"));
    let mut checked = Vec::new();
    for (name, entry) in reference.as_object().expect("object") {
        let path = fixtures().join(format!("arch/{name}.gguf"));
        let tokens = json_ids(&entry["teacher_forced_sequence"]);
        let greedy = json_ids(&entry["greedy_ids"]);
        let n_prompt = json_ids(&entry["prompt_ids"]).len();
        let margins: Vec<f64> = entry["per_row_top1_top2_margin"]
            .as_array()
            .expect("margins")
            .iter()
            .map(|m| m.as_f64().expect("margin"))
            .collect();
        let want = read_f32s(&format!("arch/{name}.numpy.logits.f32"));
        let vocab = want.len() / tokens.len();
        for dequantize in [false, true] {
            let got = teacher_forced_logits(&load_decoder(&path, dequantize), &tokens);
            let worst = max_abs_diff(&got, &want);
            assert!(
                worst <= tol,
                "{name} (dequantize: {dequantize}): max |logit - reference| = {worst}"
            );
            let row = |l: &[f32], r: usize| argmax(&l[r * vocab..(r + 1) * vocab]);
            for r in (0..tokens.len()).filter(|&r| margins[r] >= 1e-3) {
                assert_eq!(row(&got, r), row(&want, r), "{name} row {r}");
            }
            // Row n_prompt - 1 + j chose greedy token j.
            for (j, &g) in greedy.iter().enumerate() {
                let r = n_prompt - 1 + j;
                if r < tokens.len() && margins[r] >= 1e-3 {
                    assert_eq!(row(&got, r), g as usize, "{name} greedy {j}");
                }
            }
            eprintln!("{name} dequantize={dequantize}: max |diff| {worst:.2e}");
            checked.push((name.clone(), dequantize, worst));
        }
    }
    assert_eq!(checked.len(), 6, "{arch}: three files, two paths each");
    checked
}

/// Writes a copy of the GGUF file `src` to `dst` without the tensors named in `drop`
/// (metadata, the other tensors and their bytes unchanged).
pub fn copy_gguf_without(src: &std::path::Path, dst: &std::path::Path, drop: &[&str]) {
    let file = gguf::GgufFile::open(src).expect("source");
    let mut w = gguf::GgufWriter::new();
    w.alignment(file.alignment() as u32);
    for (k, v) in file.metadata() {
        if k != "general.alignment" {
            w.add_metadata(k.clone(), v.clone());
        }
    }
    for t in file
        .tensors()
        .iter()
        .filter(|t| !drop.contains(&t.name.as_str()))
    {
        w.add_tensor(t.name.clone(), t.ggml_type, &t.ne, file.tensor_data(t))
            .expect("tensor");
    }
    w.write(dst).expect("write");
}

/// A vocabulary-only GGUF (`general.architecture` `llama`) holding the real Llama 3 tokenizer,
/// built from Meta's tiktoken file (`cargo xtask fetch-model llama3-tokenizer`: PyPI
/// `llama-models` 0.3.0, `llama_models/llama3/tokenizer.model`, 128,000 base64 tokens with
/// their ranks) as llama.cpp's converter writes a Llama 3 vocabulary: `tokenizer.ggml.model`
/// `gpt2`, `pre` `llama-bpe`, the tokens as GPT-2 byte-to-unicode strings then the 256 special
/// tokens (type 3, control), and the merges recovered from the ranks as transformers'
/// `TikTokenConverter` does (every split of a token into two tokens, ordered by the parts'
/// ranks; all merges in the order of the merged token's rank): 280,147 merges.
pub fn llama3_vocab_gguf(tokenizer_model: &std::path::Path) -> gguf::GgufFile {
    use gguf::{GgufWriter, MetadataArray, MetadataValue};
    use std::collections::HashMap;
    let text = std::fs::read_to_string(tokenizer_model).expect("tokenizer.model");
    let mut ranks: HashMap<Vec<u8>, u32> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (token, rank) = line.split_once(' ').expect("token rank");
        ranks.insert(base64_decode(token), rank.trim().parse().expect("rank"));
    }
    let n_base = ranks.len();
    // GPT-2's byte-to-unicode map: printable bytes as themselves, the rest from U+0100 up.
    let mut byte_char = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        byte_char[b as usize] = if printable {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("char")
        };
    }
    let to_str = |b: &[u8]| b.iter().map(|&x| byte_char[x as usize]).collect::<String>();
    let mut tokens = vec![String::new(); n_base];
    let mut merges: Vec<(u32, u32, u32, String)> = Vec::new();
    for (token, &rank) in &ranks {
        tokens[rank as usize] = to_str(token);
        for i in 1..token.len() {
            let (l, r) = token.split_at(i);
            if let (Some(&rl), Some(&rr)) = (ranks.get(l), ranks.get(r)) {
                merges.push((rank, rl, rr, format!("{} {}", to_str(l), to_str(r))));
            }
        }
    }
    merges.sort_unstable_by_key(|m| (m.0, m.1, m.2));
    let mut specials: Vec<String> = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    .map(String::from)
    .to_vec();
    specials.extend((2..=246).map(|i| format!("<|reserved_special_token_{i}|>")));
    assert_eq!(specials.len(), 256);
    let types: Vec<i32> = (0..n_base + 256)
        .map(|i| if i < n_base { 1 } else { 3 })
        .collect();
    tokens.extend(specials);

    let mut w = GgufWriter::new();
    let u = MetadataValue::U32;
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    );
    w.add_metadata("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
    w.add_metadata(
        "tokenizer.ggml.pre",
        MetadataValue::String("llama-bpe".into()),
    );
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(MetadataArray::String(tokens)),
    );
    w.add_metadata(
        "tokenizer.ggml.token_type",
        MetadataValue::Array(MetadataArray::I32(types)),
    );
    w.add_metadata(
        "tokenizer.ggml.merges",
        MetadataValue::Array(MetadataArray::String(
            merges.into_iter().map(|m| m.3).collect(),
        )),
    );
    w.add_metadata("tokenizer.ggml.bos_token_id", u(n_base as u32));
    // `<|eot_id|>`, as in the instruct models' files.
    w.add_metadata("tokenizer.ggml.eos_token_id", u(n_base as u32 + 9));
    w.add_metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true));
    gguf::GgufFile::from_bytes(w.to_bytes().expect("vocabulary GGUF")).expect("read back")
}

/// Standard base64 (RFC 4648, with `=` padding) to bytes.
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut acc = 0u32;
        for (i, &d) in chunk.iter().enumerate() {
            acc |= (d as u32) << (18 - 6 * i);
        }
        out.extend(acc.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}

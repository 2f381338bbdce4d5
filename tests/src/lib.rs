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

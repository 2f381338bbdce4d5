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

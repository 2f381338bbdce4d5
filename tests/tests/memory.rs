//! Device memory of a packed model: loading Gemma 3 270M allocates within 10% of the file's
//! tensor bytes (the blocks as they are, the norms as f32). Alone in its test binary, so no
//! other test's buffers are counted.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::Decoder;
use gguf::GgufFile;

#[test]
fn packed_gemma_takes_its_file_size_in_device_memory() {
    let file = GgufFile::open(burn_gguf_tests::gemma_path()).unwrap();
    let tensor_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let device = burn_gguf::default_device();
    let before = burn_gguf::device_memory_in_use(&device).unwrap();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let model = Decoder::load(&loader).unwrap();
    let after = burn_gguf::device_memory_in_use(&device).unwrap();
    let used = after - before;
    println!("tensor bytes {tensor_bytes}, device bytes in use {used}");
    assert!(
        used.abs_diff(tensor_bytes) * 10 <= tensor_bytes,
        "device memory {used} bytes vs {tensor_bytes} bytes of tensors"
    );
    drop(model);
}

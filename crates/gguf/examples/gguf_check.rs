//! Checks GGUF files with the reader alone: prints a one-line summary of each file, or the
//! reader's error (naming the key, tensor or byte offset), and exits with status 1 if any file
//! was rejected. A small process: the peak memory of rejecting a hostile file is the reader's.
//!
//! `cargo run -p gguf --example gguf_check -- FILE...`

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for path in std::env::args().skip(1) {
        match gguf::GgufFile::open(&path) {
            Ok(f) => println!(
                "{path}: GGUF v{} {:?}-endian, {} metadata keys, {} tensors, {} bytes",
                f.version(),
                f.byte_order(),
                f.metadata().len(),
                f.tensors().len(),
                f.file_size()
            ),
            Err(e) => {
                eprintln!("{path}: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

//! The GGUF reader on arbitrary bytes: `Ok` or a typed error, never a panic, abort or
//! out-of-bounds read, and an accepted file is consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "check.rs"]
mod check;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = gguf::GgufFile::from_bytes(data.to_vec()) {
        check::accepted(&f);
    }
});

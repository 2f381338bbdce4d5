//! Rejecting a small hostile file allocates almost nothing: counts, lengths and shapes that
//! claim gigabytes are checked against the bytes in the file before any allocation. The heap's
//! peak is measured with a counting global allocator (one test in this binary, so no other
//! test's allocations mix in).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gguf::GgufFile;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A 100-byte file: the GGUF v3 preamble, then `body`, then zeros.
fn hostile(body: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF\x03\0\0\0".to_vec();
    b.extend_from_slice(body);
    b.resize(100, 0);
    b
}

fn le(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn rejecting_hostile_100_byte_files_stays_under_10_mib() {
    let u64b = |x: u64| x.to_le_bytes().to_vec();
    let u32b = |x: u32| x.to_le_bytes().to_vec();
    let key = |k: &str| le(&[&u64b(k.len() as u64), k.as_bytes()]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("2^20 tensors claimed", le(&[&u64b(1 << 20), &u64b(0)])),
        (
            "2^20 metadata entries claimed",
            le(&[&u64b(0), &u64b(1 << 20)]),
        ),
        ("u64::MAX counts", le(&[&u64b(u64::MAX), &u64b(u64::MAX)])),
        ("1 GiB key", le(&[&u64b(0), &u64b(1), &u64b(1 << 30)])),
        (
            "1 GiB string value",
            le(&[&u64b(0), &u64b(1), &key("k"), &u32b(8), &u64b(1 << 30)]),
        ),
        (
            "2^60-element UINT64 array",
            le(&[
                &u64b(0),
                &u64b(1),
                &key("k"),
                &u32b(9),
                &u32b(10),
                &u64b(1 << 60),
            ]),
        ),
        (
            "2^40-element STRING array",
            le(&[
                &u64b(0),
                &u64b(1),
                &key("k"),
                &u32b(9),
                &u32b(8),
                &u64b(1 << 40),
            ]),
        ),
        (
            "array of 2^40 arrays",
            le(&[
                &u64b(0),
                &u64b(1),
                &key("k"),
                &u32b(9),
                &u32b(9),
                &u64b(1 << 40),
            ]),
        ),
        (
            "array of arrays of 2^40 strings",
            le(&[
                &u64b(0),
                &u64b(1),
                &key("k"),
                &u32b(9),
                &u32b(9),
                &u64b(1),
                &u32b(8),
                &u64b(1 << 40),
            ]),
        ),
        (
            "n_dims 2^31",
            le(&[&u64b(1), &u64b(0), &key("t"), &u32b(1 << 31)]),
        ),
        (
            "tensor of 2^62 elements",
            le(&[
                &u64b(1),
                &u64b(0),
                &key("t"),
                &u32b(2),
                &u64b(1 << 31),
                &u64b(1 << 31),
                &u32b(0),
                &u64b(0),
            ]),
        ),
    ];
    let mut worst = 0usize;
    for (what, body) in cases {
        let bytes = hostile(&body);
        assert_eq!(bytes.len(), 100);
        let base = CURRENT.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let result = GgufFile::from_bytes(bytes);
        let peak = PEAK.load(Ordering::SeqCst) - base;
        let e = result.expect_err(what);
        eprintln!("{what}: rejected with a heap peak of {peak} bytes: {e}");
        worst = worst.max(peak);
    }
    eprintln!("worst heap peak: {worst} bytes");
    assert!(worst < 10 << 20, "{worst} bytes");
    // In fact it is a few kilobytes: the error message and the file's own 100 bytes.
    assert!(worst < 64 << 10, "{worst} bytes");
}

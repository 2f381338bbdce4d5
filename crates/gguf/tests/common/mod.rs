//! Helpers shared by the gguf integration tests: a raw byte builder for crafted files and byte
//! patching of writer output.
#![allow(dead_code)]

/// Builds raw GGUF bytes field by field (little-endian), for files the writer refuses to make.
#[derive(Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A tensor info entry.
    pub fn tensor(&mut self, name: &str, ne: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    /// Pads with zeros to a multiple of `align`.
    pub fn pad(&mut self, align: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn finish(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// Position of the first occurrence of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Byte position just after the length-prefixed string `s` (a key or tensor name) in `bytes`.
pub fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut enc = (s.len() as u64).to_le_bytes().to_vec();
    enc.extend_from_slice(s.as_bytes());
    find(bytes, &enc).expect("string present") + enc.len()
}

/// Byte position of the `offset` field of tensor info `name` (after n_dims, ne and type).
pub fn tensor_offset_field(bytes: &[u8], name: &str) -> usize {
    let p = after_string(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    p + 4 + 8 * n_dims + 4
}

/// Byte position of the `type` field of tensor info `name`.
pub fn tensor_type_field(bytes: &[u8], name: &str) -> usize {
    tensor_offset_field(bytes, name) - 4
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
